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
  view: ``geometry_max_dev_mm``, bench_projector.py's check).
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
- Times: best of ``--repeats`` wall-clock calls after a warm-up (the machine is
  shared), the same number of threads for both (RTK with ITK's Pool threader,
  its fastest here; ``--rtk-threader``); CPU seconds are reported too.

A second case runs a short scan (180 degrees + fan angle, same angular step)
with Parker weights in both libraries.

Output: JSON lines on stdout, appended to ``--out``.  RTK is optional: if
``itk`` cannot be imported its lines become ``{"impl": "rtk", "skipped": ...}``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_projector import Emitter as _ProjectorEmitter, machine_info  # noqa: E402  (shared bench plumbing)

from ctbench import Projector, circular_trajectory_3d  # noqa: E402
from ctbench.phantoms import Ellipsoid, ellipsoid_phantom, ellipsoid_projections, shepp_logan_ellipsoids
from ctbench.solvers import fdk

BENCH = "recon"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_recon.jsonl"
CASE = dict(n=128, voxel=2.0, n_views=180, det=128, pixel=4.0, sid=600.0, sdd=1200.0, scale=116.0)
TARGETS = {"speedup_vs_rtk": 1.5}


# ------------------------------------------------------------------ output
def Emitter(out: Path | None, run_id: str):
    """JSON lines tagged with this bench's name (the projector benchmark's emitter)."""
    return _ProjectorEmitter(out, run_id, bench=BENCH)


def _r(x, digits=5):
    return float(f"{x:.{digits}g}") if x is not None and math.isfinite(x) else x


def best_of(fn, repeats: int):
    """Warm-up call, then ``repeats`` timed calls; the fastest wall time with its CPU time."""
    out = fn()
    times, cpus = [], []
    for _ in range(max(1, repeats)):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    i = int(np.argmin(times))
    return {"seconds": _r(times[i]), "cpu_s": _r(cpus[i]), "times": [_r(t) for t in times]}, out


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
        """RTK's gantry angle is ctbench's angle + 180 degrees under the axis map (see bench_projector.py)."""
        g = self.rtk.ThreeDCircularProjectionGeometry.New()
        for a in angles_rad:
            g.AddProjection(CASE["sid"], CASE["sdd"], math.degrees(float(a)) + 180.0, 0.0, 0.0)
        return g

    @staticmethod
    def geometry_deviation(g, projector) -> float:
        """Max distance (mm) between RTK's and ctbench's sources and corner pixels, in RTK's frame."""
        from bench_projector import rtk_geometry_deviation

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
        f = self.rtk.FDKConeBeamReconstructionFilter[self.Image].New()
        f.SetInput(0, src.GetOutput())
        f.SetInput(1, proj)
        f.SetGeometry(geometry)
        f.Update()
        out = f.GetOutput()
        out.DisconnectPipeline()
        return out

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
    projector, traj, sino, truth = build_case(angle_range, n_views)
    short = angle_range < 2 * math.pi
    emit(case=name, kind="case", **{**CASE, "n_views": n_views}, angle_range_deg=_r(math.degrees(angle_range)),
         short_scan=short)
    rtk = mask = q_rtk = t_rtk = None
    if not args.skip_rtk:
        try:
            rtk = Rtk(threads, args.rtk_threader)
        except Exception as e:  # noqa: BLE001 - the peer is optional
            emit(case=name, impl="rtk", skipped="itk-rtk not importable", error=repr(e))
    if rtk is not None:
        try:
            geo = rtk.geometry(traj.meta["angles"])
            mask = rtk.fov_mask(rtk.projections(sino), geo)
            proj = rtk.projections(sino)
            phantom_diff = float((rtk.phantom() - truth).abs().max())
            t_rtk, rimg = best_of(lambda: rtk.fdk(proj, geo, short), args.repeats)
            q_rtk = quality(rtk.to_ctbench(rimg), truth, mask)
            emit(case=name, impl="rtk", op="fdk", threads=threads, threader=rtk.threader, **t_rtk, **q_rtk,
                 geometry_max_dev_mm=_r(rtk.geometry_deviation(geo, projector)), phantom_max_diff_vs_rtk=_r(phantom_diff),
                 fov_voxels=int(mask.sum()),
                 note="RTK FDK (ramp, no window" + (", Parker weights" if short else "")
                      + ") + FieldOfViewImageFilter mask")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            emit(case=name, impl="rtk", skipped="error", error=repr(e))
            rtk = None
    results = {}
    for setting, kw in SETTINGS.items():
        t_ct, recon = best_of(lambda: fdk(projector, sino, **kw), args.repeats)
        q_ct = quality(recon, truth, mask)
        results[setting] = (t_ct, q_ct)
        emit(case=name, impl="ctbench", op="fdk", setting=setting, options=kw, threads=threads, **t_ct, **q_ct,
             unmasked=quality(recon, truth, None),
             note="RTK's field-of-view mask" if mask is not None else "no RTK: unmasked errors")
        if q_rtk is not None:
            speed = t_rtk["seconds"] / t_ct["seconds"]
            emit(case=name, setting=setting, ratio="speedup_vs_rtk", value=_r(speed),
                 target=TARGETS["speedup_vs_rtk"], meets_target=bool(speed >= TARGETS["speedup_vs_rtk"]),
                 cpu_ratio=_r(t_rtk["cpu_s"] / t_ct["cpu_s"]),
                 accuracy_at_least_rtk=bool(q_ct["mae"] <= q_rtk["mae"] and q_ct["psnr_db"] >= q_rtk["psnr_db"]),
                 mae_ctbench_rtk=(q_ct["mae"], q_rtk["mae"]), psnr_db_ctbench_rtk=(q_ct["psnr_db"], q_rtk["psnr_db"]))
    return results


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines file to append to (default: %(default)s)")
    p.add_argument("--no-out", action="store_true", help="print only, write no file")
    p.add_argument("--repeats", type=int, default=3, help="timed calls (best is reported) after a warm-up")
    p.add_argument("--threads", type=int, default=None, help="threads for ctbench and RTK (default: torch's)")
    p.add_argument("--skip-rtk", action="store_true")
    p.add_argument("--rtk-threader", default="Pool", choices=("Pool", "TBB", "Platform"),
                   help="ITK threader for RTK (default: %(default)s, the fastest on the development machine)")
    p.add_argument("--skip-short-scan", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    emit = Emitter(None if args.no_out else args.out, run_id)
    emit(kind="header", time=run_id, machine=machine_info(), args={k: str(v) for k, v in vars(args).items()})
    full = run_case(emit, "shepp-logan-116-full", 2 * math.pi, CASE["n_views"], args, threads)
    if not args.skip_short_scan:
        # 180 degrees + fan angle, at the full scan's angular step
        fan = 2 * math.atan((CASE["det"] / 2 * CASE["pixel"]) / CASE["sdd"])
        step = 2 * math.pi / CASE["n_views"]
        n_short = int(math.ceil((math.pi + fan) / step))
        short = run_case(emit, "shepp-logan-116-short", n_short * step, n_short, args, threads)
        for setting in SETTINGS:
            gap = full[setting][1]["psnr_db"] - short[setting][1]["psnr_db"]
            emit(case="short-vs-full", setting=setting, ratio="psnr_loss_db", value=_r(gap), target=1.0,
                 meets_target=bool(gap <= 1.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
