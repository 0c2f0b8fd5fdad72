"""Streaming benchmark (issue 6): W1 in memory against W1 streamed through zarr block stores.

Workload W1 (benchmarks/workloads.py): circular cone beam, 128^3 volume,
180 views, 128x128 detector, float32, on the CPU backend.  Measured in the
same run, best of ``--repeats`` after one warm-up call each:

- ``memory``: ``Projector.project(volume)`` / ``Projector.backproject(sinogram)``
  on tensors in memory (the untiled call);
- ``zarr``: ``Projector.project_into(volume_store, sinogram_store)`` /
  ``backproject_into(...)`` between zarr v3 stores on disk (uncompressed,
  64^3 volume chunks, 16-view sinogram chunks), once with the default
  budget (a quarter of the available memory: one window here) and once per
  ``--budgets`` value (several windows), timing the reads and writes too.

Each streamed line carries ``ratio_vs_memory`` (wall time; target: at most
1.3) and ``cpu_ratio_vs_memory`` (process CPU time, steadier on a shared
machine), the plan (windows, slab depth, view
batch, estimated peak bytes) and the maximum difference to the in-memory
result.  Output: JSON lines on stdout, appended to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import W1, w1_projector  # noqa: E402

from ctbench.engine.plan import PlanError, parse_bytes  # noqa: E402
from ctbench.storage import ZarrStore  # noqa: E402

BENCH = "streaming"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_streaming.jsonl"
TARGET_RATIO = 1.3


def best_of(fn, repeats: int) -> tuple[float, float, object]:
    """(best wall seconds, best process CPU seconds, result) after one warm-up call.

    CPU seconds (all threads of the process, zarr's I/O threads included) are
    reported beside wall time because a shared machine stretches wall time.
    """
    result = fn()  # warm-up (kernels compiled and loaded, page cache filled)
    walls, cpus = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus), result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines are appended here")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink W1 (volume and detector) for quick runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budgets", nargs="*", default=["16MiB", "10MiB"], help="memory budgets of the windowed runs")
    ap.add_argument("--workdir", type=Path, default=None, help="where the zarr stores go (default: a temp dir)")
    args = ap.parse_args(argv)

    run_id = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)

    def emit(**fields):
        line = json.dumps({"bench": BENCH, "run_id": run_id, **fields})
        print(line, flush=True)
        with open(out, "a") as f:
            f.write(line + "\n")

    emit(kind="header", python=platform.python_version(), torch=torch.__version__, machine=platform.machine(),
         cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(), workload="W1", scale=args.scale,
         n_views=W1["n_views"], repeats=args.repeats)

    p = w1_projector("cpu", scale=args.scale)
    torch.manual_seed(0)
    vol = torch.rand(p.volume_shape)
    t_proj, c_proj, sino = best_of(lambda: p.project(vol), args.repeats)
    t_back, c_back, back = best_of(lambda: p.backproject(sino), args.repeats)
    emit(impl="memory", op="project", seconds=t_proj, cpu_seconds=c_proj, volume_shape=p.volume_shape,
         sinogram_shape=tuple(sino.shape))
    emit(impl="memory", op="backproject", seconds=t_back, cpu_seconds=c_back)

    work = Path(tempfile.mkdtemp(prefix="ctbench-bench-", dir=args.workdir))
    try:
        vol_store = ZarrStore.create(work / "volume.zarr", p.volume_shape, chunks=(64, 64, 64))
        vol_store.write(None, vol)
        sino_chunks = (16, *p.projection_shape[1:])
        for budget in [None, *args.budgets]:
            q = w1_projector("cpu", scale=args.scale, memory_budget=budget)
            sino_store = ZarrStore.create(work / f"sino-{budget}.zarr", p.projection_shape, chunks=sino_chunks)
            back_store = ZarrStore.create(work / f"back-{budget}.zarr", p.volume_shape, chunks=(64, 64, 64))
            runs = (("project_into", lambda: q.project_into(vol_store, sino_store), t_proj, c_proj,
                     sino_store, sino),
                    ("backproject_into", lambda: q.backproject_into(sino_store, back_store), t_back, c_back,
                     back_store, back))
            for op, fn, t_mem, c_mem, store, expect in runs:
                try:
                    t, c, plan = best_of(fn, args.repeats)
                except PlanError as e:
                    emit(impl="zarr", op=op, budget_bytes=parse_bytes(budget), skipped=str(e))
                    continue
                diff = float((store.read() - expect).abs().max() / expect.abs().max())
                emit(impl="zarr", op=op, seconds=t, cpu_seconds=c, ratio_vs_memory=t / t_mem,
                     cpu_ratio_vs_memory=c / c_mem, target=TARGET_RATIO, budget_bytes=parse_bytes(budget),
                     windows=plan.n_windows, slab_depth=plan.slab_depth, view_batch=plan.view_batch,
                     peak_bytes_estimate=plan.peak_bytes, rel_diff_vs_memory=diff)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
