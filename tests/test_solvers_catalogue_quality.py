"""On a simulated low-dose scan (Poisson counts, 300 photons per unattenuated ray) the statistical solvers beat
unweighted CGLS at its best iteration: OS-EM and PWLS reach a lower RMSE against the phantom."""

from __future__ import annotations

import pytest
import torch

from ctbench import Projector, circular_trajectory_2d_fan
from ctbench.phantoms import Ellipsoid, ellipsoid_phantom
from ctbench.solvers import cgls_iterations, osem_iterations, pwls

F64 = torch.float64
FLAT = 300.0


@pytest.fixture(scope="module")
def low_dose():
    n = 32
    P = Projector(circular_trajectory_2d_fan(60, 80.0, 160.0, dtype=F64), (n, n), 64, voxel_spacing=1.0,
                  detector_spacing=1.0)
    ells = [Ellipsoid(0.1, (13.0, 11.0, 13.0), (0.0, 0.0, 0.0)), Ellipsoid(0.05, (4.0, 4.0, 4.0), (-4.0, 4.0, 0.0)),
            Ellipsoid(-0.04, (3.0, 5.0, 3.0), (5.0, -3.0, 0.0))]
    x = ellipsoid_phantom(ells, (n, n), 1.0, scale=1.0, dtype=F64)
    b = P.project(x)
    assert 2.0 < float(b.max()) < 4.0          # ~300 photons in, ~15 out through the middle
    counts = torch.poisson(FLAT * torch.exp(-b), generator=torch.Generator().manual_seed(0))
    line_integrals = -torch.log(counts.clamp(min=1.0) / FLAT)
    best_cgls = min(_rmse(s.volume, x) for s in cgls_iterations(P, line_integrals, 30))
    return P, x, counts, best_cgls


def _rmse(v, x):
    return float((v - x).square().mean().sqrt())


def test_osem_beats_the_best_cgls_iterate(low_dose):
    P, x, counts, best_cgls = low_dose
    best_osem = min(_rmse(s.volume, x) for s in osem_iterations(P, counts, FLAT, 12, n_subsets=6))
    assert best_osem < 0.8 * best_cgls


def test_pwls_beats_the_best_cgls_iterate(low_dose):
    P, x, counts, best_cgls = low_dose
    r = pwls(P, counts.clamp(min=1.0), FLAT, 60, penalty="huber", lam=0.5, delta=0.005)
    assert _rmse(r.volume, x) < 0.7 * best_cgls
