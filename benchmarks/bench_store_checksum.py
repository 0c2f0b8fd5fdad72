"""What the crc32c chunk checksum and the completion record cost a ZarrStore.

    python benchmarks/bench_store_checksum.py --out benchmarks/results/bench_store_checksum.jsonl

Writes and reads a float32 volume through ``ZarrStore`` with ``checksum=True``
(the default: every chunk crc32c-encoded on write and verified on read) and
``checksum=False``, calls interleaved (one of each per round, >= 5 rounds),
and reports min and median seconds of each, and the cost of one completion
record update (an atomic rewrite of zarr.json).  The CPU model is recorded.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Emitter, cpu_model  # noqa: E402

from ctbench.storage import ZarrStore  # noqa: E402
from ctbench.storage.completion import CompletionRecord  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_store_checksum.jsonl"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--size", type=int, default=192, help="edge of the cubic float32 volume")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    run_id = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")

    emit = Emitter(args.out, run_id, bench="store_checksum")

    n = args.size
    emit(kind="header", python=platform.python_version(), torch=torch.__version__, cpu=cpu_model(),
         shape=[n, n, n], chunks=[64, 64, 64], rounds=args.rounds,
         note="shared machine: other processes compete for the CPU and the disk")
    vol = torch.rand(n, n, n)
    work = Path(tempfile.mkdtemp(prefix="ctbench-bench-"))
    times = {(c, op): [] for c in (True, False) for op in ("write", "read")}
    try:
        for r in range(args.rounds):
            for checksum in (True, False):
                store = ZarrStore.create(work / f"{checksum}.zarr", (n, n, n), chunks=(64, 64, 64),
                                         checksum=checksum, overwrite=True)
                t = time.perf_counter()
                store.write(None, vol)
                times[(checksum, "write")].append(time.perf_counter() - t)
                t = time.perf_counter()
                back = store.read()
                times[(checksum, "read")].append(time.perf_counter() - t)
                assert torch.equal(back, vol)
        for (checksum, op), ts in times.items():
            emit(op=op, checksum=checksum, min_s=min(ts), median_s=statistics.median(ts),
                 mb_per_s_at_min=vol.numel() * 4 / min(ts) / 1e6)
        store = ZarrStore.open(work / "True.zarr")
        rec = CompletionRecord("project", {"projector": "x"}, [[i, i + 1] for i in range(n)])
        ts = []
        for i in range(max(args.rounds, 5) * 4):
            rec.done.append([i, i + 1])
            t = time.perf_counter()
            store.set_completion_record(rec)
            ts.append(time.perf_counter() - t)
        emit(op="record_update", windows=n, min_s=min(ts), median_s=statistics.median(ts))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
