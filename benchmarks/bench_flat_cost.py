"""Flat-cost sweep: is the CPU Joseph pair's rate (ray samples per second) flat over the problem size?

W1's geometry (benchmarks/workloads.py: circular cone, 180 views, SID 600, SDD 1200, float32) at N^3
volumes and N x N detectors for ``--sizes`` (default N = 64 .. 320), ``--ops`` (default forward and
back) and ``--threads`` (default all threads and 1); every (N, op, threads) interleaved call by call
(one warm-up each, then ``--repeats`` rounds).  One ``flat_cost`` line per (N, op, threads) with every
call's wall and CPU seconds and the rates from the median wall time and the median CPU seconds, then
``flat_cost_summary`` lines per (op, threads) with the rate's min/max over N from both (goal >= 0.8).
Written as bench ``projector_flat_cost`` to ``results/bench_projector_flat_cost.jsonl`` unless
``--out`` says otherwise; ``bench_projector.py --flat-cost`` runs the same.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import ctbench  # noqa: F401  before torch, as the GUI and the CLI load it: its OpenMP defaults (ctbench/openmp_env.py)
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (RESULTS, Emitter, cpu_flags, cpu_model, interleaved, kernel_paths,  # noqa: E402
                     machine_info, new_run_id, parse_list, rounded, threaded)
from projector_measures import ray_plane_samples, smooth_volume, stream_bandwidth, throughput  # noqa: E402
from workloads import W1, w1_projector  # noqa: E402

BENCH = "projector_flat_cost"
DEFAULT_OUT = RESULTS / "bench_projector_flat_cost.jsonl"
FLAT_SIZES = (64, 128, 192, 256, 320)
FLAT_OPS = ("forward", "back")
FLAT_GOAL = 0.8  # rate min/max over the sizes


def run_flat_cost(emit, sizes, thread_counts, repeats: int, bandwidth: dict, ops=FLAT_OPS):
    """Rate (ray samples/s) of ``ops`` over N^3 volumes (W1's geometry: 180 views, N x N detector) at each
    thread count, every (N, op, threads) interleaved call by call; a summary line per (op, threads) with the
    rate's min/max over N from the median wall times and from the median CPU seconds."""
    machine = {"cpu": cpu_model(), "simd": cpu_flags()}
    cases, calls = {}, {}
    for n in sizes:
        projector = w1_projector("cpu", scale=n / W1["volume_shape"][0])
        volume = smooth_volume(projector.volume_shape, W1["dtype"])
        sino = projector.project(volume) if "back" in ops else None
        cases[n] = (projector, volume, ray_plane_samples(projector))
        fns = {"forward": lambda p=projector, v=volume: p.project(v),
               "back": lambda p=projector, s=sino: p.backproject(s)}
        for op in ops:
            for t in thread_counts:
                calls[(n, op, t)] = threaded(t, fns[op])
    # every (N, op, threads) in turn, one warm-up call each (a busy spell then slows every size alike)
    stats, _ = interleaved(calls, repeats)
    paths = kernel_paths()["active"]
    rates: dict[tuple, list] = {}
    for (n, op, t), st in stats.items():
        projector, volume, samples = cases[n]
        times, cpus = st["times"], st["cpu_times"]
        med, cpu_med = st["median_s"], st["cpu_median_s"]
        rate_med = samples["samples"] / med
        rate_cpu = samples["samples"] / cpu_med * t if cpu_med > 0 else math.nan  # all threads' work, per wall-s
        rates.setdefault((op, t), []).append((n, rate_med, rate_cpu))
        timing = {"seconds": st["seconds"], "median_s": med, "cpu_s": st["cpu_s"]}
        emit(kind="flat_cost", workload=f"flat N={n} {t}-thread", op=op, impl="ctbench-cpu", N=n,
             threads=t, n_views=W1["n_views"], seconds=st["seconds"],
             volume_shape=list(projector.volume_shape), detector_shape=list(projector.detector_shape),
             dtype="float32", **machine, paths=paths,
             min_s=rounded(st["seconds"]), median_s=rounded(med), cpu_s=rounded(st["cpu_s"]), cpu_median_s=rounded(cpu_med),
             n_calls=len(times), times=times, cpu_times=cpus,
             samples_per_s_median=rounded(rate_med),
             # per thread, from the median call's CPU seconds (a crowded machine inflates wall time, not CPU-s)
             samples_per_cpu_s=rounded(rate_cpu / t),
             **throughput(timing, samples, volume.element_size(), op, bandwidth), loadavg=os.getloadavg(),
             timing="sizes, ops and threads interleaved call by call")
    summaries = []
    for (op, t), rs in rates.items():
        vals = [r for _, r, _ in rs]
        cpu_vals = [c for _, _, c in rs]
        ratio = min(vals) / max(vals)
        cpu_ratio = min(cpu_vals) / max(cpu_vals)
        summaries.append(emit(
            kind="flat_cost_summary", workload=f"flat-cost {t}-thread", op=op, impl="ctbench-cpu",
            ratio="rate min/max over N", value=rounded(ratio), threads=t, sizes=[n for n, _, _ in rs],
            # the same from CPU seconds: steadier on a shared machine, where wall time counts waiting
            cpu_min_over_max=rounded(cpu_ratio), value_cpu_s=rounded(cpu_ratio),
            samples_per_s_median=[rounded(v) for v in vals], samples_per_cpu_s=[rounded(c / t) for c in cpu_vals],
            min_over_max=rounded(ratio), goal=FLAT_GOAL, meets_goal=ratio >= FLAT_GOAL,
            meets_goal_cpu_s=cpu_ratio >= FLAT_GOAL, paths=paths, **machine, loadavg=os.getloadavg()))
    return summaries


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines file to append to (default: %(default)s)")
    p.add_argument("--no-out", action="store_true", help="print only, write no file")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds after a warm-up (min and median reported)")
    p.add_argument("--sizes", type=str, default=",".join(map(str, FLAT_SIZES)),
                   help="comma-separated N (default: %(default)s)")
    p.add_argument("--ops", type=str, default=",".join(FLAT_OPS),
                   help="comma-separated ops: forward, back (default: %(default)s)")
    p.add_argument("--threads", type=str, default=None,
                   help="comma-separated thread counts (default: all threads and 1)")
    p.add_argument("--bandwidth-mib", type=int, default=512, help="array size of the DRAM streaming loop")
    p.add_argument("--quick", action="store_true", help="N = 64, 128 and 2 rounds: a check that it runs")
    return p.parse_args(argv)


def main(argv=None, header: dict | None = None) -> int:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    sizes = parse_list("64,128" if args.quick else args.sizes, "--sizes", int)
    ops = parse_list(args.ops, "--ops", str, FLAT_OPS)
    counts = parse_list(args.threads, "--threads", int) if args.threads else [threads] + ([1] if threads > 1 else [])
    repeats = 2 if args.quick else args.repeats
    run_id = new_run_id()
    emit = Emitter(None if args.no_out else args.out, run_id, BENCH)
    emit(kind="header", time=run_id, machine=machine_info(), args={k: str(v) for k, v in vars(args).items()},
         counting="samples = ray/plane samples whose bilinear stencil touches the volume (dominant-axis planes, "
                  "float64 from the geometry); forward touches 4 voxels/sample, back reads+writes 4",
         kernel_paths=kernel_paths(), **(header or {}))
    bandwidth = {"dram": stream_bandwidth(args.bandwidth_mib << 20)}
    try:
        run_flat_cost(emit, sizes, counts, repeats, bandwidth, ops)
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
