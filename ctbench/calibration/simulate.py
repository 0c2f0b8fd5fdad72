"""Misaligned scans of objects the calibration does not know: for tests, benchmarks, the sample and the docs.

The object is a random cluster of ellipsoids; its projections are exact line
integrals (:func:`ctbench.phantoms.ellipsoid_projections`) through the *true*
geometry, with Poisson noise, so neither the object nor the discretisation of
the reconstruction is known to the calibration.
"""

from __future__ import annotations

import math

import torch

from ..phantoms import Ellipsoid, ellipsoid_projections, ellipsoids_volume
from .model import GeometryModel, complement_basis

__all__ = ["random_object", "gauge_free_walk", "true_trajectory", "simulate_scan", "object_volume"]


def random_object(radius_mm: float, n: int = 14, *, seed: int = 0, attenuation: float = 0.02) -> list[Ellipsoid]:
    """``n`` random ellipsoids (mm) inside a ball of ``radius_mm``: a body, inclusions and a few dense grains."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    r = float(radius_mm)
    ells = [Ellipsoid.from_euler(attenuation, (0.85 * r, 0.7 * r, 0.8 * r), (0.0, 0.0, 0.0), phi=20.0)]
    for i in range(n - 1):
        size = r * (0.06 + 0.18 * float(rnd(())))
        axes = tuple(size * (0.5 + float(a)) for a in rnd(3))
        d = r * 0.55 * float(rnd(())) ** 0.5
        direction = torch.nn.functional.normalize(rnd(3) - 0.5, dim=0)
        centre = tuple(float(c) for c in d * direction)
        value = attenuation * (0.5 + 1.5 * float(rnd(()))) * (1 if i % 3 else -0.6)
        ells.append(Ellipsoid.from_euler(value, axes, centre, phi=float(360 * rnd(())), theta=float(180 * rnd(())),
                                         psi=float(360 * rnd(()))))
    return ells


def object_volume(ellipsoids, projector, supersample: int = 3) -> torch.Tensor:
    """The object on the projector's voxel grid (the truth a reconstruction is compared with)."""
    return ellipsoids_volume(ellipsoids, projector.global_volume_shape, projector.voxel_spacing, scale=1.0,
                             supersample=supersample, dtype=torch.float64)


def gauge_free_walk(model: GeometryModel, rms_px: float, *, seed: int = 0, components=("shift_u", "shift_v"),
                    offsets_free=("offset_u", "offset_v")) -> dict:
    """A random walk of per-view shifts with ``rms_px`` RMS, with the components the data cannot see
    (a fixed object translation, the mean where the offset is free) removed, as the calibration reports them."""
    g = torch.Generator().manual_seed(seed)
    n = model.n_views
    steps = torch.randn(len(components) * n, generator=g, dtype=torch.float64)
    walk = torch.cat([steps[i * n:(i + 1) * n].cumsum(0) for i in range(len(components))])
    B = complement_basis(model.gauge_vectors(tuple(components), tuple(offsets_free)))
    walk = B @ (B.T @ walk)
    walk = walk * (rms_px / float(walk.square().mean().sqrt()))
    return {k: walk[i * n:(i + 1) * n] for i, k in enumerate(components)}


def true_trajectory(nominal, pitch, values: dict, shifts: dict | None = None):
    model = GeometryModel(nominal, pitch)
    shifts = shifts or {}
    g = {k: torch.tensor(float(v), dtype=torch.float64) for k, v in values.items()}
    return model.apply(g, shifts.get("shift_u"), shifts.get("shift_v"), dtype=torch.float64)


def simulate_scan(projector, ellipsoids, values: dict, shifts: dict | None = None, *, photons: float = 2e4,
                  seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Line integrals of ``ellipsoids`` through the true geometry (``values``, ``shifts`` around the
    projector's nominal trajectory), with Poisson noise of ``photons`` per unattenuated pixel (0: none)."""
    traj = true_trajectory(projector.trajectory, projector.detector_spacing, values, shifts)
    p = ellipsoid_projections(ellipsoids, traj, projector.detector_shape, projector.detector_spacing, scale=1.0)
    if photons:
        g = torch.Generator().manual_seed(seed)
        counts = torch.poisson(photons * torch.exp(-p), generator=g)
        p = -torch.log(counts.clamp_min(1.0) / photons)
    return p.to(dtype)


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return math.sqrt(float((a.to(torch.float64) - b.to(torch.float64)).square().mean()))
