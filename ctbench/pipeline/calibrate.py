"""``ctbench calibrate CONFIG.json``: calibrate a measured scan's geometry from its own data.

Reads, preprocesses and builds the nominal geometry exactly as ``ctbench recon``
does, runs :func:`ctbench.calibration.calibrate` with the config's
``calibrate`` section, and writes the calibrated trajectory JSON and a report
(each written aside and renamed into place).  ``calibrate.known_object`` (a
volume file) makes it reproject that object instead of reconstructing.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..atomic_files import atomic_write_bytes
from ..json_report import dumps as strict_json
from .calibrate_config import CalibrateConfig
from ..io.scan import images_to_sinogram
from .calibrate_known import read_known_object
from .config import ReconConfig
from .steps import build_geometry, oriented_scan


def _rel(cfg_path: Path | None, p: str) -> Path:
    p = Path(p)
    return p if p.is_absolute() or cfg_path is None else cfg_path.resolve().parent / p


def run_calibrate(cfg: ReconConfig, *, config_path=None, log=None, cancel=None) -> dict:
    """Run the config's calibration; returns the report dict (with paths of what was written)."""
    import torch

    from ..calibration import calibrate

    say = log or (lambda msg: None)
    cal = cfg.calibrate or CalibrateConfig()
    traj_path, report_path = _rel(config_path, cal.trajectory), _rel(config_path, cal.report)
    for p in (traj_path, report_path):
        if p.exists() and not cal.overwrite:
            raise FileExistsError(f"{p} exists; set calibrate.overwrite to replace it")
    t0 = time.perf_counter()
    known = None
    if cal.known_object is not None:      # read (and refused) before the scan's preprocessing, not after it
        known, grid = read_known_object(_rel(config_path, cal.known_object), cfg.geometry)
        say(f"known object {cal.known_object}: {known.shape} voxels of {grid.voxel_size_mm:g} mm")
    scan, prep, sid, sdd, angles, resolved, cfg = oriented_scan(cfg, say)
    if cfg.geometry.detector_offset_u_mm == "auto":
        centre = resolved.centre
        offset_u = centre.offset_mm
        say(centre.text())
    else:
        offset_u = float(cfg.geometry.detector_offset_u_mm) + prep.shift_u
    # Calibrate from the nominal geometry: geometry.trajectory names this run's *output* for ctbench recon.
    update = {"trajectory": None}
    if known is not None:                 # the known object's grid is the calibration's
        update |= {"voxel_size_mm": grid.voxel_size_mm, "volume_shape": grid.volume_shape}
    geo_cfg = cfg.geometry.model_copy(update=update)
    geometry = build_geometry(prep, geo_cfg, sid, sdd, angles, offset_u)
    sino = torch.from_numpy(np.ascontiguousarray(images_to_sinogram(prep.images)))
    P = geometry.projector(backend=cal.backend)
    say(f"calibrating {', '.join(cal.free)} on {tuple(sino.shape)} line integrals")
    res = calibrate(P, sino, cal.free, bounds=cal.bounds or None, start=cal.start, levels=tuple(cal.levels),
                    n_outer=tuple(cal.n_outer), n_inner=cal.n_inner, smoothness=cal.smoothness, cancel=cancel,
                    known_object=None if known is None else torch.from_numpy(known),
                    callback=lambda s: say(f"  step {s.iteration} (binning {s.binning}): loss {s.loss:.4g}"))
    say(res.table())
    report = res.to_dict()
    report["orientation"], report["warnings"] = resolved.to_dict(), list(resolved.warnings)
    report["known_object"] = None if known is None else str(_rel(config_path, cal.known_object))
    report["elapsed_s"] = round(time.perf_counter() - t0, 3)
    report["trajectory"], report["report"] = str(traj_path), str(report_path)
    report["nominal_detector_offset_mm"] = [offset_u, cfg.geometry.detector_offset_v_mm + prep.shift_v]
    atomic_write_bytes(traj_path, res.trajectory.to_json().encode())
    atomic_write_bytes(report_path, strict_json(report, indent=1).encode())   # NaN/inf as null + note
    say(f"wrote {traj_path} and {report_path}")
    return report
