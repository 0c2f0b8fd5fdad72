"""Benchmark workloads shared by the benchmark scripts (one definition each)."""

from __future__ import annotations

import math

import torch

from ctbench import Projector, circular_trajectory_3d

# W1: circular cone beam, 128^3 volume of 2 mm voxels, 180 views over 360
# degrees, 128x128 detector of 4 mm pixels, SID 600, SDD 1200, float32.
W1 = dict(n_views=180, volume_shape=(128, 128, 128), voxel_spacing=2.0, detector_shape=(128, 128),
          detector_spacing=4.0, sid=600.0, sdd=1200.0, angle_range=2 * math.pi, dtype=torch.float32)


def w1_projector(backend: str = "cpu", scale: float = 1.0, **options) -> Projector:
    """The W1 projector; ``scale`` < 1 shrinks volume and detector for quick runs."""
    w = W1
    n = max(8, int(round(w["volume_shape"][0] * scale)))
    nd = max(8, int(round(w["detector_shape"][0] * scale)))
    traj = circular_trajectory_3d(w["n_views"], w["sid"], w["sdd"], angle_range=w["angle_range"], dtype=w["dtype"])
    return Projector(traj, (n, n, n), (nd, nd), voxel_spacing=w["voxel_spacing"] / scale,
                     detector_spacing=w["detector_spacing"] / scale, backend=backend, **options)
