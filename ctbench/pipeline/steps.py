"""The steps ``ctbench recon`` and ``ctbench calibrate`` share: open the scan, preprocess it, put it in
ctbench's frame (orientation and centre), and build its geometry."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..io.readers import read_scan
from ..io.scan import RawScan
from .config import GeometryConfig, InputConfig, PreprocessConfig, ReconConfig
from .corrections import clean_outliers, correct_line_integrals, to_line_integrals


def open_scan(inp: InputConfig) -> RawScan:
    return read_scan(inp.path, format=inp.format, flats=inp.flats, darks=inp.darks,
                     raw=None if inp.raw is None else inp.raw.model_dump())


@dataclass
class Prepared:
    """Line integrals ``(view, row, col)`` ready to reconstruct, and what preprocessing did to the geometry."""

    images: np.ndarray
    angles: np.ndarray | None          # radians, of the kept views (None when the file had none)
    pitch: tuple[float, float]          # (du, dv) after binning, mm
    shift_u: float = 0.0                # detector-centre shift from crops/binning, mm
    shift_v: float = 0.0
    views: np.ndarray | None = None
    correction: dict = field(default_factory=dict)


def prepare(scan: RawScan, pre: PreprocessConfig, pixel_size=None) -> Prepared:
    """Subset, crop, flat/dark-correct, remove zingers, bin, -log (or Paganin), linearise, ring-filter a scan and
    apply the per-view shifts its file records (preprocess.view_shifts)."""
    from ..preprocessing import (CorrectionReport, DetectorChange, average_frames, bin_pixels, crop,
                                 flat_dark_correct, remove_stripes, view_subset)
    from ..preprocessing.correction import replace_nonfinite

    pitch = tuple(pixel_size) if pixel_size is not None else scan.pixel_size
    if pitch is None:
        raise ValueError(f"{scan.source}: the file gives no pixel size; set geometry.pixel_size_mm")
    idx = view_subset(scan.n_views, scan.angles, every=pre.every, angle_range_deg=pre.angle_range_deg)
    change = DetectorChange()
    proj = scan.projections
    if idx.size != scan.n_views:
        proj = proj[idx]
    proj = crop(proj, pre.rows, pre.cols, pitch=pitch, change=change)
    report = CorrectionReport()
    extra: dict = {}                            # what zingers, phase, hardening and rings did
    if scan.values == "counts":
        flat = None if scan.flats is None else average_frames(crop(scan.flats, pre.rows, pre.cols), "flats",
                                                               report=report)
        dark = None if scan.darks is None else average_frames(crop(scan.darks, pre.rows, pre.cols), "darks",
                                                               report=report)
        chunks = []
        for i in range(0, proj.shape[0], 32):   # bounded memory: 32 raw views at a time
            t = flat_dark_correct(proj[i:i + 32], flat, dark, min_transmission=pre.min_transmission, report=report)
            t = clean_outliers(t, pre, extra)
            chunks.append(bin_pixels(t, pre.bin, pitch=pitch, change=DetectorChange()) if pre.bin > 1 else t)
        if pre.bin > 1:
            bin_pixels(proj[:1], pre.bin, pitch=pitch, change=change)   # records the binning's geometry once
        binned_pitch = tuple(p * f for p, f in zip(pitch, change.pitch_factor))
        images = to_line_integrals(np.concatenate(chunks), pre, binned_pitch, extra)
    else:
        data = np.asarray(proj.compute() if hasattr(proj, "compute") else proj, dtype=np.float32)
        # Same non-finite rule as for counts: neighbours' median, counted; none left for -log or the solver.
        data, n_bad, left = replace_nonfinite(data)
        data[left] = 1.0 if scan.values == "transmission" else 0.0
        report.n_values += data.size
        report.n_nonfinite_counts += n_bad
        report.n_nonfinite_unfilled += int(left.sum())
        data = clean_outliers(data, pre, extra, line_integrals=scan.values != "transmission")
        data = bin_pixels(data, pre.bin, pitch=pitch, change=change)
        binned_pitch = tuple(p * f for p, f in zip(pitch, change.pitch_factor))
        if scan.values == "transmission":
            data = to_line_integrals(np.clip(data, pre.min_transmission, None), pre, binned_pitch, extra)
        elif pre.phase is not None:              # line integrals back to transmission for the phase filter
            data = to_line_integrals(np.exp(-np.asarray(data, np.float64)), pre, binned_pitch, extra)
        images = np.asarray(data, dtype=np.float32)
    if pre.ring_filter:
        images = remove_stripes(images, pre.ring_filter)
    images = correct_line_integrals(images, pre, extra)
    if pre.view_shifts:     # the scanner's per-view shifts, after rings and binning, in the file's image frame
        from ..io.view_shifts import apply_recorded_shifts
        images, shifted = apply_recorded_shifts(images, scan.scanner, idx, pre.bin)
        if shifted:
            extra["view_shifts"] = shifted
    du, dv = (p * f for p, f in zip(pitch, change.pitch_factor))
    return Prepared(images, None if scan.angles is None else scan.angles[idx], (du, dv), change.shift_u,
                    change.shift_v, idx, report.to_dict() | extra)


def scan_angles(prep: Prepared, geo: GeometryConfig, n_views_file: int) -> np.ndarray:
    """Angles of the kept views: from the file, else evenly over ``angle_range_deg`` from ``start_angle_deg``."""
    if prep.angles is not None:
        return prep.angles
    all_angles = np.radians(geo.start_angle_deg + geo.angle_range_deg * np.arange(n_views_file) / n_views_file)
    return all_angles if prep.views is None else all_angles[prep.views]


def beam_of(scan: RawScan, geo: GeometryConfig) -> str:
    return geo.beam or ("parallel" if scan.scanner.get("beam") == "parallel" else "cone")


def distances(scan: RawScan, geo: GeometryConfig) -> tuple[float | None, float | None]:
    """SID and SDD in mm; (None, None) for a parallel beam."""
    if beam_of(scan, geo) == "parallel":
        return None, None
    sid = geo.sid_mm or scan.scanner.get("source_object_distance_mm") or scan.scanner.get("source_sample_distance_mm")
    sdd = geo.sdd_mm or scan.scanner.get("source_detector_distance_mm")
    if sdd is None and sid and scan.scanner.get("sample_detector_distance_mm"):
        sdd = sid + scan.scanner["sample_detector_distance_mm"]
    if not sid or not sdd:
        raise ValueError(f"{scan.source}: the file gives no source distances; set geometry.sid_mm and sdd_mm")
    if sdd < sid:
        raise ValueError(f"sdd ({sdd} mm) must be at least sid ({sid} mm)")
    return float(sid), float(sdd)


def build_geometry(prep: Prepared, geo: GeometryConfig, sid: float, sdd: float, angles: np.ndarray,
                   offset_u_mm: float):
    """The :class:`~ctbench.workbench.design.ScanGeometry` of the prepared data (circular cone beam, or parallel
    beam when ``sid`` is None)."""
    import torch

    from ..geometry import circular_trajectory_3d
    from ..workbench.design import ScanGeometry

    from ..geometry import circular_trajectory_3d_parallel

    n, rows, cols = prep.images.shape
    du, dv = prep.pitch
    mag = 1.0 if sid is None else sdd / sid
    vox = geo.voxel_size_mm or du / mag
    shape = geo.volume_shape or (max(1, int(round(rows * dv / mag / vox))), cols, cols)
    offset = (float(offset_u_mm), float((geo.detector_offset_v_mm or 0.0) + prep.shift_v))
    ang = torch.as_tensor(angles, dtype=torch.float32)
    if sid is None:       # parallel beam (synchrotron scans)
        traj = circular_trajectory_3d_parallel(angles=ang, detector_offset=offset)
    else:
        traj = circular_trajectory_3d(sid=sid, sdd=sdd, angles=ang, detector_offset=offset)
    if geo.detector_roll_deg:
        from ..io.orientation import roll_detector
        traj = roll_detector(traj, geo.detector_roll_deg)
    if geo.trajectory is not None:
        traj = _calibrated(geo.trajectory, traj)
    return ScanGeometry(traj, (cols, rows), (du, dv), tuple(int(s) for s in shape), (vox,) * 3)


def _calibrated(path: str, built):
    """The trajectory of ``geometry.trajectory`` (a calibration's output), checked against the scan."""
    from ..geometry import load_trajectory

    traj = load_trajectory(path)
    if traj.n_views != built.n_views or traj.beam != built.beam:
        raise ValueError(f"geometry.trajectory {path} has {traj.n_views} {traj.beam}-beam views; the preprocessed "
                         f"scan has {built.n_views} {built.beam}-beam views (calibrate with the same preprocessing)")
    return traj.to(dtype=built.dtype)


def scan_orientation(scan: RawScan, geo: GeometryConfig):
    """The scan's orientation with the config's fields (null = the file's) applied."""
    return scan.orientation.replace(seen_from=geo.image_seen_from, columns=geo.image_columns, rows=geo.image_rows,
                                    rotation=geo.rotation_direction)


def orient(prep: Prepared, scan: RawScan, geo: GeometryConfig, sid: float, sdd: float):
    """Prepared data in ctbench's frame, the angles of its views, and the :class:`~ctbench.io.handedness.Resolved`
    orientation (chosen from the data where "auto"; centre searched when the offset is "auto")."""
    from dataclasses import replace

    from ..io.handedness import ctbench_angles, fixed_fields, resolve_orientation

    o = scan_orientation(scan, geo)
    images, shift_v = prep.images, prep.shift_v
    if o.flip_rows:
        images, shift_v = np.ascontiguousarray(images[:, ::-1, :]), -shift_v
    angles = scan_angles(prep, geo, scan.n_views)
    res = resolve_orientation(images, angles, o, scan.orientation.rotation, pitch=prep.pitch[0],
                              pitch_v=prep.pitch[1], sid=sid, sdd=sdd,
                              offset_v_mm=(geo.detector_offset_v_mm or 0.0) + shift_v,
                              search_centre=geo.detector_offset_u_mm == "auto", fixed=fixed_fields(geo))
    shift_u = prep.shift_u
    if res.orientation.flip_columns:
        images, shift_u = np.ascontiguousarray(images[:, :, ::-1]), -shift_u
    out = replace(prep, images=images, shift_u=shift_u, shift_v=shift_v,
                  angles=None if prep.angles is None else ctbench_angles(prep.angles, scan.orientation.rotation,
                                                                         res.orientation.rotation))
    return out, ctbench_angles(angles, scan.orientation.rotation, res.orientation.rotation), res


def find_offset(prep: Prepared, angles, sid: float, sdd: float, offset_v_mm: float = 0.0, *, cross_check=True):
    from ..preprocessing import find_centre

    return find_centre(prep.images, angles, prep.pitch[0], sid=sid, sdd=sdd, pitch_v=prep.pitch[1],
                       offset_v=offset_v_mm + prep.shift_v, cross_check=cross_check)


def recon_inputs(cfg: ReconConfig) -> list[str]:
    """Every path a recon reads: the output may not be, contain or lie inside any of them."""
    return [p for p in (cfg.input.path, cfg.input.flats, cfg.input.darks) if p]


def oriented_scan(cfg: ReconConfig, say):
    """Read and preprocess the config's scan and put it in ctbench's frame (orientation resolved, the file's
    vertical offset where the config says null): the steps ``ctbench recon`` and ``ctbench calibrate`` share.
    Returns ``(scan, prep, sid, sdd, angles, resolved, cfg)``, ``cfg`` with the file's values filled in."""
    scan = open_scan(cfg.input)
    say(f"read {scan.format} scan {scan.source}: {scan.n_views} views of {scan.detector_shape} pixels")
    prep = prepare(scan, cfg.preprocess, cfg.geometry.pixel_size_mm)
    say(f"preprocessed: {prep.images.shape} line integrals; clipped {prep.correction.get('n_clipped', 0)} values")
    n_nonfinite = sum(prep.correction.get(k, 0) for k in ("n_nonfinite_counts", "n_nonfinite_flat_values",
                                                           "n_nonfinite_dark_values"))
    if n_nonfinite:
        say(f"non-finite input values: {n_nonfinite} ({prep.correction['nonfinite_rule']})")
    if "zingers" in prep.correction:
        say(f"zingers: replaced {prep.correction['zingers']['n_replaced']} outlier values")
    shifted = prep.correction.get("view_shifts")
    if shifted:
        say(f"per-view shifts applied ({shifted['source']}; up to {shifted['max_abs_x_px']:.2f} px across, "
            f"{shifted['max_abs_y_px']:.2f} px down)")
    sid, sdd = distances(scan, cfg.geometry)
    if cfg.geometry.detector_offset_v_mm is None:
        cfg = cfg.model_copy(deep=True)
        cfg.geometry.detector_offset_v_mm = float(scan.scanner.get("detector_offset_v_mm", 0.0))
    if cfg.geometry.detector_roll_deg is None:
        cfg = cfg.model_copy(deep=True)
        cfg.geometry.detector_roll_deg = float(scan.scanner.get("detector_roll_deg", 0.0))
    if cfg.geometry.detector_offset_u_mm == "file":
        if "detector_offset_u_mm" not in scan.scanner:
            raise ValueError(f"geometry.detector_offset_u_mm is 'file' but {scan.source} states no detector or axis "
                             "offset: give a number in mm or 'auto'")
        cfg = cfg.model_copy(deep=True)
        cfg.geometry.detector_offset_u_mm = float(scan.scanner["detector_offset_u_mm"])
    prep, angles, resolved = orient(prep, scan, cfg.geometry, sid, sdd)
    resolved.warnings[:0] = list(scan.scanner.get("warnings", []))     # what the reader found amiss in the file
    for note in resolved.notes:
        say(note)
    return scan, prep, sid, sdd, angles, resolved, cfg
