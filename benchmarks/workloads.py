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


# G1: the GPU workload of issue 16 (diffct's published A100 case): circular cone
# beam, 512^3 volume of 1 mm voxels, 360 views over 360 degrees, 1024x768
# detector of 1.2 mm pixels, SID 1000, SDD 1500, float32.
G1 = dict(n_views=360, volume_shape=(512, 512, 512), voxel_spacing=1.0, detector_shape=(1024, 768),
          detector_spacing=1.2, sid=1000.0, sdd=1500.0, angle_range=2 * math.pi, dtype=torch.float32)


def g1_geometry(scale: float = 1.0, n_views: int | None = None) -> dict:
    """G1's arguments; ``scale`` < 1 shrinks volume and detector (same field of view) for rehearsals."""
    g = G1
    n = max(8, int(round(g["volume_shape"][0] * scale)))
    du, dv = (max(8, int(round(s * scale))) for s in g["detector_shape"])
    return dict(n_views=n_views or g["n_views"], volume_shape=(n, n, n), voxel_spacing=g["voxel_spacing"] / scale,
                detector_shape=(du, dv), detector_spacing=g["detector_spacing"] / scale, sid=g["sid"],
                sdd=g["sdd"], dtype=g["dtype"])


def g1_projector(backend: str = "cuda", scale: float = 1.0, n_views: int | None = None, **options) -> Projector:
    g = g1_geometry(scale, n_views)
    traj = circular_trajectory_3d(g["n_views"], g["sid"], g["sdd"], dtype=g["dtype"])
    return Projector(traj, g["volume_shape"], g["detector_shape"], voxel_spacing=g["voxel_spacing"],
                     detector_spacing=g["detector_spacing"], backend=backend, **options)
