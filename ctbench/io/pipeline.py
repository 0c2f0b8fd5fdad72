"""``ctbench recon CONFIG.json``: read a scan, preprocess it, attach a geometry, reconstruct, export.

The same steps serve the command line, the napari "Scan import" widget
(which saves its current settings as such a config) and scripts::

    cfg = load_config("recon.json")
    report = run_recon(cfg)

A config (JSON; every section but ``input`` optional)::

    {"input":      {"path": "scan/", "format": "auto", "flats": null, "darks": null,
                    "raw": {"shape": [360, 512, 512], "dtype": "uint16", "byte_order": "little", "header": 0}},
     "preprocess": {"rows": null, "cols": null, "bin": 1, "every": 1, "angle_range_deg": null,
                    "ring_filter": 0, "min_transmission": 1e-4, "view_shifts": true,
                    "zingers": null, "rings": null, "phase": null, "beam_hardening": null},
     "geometry":   {"sid_mm": null, "sdd_mm": null, "pixel_size_mm": null, "angle_range_deg": 360,
                    "start_angle_deg": 0, "detector_offset_u_mm": "auto", "detector_offset_v_mm": null,
                    "volume_shape": null, "voxel_size_mm": null},
     "algorithm":  {"name": "fbp", "params": {}},
     "output":     {"path": "recon.tif", "format": "auto", "overwrite": false, "force": false}}

``null`` means "from the file" (SID/SDD, pixel size, angles) or "automatic"
(the volume grid covers the field of view at the detector's resolution
scaled to the isocentre).  The orientation keys (``image_seen_from``,
``image_columns``, ``image_rows``, ``rotation_direction``), ``beam``,
``detector_roll_deg`` and ``detector_offset_v_mm`` (null = the file's)
are described in docs/SCANS.md.  ``detector_offset_u_mm`` is "auto" (centre
finder, on the preprocessed data), "file" (the offset the vendor file states) or the offset of the *uncropped*
detector in mm; crops and binning are accounted for.

The output follows :mod:`ctbench.output_policy`, checked before the scan is
read: it may not be, contain or lie inside the scan, its flats or darks;
``overwrite`` replaces only what ctbench wrote, ``force`` anything else.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .calibrate_config import CalibrateConfig
from .corrections_config import CorrectionKeys, clean_outliers, correct_line_integrals, to_line_integrals
from .errors import ScanFileError, read_json_object
from .readers import FORMATS, read_scan
from .scan import RawScan, images_to_sinogram


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Sizes and indices are JSON integers: 2.7 or true is refused, never truncated (finding 10 of issue 20).
PosInt = Annotated[int, Field(strict=True, gt=0)]
Index = Annotated[int, Field(strict=True, ge=0)]


class RawOptions(_Model):
    shape: tuple[PosInt, PosInt, PosInt]
    dtype: str = "uint16"
    byte_order: Literal["little", "big", "native"] = "little"
    header: int = Field(0, ge=0)


class InputConfig(_Model):
    path: str
    format: Literal[FORMATS] = "auto"   # type: ignore[valid-type]
    flats: Optional[str] = None
    darks: Optional[str] = None
    raw: Optional[RawOptions] = None


class PreprocessConfig(CorrectionKeys):      # + zingers, rings, phase, beam_hardening (corrections_config)
    rows: Optional[tuple[Index, Index]] = None
    cols: Optional[tuple[Index, Index]] = None
    bin: int = Field(1, ge=1, strict=True)
    every: int = Field(1, ge=1, strict=True)
    angle_range_deg: Optional[tuple[float, float]] = None
    ring_filter: int = Field(0, ge=0, strict=True, description="median width in pixels; 0 = off")
    min_transmission: float = Field(1e-4, gt=0, lt=1)
    view_shifts: bool = Field(True, description="apply the per-view shifts the file records (io/view_shifts.py)")

    @field_validator("ring_filter")
    @classmethod
    def _ring(cls, v):
        if v and v < 3:
            raise ValueError("ring_filter must be 0 (off) or a width >= 3 pixels")
        return v


class GeometryConfig(_Model):
    beam: Optional[Literal["cone", "parallel"]] = None     # null: what the file says (cone if it says nothing)
    sid_mm: Optional[float] = Field(None, gt=0)
    sdd_mm: Optional[float] = Field(None, gt=0)
    pixel_size_mm: Optional[tuple[float, float]] = None
    angle_range_deg: float = Field(360.0, gt=0)
    start_angle_deg: float = 0.0
    # "auto": the centre finder; "file": the offset the vendor's file states (Nikon, SkyScan Postalignment)
    detector_offset_u_mm: Union[float, Literal["auto", "file"]] = "auto"
    detector_offset_v_mm: Optional[float] = None    # null: what the file says (Bruker's optical axis), else 0
    volume_shape: Optional[tuple[PosInt, PosInt, PosInt]] = None
    voxel_size_mm: Optional[float] = Field(None, gt=0)
    # a calibrated trajectory JSON (ctbench calibrate) used in place of the circular orbit built here
    trajectory: Optional[str] = None
    # Orientation (ctbench/io/orientation.py); null = what the file says ("auto" where it says nothing).
    image_seen_from: Optional[Literal["source", "detector", "auto"]] = None
    image_columns: Optional[Literal["right", "left"]] = None
    image_rows: Optional[Literal["down", "up"]] = None
    rotation_direction: Optional[Literal["ccw", "cw", "auto"]] = None
    # null: what the file says (SkyScan Image Rotation, Nikon ObjectRoll), else 0
    detector_roll_deg: Optional[float] = Field(None, ge=-45.0, le=45.0, description="in-plane rotation of the detector")


class AlgorithmConfig(_Model):
    name: str = "fbp"
    params: dict = Field(default_factory=dict)


class OutputConfig(_Model):
    path: str
    format: Literal["auto", "tiff", "hdf5", "zarr"] = "auto"
    overwrite: bool = False
    force: bool = Field(False, description="replace an existing output even if ctbench did not write it")


class ReconConfig(_Model):
    """A whole reconstruction, from file to file."""

    version: Literal[1] = 1
    input: InputConfig
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    geometry: GeometryConfig = Field(default_factory=GeometryConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    output: Optional[OutputConfig] = None
    calibrate: Optional[CalibrateConfig] = None   # ctbench calibrate (ctbench/io/calibrate_run.py)


def _explain(e: ValidationError, where) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    return f"{where}: invalid recon config: " + "; ".join(parts)


def parse_config(doc: dict, where: str = "config") -> ReconConfig:
    """A validated :class:`ReconConfig`; ValueError naming every bad field otherwise."""
    try:
        return ReconConfig.model_validate(doc)
    except ValidationError as e:
        raise ValueError(_explain(e, where)) from None


def load_config(path) -> ReconConfig:
    """Read a recon config; relative paths in it are taken relative to the config's folder."""
    path = Path(path)
    # Guarded: a FIFO, device or huge file is refused; JSON nested too deeply is a ScanFileError, not a crash.
    cfg = parse_config(read_json_object(path), str(path))
    base = path.resolve().parent

    def rel(p):
        return None if p is None else str(p if Path(p).is_absolute() else base / p)

    cfg.input.path, cfg.input.flats, cfg.input.darks = rel(cfg.input.path), rel(cfg.input.flats), rel(cfg.input.darks)
    cfg.geometry.trajectory = rel(cfg.geometry.trajectory)
    if cfg.calibrate is not None:
        cfg.calibrate.trajectory, cfg.calibrate.report = rel(cfg.calibrate.trajectory), rel(cfg.calibrate.report)
        cfg.calibrate.known_object = rel(cfg.calibrate.known_object)
    if cfg.output is not None:
        cfg.output.path = rel(cfg.output.path)
    return cfg


def save_config(cfg: ReconConfig, path, *, overwrite: bool = True) -> Path:
    """Write a config as JSON (aside, then renamed into place)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(cfg.model_dump(mode="json"), indent=2))
    tmp.replace(path)
    return path


# ------------------------------------------------------------------ the steps
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
        from .view_shifts import apply_recorded_shifts
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
        from .orientation import roll_detector
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

    from .handedness import ctbench_angles, resolve_orientation

    o = scan_orientation(scan, geo)
    images, shift_v = prep.images, prep.shift_v
    if o.flip_rows:
        images, shift_v = np.ascontiguousarray(images[:, ::-1, :]), -shift_v
    angles = scan_angles(prep, geo, scan.n_views)
    res = resolve_orientation(images, angles, o, scan.orientation.rotation, pitch=prep.pitch[0],
                              pitch_v=prep.pitch[1], sid=sid, sdd=sdd,
                              offset_v_mm=(geo.detector_offset_v_mm or 0.0) + shift_v,
                              search_centre=geo.detector_offset_u_mm == "auto")
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


def run_recon(cfg: ReconConfig, *, log=None) -> dict:
    """Run a config end to end; returns a JSON-able report (the exported path under ``"output"``)."""
    from ..workbench.workflow import ReconRequest, run

    say = log or (lambda msg: None)
    t0 = time.perf_counter()
    if cfg.output is not None:   # refused before any work: an output over the scan, or a foreign file
        from ..output_policy import check_output
        check_output(cfg.output.path, recon_inputs(cfg), overwrite=cfg.output.overwrite, force=cfg.output.force,
                     what="output.path")
        if not Path(cfg.output.path).parent.is_dir():
            raise ScanFileError(cfg.output.path, f"cannot be written: the folder {Path(cfg.output.path).parent} "
                                                 "does not exist")
    request = ReconRequest(cfg.algorithm.name, cfg.algorithm.params).validated()
    scan, prep, sid, sdd, angles, resolved, cfg = oriented_scan(cfg, say)
    centre = resolved.centre
    roll_how = None
    if cfg.geometry.detector_roll_deg:
        if request.algorithm in ("fbp", "fdk"):      # FBP/FDK filters rows: resample onto an unrolled detector instead
            from dataclasses import replace

            from .orientation import unroll_images
            prep = replace(prep, images=unroll_images(prep.images, cfg.geometry.detector_roll_deg, prep.pitch))
            if cfg.geometry.detector_offset_u_mm == "auto":
                centre = find_offset(prep, angles, sid, sdd, cfg.geometry.detector_offset_v_mm)
            cfg = cfg.model_copy(deep=True)
            roll_how = f"images resampled onto an unrolled detector ({cfg.geometry.detector_roll_deg} deg)"
            cfg.geometry.detector_roll_deg = 0.0
        else:
            roll_how = f"detector turned in the trajectory ({cfg.geometry.detector_roll_deg} deg)"
        say(f"detector roll: {roll_how}")
    if cfg.geometry.detector_offset_u_mm == "auto":
        offset_u = centre.offset_mm
        say(centre.text())
    else:
        offset_u = float(cfg.geometry.detector_offset_u_mm) + prep.shift_u
    geometry = build_geometry(prep, cfg.geometry, sid, sdd, angles, offset_u)
    sino = np.ascontiguousarray(images_to_sinogram(prep.images))
    import torch
    finished = run(geometry, torch.from_numpy(sino), request)
    say(f"{request.title()} done in {finished.elapsed:.1f} s")
    report = {"input": scan.describe() | {"angles_deg": None}, "preprocessed_shape": list(prep.images.shape),
              "correction": prep.correction, "centre": None if centre is None else centre.to_dict(),
              "detector_offset_mm": [offset_u, cfg.geometry.detector_offset_v_mm + prep.shift_v],
              "geometry": {"sid_mm": sid, "sdd_mm": sdd, "volume_shape": list(geometry.volume_shape),
                           "voxel_spacing": list(geometry.voxel_spacing), "trajectory": cfg.geometry.trajectory},
              "orientation": resolved.to_dict(), "warnings": list(resolved.warnings), "detector_roll": roll_how,
              "algorithm": finished.metadata(), "output": None}
    if cfg.output is not None:
        from .export import export_volume
        path = export_volume(cfg.output.path, finished.volume, geometry.voxel_spacing, format=cfg.output.format,
                             overwrite=cfg.output.overwrite, force=cfg.output.force,
                             inputs=recon_inputs(cfg), geometry=geometry,
                             meta={"config": cfg.model_dump(mode="json"), "recon": finished.metadata()})
        report["output"] = str(path)
        say(f"wrote {path}")
    report["elapsed_s"] = round(time.perf_counter() - t0, 3)
    report["volume"] = finished.volume        # not JSON: the CLI drops it
    report["geometry_object"] = geometry
    return report


# -------------------------------------------------------------------- the CLI
def register_cli(subparsers) -> None:
    """Add ``ctbench recon CONFIG.json`` to the ``ctbench`` command's subparsers."""
    p = subparsers.add_parser("recon", help="reconstruct a measured scan as described by a JSON config "
                                            "(docs/SCANS.md)")
    p.add_argument("config", help="recon config (JSON)")
    p.add_argument("--out", help="output path (overrides output.path; .tif, .h5 or .zarr)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output that ctbench wrote")
    p.add_argument("--force", action="store_true", help="replace an existing output even if ctbench did not "
                                                        "write it (never an input)")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    import sys

    try:
        cfg = load_config(args.config)
        force = getattr(args, "force", False)
        if args.out:
            cfg.output = OutputConfig(path=args.out, overwrite=args.overwrite or force, force=force)
        elif cfg.output is not None:
            cfg.output.overwrite = cfg.output.overwrite or args.overwrite or force
            cfg.output.force = cfg.output.force or force
        report = run_recon(cfg, log=lambda m: print(m, file=sys.stderr))
    except (ValueError, OSError, RecursionError, MemoryError) as e:
        # Every refused input (ScanFileError, bounds, bad config, a file that cannot be read) is rc 2 with one
        # line, never a traceback (docs/SCANS.md).
        print(f"ctbench recon: {e}", file=sys.stderr)
        return 2
    for w in report.get("warnings", []):
        print(f"ctbench recon: warning: {w}", file=sys.stderr)
    for k in ("volume", "geometry_object"):
        report.pop(k)
    print(json.dumps(report))
    return 0
