"""Small scans with known phantoms, and the projector as a dense matrix: the independent references
of the iterative-solver tests (tests/test_iterative.py, tests/test_ordered_subsets.py)."""

from __future__ import annotations

import numpy as np
import torch

from ctbench import Projector, circular_trajectory_2d_fan, circular_trajectory_3d
from ctbench.phantoms import Ellipsoid, ellipsoid_phantom

F64 = torch.float64


def small_2d(dtype=F64, n_views=24, size=16, det=24):
    """A fan-beam scan of two ellipses: (projector, true image, its sinogram)."""
    traj = circular_trajectory_2d_fan(n_views, 60.0, 120.0, dtype=dtype)
    p = Projector(traj, (size, size), det, voxel_spacing=1.0, detector_spacing=1.5)
    ells = [Ellipsoid(1.0, (6.0, 5.0, 6.0), (0.5, -0.5, 0.0)), Ellipsoid(0.5, (2.0, 2.0, 2.0), (-2.0, 2.0, 0.0))]
    x_true = ellipsoid_phantom(ells, (size, size), 1.0, scale=1.0, dtype=dtype)
    return p, x_true, p.project(x_true)


def small_3d(dtype=F64, n_views=24):
    """A cone-beam scan of one ellipsoid: (projector, true volume, its sinogram)."""
    traj = circular_trajectory_3d(n_views, 60.0, 120.0, dtype=dtype)
    p = Projector(traj, (8, 12, 12), (16, 10), voxel_spacing=1.0, detector_spacing=1.6)
    x_true = ellipsoid_phantom([Ellipsoid(1.0, (4.0, 4.5, 3.0))], (8, 12, 12), 1.0, scale=1.0, dtype=dtype)
    return p, x_true, p.project(x_true)


def dense_matrix(p: Projector) -> np.ndarray:
    """The projector as a dense matrix, one column per voxel."""
    n = int(np.prod(p.volume_shape))
    cols = []
    for j in range(n):
        e = torch.zeros(n, dtype=F64)
        e[j] = 1.0
        cols.append(p.project(e.reshape(p.volume_shape)).reshape(-1).numpy())
    return np.stack(cols, axis=1)
