"""``ctbench recon CONFIG.json``: read a scan, preprocess it, attach a geometry, reconstruct, export.

The config is described in :mod:`ctbench.pipeline.config`; the steps shared with ``ctbench calibrate`` are
in :mod:`ctbench.pipeline.steps`.  The same run serves the command line, the napari "Scan import" widget
(which saves its current settings as such a config) and scripts::

    cfg = load_config("recon.json")
    report = run_recon(cfg)

The output follows :mod:`ctbench.output_policy`, checked before the scan is
read: it may not be, contain or lie inside the scan, its flats or darks;
``overwrite`` replaces only what ctbench wrote, ``force`` anything else.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..io.errors import ScanFileError
from ..io.scan import images_to_sinogram
from .config import ReconConfig
from .steps import build_geometry, find_offset, oriented_scan, recon_inputs


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

            from ..io.orientation import unroll_images
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
        from ..io.export import export_volume
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
