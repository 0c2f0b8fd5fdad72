"""Projector benchmark (issue 2): ctbench's CPU Joseph pair against its peers, same workload, same run.

Workload W1 (benchmarks/workloads.py): circular cone beam, 128^3 volume of 2 mm
voxels, 180 views over 360 degrees, 128x128 detector of 4 mm pixels, SID 600,
SDD 1200, float32.  Measured here, on that identical geometry:

- ctbench ``backend="cpu"`` forward and backprojection, interleaved call by call
  with RTK in the same process (A B A B ..., ``--repeats`` timed calls each after
  a warm-up call that also compiles the kernels if the cache is cold; min and
  median reported), at all threads (workload ``W1``) and at 1 thread
  (``W1 1-thread``); targets: forward >= 3.5x RTK, back >= 5x RTK, judged on the
  stricter of the CPU-seconds ratio and the median wall-clock ratio;
- RTK (itk-rtk) JosephForwardProjectionImageFilter / JosephBackProjectionImageFilter
  with a ThreeDCircularProjectionGeometry built from the same angles, checked two
  ways: the world positions of RTK's source and detector pixels against
  ctbench's (``geometry_max_dev_mm``) and the relative difference of the outputs
  (``rel_diff_vs_ctbench``);
- diffct 2.5 ``backend="torch"`` (cell-constant Siddon, so outputs differ from
  Joseph by the model, not the geometry: a mismatched geometry gives O(1));
- a 2D section against ASTRA's CPU projectors (parallel ``linear`` = Joseph and
  ``line``; fan ``line_fanflat``) on a 512^2 image, 720 views, 768 pixels;
- a plain memory-streaming loop (torch copy) giving GB/s, both for arrays far
  larger than the caches and for arrays the size of the W1 volume.

Counting.  ``samples`` is the number of ray/plane samples whose bilinear stencil
touches the volume: for each ray, the dominant-axis voxel planes at which the
ray lies within one voxel of the box on the other two axes (computed in float64
from the geometry, the same count for every implementation).  The kernels march
at most two spare planes per ray more (``samples_marched``).  Each forward
sample reads 4 voxels; each backprojection sample reads and writes 4 voxels, so
``touched_bytes_per_s`` = samples/s x 4 x itemsize (x2 for back).  Dividing it by
the streaming bandwidth gives ``bandwidth_fraction``: the speed relative to a
loop that fetched every stencil voxel from memory.  Values above 1 mean the
caches serve the reuse between neighbouring rays (the W1 volume is 8 MiB).

Kernel paths (issue 24).  The header records the Joseph library's paths (offered, measured
fastest on this CPU, active: ``ctbench.engine.cpu.joseph_paths``).  After each W1 row set, the AVX2
forward lanes are timed forced by ``CTBENCH_CPU_PATH`` on an AVX-512 CPU, labelled "forced AVX2 on
an AVX-512 CPU: not the speed of an AVX2-only core" (``--all-paths``: every forward and back path),
with their RTK ratio in CPU seconds.  ``--flat-cost`` runs only the flat-cost sweep
(bench_flat_cost.py; ``--flat-sizes``, ``--flat-ops`` and ``--flat-threads`` are its ``--sizes``, ``--ops``
and ``--threads``).

Timing, output and the machine header come from harness.py; the sample count and the bandwidth loop
from projector_measures.py; the peers from peers_rtk.py and peers_astra.py.

Output: JSON lines on stdout, appended to ``--out``; one header line with the
machine (CPU model, cores, cache sizes, SIMD levels, load average), then one
line per (workload, op, impl) with ``seconds`` (min) and ``median_s``, then ratio lines
``{"ratio": "rtk/ctbench", "value": min ratio, "value_median": median ratio}`` (>1: ctbench faster).
The 2D/ASTRA and diffct sections time each implementation in turn (not interleaved).
Peers are optional: a missing one gives ``{"impl": ..., "skipped": "not installed"}``.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import ctbench  # noqa: F401  before torch, as the GUI and the CLI load it: its OpenMP defaults (ctbench/openmp_env.py)
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_flat_cost  # noqa: E402
from bench_flat_cost import FLAT_GOAL, FLAT_OPS, FLAT_SIZES, run_flat_cost  # noqa: E402,F401 (re-exported)
from harness import (RESULTS, Emitter, best_of, cpu_flags, forced_path, interleaved, kernel_paths,  # noqa: E402,F401
                     machine_info, new_run_id, parse_list, ratio_fields, rounded, timing_fields)
from peers_astra import projector_2d, run_astra  # noqa: E402
from peers_rtk import rtk_calls, rtk_geometry_deviation  # noqa: E402
from projector_measures import (ray_plane_samples, rel_diff, smooth_volume, stream_bandwidth,  # noqa: E402
                                throughput)
from workloads import W1, w1_projector  # noqa: E402

from ctbench import Projector  # noqa: E402

BENCH = "projector"
DEFAULT_OUT = RESULTS / "bench_projector.jsonl"
# Issue 24's goals: forward >= 3.5x and back >= 5x RTK, in CPU seconds (RTK's back runs on one thread, so a
# wall-clock ratio at 2 threads would flatter ctbench by the second core).
TARGETS = {("forward", "rtk/ctbench"): 3.5, ("back", "rtk/ctbench"): 5.0, "diffct/ctbench": 30.0}
CPU_S_TARGETS = {"rtk/ctbench"}


# ------------------------------------------------------------------ ctbench
def run_ctbench(emit, projector: Projector, volume, workload: str, repeats: int, bandwidth: dict, samples: dict):
    """Time project and backproject; returns {op: (timing stats, output)}."""
    results = {}
    stats, sino = best_of(lambda: projector.project(volume), repeats)
    emit(workload=workload, op="forward", impl="ctbench-cpu", threads=torch.get_num_threads(),
         dtype=str(volume.dtype).replace("torch.", ""), **timing_fields(stats),
         **throughput(stats, samples, volume.element_size(), "forward", bandwidth))
    results["forward"] = (stats, sino)
    stats, back = best_of(lambda: projector.backproject(sino), repeats)
    emit(workload=workload, op="back", impl="ctbench-cpu", threads=torch.get_num_threads(),
         dtype=str(volume.dtype).replace("torch.", ""), **timing_fields(stats),
         **throughput(stats, samples, volume.element_size(), "back", bandwidth))
    results["back"] = (stats, back)
    return results


def run_w1(emit, projector: Projector, volume, workload: str, repeats: int, threads: int, samples: dict,
           bandwidth: dict, with_rtk: bool):
    """ctbench and RTK on W1 at ``threads`` threads, interleaved call by call; returns
    ({op: {impl: stats}}, {op: ctbench output})."""
    torch.set_num_threads(threads)
    sino = projector.project(volume)
    ct_calls = {"forward": lambda: projector.project(volume), "back": lambda: projector.backproject(sino)}
    rtk = None
    if with_rtk:
        try:
            g, filters, rtk_output = rtk_calls(projector, volume, sino, threads, repeats + 1)
            rtk = (rtk_geometry_deviation(g, projector), filters, rtk_output)
        except ImportError as e:
            emit(workload=workload, impl="rtk", skipped="not installed", error=str(e))
    all_stats, ct_out = {}, {}
    for op in ("forward", "back"):
        calls = {"ctbench-cpu": ct_calls[op]}
        if rtk is not None:
            it = iter(rtk[1][op])

            def rtk_call(it=it):
                f = next(it)
                f.Update()
                return f

            calls["rtk"] = rtk_call
        stats, outs = interleaved(calls, repeats)
        ct_out[op] = outs["ctbench-cpu"]
        all_stats[op] = stats
        emit(workload=workload, op=op, impl="ctbench-cpu", threads=threads,
             dtype=str(volume.dtype).replace("torch.", ""), **timing_fields(stats["ctbench-cpu"]),
             **throughput(stats["ctbench-cpu"], samples, volume.element_size(), op, bandwidth),
             timing="interleaved with the peers, call by call")
        if rtk is not None:
            emit(workload=workload, op=op, impl="rtk", threads=threads, dtype="float32",
                 **timing_fields(stats["rtk"]), **throughput(stats["rtk"], samples, 4, op, bandwidth),
                 geometry_max_dev_mm=rounded(rtk[0]), **rel_diff(rtk[2](op, outs["rtk"]), ct_out[op].numpy(),
                                                               op == "back"),
                 filter=f"Joseph{'Forward' if op == 'forward' else 'Back'}ProjectionImageFilter",
                 timing="interleaved with ctbench, call by call")
            emit_ratio(emit, workload, op, "rtk", stats["rtk"], stats["ctbench-cpu"])
        if rtk is not None:
            rtk[1][op].clear()
    return all_stats, ct_out


# ------------------------------------------------------------------ diffct
def run_diffct(emit, projector: Projector, volume, ct_results, workload: str, repeats: int, samples: dict,
               bandwidth: dict):
    try:
        import diffct
    except ImportError as e:
        emit(workload=workload, impl="diffct-torch", skipped="not installed", error=str(e))
        return {}
    # ctbench's trajectory vectors passed unchanged: diffct takes the same
    # (source, detector centre, unit u, unit v) per view and a centred volume.
    traj = tuple(t.detach().clone() for t in projector.trajectory.tensors())
    dp = diffct.Projector(traj, tuple(projector.volume_shape), tuple(projector.detector_shape), beam="cone",
                          detector_spacing=tuple(projector.detector_spacing),
                          voxel_spacing=tuple(projector.voxel_spacing), backend="torch")
    results = {}
    sino_ct = ct_results["forward"][1]
    for op, fn in (("forward", lambda: dp.project(volume)), ("back", lambda: dp.backproject(sino_ct))):
        stats, out = best_of(fn, repeats, warmup=False)
        emit(workload=workload, op=op, impl="diffct-torch", threads=torch.get_num_threads(), dtype="float32",
             **timing_fields(stats), **throughput(stats, samples, 4, op, bandwidth),
             **rel_diff(out.detach().numpy(), ct_results[op][1].numpy(), op == "back"), model="cell-constant Siddon",
             note="no warm-up call (each call takes about a minute)")
        results[op] = stats
    return results


# ------------------------------------------------------------------ ratios
def emit_ratio(emit, workload: str, op: str, peer: str, s_peer: dict | None, s_ct: dict | None):
    """Peer time over ctbench time (> 1: ctbench faster), by wall clock and by process CPU seconds.

    The CPU-seconds ratio compares work per core; on a shared, loaded machine
    it is steadier than the wall-clock one.
    """
    if s_peer is None or s_ct is None:
        return
    name = f"{peer}/ctbench"
    line = {"workload": workload, "op": op, "ratio": name, **ratio_fields(s_peer, s_ct)}
    value, median = s_peer["seconds"] / s_ct["seconds"], line.get("value_median")
    target = TARGETS.get((op, name), TARGETS.get(name))
    if target is not None:
        # judged on the median ratio where there is one (the rule), else on the best times; RTK's targets
        # are CPU-second ratios, so the CPU-seconds ratio must reach them too
        judged = median if median is not None else value
        if name in CPU_S_TARGETS and line["value_cpu_s"] is not None:
            judged = min(judged, line["value_cpu_s"])
        line.update(target=target, meets_target=bool(judged >= target))
    emit(**line)


# ------------------------------------------------------------------ kernel paths
AVX2_LABEL = "forced AVX2 on an AVX-512 CPU: not the speed of an AVX2-only core"


def path_note(name: str, simd: list[str]) -> dict:
    return {"note": AVX2_LABEL} if name.startswith("avx2") and "avx512f" in simd else {}


def run_paths(emit, projector: Projector, volume, workload: str, repeats: int, samples: dict, bandwidth: dict,
              names: dict[str, list[str]], rtk_stats: dict | None):
    """Each named path of each op on ``workload``, forced, interleaved call by call; with the RTK ratio of the
    same run (CPU seconds) where RTK ran."""
    simd = cpu_flags()
    sino = projector.project(volume)
    ops = {"forward": lambda: projector.project(volume), "back": lambda: projector.backproject(sino)}
    for op, wanted in names.items():
        if not wanted:
            continue
        stats, _ = interleaved({n: forced_path(op, n, ops[op]) for n in wanted}, repeats)
        for n in wanted:
            extra = {}
            peer = (rtk_stats or {}).get(op)
            if peer is not None:
                extra = {"rtk_ratio_cpu_s": rounded(peer["cpu_s"] / stats[n]["cpu_s"]),
                         "rtk_ratio_median": rounded(peer["median_s"] / stats[n]["median_s"])}
            emit(workload=workload, op=op, impl=f"ctbench-cpu path={n}", path=n, threads=torch.get_num_threads(),
                 dtype=str(volume.dtype).replace("torch.", ""), simd=simd, **timing_fields(stats[n]),
                 **throughput(stats[n], samples, volume.element_size(), op, bandwidth), **extra,
                 **path_note(n, simd), timing="paths interleaved call by call (CTBENCH_CPU_PATH)")


# ------------------------------------------------------------------ main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines file to append to (default: %(default)s)")
    p.add_argument("--no-out", action="store_true", help="print only, write no file")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per op and implementation, interleaved "
                   "call by call after a warm-up (min and median are reported)")
    p.add_argument("--skip-1thread", action="store_true", help="skip the 1-thread rows")
    p.add_argument("--diffct-repeats", type=int, default=1, help="timed diffct calls per op (no warm-up)")
    p.add_argument("--threads", type=int, default=None, help="threads for ctbench, RTK and torch (default: torch's)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink W1 (volume and detector) for quick runs")
    p.add_argument("--skip-rtk", action="store_true")
    p.add_argument("--skip-diffct", action="store_true")
    p.add_argument("--skip-2d", action="store_true", help="skip the 2D section (ctbench 2D and ASTRA)")
    p.add_argument("--skip-astra", action="store_true")
    p.add_argument("--size-2d", type=int, default=512)
    p.add_argument("--views-2d", type=int, default=720)
    p.add_argument("--det-2d", type=int, default=768)
    p.add_argument("--bandwidth-mib", type=int, default=512, help="array size of the DRAM streaming loop")
    p.add_argument("--flat-cost", action="store_true", help="only the flat-cost sweep: forward and back rates "
                   "over N^3 volumes (--flat-sizes), sizes, ops and threads interleaved call by call, then exit")
    p.add_argument("--flat-sizes", type=str, default=",".join(map(str, FLAT_SIZES)),
                   help="comma-separated N of the flat-cost sweep (default: %(default)s)")
    p.add_argument("--flat-ops", type=str, default=",".join(FLAT_OPS),
                   help="comma-separated ops of the flat-cost sweep: forward, back (default: %(default)s)")
    p.add_argument("--flat-threads", type=str, default=None,
                   help="comma-separated thread counts of the flat-cost sweep (default: all threads and 1, "
                        "or all threads only with --skip-1thread)")
    p.add_argument("--all-paths", action="store_true", help="time every forward and back path on W1 (forced "
                   "by CTBENCH_CPU_PATH); by default only the AVX2 forward paths on an AVX-512 CPU")
    p.add_argument("--skip-paths", action="store_true", help="skip the forced-path rows")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    if args.flat_cost:  # a bench of its own (own file and README table): never replaces the latest W1 run
        counts = args.flat_threads or ",".join(map(str, [threads] + ([1] if threads > 1 and not args.skip_1thread
                                                                     else [])))
        out = ["--no-out"] if args.no_out else ["--out", str(bench_flat_cost.DEFAULT_OUT if args.out == DEFAULT_OUT
                                                             else args.out)]
        return bench_flat_cost.main([*out, "--repeats", str(args.repeats), "--sizes", args.flat_sizes,
                                     "--ops", args.flat_ops, "--threads", counts,
                                     "--bandwidth-mib", str(args.bandwidth_mib)])
    run_id = new_run_id()
    emit = Emitter(None if args.no_out else args.out, run_id, BENCH)
    emit(kind="header", time=run_id, machine=machine_info(), args={k: str(v) for k, v in vars(args).items()},
         counting="samples = ray/plane samples whose bilinear stencil touches the volume (dominant-axis planes, "
                  "float64 from the geometry); forward touches 4 voxels/sample, back reads+writes 4",
         kernel_paths=kernel_paths())

    torch.manual_seed(0)
    projector = w1_projector("cpu", scale=args.scale)
    workload = "W1" if args.scale == 1.0 else f"W1@{args.scale:g}"
    volume = smooth_volume(projector.volume_shape, W1["dtype"])
    vol_bytes = volume.numel() * volume.element_size()
    bandwidth = {"dram": stream_bandwidth(args.bandwidth_mib << 20), "volume_sized": stream_bandwidth(vol_bytes)}
    for name, bw in bandwidth.items():
        emit(op="memory_bandwidth", impl=f"torch-copy-{name}", threads=threads, array_bytes=bw["array_bytes"],
             seconds=rounded(bw["seconds"]), gb_per_s=rounded(bw["gb_per_s"]),
             note="dst.copy_(src), float32, counted as read+write")

    samples = ray_plane_samples(projector)
    thread_counts = [threads] + ([1] if threads > 1 and not args.skip_1thread else [])
    ct = None
    known = kernel_paths()["known"]
    if args.all_paths:
        path_names = known
    else:  # the AVX2 lanes of an AVX-512 build (the AVX-512 and measured paths run in the main rows)
        path_names = {"forward": [n for n in known["forward"] if n.startswith("avx2") and "avx512f" in cpu_flags()]}
    for t in thread_counts:
        wl = workload if t == threads else f"{workload} 1-thread"
        stats, outs = run_w1(emit, projector, volume, wl, args.repeats, t, samples, bandwidth, not args.skip_rtk)
        if ct is None:
            ct = {op: (stats[op]["ctbench-cpu"], outs[op]) for op in outs}
        if not args.skip_paths:
            run_paths(emit, projector, volume, wl, args.repeats, samples, bandwidth, path_names,
                      {op: st.get("rtk") for op, st in stats.items()})
    torch.set_num_threads(threads)
    s_ct = {op: v[0] for op, v in ct.items()}

    if not args.skip_diffct:
        try:
            times = run_diffct(emit, projector, volume, ct, workload, args.diffct_repeats, samples, bandwidth)
            for op in ("forward", "back"):
                emit_ratio(emit, workload, op, "diffct", times.get(op), s_ct.get(op))
        except Exception as e:
            traceback.print_exc()
            emit(workload=workload, impl="diffct-torch", skipped="error", error=repr(e))

    if not args.skip_2d:
        for kind in ("parallel", "fan"):
            p2 = projector_2d(kind, args.size_2d, args.views_2d, args.det_2d)
            wl = f"2D-{kind}-{args.size_2d}"
            vol2 = smooth_volume(p2.volume_shape)
            s2 = ray_plane_samples(p2)
            ct2 = run_ctbench(emit, p2, vol2, wl, args.repeats, bandwidth, s2)
            if args.skip_astra:
                continue
            try:
                astra_t = run_astra(emit, p2, kind, vol2, ct2, wl, args.repeats, s2, bandwidth)
            except Exception as e:
                traceback.print_exc()
                emit(workload=wl, impl="astra", skipped="error", error=repr(e))
                continue
            for (impl, op), st in astra_t.items():
                emit_ratio(emit, wl, op, impl, st, ct2[op][0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
