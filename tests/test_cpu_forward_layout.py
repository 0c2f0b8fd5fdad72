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
from ctbench.engine.cpu import backend as cpu_backend
from kernel_builds import joseph_library_for

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


@pytest.mark.slow
def test_cpu_forward_float32_matches_float64_on_a_w1_like_scan():
    traj = circular_trajectory_3d(24, 150.0, 300.0)
    p32 = Projector(traj, (32, 32, 32), (32, 32), voxel_spacing=2.0, detector_spacing=4.0, backend="cpu")
    p64 = Projector(traj.to(dtype=F64), (32, 32, 32), (32, 32), voxel_spacing=2.0, detector_spacing=4.0,
                    backend="reference")
    x = torch.rand((32, 32, 32), generator=torch.Generator().manual_seed(0))
    a, b = p32.project(x).double(), p64.project(x.double())
    assert float((a - b).abs().max()) <= 2e-5 * float(b.abs().max())


# float32 runs the vector-lane path where the build has AVX-512 (16 rays per group) or
# AVX2 (8): the detector rows below are 37 and 21 pixels long (full groups plus tails of
# 5 and 5 lanes), wider than the volume (lanes that miss, lanes entering through the
# sides, so lanes of one group have different interiors), at every view direction.
def _lane_case(det=(37, 21), n_views=10):
    angles = torch.tensor([0.0, 0.3, math.pi / 4, 1.2, math.pi / 2, 2.0, 3 * math.pi / 4, math.pi, 4.0, 5.5],
                          dtype=F64)[:n_views]
    traj = circular_trajectory_3d(angles.numel(), 60.0, 120.0, angles=angles, dtype=F64)
    kw = dict(voxel_spacing=(1.0, 1.1, 0.9), detector_spacing=(2.0, 1.6))
    return traj, (14, 24, 22), det, kw


def test_cpu_forward_float32_lanes_match_reference_in_every_direction():
    traj, shape, det, kw = _lane_case()
    cpu = Projector(traj.to(dtype=torch.float32), shape, det, backend="cpu", **kw)
    ref = Projector(traj, shape, det, backend="reference", **kw)
    g = torch.Generator().manual_seed(5)
    x = torch.rand((2, *shape), generator=g, dtype=F64)
    p32, p_ref = cpu.project(x.float()), ref.project(x)
    assert p32.dtype == torch.float32
    assert bool((p_ref == 0).any()) and bool((p_ref > 0).any())
    err = (p32.double() - p_ref).abs()
    assert float(err.max()) <= 1e-5 * float(p_ref.abs().max())
    # every pixel, not just the largest: a lane computed from the wrong ray would show here
    assert bool((err <= 1e-5 * p_ref.abs() + 1e-6 * float(p_ref.abs().max())).all())
    for q in range(2):
        assert torch.equal(cpu.project(x[q].float()), p32[q])
    y = torch.rand(p32.shape[1:], generator=g, dtype=F64)
    lhs = float((cpu.project(x[0].float()).double() * y).sum())
    rhs = float((x[0] * cpu.backproject(y.float()).double()).sum())
    assert abs(lhs - rhs) <= 1e-5 * abs(lhs)


def test_cpu_forward_float32_lanes_on_z_slabs_sum_to_whole():
    """Slab windows (rays cut by the slab's z range, group planes offset by z0) in float32."""
    traj, shape, det, kw = _lane_case(det=(19, 17), n_views=6)
    from ctbench.engine import Rays, Tile, VolumeGrid, get_backend
    grid = VolumeGrid(shape, (0.9, 1.1, 1.0))
    t32 = traj.to(dtype=torch.float32)
    rays = Rays(t32.source, t32.detector_center, t32.detector_u * 1.3, t32.detector_v * 1.1, True, det)
    be, ref = get_backend("cpu"), get_backend("reference")
    vol = torch.rand(1, *shape, generator=torch.Generator().manual_seed(2), dtype=F64)
    tile = Tile.full(det)
    total = torch.zeros(1, traj.n_views, *det, dtype=torch.float32)
    for z0, z1 in [(0, 3), (3, 4), (4, 11), (11, 14)]:
        part = be.project(vol[:, z0:z1].float().contiguous(), grid, z0, rays, tile)
        want = ref.project(vol[:, z0:z1].contiguous(), grid, z0, rays.to(dtype=F64), tile)
        assert float((part.double() - want).abs().max()) <= 1e-5 * float(want.abs().max()) + 1e-7
        total += part
    whole = ref.project(vol, grid, 0, rays.to(dtype=F64), tile)
    assert float((total.double() - whole).abs().max()) <= 2e-5 * float(whole.abs().max())


# The lane code is chosen at compile time: each instruction set the host can run is
# built here (outside the kernel cache) and checked against the reference backend.
@pytest.mark.parametrize("march,needs", [("x86-64", "sse2"), ("x86-64-v3", "avx2"), ("x86-64-v4", "avx512f")])
@pytest.mark.slow
def test_cpu_forward_float32_every_instruction_set(tmp_path, march, needs):
    lib = joseph_library_for(tmp_path, march, needs)
    f = lib.joseph_forward_f32
    f.argtypes = cpu_backend._FORWARD_ARGS
    f.restype = None
    traj, shape, det, kw = _lane_case()
    ref = Projector(traj, shape, det, backend="reference", **kw)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(7), dtype=F64)
    want = ref.project(x)
    t32 = traj.to(dtype=torch.float32)
    geo = [t32.source.contiguous(), t32.detector_center.contiguous(),
           (t32.detector_u * kw["detector_spacing"][0]).contiguous(),
           (t32.detector_v * kw["detector_spacing"][1]).contiguous()]
    vol = x.float().contiguous()
    out = torch.full((traj.n_views, *det), float("nan"), dtype=torch.float32)
    D, H, W = shape
    dz, dy, dx = kw["voxel_spacing"]
    for nthreads in (1, 2):
        f(vol.data_ptr(), D * H * W, 1, D, H, W, 0, D, dx, dy, dz, *[t.data_ptr() for t in geo], 1, traj.n_views,
          det[0], det[1], 0, det[0], 0, det[1], out.data_ptr(), 0, nthreads)
        assert bool(torch.isfinite(out).all())
        assert float((out.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_cpu_forward_float32_parallel_beam_with_axis_aligned_and_planar_rays():
    """Parallel rays along x, y and the diagonal: in the axis-aligned views every lane's
    b or c coordinate is constant (B == 0; on a voxel plane for the odd detector size:
    planar rays), which the vectorised set-up leaves to make_ray; the diagonal view puts
    x- and y-dominant rays (ties at 45 degrees) into one group."""
    from ctbench import circular_trajectory_3d_parallel
    angles = torch.tensor([0.0, math.pi / 4, math.pi / 2, math.pi, 0.1], dtype=F64)
    traj = circular_trajectory_3d_parallel(angles.numel(), angles=angles, dtype=F64)
    shape, det = (9, 21, 21), (21, 9)
    cpu = Projector(traj.to(dtype=torch.float32), shape, det, backend="cpu")
    ref = Projector(traj, shape, det, backend="reference")
    x = torch.rand(shape, generator=torch.Generator().manual_seed(11), dtype=F64)
    p32, p_ref = cpu.project(x.float()).double(), ref.project(x)
    assert bool((p_ref > 0).all())
    assert float((p32 - p_ref).abs().max()) <= 1e-5 * float(p_ref.abs().max())
