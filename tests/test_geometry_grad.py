"""Geometry gradients of the Joseph projector (issue 5).

Truth here is independent of the VJP kernel: float64 finite differences
(torch.autograd.gradcheck and central differences on a 64^3 phantom) and
autograd through the pure-torch reference backend.

The Joseph model is only piecewise smooth in the geometry: it has kinks where
a ray's in-plane voxel coordinate crosses an integer and jumps where its
dominant axis switches.  Symmetric scans put rays exactly on such kinks (the
central row of a centred circular scan with even V lies on a voxel-centre
plane), so every geometry here is randomly perturbed and volumes are random
or smooth.
"""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest
import torch

from ctbench import (
    Projector,
    circular_trajectory_2d_fan,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    custom_trajectory_3d,
    spiral_trajectory_3d,
    transform_trajectory,
)
from ctbench.engine import Rays, Tile, VolumeGrid, get_backend
from ctbench.engine.kernel_sources import kernel_dir
from ctbench.engine.executor import reference_geometry_vjp

F64 = torch.float64


# ----------------------------------------------------------------- set-ups
def _nominal(kind: str, n_views: int, dtype=F64):
    if kind == "cone":
        return circular_trajectory_3d(n_views, 30.0, 60.0, start_angle=0.3, dtype=dtype)
    if kind == "helical":
        return spiral_trajectory_3d(n_views, 30.0, 60.0, z_range=4.0, n_turns=1.0, start_angle=0.2, dtype=dtype)
    if kind == "parallel3d":
        return circular_trajectory_3d_parallel(n_views, start_angle=0.2, dtype=dtype)
    if kind == "fan2d":
        return circular_trajectory_2d_fan(n_views, 30.0, 60.0, start_angle=0.2, dtype=dtype)
    raise ValueError(kind)


def _perturbed_geometry(kind: str, n_views: int, seed: int, dtype=F64):
    """The nominal scan's four (n_views, 3) tensors with small random offsets and tilts.

    2D scans keep every z component at zero: their rays must stay in the plane z=0.
    """
    g = torch.Generator().manual_seed(seed)
    tr = _nominal(kind, n_views, dtype)
    scales = (0.02 if kind == "parallel3d" else 0.3, 0.3, 0.03, 0.03)
    out = []
    for t, s in zip(tr.tensors(), scales):
        noise = s * torch.randn(t.shape, generator=g, dtype=dtype)
        if kind == "fan2d":
            noise[:, 2] = 0
            if t is tr.detector_v:
                noise.zero_()
        out.append(t.detach() + noise)
    return tr, out


def _projector(kind: str, n_views: int, backend: str = "cpu", dtype=F64):
    tr = _nominal(kind, n_views, dtype)
    if kind == "fan2d":
        return Projector(tr, (7, 6), 9, detector_spacing=2.1, voxel_spacing=(0.9, 1.1), backend=backend)
    spacing = 1.2 if kind == "parallel3d" else 2.2
    return Projector(tr, (5, 6, 7), (7, 5), detector_spacing=(spacing, spacing * 1.1),
                     voxel_spacing=(1.0, 0.9, 1.1), backend=backend)


def _traj(like, src, ctr, u, v):
    return custom_trajectory_3d(src, ctr, u, v, beam=like.beam, ndim=like.ndim)


KINDS = ["cone", "helical", "parallel3d", "fan2d"]


# --------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("direction", ["project", "backproject"])
@pytest.mark.slow
def test_gradcheck_geometry(kind, direction):
    """float64 gradcheck of every trajectory tensor (in-plane components for 2D scans)."""
    torch.manual_seed(3)
    P = _projector(kind, 3)
    tr, geo = _perturbed_geometry(kind, 3, seed=11)
    vol = torch.rand(P.volume_shape, dtype=F64)
    sino = torch.rand(P.projection_shape, dtype=F64)
    in_plane = kind == "fan2d"

    def fn(src, ctr, u, v):
        if in_plane:  # parameters are the x, y components; z stays 0 and v stays +z
            pad = lambda t: torch.cat([t, torch.zeros_like(t[:, :1])], dim=1)
            src, ctr, u = pad(src), pad(ctr), pad(u)
        T = _traj(tr, src, ctr, u, v)
        return P.project(vol, trajectory=T) if direction == "project" else P.backproject(sino, trajectory=T)

    inputs = [t[:, :2].clone() if in_plane and i < 3 else t.clone() for i, t in enumerate(geo)]
    if in_plane:
        inputs[3] = inputs[3].clone()  # v: no in-plane freedom, its gradient must be zero
    inputs = [t.requires_grad_(True) for t in inputs]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("generator", ["circular", "spiral"])
def test_gradcheck_learnable_angles(generator):
    """Angle tensors of the generators reach the kernel gradient by ordinary autograd."""
    torch.manual_seed(4)
    P = _projector("cone", 3)
    vol = torch.rand(P.volume_shape, dtype=F64)
    theta0 = torch.tensor([0.31, 2.27, 4.4], dtype=F64)

    def fn(theta):
        if generator == "circular":
            T = circular_trajectory_3d(3, 30.0, 60.0, angles=theta, detector_offset=(0.37, -0.21), dtype=F64)
        else:
            T = spiral_trajectory_3d(3, 30.0, 60.0, z_range=3.0, angles=theta, detector_offset=(0.37, -0.21),
                                     dtype=F64)
        return P.project(vol, trajectory=T)

    assert torch.autograd.gradcheck(fn, (theta0.clone().requires_grad_(),), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_gradcheck_rigid_transform():
    """Rotation vector and translation of transform_trajectory are learnable."""
    torch.manual_seed(5)
    P = _projector("cone", 3)
    tr, geo = _perturbed_geometry("cone", 3, seed=2)
    base = _traj(tr, *geo)
    vol = torch.rand(P.volume_shape, dtype=F64)

    def fn(rotation, translation):
        return P.project(vol, trajectory=transform_trajectory(base, rotation=rotation, translation=translation))

    rot = torch.tensor([0.02, -0.03, 0.05], dtype=F64, requires_grad=True)
    trans = torch.tensor([0.3, -0.2, 0.15], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (rot, trans), eps=1e-6, atol=1e-6, rtol=1e-4)


# ------------------------------------------- finite differences on 64^3
def _blobs(n: int, seed: int) -> torch.Tensor:
    """A smooth 64^3-type phantom: a sum of Gaussian blobs (voxel units)."""
    g = torch.Generator().manual_seed(seed)
    ax = torch.arange(n, dtype=F64) - (n - 1) / 2
    zz, yy, xx = torch.meshgrid(ax, ax, ax, indexing="ij")
    vol = torch.zeros((n, n, n), dtype=F64)
    for _ in range(6):
        c = (torch.rand(3, generator=g, dtype=F64) - 0.5) * (n / 2)
        s = n / 12 * (1 + torch.rand((), generator=g, dtype=F64))
        a = 0.5 + torch.rand((), generator=g, dtype=F64)
        vol += a * torch.exp(-((xx - c[0]) ** 2 + (yy - c[1]) ** 2 + (zz - c[2]) ** 2) / (2 * s * s))
    return vol


@pytest.mark.parametrize("direction", ["project", "backproject"])
def test_finite_differences_64(direction):
    """Directional derivative of a scalar loss vs central differences, 64^3 smooth phantom, float64.

    View angles keep every ray within 40 degrees of the y or x axis, so no
    ray's dominant axis switches inside the step (that would be a jump, not a
    kink); kinks crossed inside the step cost O(step) relative error.
    """
    n = 64
    vol = _blobs(n, seed=1)
    angles = torch.tensor([5.0, 25.0, 100.0, 118.0, 190.0, 205.0, 280.0, 298.0], dtype=F64) * math.pi / 180
    tr = circular_trajectory_3d(angles=angles, sid=200.0, sdd=400.0, dtype=F64)
    P = Projector(tr, (n, n, n), (48, 48), detector_spacing=2.0, backend="cpu")
    g = torch.Generator().manual_seed(7)
    geo = [t.detach() + s * torch.randn(t.shape, generator=g, dtype=F64)
           for t, s in zip(tr.tensors(), (0.3, 0.3, 0.01, 0.01))]
    dirs = [s * torch.randn(t.shape, generator=g, dtype=F64) for t, s in zip(geo, (1.0, 1.0, 0.01, 0.01))]
    # Smooth cotangents: the projection of another blob phantom, or a second phantom.
    sino_w = P.project(_blobs(n, seed=2))
    vol_w = _blobs(n, seed=3)

    def loss(tensors):
        T = custom_trajectory_3d(*tensors)
        if direction == "project":
            return (P.project(vol, trajectory=T) * sino_w).sum()
        return (P.backproject(sino_w, trajectory=T) * vol_w).sum()

    leaves = [t.clone().requires_grad_(True) for t in geo]
    grads = torch.autograd.grad(loss(leaves), leaves)
    analytic = sum((gr * d).sum() for gr, d in zip(grads, dirs)).item()
    h = 1e-4
    plus = loss([t + h * d for t, d in zip(geo, dirs)]).item()
    minus = loss([t - h * d for t, d in zip(geo, dirs)]).item()
    fd = (plus - minus) / (2 * h)
    assert abs(analytic) > 1e-3
    assert abs(fd - analytic) <= 1e-4 * abs(analytic), (fd, analytic)


# ---------------------------------------- kernel vs reference autograd
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_cpu_kernel_matches_reference_autograd(kind, dtype):
    """Projector geometry gradients: cpu VJP kernel == autograd through the reference backend."""
    torch.manual_seed(6)
    tr, geo = _perturbed_geometry(kind, 4, seed=21, dtype=dtype)
    vol = torch.rand((2, *_projector(kind, 4).volume_shape), dtype=dtype)
    weights = torch.randn((2, *_projector(kind, 4).projection_shape), dtype=dtype)
    results = {}
    for backend in ("cpu", "reference"):
        P = _projector(kind, 4, backend=backend)
        leaves = [t.clone().requires_grad_(True) for t in geo]
        loss = (P.project(vol, trajectory=_traj(tr, *leaves)) * weights).sum()
        results[backend] = torch.autograd.grad(loss, leaves)
    tol = 1e-11 if dtype == F64 else 2e-5
    for a, b, name in zip(results["cpu"], results["reference"], ("source", "center", "u", "v")):
        assert a.dtype == dtype
        scale = b.norm()
        if scale == 0:  # only v of a 2D scan: no pixel offset along v
            assert kind == "fan2d" and name == "v" and a.abs().max() == 0
            continue
        assert (a - b).norm() <= tol * scale, (name, float((a - b).norm() / scale))


def _random_rays(cone: bool, n_views: int, seed: int, detector_shape=(9, 7)):
    g = torch.Generator().manual_seed(seed)
    theta = torch.rand(n_views, generator=g, dtype=F64) * 2 * math.pi
    tr = circular_trajectory_3d(angles=theta, sid=40.0, sdd=80.0, dtype=F64)
    noise = lambda s: s * torch.randn((n_views, 3), generator=g, dtype=F64)
    if cone:
        src = tr.source + noise(0.5)
    else:
        src = -tr.source / 40.0 + noise(0.05)
    return Rays(src, tr.detector_center + noise(0.5), 1.7 * tr.detector_u + noise(0.05),
                1.6 * tr.detector_v + noise(0.05), cone, detector_shape)


@pytest.mark.parametrize("cone", [True, False])
def test_slab_and_tile_windows_sum_to_whole(cone):
    """Geometry VJPs of any split of z into slabs, and of detector tiles, sum to the whole."""
    torch.manual_seed(8)
    grid = VolumeGrid((9, 8, 10), (1.0, 1.1, 0.9))
    rays = _random_rays(cone, 5, seed=3)
    full = Tile.full(rays.detector_shape)
    vol = torch.rand(2, 9, 8, 10, dtype=F64)
    cot = torch.randn(2, 5, 9, 7, dtype=F64)
    cpu = get_backend("cpu")
    whole = cpu.geometry_vjp(vol, grid, 0, cot, rays, full)
    parts = [cpu.geometry_vjp(vol[:, a:b], grid, a, cot, rays, full) for a, b in ((0, 2), (2, 3), (3, 9))]
    tiles = [Tile(0, 4, 0, 7), Tile(4, 9, 0, 3), Tile(4, 9, 3, 7)]
    tparts = [cpu.geometry_vjp(vol, grid, 0, cot[:, :, t.u0:t.u1, t.v0:t.v1].contiguous(), rays, t) for t in tiles]
    for i in range(4):
        assert whole[i].abs().max() > 0
        torch.testing.assert_close(sum(p[i] for p in parts), whole[i], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(sum(p[i] for p in tparts), whole[i], rtol=1e-12, atol=1e-12)
        # and each window agrees with the reference backend's autograd
    ref = reference_geometry_vjp(vol[:, 2:3], grid, 2, cot, rays, full)
    for a, b in zip(parts[1], ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_projector_windows_give_the_same_geometry_gradient():
    """Through the planner: slabs, view batches and detector tiles sum to the single-window gradient."""
    torch.manual_seed(12)
    tr, geo = _perturbed_geometry("helical", 5, seed=8)
    vol = torch.rand((2, 5, 6, 7), dtype=F64)
    w = torch.randn((2, 5, 7, 5), dtype=F64)
    grads = []
    for options in ({}, dict(volume_chunk_shape=2, view_chunk_size=2, detector_chunk_shape=(3, 2))):
        tr0 = _nominal("helical", 5)
        P = Projector(tr0, (5, 6, 7), (7, 5), detector_spacing=(2.2, 2.42), voxel_spacing=(1.0, 0.9, 1.1),
                      backend="cpu", **options)
        leaves = [t.clone().requires_grad_(True) for t in geo]
        (P.project(vol, trajectory=_traj(tr, *leaves)) * w).sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_cpu_geometry_vjp_is_deterministic_across_thread_counts():
    """Row partial sums are reduced in a fixed order: bitwise equal for 1 and 2 threads."""
    from ctbench.engine.cpu.geometry_vjp import cpu_geometry_vjp

    grid = VolumeGrid((9, 8, 10), (1.0, 1.1, 0.9))
    rays = _random_rays(True, 6, seed=9).to(dtype=torch.float32)
    vol = torch.rand(1, 9, 8, 10)
    cot = torch.randn(1, 6, 9, 7)
    one = cpu_geometry_vjp(vol, grid, 0, cot, rays, Tile.full(rays.detector_shape), nthreads=1)
    for _ in range(3):
        two = cpu_geometry_vjp(vol, grid, 0, cot, rays, Tile.full(rays.detector_shape), nthreads=2)
        assert all(torch.equal(a, b) for a, b in zip(one, two))


def test_only_requested_tensors_get_gradients_with_volume_gradient():
    """A mix of learnable geometry and volume in one backward: each gradient is right, the rest None."""
    torch.manual_seed(9)
    tr, geo = _perturbed_geometry("cone", 3, seed=5)
    P = _projector("cone", 3)
    vol = torch.rand(P.volume_shape, dtype=F64, requires_grad=True)
    ctr = geo[1].clone().requires_grad_(True)
    sino = P.project(vol, trajectory=_traj(tr, geo[0], ctr, geo[2], geo[3]))
    w = torch.randn_like(sino)
    (sino * w).sum().backward()
    Pr = _projector("cone", 3, backend="reference")
    vol_r = vol.detach().clone().requires_grad_(True)
    ctr_r = geo[1].clone().requires_grad_(True)
    (Pr.project(vol_r, trajectory=_traj(tr, geo[0], ctr_r, geo[2], geo[3])) * w).sum().backward()
    torch.testing.assert_close(ctr.grad, ctr_r.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(vol.grad, vol_r.grad, rtol=1e-10, atol=1e-12)
    assert geo[0].grad is None and tr.source.grad is None


def test_geometry_vjp_rejects_bad_shapes():
    grid = VolumeGrid((4, 5, 6), (1.0, 1.0, 1.0))
    rays = _random_rays(True, 2, seed=1, detector_shape=(3, 3))
    vol = torch.rand(1, 4, 5, 6, dtype=F64)
    with pytest.raises(ValueError, match="grad_sino"):
        get_backend("cpu").geometry_vjp(vol, grid, 0, torch.zeros(1, 2, 3, 4, dtype=F64), rays, Tile(0, 3, 0, 3))
    with pytest.raises(TypeError, match="dtype"):
        get_backend("cpu").geometry_vjp(vol, grid, 0, torch.zeros(1, 2, 3, 3), rays, Tile(0, 3, 0, 3))


# --------------------------------------------------------------- CUDA
def test_cuda_geometry_kernel_compiles_to_ptx(tmp_path):
    """CI has no GPU: compile the CUDA entry file to PTX so compile errors fail here."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    kd = kernel_dir()
    proc = subprocess.run([nvcc, "-ptx", "-arch=sm_80", "-std=c++17", f"-I{kd}", str(kd / "joseph_grad_cuda.cu"),
                           "-o", str(tmp_path / "g.ptx")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ptx = (tmp_path / "g.ptx").read_text()
    assert ptx.count(".entry") == 2  # float and double instantiations


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cone", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_cuda_geometry_vjp_matches_cpu(cone, dtype):
    torch.manual_seed(10)
    grid = VolumeGrid((9, 8, 10), (1.0, 1.1, 0.9))
    rays = _random_rays(cone, 5, seed=4).to(dtype=dtype)
    vol = torch.rand(2, 6, 8, 10, dtype=dtype)
    tile = Tile(1, 8, 2, 7)
    cot = torch.randn(2, 5, *tile.shape, dtype=dtype)
    want = get_backend("cpu").geometry_vjp(vol, grid, 2, cot, rays, tile)
    got = get_backend("cuda").geometry_vjp(vol.cuda(), grid, 2, cot.cuda(), rays.to(device="cuda"), tile)
    tol = 1e-10 if dtype == F64 else 1e-4
    for a, b in zip(got, want):
        assert a.device.type == "cuda" and a.dtype == dtype
        assert (a.cpu() - b).norm() <= tol * b.norm()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_projector_geometry_gradients_match_cpu():
    """End to end on the GPU: batched volume, learnable trajectory, all four tensors."""
    torch.manual_seed(13)
    tr, geo = _perturbed_geometry("helical", 4, seed=14)
    vol = torch.rand((2, 5, 6, 7), dtype=F64)
    w = torch.randn((2, 4, 7, 5), dtype=F64)
    grads = {}
    for device in ("cpu", "cuda"):
        P = _projector("helical", 4, backend="auto")
        leaves = [t.to(device).requires_grad_(True) for t in geo]
        (P.project(vol.to(device), trajectory=_traj(tr, *leaves)) * w.to(device)).sum().backward()
        grads[device] = [t.grad.cpu() for t in leaves]
    for a, b in zip(grads["cuda"], grads["cpu"]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
