"""The Joseph projector pair: adjointness, gradients, backend parity, slab windows, validation."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctbench import (
    Projector,
    circular_trajectory_2d_fan,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    custom_trajectory_3d,
)
from ctbench.engine import Rays, Tile, VolumeGrid, get_backend
from sample_geometries import sample_geometries as _geometries


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("index", range(5))
def test_dot_product_adjoint(index, dtype, tol):
    name, traj, vs, ds, kw = _geometries(dtype)[index]
    op = Projector(traj, vs, ds, **kw)
    g = torch.Generator().manual_seed(index)
    x = torch.rand(op.volume_shape, generator=g, dtype=torch.float64).to(dtype)
    y = torch.rand(op.projection_shape, generator=g, dtype=torch.float64).to(dtype)
    ax = op.project(x)
    aty = op.backproject(y)
    assert ax.shape == op.projection_shape and aty.shape == op.volume_shape
    lhs = (ax.double() * y.double()).sum().item()
    rhs = (x.double() * aty.double()).sum().item()
    assert lhs > 0
    assert abs(lhs - rhs) <= tol * abs(lhs), (name, lhs, rhs)


@pytest.mark.parametrize("index", [0, 2, 3])
@pytest.mark.slow
def test_gradcheck_project_and_backproject(index):
    name, traj, vs, ds, kw = _geometries(torch.float64)[index]
    traj = traj[:3]
    op = Projector(traj, tuple(max(2, s // 2) for s in vs), ds if isinstance(ds, int) else (ds[0] // 2, ds[1] // 2),
                   **kw)
    x = torch.rand(op.volume_shape, dtype=torch.float64, requires_grad=True)
    y = torch.rand(op.projection_shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(op.project, (x,))
    assert torch.autograd.gradcheck(op.backproject, (y,))
    # the second order in random directions (torch's fast mode): project is linear, so its double backward is
    # the adjoint of backward, whose full Jacobians the two checks above compare already
    assert torch.autograd.gradgradcheck(op.project, (x,), fast_mode=True)


def test_backward_is_backprojection():
    traj = circular_trajectory_3d(6, 30.0, 60.0, dtype=torch.float64)
    op = Projector(traj, (6, 7, 8), (9, 10))
    x = torch.rand(op.volume_shape, dtype=torch.float64, requires_grad=True)
    w = torch.rand(op.projection_shape, dtype=torch.float64)
    (op.project(x) * w).sum().backward()
    torch.testing.assert_close(x.grad, op.backproject(w), rtol=1e-12, atol=1e-12)


def _random_trajectory(seed, n_views, cone, dtype):
    g = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.rand(*s, generator=g, dtype=torch.float64)

    theta = rnd(n_views) * 2 * math.pi
    tilt = (rnd(n_views) - 0.5) * 0.6
    d = torch.stack([torch.sin(theta) * torch.cos(tilt), -torch.cos(theta) * torch.cos(tilt), torch.sin(tilt)], 1)
    u = torch.stack([torch.cos(theta), torch.sin(theta), torch.zeros(n_views, dtype=torch.float64)], 1)
    v = torch.linalg.cross(d, u)
    u = u + 0.1 * (rnd(n_views, 3) - 0.5)
    sid = 25 + 10 * rnd(n_views, 1)
    centre = -(15 + 10 * rnd(n_views, 1)) * d + 3 * (rnd(n_views, 3) - 0.5)
    src = sid * d if cone else -d
    return custom_trajectory_3d(src, centre, u, v, beam="cone" if cone else "parallel", dtype=dtype)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cone=st.booleans(), batch=st.integers(1, 2),
       shape=st.tuples(st.integers(1, 7), st.integers(1, 8), st.integers(1, 8)),
       det=st.tuples(st.integers(1, 9), st.integers(1, 9)),
       spacing=st.tuples(*[st.floats(0.5, 2.0)] * 3))
@pytest.mark.slow
def test_cpu_matches_reference(seed, cone, batch, shape, det, spacing):
    traj = _random_trajectory(seed, 4, cone, torch.float32)
    kw = dict(voxel_spacing=spacing, detector_spacing=(1.3, 1.1))
    cpu = Projector(traj, shape, det, backend="cpu", **kw)
    # The truth: the reference backend in float64 on the same (float32-representable) geometry.  A
    # float32 reference is no truth here: on a ray grazing a voxel's edge it was measured up to 25x
    # further from float64 than the CPU kernel (whose ray set-up runs in double).
    ref = Projector(traj.to(dtype=torch.float64), shape, det, backend="reference", **kw)
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((batch, *shape), generator=g)
    y = torch.rand((batch, *cpu.projection_shape), generator=g)
    # float32 rounding is relative to one voxel's contribution (a value of at most 1 times about a
    # voxel's length), not to the output, which a grazing ray makes tiny.
    unit = max(spacing)
    p_cpu, p_ref = cpu.project(x).double(), ref.project(x.double())
    assert (p_cpu - p_ref).abs().max().item() <= 1e-6 * (p_ref.abs().max().item() + unit) * max(shape) ** 0.5
    b_cpu, b_ref = cpu.backproject(y).double(), ref.backproject(y.double())
    assert (b_cpu - b_ref).abs().max().item() <= 1e-6 * (b_ref.abs().max().item() + unit) * max(shape) ** 0.5


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("cone", [True, False])
def test_slab_windows_sum_to_whole(backend, cone):
    traj = _random_trajectory(3, 5, cone, torch.float64)
    grid = VolumeGrid((13, 9, 10), (1.0, 1.1, 0.9))
    du, dv = 1.4, 1.2
    rays = Rays(traj.source, traj.detector_center, traj.detector_u * du, traj.detector_v * dv, cone, (11, 9))
    be = get_backend(backend)
    vol = torch.rand(1, *grid.shape, dtype=torch.float64)
    tile = Tile.full(rays.detector_shape)
    whole = be.project(vol, grid, 0, rays, tile)
    g = torch.Generator().manual_seed(1)
    cuts = sorted(torch.randperm(12, generator=g)[:3].add(1).tolist())
    bounds = [0, *cuts, grid.D]
    total = torch.zeros_like(whole)
    for z0, z1 in zip(bounds[:-1], bounds[1:]):
        be.project(vol[:, z0:z1].contiguous(), grid, z0, rays, tile, out=total)
    torch.testing.assert_close(total, whole, rtol=1e-12, atol=1e-12)
    # An empty slab contributes nothing.
    empty = be.project(vol[:, 5:5].contiguous(), grid, 5, rays, tile)
    assert empty.abs().max().item() == 0.0

    y = torch.rand_like(whole)
    whole_bp = be.backproject(y, grid, 0, grid.D, rays, tile)
    for z0, z1 in zip(bounds[:-1], bounds[1:]):
        part = be.backproject(y, grid, z0, z1, rays, tile)
        torch.testing.assert_close(part, whole_bp[:, z0:z1], rtol=1e-12, atol=1e-12)


def test_view_ranges_and_detector_tiles():
    traj = _random_trajectory(5, 6, True, torch.float64)
    grid = VolumeGrid((8, 9, 10), (1.0, 1.0, 1.0))
    rays = Rays(traj.source, traj.detector_center, traj.detector_u, traj.detector_v, True, (12, 10))
    be = get_backend("cpu")
    vol = torch.rand(2, *grid.shape, dtype=torch.float64)
    whole = be.project(vol, grid, 0, rays, Tile.full((12, 10)))
    part = be.project(vol, grid, 0, rays.views(2, 5), Tile(3, 9, 2, 7))
    torch.testing.assert_close(part, whole[:, 2:5, 3:9, 2:7], rtol=1e-13, atol=1e-13)
    y = torch.zeros_like(whole)
    y[:, 2:5, 3:9, 2:7] = torch.rand(2, 3, 6, 5, dtype=torch.float64)
    bp_whole = be.backproject(y, grid, 0, grid.D, rays, Tile.full((12, 10)))
    bp_tile = be.backproject(y[:, 2:5, 3:9, 2:7].contiguous(), grid, 0, grid.D, rays.views(2, 5), Tile(3, 9, 2, 7))
    torch.testing.assert_close(bp_tile, bp_whole, rtol=1e-12, atol=1e-12)


def test_uniform_cube_central_ray_length():
    """A parallel ray along x through a block of ones integrates to the block's length."""
    traj = circular_trajectory_3d_parallel(angles=torch.tensor([0.0], dtype=torch.float64),  # rays along +x
                                           dtype=torch.float64)
    op = Projector(traj, (5, 5, 8), (3, 3), voxel_spacing=(1.0, 1.0, 1.5))
    sino = op.project(torch.ones(5, 5, 8, dtype=torch.float64))
    # the central ray runs along x through 8 voxels of 1.5 mm; the interpolated
    # profile covers 7 plane gaps plus one half-voxel ramp at each end.
    assert sino[0, 1, 1].item() == pytest.approx(8 * 1.5, rel=1e-12)


def test_batched_leading_dims_match_items():
    traj = circular_trajectory_3d(5, 30.0, 60.0, dtype=torch.float64)
    op = Projector(traj, (6, 6, 6), (8, 7))
    x = torch.rand(2, 3, 6, 6, 6, dtype=torch.float64)
    s = op.project(x)
    assert s.shape == (2, 3, 5, 8, 7)
    for i in range(2):
        for c in range(3):
            assert torch.equal(s[i, c], op.project(x[i, c]))
    b = op.backproject(s)
    assert b.shape == x.shape
    assert torch.equal(b[1, 2], op.backproject(s[1, 2]))


def test_non_contiguous_input_is_handled():
    traj = circular_trajectory_3d(4, 30.0, 60.0, dtype=torch.float64)
    op = Projector(traj, (5, 6, 7), (8, 8))
    x = torch.rand(7, 6, 5, dtype=torch.float64).permute(2, 1, 0)
    assert not x.is_contiguous()
    torch.testing.assert_close(op.project(x), op.project(x.contiguous()), rtol=0, atol=0)


# ---------------------------------------------------------------- validation
def test_bad_inputs_give_clear_errors():
    traj = circular_trajectory_3d(4, 30.0, 60.0)
    op = Projector(traj, (5, 6, 7), (8, 8))
    with pytest.raises(ValueError, match="volume must have shape"):
        op.project(torch.zeros(5, 6, 8))
    with pytest.raises(TypeError, match="float32 or float64"):
        op.project(torch.zeros(5, 6, 7, dtype=torch.int32))
    with pytest.raises(ValueError, match="sinogram must have shape"):
        op.backproject(torch.zeros(3, 8, 8))
    with pytest.raises(TypeError, match="torch.Tensor"):
        op.project([[1.0]])
    with pytest.raises(ValueError, match="backend 'cpu' cannot run on meta"):
        op.project(torch.zeros(5, 6, 7, device="meta"))


@pytest.mark.parametrize("kwargs,match", [
    (dict(volume_shape=(0, 4, 4)), "volume_shape"),
    (dict(detector_shape=(8, 0)), "detector_shape"),
    (dict(voxel_spacing=0.0), "voxel_spacing"),
    (dict(detector_spacing=(1.0, float("nan"))), "detector_spacing"),
    (dict(backend="gpu"), "backend"),
    (dict(volume_shape=(4, 4, 4, 4)), "volume_shape"),
])
def test_bad_construction(kwargs, match):
    args = dict(trajectory=circular_trajectory_3d(4, 30.0, 60.0), volume_shape=(4, 4, 4), detector_shape=(8, 8))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Projector(args.pop("trajectory"), args.pop("volume_shape"), args.pop("detector_shape"), **args)


def test_bad_geometry():
    traj = circular_trajectory_3d(4, 30.0, 60.0)
    bad = traj.replace(source=traj.source.clone().index_fill_(0, torch.tensor([2]), float("nan")))
    with pytest.raises(ValueError, match="non-finite.*views \\[2\\]"):
        Projector(bad, (4, 4, 4), (8, 8))
    zero_u = traj.replace(detector_u=traj.detector_u.clone().index_fill_(0, torch.tensor([1]), 0.0))
    with pytest.raises(ValueError, match="detector_u has zero-length"):
        Projector(zero_u, (4, 4, 4), (8, 8))
    with pytest.raises(ValueError, match="source lies inside the volume"):
        Projector(circular_trajectory_3d(4, 3.0, 60.0), (10, 10, 10), (8, 8))
    op = Projector(traj, (4, 4, 4), (8, 8))
    with pytest.raises(ValueError, match="override has 3 views"):
        op.project(torch.zeros(4, 4, 4), trajectory=traj[:3])


def test_2d_shapes_and_validation():
    op = Projector(circular_trajectory_2d_fan(10, 50.0, 100.0), (16, 12), 24)
    assert op.volume_shape == (16, 12) and op.projection_shape == (10, 24)
    assert op.project(torch.rand(3, 16, 12)).shape == (3, 10, 24)
    with pytest.raises(ValueError, match="2D scans have one detector row"):
        Projector(circular_trajectory_2d_fan(10, 50.0, 100.0), (16, 12), (24, 2))
    with pytest.raises(ValueError, match="2D trajectory needs a 2D volume_shape"):
        Projector(circular_trajectory_2d_fan(10, 50.0, 100.0), (4, 16, 12), 24)


@pytest.mark.parametrize("cone", [True, False])
def test_backprojection_writes_only_inside_its_slab(cone):
    """Canaries around the output buffer stay untouched for slabs of every thickness."""
    traj = _random_trajectory(11, 6, cone, torch.float64)
    grid = VolumeGrid((9, 7, 8), (1.0, 0.8, 1.2))
    rays = Rays(traj.source, traj.detector_center, traj.detector_u * 1.3, traj.detector_v * 1.1, cone, (10, 9))
    be = get_backend("cpu")
    y = torch.rand(2, 6, 10, 9, dtype=torch.float64)
    whole = be.backproject(y, grid, 0, grid.D, rays, Tile.full((10, 9)))
    pad = 4096
    for z0 in range(grid.D):
        for z1 in range(z0 + 1, grid.D + 1):
            n = 2 * (z1 - z0) * grid.H * grid.W
            buf = torch.zeros(n + 2 * pad, dtype=torch.float64)
            out = buf[pad:pad + n].view(2, z1 - z0, grid.H, grid.W)
            be.backproject(y, grid, z0, z1, rays, Tile.full((10, 9)), out=out)
            assert buf[:pad].abs().max() == 0 and buf[pad + n:].abs().max() == 0, (z0, z1)
            torch.testing.assert_close(out, whole[:, z0:z1], rtol=1e-12, atol=1e-12)
