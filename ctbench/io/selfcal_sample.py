"""The bundled self-calibration sample: a lab cone-beam scan with a rolled detector, an offset and drift.

Simulated by ctbench (no third-party data): a random ellipsoid object (not a
model the calibration knows) is scanned through the misaligned geometry with
exact line integrals; counts are Poisson around a flat beam, with flats and
darks.  The misalignment is *not* in ``scan.json`` (a scanner would not know
it); ``truth.json`` holds it for checking a calibration.

    write_selfcal_sample("sample_data/selfcal_scan")     # regenerate the bundled copy
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .scan import sinogram_to_images
from .sample_scan import write_scan_folder
from .scanner import scanner_json


@dataclass(frozen=True)
class SelfCalSpec:
    n_views: int = 90
    detector_u: int = 64          # columns
    detector_v: int = 56          # rows
    pitch: float = 2.0            # mm
    sid: float = 300.0
    sdd: float = 600.0
    offset_u_px: float = 2.4
    roll_deg: float = 0.5
    drift_rms_px: float = 1.2
    detector_pitch_deg: float = 0.0   # detector turned about its u axis (the calibration's "pitch")
    sdd_error_mm: float = 0.0         # the true source-detector distance minus the stated one
    i0: float = 20000.0
    dark_level: float = 100.0
    n_flats: int = 4
    n_darks: int = 2
    seed: int = 26


def selfcal_object(spec: SelfCalSpec):
    """The sample's object (random ellipsoids, mm, centred on the isocentre): what a known-object calibration
    of the sample is given, sampled on its reconstruction grid."""
    from ..calibration.simulate import random_object

    field_mm = spec.detector_u * spec.pitch * spec.sid / spec.sdd
    return random_object(0.38 * field_mm, seed=spec.seed)


def _scan(spec: SelfCalSpec):
    import torch

    from ..calibration.model import GeometryModel
    from ..calibration.simulate import gauge_free_walk, true_trajectory
    from ..geometry import circular_trajectory_3d
    from ..phantoms import ellipsoid_projections

    nominal = circular_trajectory_3d(spec.n_views, spec.sid, spec.sdd, dtype=torch.float64)
    pitch = (spec.pitch, spec.pitch)
    walk = gauge_free_walk(GeometryModel(nominal, pitch), spec.drift_rms_px, seed=spec.seed,
                           offsets_free=("offset_u",))
    truth = {"offset_u": spec.offset_u_px, "roll": spec.roll_deg}
    truth |= {k: v for k, v in (("pitch", spec.detector_pitch_deg), ("sdd", spec.sdd_error_mm)) if v}
    traj = true_trajectory(nominal, pitch, truth, walk)
    ells = selfcal_object(spec)
    line = ellipsoid_projections(ells, traj, (spec.detector_u, spec.detector_v), pitch).numpy()
    return line, truth, {k: v.tolist() for k, v in walk.items()}


def write_selfcal_sample(folder, spec: SelfCalSpec = SelfCalSpec(), *, overwrite: bool = False) -> Path:
    """Simulate the scan and write a lab-scanner folder (aside, then renamed into place)."""
    folder = Path(folder)
    if folder.exists() and not overwrite:
        raise FileExistsError(f"{folder} exists; pass overwrite=True to replace it")
    rng = np.random.default_rng(spec.seed)
    line, truth, walk = _scan(spec)
    images = sinogram_to_images(line)                       # (view, row, col)
    V, U = spec.detector_v, spec.detector_u
    dark = np.full((V, U), spec.dark_level)

    def frames(mean):
        counts = rng.poisson(mean) + dark + rng.normal(0.0, 2.0, mean.shape)
        return np.clip(np.rint(counts), 0, 65535).astype(np.uint16)

    proj = frames(spec.i0 * np.exp(-images))
    flats = frames(np.full((spec.n_flats, V, U), spec.i0))
    darks = frames(np.zeros((spec.n_darks, V, U)))
    doc = scanner_json(sid=spec.sid, sdd=spec.sdd, pixel_size=(spec.pitch, spec.pitch), n_projections=spec.n_views,
                       scanner="ctbench simulated misaligned cone-beam scan (self-calibration sample)",
                       acquisition={"n_flats": spec.n_flats, "n_darks": spec.n_darks})
    truth_doc = json.dumps({"spec": asdict(spec), "parameters": truth, "shifts_px": walk}, indent=1)
    config = {"input": {"path": "."},
              "geometry": {"detector_offset_u_mm": 0.0, "trajectory": "calibrated_trajectory.json"},
              "algorithm": {"name": "cgls", "params": {"n_iter": 15}},
              "output": {"path": "../selfcal_recon.tif"},   # beside the scan folder: an output may not lie in its input
              "calibrate": {"free": ["offset_u", "roll", "shift"], "levels": [2, 1], "n_outer": [8, 3],
                            "trajectory": "calibrated_trajectory.json", "report": "calibration_report.json"}}
    return write_scan_folder(folder, proj, flats, darks, doc,
                             {"truth.json": truth_doc, "calibrate.json": json.dumps(config, indent=2)})
