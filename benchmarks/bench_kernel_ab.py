"""Old kernels against new: a git revision's CPU Joseph kernels against the checkout's, in one process.

Both builds are compiled with the same flags through the same cache code and called through the same
Python path (harness.revision_library and harness.with_cpu_library), alternating call by call (old,
new, old, ...) after one warm-up call each, so that the load of a shared machine hits both alike.
Each build runs its own default path (``CTBENCH_CPU_PATH`` unset) unless ``--forward-path`` /
``--back-path`` force one in both.  Cases:

- W1 (benchmarks/workloads.py) forward, back and the geometry VJP at ``--threads`` (default 1 and all);
- the flat-cost sizes ``--sizes`` (default N = 64 .. 320: N^3 volumes, N x N detectors, W1's 180
  views) forward and back at ``--flat-threads`` (default 1).

Per case: min and median wall and CPU seconds of each build, the new/old ratio of the CPU-s medians
(< 1: the new build faster), the rate in ray samples per CPU-second, and whether the outputs are
bitwise the same.  ``--quick``: W1 at 1 thread and N = 64, 128, 5 calls (a check that it runs).
Output: JSON lines (bench ``kernel_ab``) on stdout, appended to ``--out`` if given.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import ctbench  # noqa: F401  before torch, as the GUI and the CLI load it: its OpenMP defaults (ctbench/openmp_env.py)
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (Emitter, forced_path, interleaved, kernels_revision, machine_info, new_run_id,  # noqa: E402
                     parse_list, revision_library, rounded, threaded, with_cpu_library)
from projector_measures import ray_plane_samples, smooth_volume  # noqa: E402
from workloads import W1, w1_projector  # noqa: E402

BENCH = "kernel_ab"
FLAT_SIZES = (64, 128, 192, 256, 320)


def _builds(rev: str, tmp: Path) -> dict:
    """{family: {"old": lib, "new": lib}} for the Joseph projector and its geometry VJP."""
    from ctbench.engine.cpu import library
    return {f: {"old": revision_library(rev, f, tmp), "new": library.load_cpu_library(f)}
            for f in ("joseph", "joseph_grad")}


def _forcing(args, op: str, fn):
    name = {"forward": args.forward_path, "back": args.back_path}.get(op)
    return forced_path(op, name, fn) if name else fn


def _case(emit, name: str, fns: dict, family_libs: dict, family: str, repeats: int, samples: int | None, **extra):
    calls = {b: with_cpu_library(family_libs[family][b], fns, family) for b in ("old", "new")}
    stats, outs = interleaved(calls, repeats)
    o, n = outs["old"], outs["new"]
    same = all(torch.equal(a, b) for a, b in zip(o, n)) if isinstance(o, tuple) else torch.equal(o, n)
    if isinstance(o, tuple):
        scale = max(float(x.abs().max()) for x in o) or 1.0
        diff = max(float((a - b).abs().max()) for a, b in zip(o, n)) / scale
    else:
        diff = float((o - n).abs().max()) / (float(o.abs().max()) or 1.0)
    line = {b: {"min_s": rounded(s["seconds"]), "median_s": rounded(s["median_s"]),
                "cpu_min_s": rounded(s["cpu_min_s"]), "cpu_median_s": rounded(s["cpu_median_s"]),
                "cpu_times": s["cpu_times"]} for b, s in stats.items()}
    ratio = stats["new"]["cpu_median_s"] / stats["old"]["cpu_median_s"]
    rates = {}
    if samples:
        rates = {f"samples_per_cpu_s_{b}": rounded(samples / stats[b]["cpu_median_s"]) for b in ("old", "new")}
    return emit(case=name, **extra, **line, new_over_old_cpu_median=rounded(ratio),
                new_over_old_cpu_min=rounded(stats["new"]["cpu_min_s"] / stats["old"]["cpu_min_s"]),
                bitwise_same=bool(same), max_rel_diff=rounded(diff), n_calls=repeats, **rates,
                timing="old and new alternated call by call, one warm-up each")


def run(emit, args, libs) -> list[dict]:
    lines = []
    threads_all = torch.get_num_threads()
    P = w1_projector("cpu", scale=args.scale)
    vol = smooth_volume(P.volume_shape, W1["dtype"])
    sino = P.project(vol)
    samples = ray_plane_samples(P)["samples"]
    ex = P._executor(torch.device("cpu"))
    rays = P._rays(None, vol.dtype, torch.device("cpu"))
    cot = torch.randn_like(sino)[None]
    w1 = "W1" if args.scale == 1.0 else f"W1@{args.scale:g}"
    for t in args.threads:
        cases = {"forward": (lambda: P.project(vol), "joseph"), "back": (lambda: P.backproject(sino), "joseph"),
                 "vjp": (lambda: ex.geometry_vjp(vol[None], 0, cot, rays), "joseph_grad")}
        for op in args.ops:
            fn, family = cases[op]
            lines.append(_case(emit, f"{w1} {op} {t}-thread", threaded(t, _forcing(args, op, fn)), libs, family,
                               args.repeats, samples if op != "vjp" else None, workload=w1, op=op, threads=t))
    for n in args.sizes:
        Pn = w1_projector("cpu", scale=n / W1["volume_shape"][0])
        vn = smooth_volume(Pn.volume_shape, W1["dtype"])
        sn = Pn.project(vn)
        cnt = ray_plane_samples(Pn)["samples"]
        for t in args.flat_threads:
            for op, fn in (("forward", lambda: Pn.project(vn)), ("back", lambda: Pn.backproject(sn))):
                if op not in args.ops:
                    continue
                lines.append(_case(emit, f"flat N={n} {op} {t}-thread", threaded(t, _forcing(args, op, fn)), libs,
                                   "joseph", args.flat_repeats, cnt, workload=f"flat N={n}", N=n, op=op, threads=t))
    torch.set_num_threads(threads_all)
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", default="main", help="git revision of the old kernels (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="JSON lines file to append to (default: print only)")
    p.add_argument("--repeats", type=int, default=8, help="timed calls per build on W1 (>= 8 for a claim)")
    p.add_argument("--flat-repeats", type=int, default=8, help="timed calls per build and size")
    p.add_argument("--threads", type=str, default=None, help="W1 thread counts (default: 1 and all)")
    p.add_argument("--flat-threads", type=str, default="1", help="flat-cost thread counts (default: 1)")
    p.add_argument("--sizes", type=str, default=",".join(map(str, FLAT_SIZES)), help="flat-cost N (0: none)")
    p.add_argument("--ops", type=str, default="forward,back,vjp", help="of forward, back, vjp")
    p.add_argument("--scale", type=float, default=1.0, help="shrink W1 for a quick run")
    p.add_argument("--forward-path", default=None, help="force this forward path in both builds")
    p.add_argument("--back-path", default=None, help="force this back path in both builds")
    p.add_argument("--quick", action="store_true", help="W1 at 1 thread, N = 64 and 128, 5 calls")
    args = p.parse_args(argv)
    every = torch.get_num_threads()
    args.threads = parse_list(args.threads, "--threads", int) if args.threads else sorted({1, every})
    args.flat_threads = parse_list(args.flat_threads, "--flat-threads", int)
    args.sizes = [] if args.sizes.strip() == "0" else parse_list(args.sizes, "--sizes", int)
    args.ops = parse_list(args.ops, "--ops", str, ("forward", "back", "vjp"))
    if args.quick:
        args.threads, args.sizes, args.repeats, args.flat_repeats = [1], [64, 128], 5, 5
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    run_id = new_run_id()
    emit = Emitter(args.out, run_id, BENCH)
    emit(kind="header", time=run_id, machine=machine_info(), baseline=args.baseline, kernels=kernels_revision(),
         args={k: str(v) for k, v in vars(args).items()},
         note="shared machine: CPU-s medians are the steadier figure; old and new alternated call by call")
    with tempfile.TemporaryDirectory() as tmp:
        libs = _builds(args.baseline, Path(tmp))
        run(emit, args, libs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
