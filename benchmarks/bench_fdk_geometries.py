"""FDK on calibrated, half-fan and cylindrical geometries, side by side with RTK's (issue 44).

One run measures, on one ellipsoid phantom (Kak-Slaney Shepp-Logan scaled to ``--scale`` mm) and one volume
grid, with both libraries reconstructing from the *same* projections (exact analytic line integrals through
the geometry each case scans with, ``ctbench.phantoms``; a cylinder's from its own pixel positions):

- ``calibrated``: the exact circular scan and three calibrated ones (a detector roll, a per-view drift of the
  object, both with a detector offset), the geometry as the calibration reports it (``ctbench.calibration.
  simulate.true_trajectory``); ctbench's ``fdk`` reads every view's vectors, RTK gets them view by view
  (``ThreeDCircularProjectionGeometry.AddProjection(source, detector centre, row, column)``, peers_rtk.py's
  ``rtk_geometry_vectors``).  Goals: RMSE within 5 % of the exact geometry's and no worse than RTK's.
- ``half-fan``: a full turn with the detector displaced sideways by 40 % of its width (``half_fan_trajectory_3d``,
  overlap 10 % of the width); ctbench's Wang weights against RTK's ``DisplacedDetectorImageFilter`` before its FDK,
  and a centred detector covering the same field of view (1.8 times as many columns of the same pitch).  Goals:
  RMSE within 10 % of the centred scan's and no worse than RTK's.
- ``cylinder``: a detector bent on a cylinder about the source (``CylindricalProjector``) against the flat
  detector of the same size and pitch; RTK's FDK is asked for the same cylinder
  (``SetRadiusCylindricalDetector``); where it refuses, that is recorded and RTK's flat-detector FDK is the
  speed reference.

Before any RTK figure counts, RTK's source and corner-pixel positions must match ctbench's to 1e-6 mm in every
view (``geometry_max_dev_mm``; peers_rtk.py's ``rtk_geometry_deviation``); a case that misses it records RTK as
skipped.  RMSE: against the phantom's voxel values inside the field of view both reconstructions share (the
intersection of ctbench's ``field_of_view`` of the scans compared).  Times: every method of a case called in
turn, call by call in one process (harness.interleaved: a warm-up round, then ``--repeats`` rounds), the same
thread count for both (``--threads``; RTK with ITK's Pool threader), min and median of the wall clock and the
CPU seconds.

Output: JSON lines on stdout, appended to ``--out`` (benchmarks/results/bench_fdk_geometries.jsonl): a header
with the machine (CPU model, AVX-512 flag, threads) and the sizes, one ``result`` line per method and case and one
``summary`` line per case.  ``--table`` prints the markdown table of the last run in ``--out`` (docs/
RECONSTRUCTION.md, "FDK on calibrated, half-fan and cylindrical geometries") and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Emitter, interleaved, machine_info, new_run_id, ratio_fields, rounded, timing_fields  # noqa: E402

from ctbench import Projector, circular_trajectory_3d  # noqa: E402
from ctbench.calibration.model import GeometryModel  # noqa: E402
from ctbench.calibration.simulate import gauge_free_walk, true_trajectory  # noqa: E402
from ctbench.geometry import half_fan_trajectory_3d  # noqa: E402
from ctbench.phantoms import (ellipsoid_line_integrals, ellipsoid_phantom, ellipsoid_projections,  # noqa: E402
                              shepp_logan_ellipsoids)
from ctbench.solvers import CylindricalProjector, fdk, fdk_weighting, field_of_view  # noqa: E402
from ctbench.solvers.cylindrical import cylinder_pixels  # noqa: E402

BENCH = "fdk_geometries"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_fdk_geometries.jsonl"
F64 = torch.float64
GEOMETRY_TOLERANCE_MM = 1e-6
# the calibrated scans: (GeometryModel values, RMS of the per-view shift walk in pixels, its seed)
CALIBRATIONS = {
    "roll": ({"roll": 1.0}, 0.0),
    "drift": ({}, 1.5),
    "roll+drift": ({"roll": 1.0, "offset_u": 1.4}, 1.5),
}
HALF_FAN_OFFSET = 0.4   # of the detector's width
HALF_FAN_OVERLAP = 0.1  # of the detector's width: the band both halves of the turn see
GOALS = {"calibrated_vs_exact": 1.05, "half_fan_vs_centred": 1.10, "speedup_vs_rtk": 3.0}


# ------------------------------------------------------------------ the scans
class Case:
    """The shared sizes: volume, detector, orbit and phantom."""

    def __init__(self, args):
        self.shape = tuple(args.shape)
        self.voxel = args.voxel
        self.det = tuple(args.detector)
        self.pixel = args.pixel
        self.views, self.sid, self.sdd = args.views, args.sid, args.sdd
        self.scale = args.scale
        self.ells = shepp_logan_ellipsoids(modified=False)
        self.truth = ellipsoid_phantom(self.ells, self.shape, self.voxel, scale=self.scale, dtype=F64)
        self.nominal = circular_trajectory_3d(self.views, self.sid, self.sdd, dtype=F64)

    def sizes(self) -> dict:
        return {"volume": list(self.shape), "voxel_mm": self.voxel, "detector": list(self.det),
                "pixel_mm": self.pixel, "views": self.views, "sid_mm": self.sid, "sdd_mm": self.sdd,
                "phantom": f"Kak-Slaney Shepp-Logan x {self.scale:g} mm"}

    def projector(self, traj, det=None, pixel=None):
        return Projector(traj, self.shape, det or self.det, voxel_spacing=self.voxel,
                         detector_spacing=pixel or self.pixel)

    def flat_scan(self, traj, det=None, pixel=None):
        """(projector, float32 sinogram of exact line integrals) of a flat detector."""
        det, pixel = det or self.det, pixel or self.pixel
        sino = ellipsoid_projections(self.ells, traj, det, pixel, scale=self.scale, dtype=F64)
        return self.projector(traj, det, pixel), sino.float()

    def cylinder_scan(self, traj):
        """(CylindricalProjector centred on the source, float32 sinogram) of the same detector bent on a
        cylinder: line integrals from the source to every pixel's own position."""
        p = CylindricalProjector(traj, self.shape, self.det, voxel_spacing=self.voxel,
                                 detector_spacing=self.pixel)
        pix = cylinder_pixels(traj, self.det, (self.pixel, self.pixel)).to(F64)
        src = traj.tensors()[0].to(F64)
        n, U, V, _ = pix.shape
        d = pix - src[:, None, None, :]
        d = d / d.norm(dim=-1, keepdim=True)
        scaled = [e.scaled(self.scale) for e in self.ells]
        o = src[:, None, None, :].expand(n, U, V, 3).reshape(-1, 3)
        sino = ellipsoid_line_integrals(scaled, o, d.reshape(-1, 3)).reshape(n, U, V)
        return p, sino.float()

    def rmse(self, rec, mask) -> float:
        d = (torch.as_tensor(rec).double() - self.truth)[mask]
        return math.sqrt(float((d * d).mean()))


def calibrated_trajectory(case: Case, values: dict, walk_px: float):
    model = GeometryModel(case.nominal, (case.pixel, case.pixel))
    shifts = gauge_free_walk(model, walk_px, seed=4) if walk_px else None
    return true_trajectory(case.nominal, (case.pixel, case.pixel), values, shifts)


# ------------------------------------------------------------------ RTK
class Rtk:
    """RTK's FDK on ctbench's per-view geometry (peers_rtk.py), or why it is not there."""

    def __init__(self, threads: int, threader: str = "Pool"):
        import itk
        from itk import RTK  # noqa: F401 - fails here if itk-rtk is missing

        itk.MultiThreaderBase.SetGlobalDefaultThreader(itk.MultiThreaderBase.ThreaderTypeFromString(threader))
        itk.MultiThreaderBase.SetGlobalDefaultNumberOfThreads(threads)
        self.threader = itk.MultiThreaderBase.New().GetNameOfClass()

    @staticmethod
    def prepare(case: Case, projector, sino, displaced=False, detector_radius=0.0):
        """(call, geometry deviation in mm): a callable running RTK's FDK on these projections."""
        import peers_rtk as pr

        g = pr.rtk_geometry_vectors(projector.trajectory, detector_radius)
        dev = pr.rtk_geometry_deviation(g, projector) if not detector_radius else None
        proj = pr.rtk_projections(sino, projector.detector_spacing)
        vol = pr.rtk_volume_source(case.shape, projector.grid.spacing)
        return (lambda: pr.rtk_fdk(proj, g, vol, displaced)), dev


def rtk_or_none(rtk, case, projector, sino, **kw):
    """RTK's call and its record, or (None, record saying why not)."""
    if rtk is None:
        return None, {"skipped": "itk-rtk not importable"}
    try:
        call, dev = Rtk.prepare(case, projector, sino, **kw)
    except Exception as e:  # noqa: BLE001 - the peer is optional
        traceback.print_exc()
        return None, {"skipped": "error", "error": repr(e)}
    rec = {"threader": rtk.threader}
    if dev is not None:
        rec["geometry_max_dev_mm"] = rounded(dev, 3)
        if not dev <= GEOMETRY_TOLERANCE_MM:
            return None, {**rec, "skipped": f"RTK's geometry misses ctbench's by {dev:.3g} mm "
                                            f"(> {GEOMETRY_TOLERANCE_MM:g} mm)"}
    return call, rec


def to_volume(out):
    """ctbench's output as it is; RTK's image in ctbench's layout."""
    if isinstance(out, torch.Tensor):
        return out
    import peers_rtk as pr

    return torch.from_numpy(pr.from_rtk_volume(out).astype(np.float64))


# ------------------------------------------------------------------ running a case
def run_methods(emit, case: Case, name: str, methods: dict, masks, repeats: int, threads: int) -> dict:
    """Time ``methods`` ({label: (call, record)}) in turn; one result line each; {label: rmse}."""
    calls = {k: c for k, (c, _) in methods.items() if c is not None}
    stats, outs = interleaved(calls, repeats) if calls else ({}, {})
    rmses = {}
    for label, (call, rec) in methods.items():
        impl, _, geometry = label.partition(":")
        where = dict(workload=f"{name}: {geometry}, {threads} threads", op="fdk")  # readme_table's grouping
        if call is None:
            emit(kind="result", case=name, geometry=geometry, impl=impl, threads=threads, **where, **rec)
            continue
        vol = to_volume(outs[label])
        rmses[label] = case.rmse(vol, masks)
        emit(kind="result", case=name, geometry=geometry, impl=impl, threads=threads, **where,
             rmse=rounded(rmses[label], 5),
             fov_voxels=int(masks.sum()), **timing_fields(stats[label]), **rec)
        stats[label]["rmse"] = rmses[label]
    return stats


def ratio(a, b):
    return rounded(a / b, 4) if a is not None and b else None


def emit_speed_ratio(emit, name, geometry, threads, peer, ours, peer_label="rtk"):
    """The ratio line readme_table.py shows beside the timings: peer time / ctbench time."""
    if peer is None:
        return
    emit(kind="ratio", case=name, geometry=geometry, workload=f"{name}: {geometry}, {threads} threads", op="fdk",
         ratio=f"{peer_label} / ctbench", **ratio_fields(peer, ours))


def calibrated_case(emit, case: Case, rtk, args, threads):
    scans = {"exact": case.flat_scan(case.nominal)}
    for label, (values, walk) in CALIBRATIONS.items():
        scans[label] = case.flat_scan(calibrated_trajectory(case, values, walk))
    mask = torch.ones(case.shape, dtype=torch.bool)
    for p, _ in scans.values():
        mask &= field_of_view(p)
    methods = {}
    for geo, (p, sino) in scans.items():
        kind = fdk_weighting(p)["kind"]
        methods[f"ctbench:{geo}"] = ((lambda p=p, s=sino: fdk(p, s)), {"weighting": kind})
        # a detector offset beyond 10 % of the fan's span gets Wang's weights in ctbench: RTK gets its filter too
        methods[f"rtk:{geo}"] = rtk_or_none(rtk, case, p, sino, displaced=kind.startswith("displaced"))
    stats = run_methods(emit, case, "calibrated", methods, mask, args.repeats, threads)
    exact = stats["ctbench:exact"]["rmse"]
    emit_speed_ratio(emit, "calibrated", "exact", threads, stats.get("rtk:exact"), stats["ctbench:exact"])
    for geo in CALIBRATIONS:
        ours, peer = stats[f"ctbench:{geo}"], stats.get(f"rtk:{geo}")
        emit_speed_ratio(emit, "calibrated", geo, threads, peer, ours)
        emit(kind="summary", case="calibrated", geometry=geo, threads=threads,
             rmse_ctbench=rounded(ours["rmse"], 5), rmse_exact_geometry=rounded(exact, 5),
             rmse_rtk=rounded(peer["rmse"], 5) if peer else None,
             rmse_vs_exact=ratio(ours["rmse"], exact), rmse_vs_rtk=ratio(ours["rmse"], peer and peer["rmse"]),
             speedup_vs_rtk=ratio(peer and peer["seconds"], ours["seconds"]),
             speedup_vs_rtk_median=ratio(peer and peer["median_s"], ours["median_s"]),
             goal_rmse_vs_exact=GOALS["calibrated_vs_exact"])


def half_fan_case(emit, case: Case, rtk, args, threads):
    U, V = case.det
    du = args.half_fan_pixel
    width = U * du
    traj = half_fan_trajectory_3d(case.views, case.sid, case.sdd, width, HALF_FAN_OVERLAP * width, dtype=F64)
    half = case.flat_scan(traj, (U, V), (du, case.pixel))
    wide = (int(round((1 - 2 * HALF_FAN_OVERLAP) * 2 * U + 2 * HALF_FAN_OVERLAP * U)), V)  # 1.8 U columns
    centred = case.flat_scan(case.nominal, wide, (du, case.pixel))
    mask = field_of_view(half[0]) & field_of_view(centred[0])
    info = fdk_weighting(half[0])
    methods = {"ctbench:half-fan": ((lambda: fdk(*half)), {"weighting": info["kind"],
                                                           "detector_asymmetry": info.get("detector_asymmetry")}),
               "rtk:half-fan": rtk_or_none(rtk, case, *half, displaced=True),
               "ctbench:centred": ((lambda: fdk(*centred)), {"weighting": fdk_weighting(centred[0])["kind"],
                                                             "detector": list(wide)}),
               "rtk:centred": rtk_or_none(rtk, case, *centred)}
    stats = run_methods(emit, case, "half-fan", methods, mask, args.repeats, threads)
    ours, ref, peer = stats["ctbench:half-fan"], stats["ctbench:centred"], stats.get("rtk:half-fan")
    emit_speed_ratio(emit, "half-fan", "half-fan", threads, peer, ours)
    emit_speed_ratio(emit, "half-fan", "centred", threads, stats.get("rtk:centred"), ref)
    emit(kind="summary", case="half-fan", geometry="half-fan", threads=threads, detector=[U, V],
         pixel_mm=[du, case.pixel], offset_of_width=HALF_FAN_OFFSET, overlap_of_width=HALF_FAN_OVERLAP,
         centred_detector=list(wide), rmse_ctbench=rounded(ours["rmse"], 5), rmse_centred=rounded(ref["rmse"], 5),
         rmse_rtk=rounded(peer["rmse"], 5) if peer else None, rmse_vs_centred=ratio(ours["rmse"], ref["rmse"]),
         rmse_vs_rtk=ratio(ours["rmse"], peer and peer["rmse"]),
         speedup_vs_rtk=ratio(peer and peer["seconds"], ours["seconds"]),
         speedup_vs_rtk_median=ratio(peer and peer["median_s"], ours["median_s"]),
         goal_rmse_vs_centred=GOALS["half_fan_vs_centred"])


def cylinder_case(emit, case: Case, rtk, args, threads):
    cyl = case.cylinder_scan(case.nominal)
    flat = case.flat_scan(case.nominal)
    mask = field_of_view(cyl[0]) & field_of_view(flat[0])
    rtk_cyl = rtk_or_none(rtk, case, cyl[0].flat, cyl[1], detector_radius=case.sdd)
    methods = {"ctbench:cylinder": ((lambda: fdk(*cyl)), {"detector": fdk_weighting(cyl[0])["detector"]}),
               "ctbench:flat": ((lambda: fdk(*flat)), {"detector": "flat"}),
               "rtk:flat": rtk_or_none(rtk, case, *flat)}
    if rtk_cyl[0] is not None:
        # RTK's FDK may refuse a cylindrical detector: find out before timing it
        try:
            rtk_cyl[0]()
            methods["rtk:cylinder"] = rtk_cyl
        except Exception as e:  # noqa: BLE001
            methods["rtk:cylinder"] = (None, {**rtk_cyl[1], "skipped": "RTK's FDK refused the cylindrical detector",
                                              "error": str(e).strip().splitlines()[-1][:300]})
    else:
        methods["rtk:cylinder"] = rtk_cyl
    stats = run_methods(emit, case, "cylinder", methods, mask, args.repeats, threads)
    ours, ref = stats["ctbench:cylinder"], stats["ctbench:flat"]
    peer = stats.get("rtk:cylinder")
    peer_flat = stats.get("rtk:flat")
    if peer is not None:
        emit_speed_ratio(emit, "cylinder", "cylinder", threads, peer, ours)
    else:
        emit_speed_ratio(emit, "cylinder", "cylinder", threads, peer_flat, ours, "rtk (flat detector)")
    emit_speed_ratio(emit, "cylinder", "flat", threads, peer_flat, ref)
    emit(kind="summary", case="cylinder", geometry="cylinder", threads=threads,
         rmse_ctbench=rounded(ours["rmse"], 5), rmse_flat=rounded(ref["rmse"], 5),
         rmse_rtk=rounded(peer["rmse"], 5) if peer else None,
         rmse_rtk_flat=rounded(peer_flat["rmse"], 5) if peer_flat else None,
         rtk_cylinder=methods["rtk:cylinder"][1].get("skipped", "ran"),
         rmse_vs_flat=ratio(ours["rmse"], ref["rmse"]), rmse_vs_rtk=ratio(ours["rmse"], peer and peer["rmse"]),
         speedup_vs_rtk=ratio((peer or peer_flat) and (peer or peer_flat)["seconds"], ours["seconds"]),
         speedup_vs_rtk_median=ratio((peer or peer_flat) and (peer or peer_flat)["median_s"], ours["median_s"]),
         speed_reference="rtk:cylinder" if peer else "rtk:flat")


# ------------------------------------------------------------------ the table
def markdown_table(path: Path, run_id: str | None = None) -> str:
    """The docs' table from one run's summary and result lines (the last run in ``path`` unless ``run_id``)."""
    lines = [json.loads(t) for t in Path(path).read_text().splitlines() if t.strip()]
    run_id = run_id or [ln for ln in lines if ln.get("kind") == "header"][-1]["run_id"]
    run = [ln for ln in lines if ln.get("run_id") == run_id]
    head = next(ln for ln in run if ln.get("kind") == "header")
    res = {(ln["case"], ln["impl"], ln["geometry"]): ln for ln in run if ln.get("kind") == "result"}

    def t(case, impl, geo):
        r = res.get((case, impl, geo))
        if r is None or "seconds" not in r:
            return "—", "—"
        return f"{r['seconds']:.3f} / {r['median_s']:.3f}", f"{r['rmse']:.5f}"

    def rmse_of(case, impl, geo):
        return t(case, impl, geo)[1]

    def speedup(case, geo, rtk_geo):
        ours, peer = res.get((case, "ctbench", geo)), res.get((case, "rtk", rtk_geo))
        if not (ours and peer and "seconds" in ours and "seconds" in peer):
            return "—"
        return f"{peer['seconds'] / ours['seconds']:.2f}x / {peer['median_s'] / ours['median_s']:.2f}x"

    out = ["| case | reference RMSE | ctbench RMSE | / reference | RTK RMSE | ctbench s (min / median) "
           "| RTK s (min / median) | speed-up (min / median) |",
           "|---|---|---|---|---|---|---|---|"]
    if ("calibrated", "ctbench", "exact") in res:
        out.append(f"| exact circular geometry | — | {rmse_of('calibrated', 'ctbench', 'exact')} | — | "
                   f"{rmse_of('calibrated', 'rtk', 'exact')} | {t('calibrated', 'ctbench', 'exact')[0]} | "
                   f"{t('calibrated', 'rtk', 'exact')[0]} | {speedup('calibrated', 'exact', 'exact')} |")
    for s in (ln for ln in run if ln.get("kind") == "summary"):
        case, geo = s["case"], s["geometry"]
        if case == "calibrated":
            label, ref = f"calibrated: {geo}", f"{s['rmse_exact_geometry']:.5f} (exact geometry)"
            rtk_geo = geo
        elif case == "half-fan":
            label = f"half-fan, offset {100 * s['offset_of_width']:g} % of the width"
            ref, rtk_geo = f"{s['rmse_centred']:.5f} (centred, {s['centred_detector'][0]} columns)", geo
        else:
            label, ref = "cylinder (source-centred)", f"{s['rmse_flat']:.5f} (flat detector)"
            rtk_geo = "cylinder" if s["speed_reference"] == "rtk:cylinder" else "flat"
        rtk_rmse = rmse_of(case, "rtk", rtk_geo) + ("" if rtk_geo == geo else " (flat: RTK refuses the cylinder)")
        rel = s.get("rmse_vs_exact") or s.get("rmse_vs_centred") or s.get("rmse_vs_flat")
        out.append(f"| {label} | {ref} | {rmse_of(case, 'ctbench', geo)} | {rel:.3f} | {rtk_rmse} | "
                   f"{t(case, 'ctbench', geo)[0]} | {t(case, 'rtk', rtk_geo)[0]} | {speedup(case, geo, rtk_geo)} |")
    m = head["machine"]
    sizes = head["sizes"]
    out.append("")
    out.append(f"Run {run_id}: {m['cpu']} ({m['nproc']} CPUs, AVX-512: {'yes' if m['avx512'] else 'no'}), "
               f"{head['threads']} threads each, load average {m['loadavg'][0]:.1f} at the start"
               f"{' (a machine shared with other work)' if m['loadavg'][0] > 0.5 * m['nproc'] else ''}; volume "
               f"{'x'.join(map(str, sizes['volume']))} of {sizes['voxel_mm']:g} mm, detector "
               f"{'x'.join(map(str, sizes['detector']))} of {sizes['pixel_mm']:g} mm, {sizes['views']} views over "
               f"360 degrees, SID {sizes['sid_mm']:g} mm, SDD {sizes['sdd_mm']:g} mm; {head['repeats']} timed calls "
               f"each after a warm-up, interleaved.")
    return "\n".join(out)


# ------------------------------------------------------------------ main
def _load_note() -> str:
    """What the load at the start says about the times (a busy machine slows both libraries alike)."""
    load, n = os.getloadavg()[0], os.cpu_count() or 1
    busy = load > 0.5 * n
    return (f"load average {load:.1f} on {n} CPUs at the start"
            + (": a machine shared with other work, times indicative, ratios from interleaved calls" if busy else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-out", action="store_true", help="print only, append nothing")
    ap.add_argument("--table", action="store_true", help="print the markdown table of the last run in --out")
    ap.add_argument("--run-id", default=None, help="with --table: this run instead of the last")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5, help="timed calls of each method after the warm-up")
    ap.add_argument("--shape", type=int, nargs=3, default=(64, 80, 80), metavar=("D", "H", "W"))
    ap.add_argument("--voxel", type=float, default=2.5)
    ap.add_argument("--detector", type=int, nargs=2, default=(128, 96), metavar=("U", "V"))
    ap.add_argument("--pixel", type=float, default=3.2)
    ap.add_argument("--half-fan-pixel", type=float, default=1.8,
                    help="column pitch of the half-fan case (its detector reaches as far as the full one's)")
    ap.add_argument("--views", type=int, default=240)
    ap.add_argument("--sid", type=float, default=500.0)
    ap.add_argument("--sdd", type=float, default=1000.0)
    ap.add_argument("--scale", type=float, default=80.0, help="phantom scale (mm)")
    ap.add_argument("--cases", default="calibrated,half-fan,cylinder")
    ap.add_argument("--skip-rtk", action="store_true")
    args = ap.parse_args(argv)
    if args.table:
        print(markdown_table(args.out, args.run_id))
        return
    for name in ("threads", "repeats", "views"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name}: expected a positive integer, got {getattr(args, name)}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    runners = {"calibrated": calibrated_case, "half-fan": half_fan_case, "cylinder": cylinder_case}
    bad = [c for c in cases if c not in runners]
    if bad or not cases:
        raise SystemExit(f"--cases: expected some of {', '.join(runners)}, got {args.cases!r}")
    torch.set_num_threads(args.threads)
    emit = Emitter(None if args.no_out else args.out, new_run_id(), bench=BENCH)
    case = Case(args)
    rtk = None
    if not args.skip_rtk:
        try:
            rtk = Rtk(args.threads)
        except Exception as e:  # noqa: BLE001 - the peer is optional
            print(f"itk-rtk not importable: {e!r}", file=sys.stderr)
    emit(kind="header", machine=machine_info(), threads=args.threads, repeats=args.repeats, sizes=case.sizes(),
         cases=cases, goals=GOALS, rtk=None if rtk is None else rtk.threader,
         note=_load_note())
    for c in cases:
        runners[c](emit, case, rtk, args, args.threads)


if __name__ == "__main__":
    main()
