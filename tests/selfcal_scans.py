"""Misaligned scans for the self-calibration tests: a random ellipsoid object (not a model the
calibration knows), exact line integrals through the true geometry, Poisson noise."""

from __future__ import annotations

import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.calibration.model import GeometryModel
from ctbench.calibration.simulate import gauge_free_walk, random_object, simulate_scan


def cone_scan(size=64, views=90, det=64, seed=1):
    """A W1-shaped cone-beam scan scaled down: (projector, object ellipsoids)."""
    traj = circular_trajectory_3d(views, 600.0, 1200.0)
    P = Projector(traj, (size, size, size), (det, det), voxel_spacing=256.0 / size,
                  detector_spacing=512.0 / det, backend="cpu")
    return P, random_object(0.4 * 256, seed=seed)


def symmetric_object():
    """Ellipsoids symmetric top to bottom (z -> -z): a known object that must give no pitch and no vertical
    offset (tests/test_selfcal_known_bias.py, tests/test_selfcal_rounding.py)."""
    from ctbench.phantoms import Ellipsoid

    return [Ellipsoid.from_euler(0.02, (80.0, 70.0, 75.0), (0.0, 0.0, 0.0), phi=20.0),
            Ellipsoid.from_euler(0.03, (20.0, 25.0, 15.0), (30.0, -10.0, 40.0), phi=30.0),
            Ellipsoid.from_euler(0.03, (20.0, 25.0, 15.0), (30.0, -10.0, -40.0), phi=30.0)]


def misaligned(P, ells, values, walk_rms=0.0, photons=2e4, seed=2):
    """(sinogram, true shifts or None) of the object through the misaligned geometry."""
    shifts = None
    if walk_rms:
        shifts = gauge_free_walk(GeometryModel(P.trajectory, P.detector_spacing), walk_rms, seed=seed,
                                 offsets_free=tuple(k for k in ("offset_u", "offset_v") if k in values))
    return simulate_scan(P, ells, values, shifts, photons=photons, seed=seed), shifts


def rms(t) -> float:
    return float(torch.as_tensor(t, dtype=torch.float64).square().mean().sqrt())


def estimate_of(res, name):
    """(value, 1-sd) of a global parameter: from the table when estimated, from its note when held as "not
    determined by this scan" (the note keeps the estimate); None when neither."""
    import re

    for p in res.parameters:
        if p.name == name and p.value is not None:
            return p.value, p.uncertainty
    for n in res.notes:
        found = re.match(rf"{name}: not determined by this scan \(its estimate (\S+) has a 1-sd uncertainty of (\S+) ", n)
        if found:
            return float(found.group(1)), float(found.group(2))
    return None
