"""The CPU forward kernel's layouts: beams of neighbouring rays traced in lockstep, the
x/y-swapped slab copy read by x-dominant rays, prefetch past the walk's end.

Independent truth: the reference backend (pure torch) on the same geometry, in
float64, for views of every direction (x-dominant, y-dominant and mixed at
45 degrees), detector rows whose length is not a multiple of the beam width,
rays that enter the volume through its sides (different interior ranges within
a beam), a thin z-slab, and a batch, which must equal its items bitwise.
"""

from __future__ import annotations

import math

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d

F64 = torch.float64


@pytest.mark.parametrize("det", [(30, 22), (33, 7)])
def test_cpu_forward_matches_reference_in_every_direction(det):
    angles = torch.tensor([0.0, 0.3, math.pi / 4, 1.2, math.pi / 2, 2.0, 3 * math.pi / 4, math.pi, 4.0, 5.5],
                          dtype=F64)
    traj = circular_trajectory_3d(angles.numel(), 60.0, 120.0, angles=angles, dtype=F64)
    kw = dict(voxel_spacing=(1.0, 1.1, 0.9), detector_spacing=(2.3, 1.9))
    shape = (12, 20, 18)
    cpu = Projector(traj, shape, det, backend="cpu", **kw)
    ref = Projector(traj, shape, det, backend="reference", **kw)
    g = torch.Generator().manual_seed(3)
    x = torch.rand((2, *shape), generator=g, dtype=F64)
    p_cpu, p_ref = cpu.project(x), ref.project(x)
    assert float((p_cpu - p_ref).abs().max()) <= 1e-11 * float(p_ref.abs().max())
    # the detector is wider than the volume: some rays of a beam miss, some enter through the sides
    assert bool((p_ref == 0).any()) and bool((p_ref > 0).any())
    for q in range(2):
        assert torch.equal(cpu.project(x[q]), p_cpu[q])
    # adjoint of the same kernel pair still exact
    y = torch.rand(p_cpu.shape[1:], generator=g, dtype=F64)
    lhs = float((cpu.project(x[0]) * y).sum())
    rhs = float((x[0] * cpu.backproject(y)).sum())
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)


def test_cpu_forward_float32_matches_float64_on_a_w1_like_scan():
    traj = circular_trajectory_3d(24, 150.0, 300.0)
    p32 = Projector(traj, (32, 32, 32), (32, 32), voxel_spacing=2.0, detector_spacing=4.0, backend="cpu")
    p64 = Projector(traj.to(dtype=F64), (32, 32, 32), (32, 32), voxel_spacing=2.0, detector_spacing=4.0,
                    backend="reference")
    x = torch.rand((32, 32, 32), generator=torch.Generator().manual_seed(0))
    a, b = p32.project(x).double(), p64.project(x.double())
    assert float((a - b).abs().max()) <= 2e-5 * float(b.abs().max())
