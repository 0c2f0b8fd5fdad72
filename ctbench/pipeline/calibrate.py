"""``ctbench calibrate CONFIG.json``: calibrate a measured scan's geometry from its own data.

Reads, preprocesses and builds the nominal geometry exactly as ``ctbench recon``
does, runs :func:`ctbench.calibration.calibrate` with the config's
``calibrate`` section, and writes the calibrated trajectory JSON and a report.
``calibrate.known_object`` (a volume file) makes it reproject that object
instead of reconstructing.

Both files follow the output policy (:mod:`ctbench.output_policy`), checked
before the scan is read: neither may be the scan, its flats or darks, the
known object or the config file, nor replace a file inside a scan folder that
ctbench did not write (a new file beside the scan's files is fine); they may
not be one path; an existing file
is replaced only with ``overwrite`` and only if ctbench wrote it (``force``:
anything but an input).  Both are reserved before the work
(:class:`~ctbench.output_policy.FileReservation`: a staging file created
exclusively beside each and the expected bytes allocated), so a missing,
read-only, unwritable or full location stops the command at once, not after
the calibration; each is then committed by one swap (old file or new, never a
mixture), and any failure leaves no staging file behind.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np

from ..json_report import dumps as strict_json
from ..output_policy import FileReservation, check_overlap
from .calibrate_config import CalibrateConfig
from ..io.scan import images_to_sinogram
from .calibrate_known import read_known_object
from .config import ReconConfig
from .steps import build_geometry, oriented_scan


def _rel(cfg_path: Path | None, p: str) -> Path:
    p = Path(p)
    return p if p.is_absolute() or cfg_path is None else cfg_path.resolve().parent / p


# What each output is reserved for before the work (bytes): a JSON file of a few numbers per view.
_RESERVE_BASE, _RESERVE_PER_VIEW = 64 << 10, 2 << 10
# The calibration holds its estimate on the full grid at the end (the final loss reprojects it there) beside
# its resampled copy and the coarse levels' volumes; the sinogram, its binned levels and their residuals.
_VOLUME_COPIES, _SINOGRAM_COPIES = 3.0, 6.0


def check_memory(volume_shape, sinogram_shape, itemsize: int, memory=None) -> None:
    """Refuse a calibration whose arrays cannot fit ``memory`` (``resources.memory``; default: 80% of the
    memory available) before anything is allocated: a clear error instead of "Unable to allocate 1.16 TiB"."""
    from ..engine.plan import format_bytes        # here, not at the top: ctbench --help loads no torch
    from .budget import BudgetError, default_budget, parse_budget

    voxels = math.prod(int(s) for s in volume_shape)
    values = math.prod(int(s) for s in sinogram_shape)
    need = (_VOLUME_COPIES * voxels + _SINOGRAM_COPIES * values) * int(itemsize)
    cap = parse_budget(memory, "resources.memory") or default_budget()
    if need > cap:
        raise BudgetError(f"the calibration needs about {format_bytes(need)} for a {tuple(volume_shape)} volume grid "
                          f"and {tuple(sinogram_shape)} line integrals, more than the {format_bytes(cap)} it may use "
                          "(resources.memory, default 80% of the memory available): give a coarser grid "
                          "(geometry.voxel_size_mm, geometry.volume_shape), bin or crop the detector (preprocess.bin, "
                          "rows, cols), or raise resources.memory")


def calibrate_inputs(cfg: ReconConfig, config_path=None) -> list[Path]:
    """Every file a calibration reads: its outputs may not be, contain or lie inside any of them."""
    cal = cfg.calibrate or CalibrateConfig()
    paths = [cfg.input.path, cfg.input.flats, cfg.input.darks,
             None if cal.known_object is None else _rel(config_path, cal.known_object), config_path]
    return [Path(p) for p in paths if p]


def _reserve_outputs(cfg: ReconConfig, cal: CalibrateConfig, config_path) -> tuple[FileReservation, FileReservation]:
    """The policy applied to both outputs and their space reserved (before any long work)."""
    traj_path, report_path = _rel(config_path, cal.trajectory), _rel(config_path, cal.report)
    try:
        check_overlap(report_path, [traj_path])
    except ValueError:
        raise ValueError(f"calibrate.trajectory and calibrate.report name the same file ({traj_path}); one would "
                         "replace the other: give two paths") from None
    inputs = calibrate_inputs(cfg, config_path)
    for key, p in (("calibrate.trajectory", traj_path), ("calibrate.report", report_path)):
        check_overlap(p, inputs, new_file_inside=True, what=key)    # an input: refused whatever overwrite says
        if os.path.lexists(p) and not (cal.overwrite or cal.force):
            raise FileExistsError(f"{key} {p} exists; set calibrate.overwrite (--overwrite) to replace it")
    # beside the scan's files in its folder is fine (the bundled sample does so), over one of them never
    traj = FileReservation(traj_path, inputs, overwrite=cal.overwrite, force=cal.force, what="calibrate.trajectory",
                           reserve_bytes=_RESERVE_BASE, new_file_inside=True)
    try:
        report = FileReservation(report_path, inputs, overwrite=cal.overwrite, force=cal.force,
                                 what="calibrate.report", reserve_bytes=_RESERVE_BASE, new_file_inside=True)
    except BaseException:
        traj.discard()
        raise
    return traj, report


def run_calibrate(cfg: ReconConfig, *, config_path=None, log=None, cancel=None) -> dict:
    """Run the config's calibration; returns the report dict (with paths of what was written)."""
    cal = cfg.calibrate or CalibrateConfig()
    traj_out, report_out = _reserve_outputs(cfg, cal, config_path)
    with traj_out, report_out:          # leaving without a commit removes both staging files
        return _calibrate(cfg, cal, config_path, traj_out, report_out, log, cancel)


def _calibrate(cfg, cal, config_path, traj_out: FileReservation, report_out: FileReservation, log, cancel) -> dict:
    import torch

    from ..calibration import calibrate

    say = log or (lambda msg: None)
    traj_path, report_path = traj_out.path, report_out.path
    t0 = time.perf_counter()
    known = None
    if cal.known_object is not None:      # read (and refused) before the scan's preprocessing, not after it
        known, grid = read_known_object(_rel(config_path, cal.known_object), cfg.geometry)
        say(f"known object {cal.known_object}: {known.shape} voxels of {grid.voxel_size_mm:g} mm")
    scan, prep, sid, sdd, angles, resolved, cfg = oriented_scan(cfg, say)
    need = _RESERVE_BASE + _RESERVE_PER_VIEW * int(prep.images.shape[0])
    traj_out.reserve(need)                # a disk too full for the results is an error now, not after the work
    report_out.reserve(need)
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
    check_memory(geometry.volume_shape, images_to_sinogram(prep.images).shape, 4, cfg.resources.memory)
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
    traj_out.commit(res.trajectory.to_json().encode())
    report_out.commit(strict_json(report, indent=1).encode())   # NaN/inf as null + note
    say(f"wrote {traj_path} and {report_path}")
    return report
