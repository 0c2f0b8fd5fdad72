"""What durability (fsync of files and folders at commit points) costs: a 256^3 dataset save and a W1
disk-CGLS checkpoint.

    python benchmarks/bench_durability.py --out benchmarks/results/bench_durability.jsonl

Peers, interleaved call by call (one with fsync, one without, per round, >= 5 rounds), in the same
process on the same file system: ``save_dataset`` of a float32 256^3 volume (random values, 64 MiB, so
compression cannot hide the bytes), and one checkpoint of a real W1 disk-CGLS run (128^3 volume, 180
views of 128 x 128: the x, r and p stores, their part.json and the manifest), timed around
``Checkpoints.write`` inside ``disk_cgls_iterations``.  "Without" is ``durability(False)``, the same code
with the flushes skipped.  Reports min and median seconds of each and the difference; records the CPU
model, AVX-512, the file system and the load average (the machine may be shared: say so when quoting).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_durability.jsonl"


def avx512() -> bool:
    try:
        return " avx512f" in open("/proc/cpuinfo").read()
    except OSError:
        return False


def loadavg() -> list[float]:
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return []


def filesystem(path: Path) -> str:
    try:
        out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, timeout=10).stdout
        return out.splitlines()[1].split()[1]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def main(argv=None) -> int:
    from harness import Emitter, cpu_model

    from ctbench.atomic_files import durability
    from ctbench.solvers import checkpoint as ckmod
    from ctbench.solvers.disk_cgls import disk_cgls_iterations
    from ctbench.storage import ZarrStore
    from ctbench.workbench.dataset import save_dataset
    from workloads import w1_projector

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--size", type=int, default=256, help="edge of the cubic float32 dataset volume")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--w1-scale", type=float, default=1.0, help="shrink W1 (quick rehearsals only)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args(argv)
    if args.rounds < 5:
        ap.error("--rounds must be at least 5")
    run_id = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")

    emit = Emitter(args.out, run_id, bench="durability")

    work = Path(tempfile.mkdtemp(prefix="ctbench-durability-", dir=args.dir))
    emit(kind="header", python=platform.python_version(), cpu=cpu_model(), avx512=avx512(),
         filesystem=filesystem(work), loadavg_start=loadavg(), rounds=args.rounds,
         omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
         note="peers interleaved call by call in one process; the machine may be shared (see loadavg)")
    try:
        # ------------------------------------------------------------- dataset save
        n = args.size
        vol = np.random.default_rng(0).random((n, n, n), dtype=np.float32)
        times = {True: [], False: []}
        for r in range(args.rounds):
            for fsync in (True, False):
                path = work / f"save-{fsync}.zarr"
                with durability(fsync):
                    t = time.perf_counter()
                    save_dataset(path, volume=vol, voxel_spacing=1.0, overwrite=True)
                    times[fsync].append(time.perf_counter() - t)
        for fsync, ts in times.items():
            emit(op="save_dataset", shape=[n, n, n], mib=vol.nbytes / 2**20, fsync=fsync, min_s=min(ts),
                 median_s=statistics.median(ts), all_s=ts)
        emit(op="save_dataset", summary=True, cost_min_s=min(times[True]) - min(times[False]),
             cost_median_s=statistics.median(times[True]) - statistics.median(times[False]),
             ratio_median=statistics.median(times[True]) / statistics.median(times[False]), loadavg=loadavg())
        shutil.rmtree(work / "save-True.zarr", ignore_errors=True)
        shutil.rmtree(work / "save-False.zarr", ignore_errors=True)

        # ------------------------------------------------------- W1 disk-CGLS checkpoint
        P = w1_projector("cpu", scale=args.w1_scale)
        import torch
        b = P.project(torch.rand(P.global_volume_shape))
        sino = ZarrStore.create(work / "b.zarr", tuple(b.shape), torch.float32)
        sino.write(None, b)
        real_write = ckmod.Checkpoints.write
        last = {}

        def timed(self, *a, **k):
            t = time.perf_counter()
            out = real_write(self, *a, **k)
            last["s"] = time.perf_counter() - t
            return out

        ckmod.Checkpoints.write = timed
        times = {True: [], False: []}
        try:
            for r in range(args.rounds):
                for fsync in (True, False):
                    wd = work / f"cgls-{fsync}"
                    shutil.rmtree(wd, ignore_errors=True)
                    with durability(fsync):
                        gen = disk_cgls_iterations(P, sino, wd, 1, checkpoint_every=1)
                        for _ in gen:
                            pass
                    times[fsync].append(last.pop("s"))
        finally:
            ckmod.Checkpoints.write = real_write
        state_mib = (2 * np.prod(P.global_volume_shape) + np.prod(b.shape)) * 4 / 2**20
        for fsync, ts in times.items():
            emit(op="disk_cgls_checkpoint", workload="W1" if args.w1_scale == 1.0 else f"W1 x{args.w1_scale}",
                 volume_shape=list(P.global_volume_shape), projection_shape=list(b.shape), state_mib=state_mib,
                 fsync=fsync, min_s=min(ts), median_s=statistics.median(ts), all_s=ts)
        emit(op="disk_cgls_checkpoint", summary=True, cost_min_s=min(times[True]) - min(times[False]),
             cost_median_s=statistics.median(times[True]) - statistics.median(times[False]),
             ratio_median=statistics.median(times[True]) / statistics.median(times[False]), loadavg=loadavg())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
