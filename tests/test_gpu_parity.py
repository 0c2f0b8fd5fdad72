"""CUDA backend parity: the NVRTC-compiled kernels against the compiled CPU kernels.

Both backends run the same per-ray functions (kernels/joseph.cuh), so on random
small geometries they must agree to float32 round-off (float32) and to 1e-12
(float64), for whole calls, slab windows, detector tiles, accumulation into
``out``, batches and 2D scans; the CUDA pair must also be adjoint on its own,
and geometry gradients must match the CPU ones.  Run by ``make gpu-check``;
skipped without a CUDA device or CuPy.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)
pytest.importorskip("cupy", reason="backend='cuda' needs CuPy (pip install 'ctbench[gpu]')")

from ctbench import (  # noqa: E402
    Projector,
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    spiral_trajectory_3d,
    transform_trajectory,
)
from ctbench.engine import get_backend  # noqa: E402
from ctbench.engine.base import Rays, Tile, VolumeGrid  # noqa: E402
from ctbench.engine.executor import reference_geometry_vjp  # noqa: E402

CUDA = torch.device("cuda")
DTYPES = [torch.float32, torch.float64]
SEEDS = range(4)


def assert_parity(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """cuda vs cpu: float32 round-off, or 1e-12 in float64, relative to the largest value."""
    actual = actual.detach().cpu().to(torch.float64)
    expected = expected.detach().cpu().to(torch.float64)
    assert actual.shape == expected.shape, what
    scale = float(expected.abs().max())
    assert scale > 0, f"{what}: the reference is all zeros, the test would prove nothing"
    tol = 2e-5 if dtype == torch.float32 else 1e-12
    err = float((actual - expected).abs().max())
    assert err <= tol * scale, f"{what}: max |cuda - cpu| = {err:.3e}, allowed {tol * scale:.3e}"


# ------------------------------------------------------------------ geometries
def random_scan(seed: int, dtype: torch.dtype):
    """A random small scan: projector arguments and a trajectory, rigidly moved off the axes.

    Angles are random (no exact 45-degree rays, where the dominant axis is a
    tie that round-off may break differently on the two devices).
    """
    g = torch.Generator().manual_seed(1000 + seed)

    def r(lo, hi, n=None):
        x = torch.rand(n if n else (), generator=g, dtype=torch.float64)
        return lo + (hi - lo) * x

    shape = tuple(int(v) for v in torch.randint(5, 13, (3,), generator=g))
    spacing = tuple(float(v) for v in r(0.7, 1.3, 3))
    n_views = int(torch.randint(5, 11, (), generator=g))
    U, V = (int(v) for v in torch.randint(6, 15, (2,), generator=g))
    angles = r(0, 2 * math.pi, n_views)
    extent = max(s * n for s, n in zip(spacing, shape))
    kind = ("cone", "parallel", "spiral")[seed % 3]
    if kind == "cone":
        sid = float(r(2.0, 4.0)) * extent
        traj = circular_trajectory_3d(sid=sid, sdd=2 * sid, angles=angles,
                                      detector_offset=tuple(float(v) for v in r(-2, 2, 2)), dtype=torch.float64)
        pitch = 2 * 1.8 * extent / min(U, V)
    elif kind == "parallel":
        traj = circular_trajectory_3d_parallel(angles=angles, detector_offset=tuple(float(v) for v in r(-1, 1, 2)),
                                               dtype=torch.float64)
        pitch = 1.8 * extent / min(U, V)
    else:
        sid = float(r(2.0, 4.0)) * extent
        traj = spiral_trajectory_3d(n_views, sid, 2 * sid, z_range=0.8 * extent, n_turns=1.3,
                                    start_angle=float(r(0, 1)), dtype=torch.float64)
        pitch = 2 * 1.8 * extent / min(U, V)
    traj = transform_trajectory(traj, rotation=r(-0.2, 0.2, 3), translation=r(-1, 1, 3)).to(dtype=dtype)
    kwargs = dict(detector_spacing=(pitch, pitch * float(r(0.8, 1.2))), voxel_spacing=spacing)
    return traj, shape, (U, V), kwargs


def projector_pair(traj, shape, det, kwargs):
    return (Projector(traj, shape, det, backend="cpu", **kwargs),
            Projector(traj.to(device=CUDA), shape, det, backend="cuda", **kwargs))


def rays_of(p: Projector, dtype, device) -> Rays:
    """Per-view rays as the projector hands them to a backend (axes times pixel pitch)."""
    src, ctr, u, v = (t.detach().to(device=device, dtype=dtype) for t in p.trajectory.tensors())
    du, dv = p.detector_spacing
    return Rays(src, ctr, u * du, v * dv, p.beam == "cone", p.detector_shape)


# ------------------------------------------------------------------ whole calls
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_project_and_backproject_match_cpu(seed, dtype):
    traj, shape, det, kw = random_scan(seed, dtype)
    cpu, gpu = projector_pair(traj, shape, det, kw)
    g = torch.Generator().manual_seed(seed)
    vol = torch.rand(shape, generator=g, dtype=torch.float64).to(dtype)
    sino_cpu = cpu.project(vol)
    sino_gpu = gpu.project(vol.to(CUDA))
    assert sino_gpu.device.type == "cuda" and sino_gpu.dtype == dtype
    assert_parity(sino_gpu, sino_cpu, dtype, f"project seed {seed}")

    y = torch.rand(cpu.projection_shape, generator=g, dtype=torch.float64).to(dtype)
    back_cpu = cpu.backproject(y)
    back_gpu = gpu.backproject(y.to(CUDA))
    assert_parity(back_gpu, back_cpu, dtype, f"backproject seed {seed}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_volumes_match_cpu(dtype):
    traj, shape, det, kw = random_scan(5, dtype)
    cpu, gpu = projector_pair(traj, shape, det, kw)
    vol = torch.rand((2, 3, *shape), dtype=torch.float64).to(dtype)
    assert_parity(gpu.project(vol.to(CUDA)), cpu.project(vol), dtype, "batched project")
    y = torch.rand((2, *cpu.projection_shape), dtype=torch.float64).to(dtype)
    assert_parity(gpu.backproject(y.to(CUDA)), cpu.backproject(y), dtype, "batched backproject")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["fan", "parallel"])
def test_2d_scans_match_cpu(kind, dtype):
    angles = torch.rand(9, dtype=torch.float64) * 2 * math.pi
    if kind == "fan":
        traj = circular_trajectory_2d_fan(sid=60.0, sdd=110.0, angles=angles, detector_offset=0.7,
                                          dtype=torch.float64)
        pitch = 1.6
    else:
        traj = circular_trajectory_2d_parallel(angles=angles, detector_offset=-0.4, dtype=torch.float64)
        pitch = 0.9
    traj = traj.to(dtype=dtype)
    kw = dict(detector_spacing=pitch, voxel_spacing=(1.1, 0.9))
    cpu, gpu = projector_pair(traj, (13, 17), 31, kw)
    img = torch.rand((13, 17), dtype=torch.float64).to(dtype)
    assert_parity(gpu.project(img.to(CUDA)), cpu.project(img), dtype, f"2D {kind} project")
    y = torch.rand(cpu.projection_shape, dtype=torch.float64).to(dtype)
    assert_parity(gpu.backproject(y.to(CUDA)), cpu.backproject(y), dtype, f"2D {kind} backproject")


# ------------------------------------------------------------------ windows
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_slab_and_tile_windows_match_cpu(seed, dtype):
    """Backend calls on a z-slab and a detector tile, global coordinates kept, against the CPU backend."""
    traj, shape, det, kw = random_scan(seed, dtype)
    p = Projector(traj, shape, det, backend="cpu", **kw)
    grid = VolumeGrid(p.global_volume_shape, p.voxel_spacing)
    cpu_b, gpu_b = get_backend("cpu"), get_backend("cuda")
    g = torch.Generator().manual_seed(50 + seed)
    D = shape[0]
    z0 = int(torch.randint(0, D - 1, (), generator=g))
    z1 = int(torch.randint(z0 + 1, D + 1, (), generator=g))
    U, V = det

    def span(n):  # a random range over the middle of the detector axis, so the tile sees the volume
        lo = int(torch.randint(0, n // 3 + 1, (), generator=g))
        return lo, int(torch.randint(max(lo + 1, (2 * n) // 3), n + 1, (), generator=g))

    tile = Tile(*span(U), *span(V))
    vol = torch.rand((1, *shape), generator=g, dtype=torch.float64).to(dtype)
    slab = vol[:, z0:z1].contiguous()
    rc, rg = rays_of(p, dtype, "cpu"), rays_of(p, dtype, CUDA)

    ref = cpu_b.project(slab, grid, z0, rc, tile)
    got = gpu_b.project(slab.to(CUDA), grid, z0, rg, tile)
    assert got.shape == (1, p.n_views, *tile.shape)
    assert_parity(got, ref, dtype, f"slab [{z0},{z1}) tile {tile} project")

    y = torch.rand((1, p.n_views, *tile.shape), generator=g, dtype=torch.float64).to(dtype)
    ref_b = cpu_b.backproject(y, grid, z0, z1, rc, tile)
    got_b = gpu_b.backproject(y.to(CUDA), grid, z0, z1, rg, tile)
    assert got_b.shape == (1, z1 - z0, *shape[1:])
    assert_parity(got_b, ref_b, dtype, f"slab [{z0},{z1}) tile {tile} backproject")


@pytest.mark.parametrize("dtype", DTYPES)
def test_slab_projections_add_up_on_cuda(dtype):
    """The slab principle on the GPU: projections of the slabs sum to the CPU's whole projection,
    and ``out=`` accumulates into an existing block."""
    traj, shape, det, kw = random_scan(1, dtype)
    p = Projector(traj, shape, det, backend="cpu", **kw)
    grid = VolumeGrid(p.global_volume_shape, p.voxel_spacing)
    gpu_b = get_backend("cuda")
    vol = torch.rand((1, *shape), dtype=torch.float64).to(dtype)
    rg = rays_of(p, dtype, CUDA)
    full = Tile.full(det)
    cuts = [0, shape[0] // 3, (2 * shape[0]) // 3, shape[0]]
    acc = torch.zeros((1, p.n_views, *det), dtype=dtype, device=CUDA)
    for a, b in zip(cuts[:-1], cuts[1:]):
        if b > a:
            gpu_b.project(vol[:, a:b].contiguous().to(CUDA), grid, a, rg, full, out=acc)
    assert_parity(acc, p.project(vol[0])[None], dtype, "sum of cuda slab projections")

    y = torch.rand((1, p.n_views, *det), dtype=torch.float64).to(dtype)
    whole = p.backproject(y[0])
    for a, b in zip(cuts[:-1], cuts[1:]):
        if b > a:
            part = gpu_b.backproject(y.to(CUDA), grid, a, b, rg, full)
            assert_parity(part[0], whole[a:b], dtype, f"cuda backprojection into slab [{a},{b})")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["inplace", "streamed"])
def test_planned_windows_on_cuda_match_cpu(where, dtype):
    """Projector calls split by the planner (slabs, view batches, detector tiles) on CUDA.

    ``inplace``: CUDA tensors, windows are views of them.  ``streamed``: CPU
    tensors with ``devices=["cuda:0"]``, windows copied through pinned buffers.
    """
    traj, shape, det, kw = random_scan(4, dtype)
    chunks = dict(volume_chunk_shape=max(1, shape[0] // 3), view_chunk_size=3,
                  detector_chunk_shape=(max(1, det[0] // 2), max(1, det[1] // 3)))
    cpu = Projector(traj, shape, det, backend="cpu", **kw)
    if where == "inplace":
        gpu = Projector(traj.to(device=CUDA), shape, det, backend="cuda", **kw, **chunks)
        dev = CUDA
    else:
        gpu = Projector(traj, shape, det, backend="cuda", devices=["cuda:0"], **kw, **chunks)
        dev = torch.device("cpu")
    vol = torch.rand((2, *shape), dtype=torch.float64).to(dtype)
    sino = gpu.project(vol.to(dev))
    assert sino.device.type == dev.type
    assert_parity(sino, cpu.project(vol), dtype, f"{where} windowed project")
    y = torch.rand((2, *cpu.projection_shape), dtype=torch.float64).to(dtype)
    back = gpu.backproject(y.to(dev))
    assert back.device.type == dev.type
    assert_parity(back, cpu.backproject(y), dtype, f"{where} windowed backproject")


def test_cuda_pair_is_adjoint_in_float64():
    traj, shape, det, kw = random_scan(2, torch.float64)
    gpu = Projector(traj.to(device=CUDA), shape, det, backend="cuda", **kw)
    x = torch.rand(shape, dtype=torch.float64, device=CUDA)
    y = torch.rand(gpu.projection_shape, dtype=torch.float64, device=CUDA)
    lhs = float((gpu.project(x) * y).sum())
    rhs = float((x * gpu.backproject(y)).sum())
    assert lhs > 0
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)


def test_launch_runs_on_torch_current_stream():
    """Inputs produced on a side stream are read by the kernel on that stream (no race with the producer)."""
    traj, shape, det, kw = random_scan(0, torch.float32)
    cpu, gpu = projector_pair(traj, shape, det, kw)
    base = torch.rand(shape, dtype=torch.float32)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        vol = base.to(CUDA, non_blocking=False) * 3.0 + 1.0
        sino = gpu.project(vol)
    side.synchronize()
    assert_parity(sino, cpu.project(base * 3.0 + 1.0), torch.float32, "project on a side stream")


# ------------------------------------------------------------------ geometry gradients
@pytest.mark.parametrize("seed", [0, 1])
def test_geometry_gradients_match_cpu(seed):
    """d loss / d(trajectory) through Projector.project on cuda equals the cpu result (float64)."""
    traj, shape, det, kw = random_scan(seed, torch.float64)
    vol = torch.rand(shape, dtype=torch.float64)
    grads = {}
    for backend, device in (("cpu", torch.device("cpu")), ("cuda", CUDA)):
        leaves = [t.detach().to(device).requires_grad_(True) for t in traj.tensors()]
        tr = traj.replace(source=leaves[0], detector_center=leaves[1], detector_u=leaves[2], detector_v=leaves[3])
        p = Projector(tr, shape, det, backend=backend, **kw)
        w = torch.linspace(-1, 1, math.prod(p.projection_shape), dtype=torch.float64).reshape(p.projection_shape)
        loss = (p.project(vol.to(device)) * w.to(device)).sum()
        grads[backend] = torch.autograd.grad(loss, leaves)
    for name, gc, gg in zip(("source", "detector_center", "detector_u", "detector_v"), grads["cpu"], grads["cuda"]):
        scale = float(gc.abs().max())
        assert scale > 0, f"zero gradient for {name}: the test would prove nothing"
        err = float((gg.cpu() - gc).abs().max())
        assert err <= 1e-9 * scale, f"{name}: max |cuda - cpu| = {err:.3e} (scale {scale:.3e})"


def test_backend_geometry_vjp_matches_cpu():
    """The CUDA backend's own geometry-VJP kernel (when it has one) against the CPU path, float64."""
    gpu_b = get_backend("cuda")
    if not hasattr(gpu_b, "geometry_vjp"):
        pytest.skip("the cuda backend has no geometry_vjp kernel (the executor falls back to the reference "
                    "autograd, covered by test_geometry_gradients_match_cpu)")
    traj, shape, det, kw = random_scan(3, torch.float64)
    p = Projector(traj, shape, det, backend="cpu", **kw)
    grid = VolumeGrid(p.global_volume_shape, p.voxel_spacing)
    cpu_b = get_backend("cpu")
    vol = torch.rand((1, *shape), dtype=torch.float64)
    gs = torch.rand((1, p.n_views, *det), dtype=torch.float64)
    tile = Tile.full(det)
    rc = rays_of(p, torch.float64, "cpu")
    if hasattr(cpu_b, "geometry_vjp"):
        ref = cpu_b.geometry_vjp(vol, grid, 0, gs, rc, tile)
    else:
        ref = reference_geometry_vjp(vol, grid, 0, gs, rc, tile)
    got = gpu_b.geometry_vjp(vol.to(CUDA), grid, 0, gs.to(CUDA), rays_of(p, torch.float64, CUDA), tile)
    for name, a, b in zip(("source", "center", "ustep", "vstep"), got, ref):
        scale = float(b.abs().max())
        assert scale > 0
        assert float((a.cpu() - b).abs().max()) <= 1e-9 * scale, name
