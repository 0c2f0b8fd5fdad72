"""The steps ``ctbench recon`` and ``ctbench calibrate`` share: open the scan, preprocess it, put it in
ctbench's frame (orientation and centre), and build its geometry."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..io.readers import read_scan
from ..io.scan import RawScan
from .config import GeometryConfig, InputConfig, PreprocessConfig, ReconConfig


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
    apply the per-view shifts its file records (preprocess.view_shifts), all in memory: the corrections of
    :class:`~ctbench.pipeline.correct.Corrections`, which the streamed pipeline applies chunk by chunk."""
    from ..io.view_shifts import shift_images
    from .correct import Corrections

    c = Corrections(scan, pre, pixel_size)
    n = c.n_views
    images = np.concatenate([c.views(i, min(n, i + 32)) for i in range(0, n, 32)]) if n else \
        np.zeros((0, *c.frame), np.float32)
    if c.has_row_pass:
        images = c.rows(images)
    shifted = c.shifts()
    if shifted is not None:     # the scanner's per-view shifts, after rings and binning, in the file's image frame
        images = shift_images(images, shifted[0], shifted[1])
        c.extra["view_shifts"] = shifted[2]
    return Prepared(images, None if scan.angles is None else scan.angles[c.idx], c.pitch, c.change.shift_u,
                    c.change.shift_v, c.idx, c.summary())


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
    return scan_geometry(prep.images.shape, prep.pitch, prep.shift_v, geo, sid, sdd, angles, offset_u_mm)


def scan_geometry(shape, pitch, shift_v: float, geo: GeometryConfig, sid, sdd, angles: np.ndarray,
                  offset_u_mm: float):
    """The :class:`~ctbench.workbench.design.ScanGeometry` of ``(view, row, col)`` line integrals of ``shape``
    with detector ``pitch`` (du, dv) and the vertical centre shift of crops/binning ``shift_v`` (mm)."""
    import torch

    from ..geometry import circular_trajectory_3d, circular_trajectory_3d_parallel
    from ..workbench.design import ScanGeometry

    n, rows, cols = shape
    du, dv = pitch
    mag = 1.0 if sid is None else sdd / sid
    vox = geo.voxel_size_mm or du / mag
    vshape = geo.volume_shape or (max(1, int(round(rows * dv / mag / vox))), cols, cols)
    offset = (float(offset_u_mm), float((geo.detector_offset_v_mm or 0.0) + shift_v))
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
    return ScanGeometry(traj, (cols, rows), (du, dv), tuple(int(s) for s in vshape), (vox,) * 3)


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
    """Every path a recon reads or its config names as a user's file (the scan, its flats and darks, the
    calibrated trajectory, the calibration's known object): the output may not be, contain or lie inside any."""
    known = cfg.calibrate.known_object if cfg.calibrate is not None else None
    return [p for p in (cfg.input.path, cfg.input.flats, cfg.input.darks, cfg.geometry.trajectory, known) if p]


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
    cfg = with_file_values(cfg, scan)
    prep, angles, resolved = orient(prep, scan, cfg.geometry, sid, sdd)
    resolved.warnings[:0] = list(scan.scanner.get("warnings", []))     # what the reader found amiss in the file
    for note in resolved.notes:
        say(note)
    return scan, prep, sid, sdd, angles, resolved, cfg


def with_file_values(cfg: ReconConfig, scan: RawScan) -> ReconConfig:
    """``cfg`` with what its geometry leaves to the file filled in: the vertical offset and the detector roll
    (null: the file's, else 0) and the horizontal offset where it says "file"."""
    geo = cfg.geometry
    update = {}
    if geo.detector_offset_v_mm is None:
        update["detector_offset_v_mm"] = float(scan.scanner.get("detector_offset_v_mm", 0.0))
    if geo.detector_roll_deg is None:
        update["detector_roll_deg"] = float(scan.scanner.get("detector_roll_deg", 0.0))
    if geo.detector_offset_u_mm == "file":
        if "detector_offset_u_mm" not in scan.scanner:
            raise ValueError(f"geometry.detector_offset_u_mm is 'file' but {scan.source} states no detector or axis "
                             "offset: give a number in mm or 'auto'")
        update["detector_offset_u_mm"] = float(scan.scanner["detector_offset_u_mm"])
    if not update:
        return cfg
    cfg = cfg.model_copy(deep=True)
    for k, v in update.items():
        setattr(cfg.geometry, k, v)
    return cfg
