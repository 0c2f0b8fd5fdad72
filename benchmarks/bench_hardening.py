"""Hardening benchmark (issue 10): what the safety checks cost on W1.

Workload W1 (benchmarks/workloads.py): circular cone beam, 128^3 volume of 2 mm
voxels, 180 views, 128x128 detector of 4 mm pixels, float32, ``backend="cpu"``.

1. ``ray_setup``: the CPU Joseph forward and backprojection with today's
   kernels (double-precision ray set-up, non-finite guards) against the
   kernels of a baseline git revision (``--baseline``, default the commit
   before the change), both compiled with the same flags through the same
   cache code and called through the same Python path; calls alternate
   (baseline, current, baseline, ...) so drifting load hits both alike.
2. ``call_check``: ``Projector.project`` / ``backproject`` with the call-time
   NaN/inf check of the held trajectory against the same calls with the check
   switched off, interleaved; plus the check alone.

Every figure is min and median over ``--repeat`` timed calls after a warm-up.
The machine may be shared and noisy: the header records the load average.
Output: JSON lines on stdout, appended to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (Emitter, interleaved_summary, kernels_revision, machine_info, revision_kernels,  # noqa: E402
                     with_cpu_library)
from workloads import w1_projector  # noqa: E402

from ctbench.engine.cpu import library as cpu_library  # noqa: E402
from ctbench.geometry.trajectory import check_finite  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_hardening.jsonl"
DEFAULT_BASELINE = "15c5a91"  # main before issue 10's kernel change


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of the baseline kernels")
    ap.add_argument("--scale", type=float, default=1.0, help="W1 scale (<1 for a quick run)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--sections", default="ray_setup,call_check", help="comma-separated sections to run")
    args = ap.parse_args(argv)
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    emit = Emitter(args.out, run_id, bench="hardening")
    emit(kind="header", machine=machine_info(), workload="W1", scale=args.scale, repeat=args.repeat,
         baseline=args.baseline, kernels=kernels_revision(),
         note="shared machine: figures are noisy; calls interleaved")

    P = w1_projector("cpu", scale=args.scale)
    vol = torch.rand(P.volume_shape, dtype=torch.float32)
    sino = P.project(vol)

    sections = set(args.sections.split(","))
    # 1. ray set-up: baseline kernels vs current, same Python path
    if "ray_setup" in sections:
        ray_setup(P, vol, sino, args, emit)
    if "call_check" in sections:
        call_check(P, vol, sino, args, emit)
    return 0


def ray_setup(P, vol, sino, args, emit) -> None:
    current = cpu_library.load_cpu_library("joseph")
    with tempfile.TemporaryDirectory() as tmp:
        src = revision_kernels(args.baseline, Path(tmp) / "kernels")
        base = cpu_library.load_library("joseph", src, cpu_library.cache_dir())

    for op, fn in (("forward", lambda: P.project(vol)), ("backproject", lambda: P.backproject(sino))):
        res = interleaved_summary({"baseline": with_cpu_library(base, fn), "current": with_cpu_library(current, fn)},
                                  args.repeat)
        c, b = res["current"], res["baseline"]
        emit(kind="ray_setup", op=op, **res, median_ratio=round(c["median_s"] / b["median_s"], 4),
             min_ratio=round(c["min_s"] / b["min_s"], 4),
             cpu_median_ratio=round(c["cpu_median_s"] / b["cpu_median_s"], 4),
             cpu_min_ratio=round(c["cpu_min_s"] / b["cpu_min_s"], 4))


def call_check(P, vol, sino, args, emit) -> None:
    """The call-time check of the held trajectory: on against off, and alone."""
    def unchecked(fn):
        def call():
            P._check_current_geometry = lambda: None  # instance attribute shadows the method
            try:
                return fn()
            finally:
                del P._check_current_geometry
        return call

    for op, fn in (("forward", lambda: P.project(vol)), ("backproject", lambda: P.backproject(sino))):
        res = interleaved_summary({"unchecked": unchecked(fn), "checked": fn}, args.repeat)
        emit(kind="call_check", op=op, **res,
             median_ratio=round(res["checked"]["median_s"] / res["unchecked"]["median_s"], 4))
    ts = P.trajectory.tensors()
    check = interleaved_summary({"check_finite": lambda: check_finite(ts)}, max(args.repeat, 200))
    emit(kind="call_check", op="check_only", n_views=P.n_views, **check)


if __name__ == "__main__":
    sys.exit(main())
