"""The float32 CPU geometry VJP in SIMD lanes (kernels/joseph_grad_lanes_cpu.hpp).

Independent truth: autograd through the pure-torch reference backend in float64
(executor.reference_geometry_vjp) on the same float32-rounded geometry, and the
scalar float32 path of the same kernel (an x86-64 build without AVX2).

The detector is wider than the volume (rays that miss, rays entering through
the sides: lanes of one group with different interiors), its rows are 37 and
21 pixels long (full groups of 16 / 8 plus partial ones), the views cover
x-dominant, y-dominant and oblique directions, and slabs cut the rays in z.
The volume is smooth and the geometry slightly off-symmetric: the model is
only piecewise smooth, and a float32 sample that rounds across a voxel
boundary must change the sum of a whole view by little (measured: 1e-6 of a view's largest
derivative; the tolerances are 2e-5).
"""

from __future__ import annotations

import math

import pytest
import torch

from ctbench import circular_trajectory_3d
from ctbench.engine import Rays, Tile, VolumeGrid, get_backend
from ctbench.engine.executor import reference_geometry_vjp
from ctbench.engine.cpu.geometry_vjp import _CPU_ARGS
from kernel_builds import joseph_library_for

F64, F32 = torch.float64, torch.float32
SHAPE = (14, 24, 22)
SPACING = (0.9, 1.1, 1.0)  # (dz, dy, dx)


def _case(det=(37, 21), seed=0):
    # x-dominant (near 0 and pi), y-dominant (near pi/2), oblique (near pi/4, 3pi/4), off the exact axes
    angles = torch.tensor([0.013, 0.31, math.pi / 4 + 0.021, 1.23, math.pi / 2 + 0.011, 2.03,
                           3 * math.pi / 4 + 0.017, math.pi + 0.007, 4.01, 5.52], dtype=F64)
    traj = circular_trajectory_3d(angles.numel(), 60.0, 120.0, angles=angles, dtype=F64)
    g = torch.Generator().manual_seed(seed)
    src = traj.source + 0.3 * torch.randn(traj.source.shape, generator=g, dtype=F64)
    ctr = traj.detector_center + 0.3 * torch.randn(traj.source.shape, generator=g, dtype=F64)
    rays = Rays(src, ctr, traj.detector_u * 2.0, traj.detector_v * 1.6, True, det)
    # float32-rounded geometry, so that both sides see the same rays
    rays32 = rays.to(dtype=F32)
    return rays32, rays32.to(dtype=F64)


def _smooth_volume(batch=1):
    D, H, W = SHAPE
    z, y, x = torch.meshgrid(torch.linspace(-1, 1, D, dtype=F64), torch.linspace(-1, 1, H, dtype=F64),
                             torch.linspace(-1, 1, W, dtype=F64), indexing="ij")
    vols = []
    for q in range(batch):
        v = torch.exp(-((x - 0.2 + 0.1 * q) ** 2 + (y + 0.1) ** 2 + (z - 0.1) ** 2) / 0.3)
        v = v + 0.5 * torch.exp(-((x + 0.4) ** 2 + (y - 0.3 + 0.2 * q) ** 2 + (z + 0.2) ** 2) / 0.15)
        vols.append(v)
    return torch.stack(vols)


def _stack(grads):
    return torch.cat([g.double() for g in grads], dim=1)  # (n_views, 12)


def _assert_views_close(got, want, tol):
    """Each view's 12 derivatives within tol of that view's largest one (and not all zero)."""
    scale = want.abs().amax(dim=1, keepdim=True)
    assert bool((scale > 0).all())
    err = (got - want).abs() / scale
    assert float(err.max()) <= tol, float(err.max())


@pytest.mark.parametrize("det", [(37, 21), (21, 37)])
@pytest.mark.slow
def test_float32_lanes_match_reference_vjp_in_every_direction(det):
    rays32, rays64 = _case(det)
    grid = VolumeGrid(SHAPE, SPACING)
    tile = Tile.full(det)
    vol = _smooth_volume(2)
    g = torch.Generator().manual_seed(11)
    cot = torch.randn((2, rays32.n_views, *det), generator=g, dtype=F64)
    cot[1, :, ::3] = 0.0  # batch item 1: some rays carry no cotangent
    got = _stack(get_backend("cpu").geometry_vjp(vol.float(), grid, 0, cot.float(), rays32, tile))
    want = _stack(reference_geometry_vjp(vol, grid, 0, cot, rays64, tile))
    # some rays miss (the detector is wider than the volume), others hit
    sino = get_backend("reference").project(vol, grid, 0, rays64, tile)
    assert bool((sino == 0).any()) and bool((sino > 0).any())
    _assert_views_close(got, want, 2e-5)


def test_float32_lanes_on_z_slabs_match_reference_and_sum_to_whole():
    rays32, rays64 = _case((19, 17), seed=1)
    grid = VolumeGrid(SHAPE, SPACING)
    tile = Tile.full((19, 17))
    vol = _smooth_volume(1)
    cot = torch.randn((1, rays32.n_views, 19, 17), generator=torch.Generator().manual_seed(4), dtype=F64)
    cpu = get_backend("cpu")
    total = torch.zeros(rays32.n_views, 12, dtype=F64)
    for z0, z1 in [(0, 3), (3, 4), (4, 11), (11, 14)]:
        part = _stack(cpu.geometry_vjp(vol[:, z0:z1].float().contiguous(), grid, z0, cot.float(), rays32, tile))
        want = _stack(reference_geometry_vjp(vol[:, z0:z1].contiguous(), grid, z0, cot, rays64, tile))
        _assert_views_close(part, want, 3e-5)
        total += part
    whole = _stack(reference_geometry_vjp(vol, grid, 0, cot, rays64, tile))
    _assert_views_close(total, whole, 3e-5)


def _run_lib(lib, vol, grid, cot, rays, nthreads):
    f = lib.joseph_geometry_vjp_f32
    f.argtypes = _CPU_ARGS
    f.restype = None
    B, D, H, W = vol.shape
    dz, dy, dx = grid.spacing
    U, V = rays.detector_shape
    geo = [t.contiguous() for t in rays.tensors()]
    out = torch.full((rays.n_views, 12), float("nan"), dtype=F64)
    f(vol.data_ptr(), D * H * W, B, D, H, W, 0, D, dx, dy, dz, *[t.data_ptr() for t in geo], int(rays.cone),
      rays.n_views, U, V, 0, U, 0, V, cot.data_ptr(), out.data_ptr(), nthreads)
    return out


# The lane code is chosen at compile time: each instruction set the host can run is built here
# (outside the kernel cache) and checked against the reference and against the scalar float32 path.
@pytest.mark.parametrize("march,needs", [("x86-64-v3", "avx2"), ("x86-64-v4", "avx512f")])
@pytest.mark.slow
def test_float32_geometry_vjp_every_instruction_set(tmp_path, march, needs):
    lib = joseph_library_for(tmp_path, march, needs, family="joseph_grad")
    scalar = joseph_library_for(tmp_path, "x86-64", "sse2", family="joseph_grad")
    rays32, rays64 = _case((37, 21), seed=2)
    grid = VolumeGrid(SHAPE, SPACING)
    vol = _smooth_volume(1)
    cot = torch.randn((1, rays32.n_views, 37, 21), generator=torch.Generator().manual_seed(6), dtype=F64)
    want = _stack(reference_geometry_vjp(vol, grid, 0, cot, rays64, Tile.full((37, 21))))
    v32, c32 = vol.float().contiguous(), cot.float().contiguous()
    ref32 = _run_lib(scalar, v32, grid, c32, rays32, 1)
    _assert_views_close(ref32, want, 2e-5)
    for nthreads in (1, 2):
        got = _run_lib(lib, v32, grid, c32, rays32, nthreads)
        assert bool(torch.isfinite(got).all())
        _assert_views_close(got, want, 2e-5)
        _assert_views_close(got, ref32, 1e-5)


@pytest.mark.parametrize("sid", [1e5, 1e7])
def test_float32_lanes_with_far_sources(sid):
    """Nearly parallel rays from a far source (0.1 mm voxels): n - fo_a is moved from the group's
    first plane to the origin per lane in float; measured 1e-6 of a view's largest derivative."""
    angles = torch.tensor([0.013, 0.8, 1.58, 2.4], dtype=F64)
    traj = circular_trajectory_3d(4, sid, 2 * sid, angles=angles, dtype=F64)
    det = (37, 21)
    rays32 = Rays(traj.source, traj.detector_center, traj.detector_u * 0.2, traj.detector_v * 0.16, True,
                  det).to(dtype=F32)
    grid = VolumeGrid(SHAPE, (0.09, 0.11, 0.1))
    vol = _smooth_volume(1)
    cot = torch.randn((1, 4, *det), generator=torch.Generator().manual_seed(1), dtype=F64)
    want = _stack(reference_geometry_vjp(vol, grid, 0, cot, rays32.to(dtype=F64), Tile.full(det)))
    got = _stack(get_backend("cpu").geometry_vjp(vol.float(), grid, 0, cot.float(), rays32, Tile.full(det)))
    _assert_views_close(got, want, 2e-5)
