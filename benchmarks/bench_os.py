"""Ordered-subsets benchmark (issue 15): quality reached per second, OS-SIRT / OS-TV against SIRT and CGLS.

Cases:

- ``phantom``: the napari sample scan (64^3 modified Shepp-Logan of 1 mm
  voxels times 0.02/mm; circular cone beam, 120 views, SID 200, SDD 400, 96x96
  detector of 1.5 mm pixels; noiseless Joseph projections).  Reference:
  SIRT-50 (non-negative), its RMSE against the phantom and its wall time.
  Goal: OS-SIRT reaches that RMSE in at most a quarter of SIRT-50's time.
- ``htc2022``: the bundled HTC2022 "ta" full scan (721 views, 512^2).
  Reference: CGLS-20, its time; quality = the median of the acrylic centre
  (3 mm disc) against the organisers' 0.0281/mm.  Goal: OS-SIRT within 2% of
  it in at most a quarter of CGLS-20's time.

Timing.  The machine is shared, so the reference and the OS run alternate
(reference, OS, reference, OS, ...: ``--repeats`` rounds) and min and median
are reported.  An OS run records, after every pass, the elapsed time and the
quality (the callback's quality evaluation is excluded from the time); the
time to the goal is the elapsed time at the first pass that meets it,
including the set-up of the subset weights.  Output: JSON lines on stdout,
appended to ``--out``: a header (machine, cores, caches, load), one line per
(case, impl) with ``seconds`` (min), ``median_s``, per-pass history and
``seconds_per_iteration``, and ratio lines ``reference time / OS time to goal``
(target >= 4).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Emitter as _ProjectorEmitter, machine_info  # noqa: E402

from ctbench import Projector, circular_trajectory_3d  # noqa: E402
from ctbench.phantoms import shepp_logan_3d  # noqa: E402
from ctbench.solvers import cgls, os_sirt, os_tv_reconstruction, sirt  # noqa: E402

BENCH = "os"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_os.jsonl"
TARGET = 4.0  # reference time / OS time to the reference's quality


def _r(x, digits=4):
    return float(f"{x:.{digits}g}") if x is not None and math.isfinite(x) else x


class _Clock:
    """Wall time of a solver run without the time its callback spends measuring quality."""

    def __init__(self, quality):
        self.quality = quality
        self.t0 = time.perf_counter()
        self.paused = 0.0
        self.history = []

    def __call__(self, state):
        t = time.perf_counter() - self.t0 - self.paused
        q0 = time.perf_counter()
        self.history.append((state.iteration, t, self.quality(state.volume)))
        self.paused += time.perf_counter() - q0


def _time_to(history, ok):
    for it, t, q in history:
        if ok(q):
            return it, t
    return None, None


def phantom_case():
    traj = circular_trajectory_3d(120, 200.0, 400.0)
    P = Projector(traj, (64, 64, 64), (96, 96), voxel_spacing=1.0, detector_spacing=1.5, backend="cpu")
    x = shepp_logan_3d((64, 64, 64), 1.0, modified=True) * 0.02
    return P, P.project(x), x


def run_phantom(emit, repeats: int, n_subsets: int, passes: int):
    P, b, x = phantom_case()

    def rmse(v):
        return float((v - x).square().mean().sqrt())

    ref_t, ref_q, os_runs = [], None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ref = sirt(P, b, 50, bounds=(0.0, None))
        ref_t.append(time.perf_counter() - t0)
        ref_q = rmse(ref.volume)
        clock = _Clock(rmse)
        os_sirt(P, b, passes, n_subsets=n_subsets, bounds=(0.0, None), callback=clock)
        os_runs.append(clock.history)
    _emit_case(emit, "phantom-64-120v", "sirt-50", ref_t, {"rmse": _r(ref_q, 5)}, os_runs,
               f"os-sirt-{n_subsets}", "rmse", lambda q: q <= ref_q, ref_iters=50)
    # OS-TV on the same data, one run: quality per pass for the record
    clock = _Clock(rmse)
    os_tv_reconstruction(P, b, passes, n_subsets=n_subsets, lam=1e-5, callback=clock)
    emit(workload="phantom-64-120v", op="reconstruct", impl=f"os-tv-{n_subsets}", seconds=_r(clock.history[-1][1]),
         seconds_per_iteration=_r(clock.history[-1][1] / len(clock.history)),
         history=[{"iteration": i, "seconds": _r(t), "rmse": _r(q, 5)} for i, t, q in clock.history],
         note="one run, lam=1e-5; not part of the goal")


def run_htc(emit, repeats: int, n_subsets: int, passes: int):
    from ctbench.datasets import HTC2022_ATTENUATION, htc2022_disc_mask, load_htc2022

    full = load_htc2022("full")
    P, b = full.projector(), full.sinogram
    centre = htc2022_disc_mask(radius_mm=3.0)

    def value(v):
        return float(v[centre].median())

    def ok(q):
        return abs(q - HTC2022_ATTENUATION) <= 0.02 * HTC2022_ATTENUATION

    ref_t, ref_q, os_runs = [], None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ref = cgls(P, b, 20)
        ref_t.append(time.perf_counter() - t0)
        ref_q = value(ref.volume)
        clock = _Clock(value)
        os_sirt(P, b, passes, n_subsets=n_subsets, bounds=(0.0, None), callback=clock)
        os_runs.append(clock.history)
    _emit_case(emit, "htc2022-ta-full", "cgls-20", ref_t, {"acrylic_centre": _r(ref_q, 5),
                                                           "acrylic_expected": HTC2022_ATTENUATION},
               os_runs, f"os-sirt-{n_subsets}", "acrylic_centre", ok, ref_iters=20)


def _emit_case(emit, workload, ref_name, ref_t, ref_quality, os_runs, os_name, qname, ok, ref_iters):
    emit(workload=workload, op="reconstruct", impl=ref_name, seconds=_r(min(ref_t)),
         median_s=_r(statistics.median(ref_t)), times=[_r(t) for t in ref_t],
         seconds_per_iteration=_r(statistics.median(ref_t) / ref_iters), **ref_quality)
    reach = [_time_to(h, ok) for h in os_runs]
    times = [t for _, t in reach if t is not None]
    last = os_runs[-1]
    per_pass = [b[1] - a[1] for a, b in zip(last, last[1:])]
    line = dict(workload=workload, op="reconstruct", impl=os_name,
                passes_to_goal=[i for i, _ in reach], times=[_r(t) for t in times],
                seconds_per_iteration=_r(statistics.median(per_pass)) if per_pass else None,
                history=[{"iteration": i, "seconds": _r(t), qname: _r(q, 5)} for i, t, q in last],
                goal=f"{qname} of {ref_name}" if qname == "rmse" else "acrylic centre within 2%")
    if times:
        line.update(seconds=_r(min(times)), median_s=_r(statistics.median(times)))
    else:
        line.update(seconds=None, reached="no")
    emit(**line)
    if times:
        value = min(ref_t) / min(times)
        med = statistics.median(ref_t) / statistics.median(times)
        emit(workload=workload, op="reconstruct", ratio=f"{ref_name}/{os_name}", value=_r(value),
             value_median=_r(med), target=TARGET, meets_target=bool(med >= TARGET),
             note="reference wall time / OS wall time to the reference's quality (runs alternated)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-out", action="store_true")
    p.add_argument("--repeats", type=int, default=2, help="alternating (reference, OS) rounds per case")
    p.add_argument("--subsets-phantom", type=int, default=15)
    p.add_argument("--subsets-htc", type=int, default=16)
    p.add_argument("--passes", type=int, default=6)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--skip-htc", action="store_true")
    p.add_argument("--skip-phantom", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    emit = _ProjectorEmitter(None if args.no_out else args.out, run_id, bench=BENCH)
    emit(kind="header", time=run_id, machine=machine_info(), args={k: str(v) for k, v in vars(args).items()})
    if not args.skip_phantom:
        run_phantom(emit, args.repeats, args.subsets_phantom, args.passes)
    if not args.skip_htc:
        run_htc(emit, args.repeats, args.subsets_htc, args.passes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
