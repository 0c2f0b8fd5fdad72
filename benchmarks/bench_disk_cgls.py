"""Disk CGLS benchmark (issue 11): seconds per CGLS iteration, vectors on disk against in memory.

- ``memory``: :func:`ctbench.solvers.cgls_iterations` on tensors in memory;
- ``disk``: :func:`ctbench.solvers.disk_cgls_iterations` with x, s, p, r, q in zarr v3 stores
  under a temporary folder, within ``--budget`` (no checkpoints).

Workloads: W1 (benchmarks/workloads.py: 128^3, 180 views, 128x128 detector, float32) and a
384^3 float32 volume seen by ``--big-views`` views of a 128x128 detector (the disk solver with a
256 MiB budget; in memory too when ``--big-memory`` is given).  A call runs ``--iterations``
iterations; the seconds of every iteration after the first of a call are kept (the first one
includes nothing special, but the data pass and initial residual precede it, so it is timed apart).
Calls of the two implementations are interleaved, ``--repeats`` of each; lines report min and
median seconds per iteration and ``ratio_vs_memory`` (min over min; target at most 1.5 on W1).
Output: JSON lines on stdout, appended to ``--out``.  The machine may be shared: see ``loadavg``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine_info  # noqa: E402
from workloads import w1_projector  # noqa: E402

from ctbench import Projector, circular_trajectory_3d  # noqa: E402
from ctbench.engine.plan import parse_bytes  # noqa: E402
from ctbench.solvers import cgls_iterations, disk_cgls_iterations, plan_disk_cgls  # noqa: E402
from ctbench.storage import ZarrStore  # noqa: E402

BENCH = "disk_cgls"
TARGET_RATIO = 1.5
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_disk_cgls.jsonl"


def per_iteration(gen) -> tuple[list[float], float]:
    """Seconds of each iteration of a solver generator, and the seconds before the first one."""
    times = []
    t0 = time.perf_counter()
    first = None
    for _ in gen:
        t = time.perf_counter()
        if first is None:
            first = t - t0
        else:
            times.append(t - t0)
        t0 = t
    return times, first


def big_projector(n_views: int) -> Projector:
    traj = circular_trajectory_3d(n_views, 600.0, 1200.0)
    return Projector(traj, (384, 384, 384), (128, 128), voxel_spacing=256.0 / 384, detector_spacing=4.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--budget", default="256 MiB")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink W1 for quick runs")
    ap.add_argument("--big-views", type=int, default=24)
    ap.add_argument("--big-repeats", type=int, default=2)
    ap.add_argument("--big-memory", action="store_true", help="also run the 384^3 case in memory")
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--skip-w1", action="store_true")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    run_id = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def emit(**fields):
        line = json.dumps({"bench": BENCH, "run_id": run_id, **fields})
        print(line, flush=True)
        with open(args.out, "a") as f:
            f.write(line + "\n")

    emit(kind="header", machine=machine_info(), workload="W1 and 384^3", iterations=args.iterations,
         repeats=args.repeats, budget_bytes=parse_bytes(args.budget), note="shared machine: figures are noisy")
    work = Path(tempfile.mkdtemp(prefix="ctbench-bench-disk-", dir=args.workdir))
    try:
        cases = [] if args.skip_w1 else [("W1", w1_projector("cpu", scale=args.scale), args.repeats, True)]
        if not args.skip_big:
            cases.append((f"384^3, {args.big_views} views", big_projector(args.big_views), args.big_repeats,
                          args.big_memory))
        for name, P, repeats, with_memory in cases:
            torch.manual_seed(0)
            vol = torch.rand(P.volume_shape) if name == "W1" else None
            b = P.project(vol) if vol is not None else P.project(
                torch.ones(P.volume_shape, dtype=torch.float32))
            del vol
            store = ZarrStore.create(work / f"{len(name)}b.zarr", b.shape, torch.float32,
                                     chunks=(16, *b.shape[1:]))
            store.write(None, b)
            plan = plan_disk_cgls(P, store, memory_budget=args.budget, with_x0=False)
            samples = {"memory": [], "disk": []}
            starts = {"memory": [], "disk": []}
            for k in range(repeats):  # interleaved calls
                impls = (["memory"] if with_memory else []) + ["disk"]
                for impl in impls:
                    if impl == "memory":
                        gen = cgls_iterations(P, b, args.iterations)
                    else:
                        folder = work / f"w{k}"
                        gen = disk_cgls_iterations(P, store, folder, args.iterations, memory_budget=args.budget)
                    times, first = per_iteration(gen)
                    samples[impl] += times
                    starts[impl].append(first)
                    if impl == "disk":
                        shutil.rmtree(work / f"w{k}", ignore_errors=True)
            del b
            mem_min = min(samples["memory"]) if samples["memory"] else None
            for impl, times in samples.items():
                if not times:
                    continue
                line = dict(workload=name, impl=impl, op="cgls iteration", seconds=min(times),
                            median_seconds=statistics.median(times), n_samples=len(times),
                            first_iteration_seconds=min(starts[impl]), volume_shape=list(P.volume_shape),
                            n_views=P.n_views)
                if impl == "disk":
                    line.update(budget_bytes=plan.budget, peak_bytes_estimate=plan.peak_bytes,
                                state_bytes=plan.state_bytes, disk_bytes=plan.disk_bytes,
                                windows=[plan.slab_depth, plan.view_batch])
                    if mem_min:
                        line.update(ratio_vs_memory=min(times) / mem_min,
                                    median_ratio_vs_memory=statistics.median(times)
                                    / statistics.median(samples["memory"]))
                emit(**line)
                if impl == "disk" and mem_min:  # the README table's ratio row
                    ratio = min(times) / mem_min
                    # The 1.5x target is for W1; the 384^3 case (few views, so the iteration is
                    # bound by streaming x, s and p through zarr) is reported without one.
                    goal = dict(target=TARGET_RATIO, meets_target=ratio <= TARGET_RATIO) if name == "W1" else \
                        dict(note="no target: volume-I/O bound (few views); the 1.5x target is W1's")
                    emit(workload=name, op="cgls iteration", ratio="disk/memory", value=ratio,
                         value_median=line["median_ratio_vs_memory"], **goal)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
