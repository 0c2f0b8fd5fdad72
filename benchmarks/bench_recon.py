"""Reconstruction benchmark (issue 3): ctbench's FDK against RTK's, same projections, same run.

Case (RTK's own FDK test, rtkfdktest.cxx, without its source offsets): the
original Kak-Slaney 3D Shepp-Logan head scaled to 116 mm (RTK's
``PhantomScale(116)``), a 128^3 grid of 2 mm voxels centred on the origin,
180 views over 360 degrees, a centred 128x128 detector of 4 mm pixels,
SID 600 mm, SDD 1200 mm, float32.

Apples to apples:

- RTK rotates about its y axis (source at ``(SID sin a, 0, SID cos a)``,
  detector u ``(cos a, 0, -sin a)``, v = +y); ctbench rotates about z.  The
  rotation ``(X, Y, Z)_rtk = (x, z, -y)`` maps ctbench's orbit (diffct's
  frame, docs/GEOMETRY.md) at angle t onto RTK's at gantry angle t + 180 deg,
  with RTK's detector x along -u, so projections are handed over reversed
  along u (checked here on the source and corner-pixel positions of every
  view: ``geometry_max_dev_mm``, peers_rtk.py's check).
- RTK's ``SheppLoganPhantom`` is the Kak-Slaney table with its y and z
  swapped; through that map it is ctbench's Kak-Slaney phantom mirrored in y.
  The phantom used here is built from ctbench's table mirrored in y, and its
  voxelisation is checked against RTK's ``DrawSheppLoganFilter`` output
  (``phantom_max_diff_vs_rtk``).
- Both reconstruct from the *same* projections: ctbench's exact analytic line
  integrals (``ctbench.phantoms``), handed to RTK as an itk image.
- Errors are RTK's ``CheckImageQuality``: the reconstruction with voxels
  outside RTK's ``FieldOfViewImageFilter`` set to zero, against the phantom
  sampled at voxel centres; MAE = mean |difference| over all voxels, PSNR =
  20 log10(2) - 10 log10(MSE).  The same mask is applied to both.
- Times: RTK and every ctbench setting are called in turn, call by call, in
  one process (``--repeats`` rounds after a warm-up round), so a loaded
  machine slows all of them alike; the minimum and the median of the wall
  clock and of the CPU seconds are reported, at each of ``--threads`` (default
  1 and 2) for both libraries (RTK with ITK's Pool threader, its fastest here;
  ``--rtk-threader``).  ``--paths`` adds ctbench with each cpu FDK path forced
  (``CTBENCH_CPU_PATH=fdk=NAME``).  Every line carries the CPU model and its
  SIMD flags.

A second case runs a short scan (180 degrees + fan angle, same angular step)
with Parker weights in both libraries.  A third times the recon pipeline
(``ctbench recon``'s ``run_recon``) end to end with FDK on a simulated lab
scan of 240 views of 160x120 pixels into a 120x160x160 volume.

Output: JSON lines on stdout, appended to ``--out``.  RTK is optional: if
``itk`` cannot be imported its lines become ``{"impl": "rtk", "skipped": ...}``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Emitter as _ProjectorEmitter, cpu_flags, cpu_model, machine_info  # noqa: E402
from harness import interleaved as timed_in_turn  # noqa: E402
from peers_rtk import rtk_fdk  # noqa: E402

from ctbench import Projector, circular_trajectory_3d  # noqa: E402
from ctbench.phantoms import Ellipsoid, ellipsoid_phantom, ellipsoid_projections, shepp_logan_ellipsoids
from ctbench.solvers import fdk

BENCH = "recon"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_recon.jsonl"
CASE = dict(n=128, voxel=2.0, n_views=180, det=128, pixel=4.0, sid=600.0, sdd=1200.0, scale=116.0)
TARGETS = {"speedup_vs_rtk": 4.0}  # issue 24: FDK >= 4x RTK's on W1 with equal accuracy


# ------------------------------------------------------------------ output
def Emitter(out: Path | None, run_id: str):
    """JSON lines tagged with this bench's name, the CPU model and its SIMD flags (the projector
    benchmark's emitter)."""
    plain = _ProjectorEmitter(out, run_id, bench=BENCH)
    cpu = {"cpu": cpu_model(), "simd": cpu_flags()}

    def emit(**fields):
        return plain(**fields, **cpu)
    return emit


def _r(x, digits=5):
    return float(f"{x:.{digits}g}") if x is not None and math.isfinite(x) else x


def interleaved(fns: dict, repeats: int) -> tuple[dict, dict]:
    """harness.interleaved's calls (one warm-up round, then ``repeats`` rounds), reported as this bench's
    lines have it: ({name: {seconds (min), median_s, cpu_s (min), median_cpu_s, times}}, {name: last output})."""
    stats, outs = timed_in_turn(fns, repeats)
    return {name: {"seconds": _r(st["seconds"]), "median_s": _r(st["median_s"]), "cpu_s": _r(st["cpu_min_s"]),
                   "median_cpu_s": _r(st["cpu_median_s"]), "times": [_r(t) for t in st["times"]]}
            for name, st in stats.items()}, outs


class forced_fdk_path:
    """``CTBENCH_CPU_PATH=fdk=NAME`` for the duration of a call (None: the default path)."""

    def __init__(self, name):
        self.name = name

    def __call__(self, fn):
        def run():
            old = os.environ.get("CTBENCH_CPU_PATH")
            if self.name is not None:
                os.environ["CTBENCH_CPU_PATH"] = f"fdk={self.name}"
            try:
                return fn()
            finally:
                if self.name is not None:
                    if old is None:
                        os.environ.pop("CTBENCH_CPU_PATH", None)
                    else:
                        os.environ["CTBENCH_CPU_PATH"] = old
        return run


# ------------------------------------------------------------------ the case
def mirrored_y(e: Ellipsoid) -> Ellipsoid:
    """The mirror image of an ellipsoid in the plane y = 0 (flipping the local y axis keeps it a rotation)."""
    R = [list(r) for r in e.rotation]
    # S R D with S = D = diag(1, -1, 1): negate row 1 and column 1.
    M = [[R[i][j] * (-1 if i == 1 else 1) * (-1 if j == 1 else 1) for j in range(3)] for i in range(3)]
    cx, cy, cz = e.center
    return Ellipsoid(e.intensity, e.semi_axes, (cx, -cy, cz), tuple(tuple(r) for r in M))


def rtk_shepp_logan() -> list[Ellipsoid]:
    """RTK's SheppLoganPhantom expressed in ctbench's frame: Kak-Slaney mirrored in y."""
    return [mirrored_y(e) for e in shepp_logan_ellipsoids(modified=False)]


def build_case(angle_range: float = 2 * math.pi, n_views: int | None = None):
    c = CASE
    n_views = n_views or c["n_views"]
    traj = circular_trajectory_3d(n_views, c["sid"], c["sdd"], angle_range=angle_range)
    shape = (c["n"],) * 3
    projector = Projector(traj, shape, (c["det"], c["det"]), voxel_spacing=c["voxel"], detector_spacing=c["pixel"])
    ells = rtk_shepp_logan()
    sino = ellipsoid_projections(ells, traj, (c["det"], c["det"]), c["pixel"], scale=c["scale"]).float()
    truth = ellipsoid_phantom(ells, shape, c["voxel"], scale=c["scale"], dtype=torch.float64)
    return projector, traj, sino, truth


def quality(recon: torch.Tensor, truth: torch.Tensor, mask: torch.Tensor | None) -> dict:
    """RTK's CheckImageQuality: MAE per voxel and PSNR (peak 2.0) of the masked reconstruction."""
    r = recon.double()
    if mask is not None:
        r = torch.where(mask, r, torch.zeros_like(r))
    d = r - truth
    mse = float((d * d).mean())
    return {"mae": _r(float(d.abs().mean())), "psnr_db": _r(20 * math.log10(2.0) - 10 * math.log10(mse))}


# ------------------------------------------------------------------ RTK
class Rtk:
    """RTK's FDK on ctbench's geometry, with the axis map (X, Y, Z)_rtk = (x, z, -y)."""

    def __init__(self, threads: int, threader: str = "Pool"):
        import itk
        from itk import RTK as rtk

        self.itk, self.rtk = itk, rtk
        self.Image = itk.Image[itk.F, 3]
        # ITK's threaders differ a lot on a small machine (Pool was the fastest here, TBB
        # sometimes ran single-threaded): give RTK the one asked for, with our thread count.
        itk.MultiThreaderBase.SetGlobalDefaultThreader(itk.MultiThreaderBase.ThreaderTypeFromString(threader))
        itk.MultiThreaderBase.SetGlobalDefaultNumberOfThreads(threads)
        self.threader = itk.MultiThreaderBase.New().GetNameOfClass()

    def geometry(self, angles_rad):
        """RTK's gantry angle is ctbench's angle + 180 degrees under the axis map (see peers_rtk.py)."""
        g = self.rtk.ThreeDCircularProjectionGeometry.New()
        for a in angles_rad:
            g.AddProjection(CASE["sid"], CASE["sdd"], math.degrees(float(a)) + 180.0, 0.0, 0.0)
        return g

    @staticmethod
    def geometry_deviation(g, projector) -> float:
        """Max distance (mm) between RTK's and ctbench's sources and corner pixels, in RTK's frame."""
        from peers_rtk import rtk_geometry_deviation

        return rtk_geometry_deviation(g, projector)

    def volume_source(self, value: float = 0.0):
        n, sp = CASE["n"], CASE["voxel"]
        s = self.rtk.ConstantImageSource[self.Image].New()
        s.SetOrigin([-(n - 1) / 2 * sp] * 3)
        s.SetSpacing([sp] * 3)
        s.SetSize([n] * 3)
        s.SetConstant(value)
        s.Update()
        return s

    def projections(self, sino: torch.Tensor):
        """ctbench (n_views, U, V) -> RTK stack, numpy order (view, v, u); RTK's detector x is -u."""
        arr = np.ascontiguousarray(sino.flip(1).permute(0, 2, 1).numpy().astype(np.float32))
        img = self.itk.image_from_array(arr)
        d, p = CASE["det"], CASE["pixel"]
        img.SetOrigin([-(d - 1) / 2 * p, -(d - 1) / 2 * p, 0.0])
        img.SetSpacing([p, p, 1.0])
        return img

    def to_ctbench(self, img) -> torch.Tensor:
        """RTK volume (numpy order Z, Y, X) -> ctbench (z, y, x): z = Y, y = -Z, x = X."""
        a = np.asarray(self.itk.array_from_image(img), dtype=np.float64)
        return torch.from_numpy(np.ascontiguousarray(a.transpose(1, 0, 2)[:, ::-1, :]))

    def fdk(self, projections, geometry, short_scan: bool):
        src = self.volume_source()
        proj = projections
        if short_scan:
            parker = self.rtk.ParkerShortScanImageFilter[self.Image].New()
            parker.InPlaceOff()  # in place, it would consume the projections of the next call
            parker.SetInput(projections)
            parker.SetGeometry(geometry)
            parker.Update()
            proj = parker.GetOutput()
        return rtk_fdk(proj, geometry, src)

    def fov_mask(self, projections, geometry) -> torch.Tensor:
        ones = self.volume_source(1.0)
        fov = self.rtk.FieldOfViewImageFilter[self.Image, self.Image].New()
        fov.SetInput(0, ones.GetOutput())
        fov.SetProjectionsStack(projections)
        fov.SetGeometry(geometry)
        fov.Update()
        return self.to_ctbench(fov.GetOutput()) > 0.5

    def phantom(self) -> torch.Tensor:
        dsl = self.rtk.DrawSheppLoganFilter[self.Image, self.Image].New()
        dsl.SetInput(self.volume_source().GetOutput())
        dsl.SetPhantomScale(CASE["scale"])
        dsl.Update()
        return self.to_ctbench(dsl.GetOutput())


# ------------------------------------------------------------------ main
# ctbench settings measured: the defaults (the classical FDK, the same method as RTK's) and the
# band-limited 2x oversampling of the filtered rows with the Shepp-Logan window.
SETTINGS = {"default": {}, "shepp-logan+oversample2": {"filter": "shepp-logan", "oversample": 2}}


def run_case(emit, name: str, angle_range: float, n_views: int, args, threads: int):
    """One case at one thread count: RTK and the ctbench settings interleaved call by call."""
    torch.set_num_threads(threads)
    projector, traj, sino, truth = build_case(angle_range, n_views)
    short = angle_range < 2 * math.pi
    workload = f"{name}, {threads} thread{'s' if threads > 1 else ''}"
    emit(case=name, kind="case", workload=workload, threads=threads, **{**CASE, "n_views": n_views},
         angle_range_deg=_r(math.degrees(angle_range)), short_scan=short)
    rtk = mask = None
    fns, extra = {}, {}
    if not args.skip_rtk:
        try:
            rtk = Rtk(threads, args.rtk_threader)
        except Exception as e:  # noqa: BLE001 - the peer is optional
            emit(case=name, workload=workload, impl="rtk", skipped="itk-rtk not importable", error=repr(e))
    if rtk is not None:
        try:
            geo = rtk.geometry(traj.meta["angles"])
            mask = rtk.fov_mask(rtk.projections(sino), geo)
            proj = rtk.projections(sino)
            extra["rtk"] = dict(threader=rtk.threader, geometry_max_dev_mm=_r(rtk.geometry_deviation(geo, projector)),
                                phantom_max_diff_vs_rtk=_r(float((rtk.phantom() - truth).abs().max())),
                                fov_voxels=int(mask.sum()),
                                note="RTK FDK (ramp, no window" + (", Parker weights" if short else "")
                                     + ") + FieldOfViewImageFilter mask")
            fns["rtk"] = lambda: rtk.to_ctbench(rtk.fdk(proj, geo, short))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            emit(case=name, workload=workload, impl="rtk", skipped="error", error=repr(e))
            rtk = None
    settings = {s: (kw, None) for s, kw in SETTINGS.items()}
    if args.paths:
        from ctbench.engine.fdk_kernels import fdk_paths
        settings.update({f"default, path {p}": ({}, p) for p in fdk_paths(torch.float32)})
    for setting, (kw, path) in settings.items():
        fns[setting] = forced_fdk_path(path)(lambda kw=kw: fdk(projector, sino, **kw))
    stats, outs = interleaved(fns, args.repeats)
    q_rtk = None
    if "rtk" in stats:
        q_rtk = quality(outs["rtk"], truth, mask)
        emit(case=name, workload=workload, impl="rtk", op="fdk", threads=threads, **stats["rtk"], **q_rtk,
             **extra["rtk"])
    results = {}
    for setting, (kw, path) in settings.items():
        t_ct, recon = stats[setting], outs[setting]
        q_ct = quality(recon, truth, mask)
        results[setting] = (t_ct, q_ct)
        emit(case=name, workload=workload, impl="ctbench", op="fdk", setting=setting, options=kw, fdk_path=path,
             threads=threads, **t_ct, **q_ct, unmasked=quality(recon, truth, None),
             note="RTK's field-of-view mask" if mask is not None else "no RTK: unmasked errors")
        if q_rtk is not None:
            t_rtk = stats["rtk"]
            speed = t_rtk["seconds"] / t_ct["seconds"]
            emit(case=name, workload=workload, op="fdk", setting=setting, ratio="speedup_vs_rtk", value=_r(speed),
                 value_median=_r(t_rtk["median_s"] / t_ct["median_s"]),
                 value_cpu_s=_r(t_rtk["cpu_s"] / t_ct["cpu_s"]),
                 value_median_cpu_s=_r(t_rtk["median_cpu_s"] / t_ct["median_cpu_s"]),
                 target=TARGETS["speedup_vs_rtk"], meets_target=bool(speed >= TARGETS["speedup_vs_rtk"]),
                 accuracy_at_least_rtk=bool(q_ct["mae"] <= q_rtk["mae"] and q_ct["psnr_db"] >= q_rtk["psnr_db"]),
                 mae_ctbench_rtk=(q_ct["mae"], q_rtk["mae"]), psnr_db_ctbench_rtk=(q_ct["psnr_db"], q_rtk["psnr_db"]))
    return results


# The recon pipeline's FDK case: a simulated lab scan (ctbench.io.sample_scan) of 240 views of 160x120
# pixels; the default grid (the detector at the isocentre) is 120x160x160.
PIPELINE_SCAN = dict(n_views=240, detector_u=160, detector_v=120)


def run_pipeline(emit, args, threads: int):
    """``run_recon`` end to end (read, flat/dark, -log, centre, FDK) and the FDK inside it."""
    from ctbench.pipeline import parse_config, run_recon
    from ctbench.io.sample_scan import LabScanSpec, write_lab_scan

    torch.set_num_threads(threads)
    workload = f"pipeline fdk 240x160x120 -> 120x160x160, {threads} thread{'s' if threads > 1 else ''}"
    with tempfile.TemporaryDirectory(prefix="bench_recon_") as tmp:
        spec = LabScanSpec(**PIPELINE_SCAN)
        folder = write_lab_scan(Path(tmp) / "lab_scan", spec)
        cfg = parse_config({"input": {"path": str(folder)},
                            "geometry": {"detector_offset_u_mm": spec.offset_px * spec.pitch},
                            "algorithm": {"name": "fbp", "params": {}}})  # FDK for a cone-beam scan
        totals, cpus, fdks, shape = [], [], [], None
        for i in range(max(1, args.repeats) + 1):
            c0, t0 = time.process_time(), time.perf_counter()
            report = run_recon(cfg)
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
            if i:  # the first call warms up (kernel build, caches)
                totals.append(total)
                cpus.append(cpu)
                fdks.append(float(report["algorithm"]["elapsed_s"]))
            shape = list(report["volume"].shape)
    emit(workload=workload, impl="ctbench", op="pipeline-fdk", threads=threads, scan=PIPELINE_SCAN,
         volume_shape=shape, seconds=_r(min(totals)), median_s=_r(statistics.median(totals)),
         cpu_s=_r(min(cpus)), median_cpu_s=_r(statistics.median(cpus)),
         fdk_seconds=_r(min(fdks)), fdk_median_s=_r(statistics.median(fdks)), times=[_r(t) for t in totals],
         note="run_recon wall time (read, correct, centre, FDK); fdk_* is the reconstruction step alone")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines file to append to (default: %(default)s)")
    p.add_argument("--no-out", action="store_true", help="print only, write no file")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds after a warm-up (min and median reported)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts for ctbench and RTK "
                                                    "(default: %(default)s)")
    p.add_argument("--paths", action="store_true", help="also time ctbench with each cpu FDK path forced")
    p.add_argument("--skip-pipeline", action="store_true", help="skip the recon pipeline's FDK case")
    p.add_argument("--skip-rtk", action="store_true")
    p.add_argument("--rtk-threader", default="Pool", choices=("Pool", "TBB", "Platform"),
                   help="ITK threader for RTK (default: %(default)s, the fastest on the development machine)")
    p.add_argument("--skip-short-scan", action="store_true")
    return p.parse_args(argv)


def _thread_counts(text: str) -> list[int]:
    try:
        counts = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 for c in counts):
        raise SystemExit(f"--threads: expected comma-separated positive integers, got {text!r}")
    return counts


def main(argv=None) -> int:
    args = parse_args(argv)
    counts = _thread_counts(args.threads)
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    emit = Emitter(None if args.no_out else args.out, run_id)
    emit(kind="header", time=run_id, machine=machine_info(), args={k: str(v) for k, v in vars(args).items()})
    for threads in counts:
        full = run_case(emit, "shepp-logan-116-full", 2 * math.pi, CASE["n_views"], args, threads)
        if not args.skip_short_scan:
            # 180 degrees + fan angle, at the full scan's angular step
            fan = 2 * math.atan((CASE["det"] / 2 * CASE["pixel"]) / CASE["sdd"])
            step = 2 * math.pi / CASE["n_views"]
            n_short = int(math.ceil((math.pi + fan) / step))
            short = run_case(emit, "shepp-logan-116-short", n_short * step, n_short, args, threads)
            for setting in SETTINGS:
                gap = full[setting][1]["psnr_db"] - short[setting][1]["psnr_db"]
                emit(case="short-vs-full", threads=threads, setting=setting, ratio="psnr_loss_db", value=_r(gap),
                     target=1.0, meets_target=bool(gap <= 1.0))
        if not args.skip_pipeline:
            run_pipeline(emit, args, threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
