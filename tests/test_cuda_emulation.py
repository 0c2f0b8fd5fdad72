"""The CUDA entry files, executed on the host, against the CPU backend.

``backend="cuda-emulated"`` compiles ``kernels/*_cuda.cu`` with the host compiler
through ``kernels/cuda_host_shim.h`` and runs every launch grid block by block
(threads as fibers, barriers and warp shuffles honoured) with the grid the cuda
backend computes.  The whole cuda backend path runs: argument marshalling,
launch arithmetic, windows.  So indexing, window and launch-configuration bugs
of the CUDA kernels fail here, on a machine without a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ctbench import Projector
from ctbench.engine import get_backend
from ctbench.engine.base import Rays, Tile, VolumeGrid
from ctbench.engine import cuda as cuda_backend
from ctbench.engine.cuda import launch_config
from ctbench.engine.fdk_kernels import weighted_backproject
from sample_geometries import sample_geometries

DTYPES = [torch.float64, torch.float32]
FIELDS = ("source", "detector_center", "detector_u", "detector_v")


def assert_parity(actual, expected, dtype, what):
    actual, expected = actual.detach().double(), expected.detach().double()
    assert actual.shape == expected.shape, what
    scale = float(expected.abs().max())
    assert scale > 0, f"{what}: the reference is all zeros, the comparison would prove nothing"
    tol = 2e-5 if dtype == torch.float32 else 1e-12
    err = float((actual - expected).abs().max())
    assert err <= tol * scale, f"{what}: max |emulated cuda - cpu| = {err:.3e}, allowed {tol * scale:.3e}"


def pair(traj, vol, det, kw, **opts):
    return (Projector(traj, vol, det, backend="cpu", **kw, **opts),
            Projector(traj, vol, det, backend="cuda-emulated", **kw, **opts))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", range(5), ids=[g[0] for g in sample_geometries(torch.float64)])
def test_projection_and_backprojection_equal_the_cpu_backend(case, dtype):
    name, traj, vol, det, kw = sample_geometries(dtype)[case]
    cpu, emu = pair(traj, vol, det, kw)
    g = torch.Generator().manual_seed(case)
    x = torch.rand(cpu.volume_shape, dtype=dtype, generator=g)
    assert_parity(emu.project(x), cpu.project(x), dtype, f"{name} forward")
    y = torch.rand(cpu.projection_shape, dtype=dtype, generator=g)
    assert_parity(emu.backproject(y), cpu.backproject(y), dtype, f"{name} backward")


@pytest.mark.parametrize("case", [0, 1, 3], ids=["cone", "helical", "fan2d"])
def test_slab_view_and_tile_windows_and_batches(case):
    """Windows of the executor (slabs, view batches, detector tiles) and (B, C) batches, odd sizes."""
    dtype = torch.float64
    name, traj, vol, det, kw = sample_geometries(dtype)[case]
    opts = dict(volume_chunk_shape=3, view_chunk_size=4)
    if len(vol) == 3:
        opts["detector_chunk_shape"] = (5, 4)
    cpu, emu = pair(traj, vol, det, kw, **opts)
    whole = Projector(traj, vol, det, backend="cpu", **kw)
    g = torch.Generator().manual_seed(7)
    x = torch.rand((2, 1, *cpu.volume_shape), dtype=dtype, generator=g)
    ref = whole.project(x)
    assert_parity(emu.project(x), ref, dtype, f"{name} windowed batched forward")
    assert_parity(cpu.project(x), ref, dtype, f"{name} windowed cpu (sanity)")
    y = torch.rand((2, 1, *cpu.projection_shape), dtype=dtype, generator=g)
    assert_parity(emu.backproject(y), whole.backproject(y), dtype, f"{name} windowed batched backward")


def _rays(traj, det, dtype):
    return Rays(*[getattr(traj, f).to(dtype) for f in FIELDS], traj.beam == "cone", det)


def test_zero_size_windows_launch_nothing_and_write_nothing():
    emu, cpu = get_backend("cuda-emulated"), get_backend("cpu")
    name, traj, vol, det, kw = sample_geometries(torch.float64)[0]
    grid = VolumeGrid(vol, kw["voxel_spacing"])
    rays = Rays(*[t * s for t, s in zip([traj.source, traj.detector_center], [1, 1])],
                traj.detector_u * kw["detector_spacing"][0], traj.detector_v * kw["detector_spacing"][1],
                True, det)
    slab = torch.rand((1, 4, vol[1], vol[2]), dtype=torch.float64)
    for tile in (Tile(3, 3, 0, det[1]), Tile(0, det[0], 2, 2)):
        out = emu.project(slab, grid, 2, rays, tile)
        assert out.numel() == 0
    none = rays.views(3, 3)
    assert emu.project(slab, grid, 2, none, Tile(0, det[0], 0, det[1])).numel() == 0
    vol_out = torch.full((1, 0, vol[1], vol[2]), 5.0, dtype=torch.float64)
    sino = torch.rand((1, rays.n_views, *det), dtype=torch.float64)
    res = emu.backproject(sino, grid, 4, 4, rays, Tile(0, det[0], 0, det[1]))
    assert res.numel() == 0
    # a one-plane slab at the grid's top edge still equals the cpu backend
    top = torch.rand((1, 1, vol[1], vol[2]), dtype=torch.float64)
    full = Tile(0, det[0], 0, det[1])
    assert_parity(emu.project(top, grid, vol[0] - 1, rays, full), cpu.project(top, grid, vol[0] - 1, rays, full),
                  torch.float64, "one-plane top slab")
    assert_parity(emu.backproject(sino, grid, vol[0] - 1, vol[0], rays, full),
                  cpu.backproject(sino, grid, vol[0] - 1, vol[0], rays, full), torch.float64, "one-plane backward")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [0, 2, 3], ids=["cone", "parallel3d", "fan2d"])
def test_fdk_weighted_backprojection_equals_the_cpu_backend(case, dtype):
    name, traj, vol, det, kw = sample_geometries(dtype)[case]
    p = Projector(traj, vol, det, backend="cpu", **kw)
    rays = p._rays(None, dtype, torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    U, V = rays.detector_shape
    q = torch.rand((rays.n_views, U, V), dtype=dtype, generator=g)
    w = torch.rand(rays.n_views, dtype=dtype, generator=g) + 0.5
    D = p.grid.shape[0]
    windows = [(0, D, None), (D - 1, D, (0, 1))]
    if D > 2:
        windows.append((1, D - 2, (2, rays.n_views - 1)))
    for z0, z1, views in windows:
        a = weighted_backproject(q, rays, p.grid, w, z0=z0, z1=z1, views=views, backend="cuda-emulated")
        b = weighted_backproject(q, rays, p.grid, w, z0=z0, z1=z1, views=views, backend="cpu")
        assert_parity(a, b, dtype, f"{name} fdk slab [{z0},{z1}) views {views}")


@pytest.mark.parametrize("case", [0, 1, 4], ids=["cone", "helical", "parallel2d"])
def test_geometry_vjp_equals_the_cpu_backend(case):
    """The reduction kernel (warp shuffles, shared memory, one atomic per view and value) runs emulated."""
    dtype = torch.float64
    name, traj, vol, det, kw = sample_geometries(dtype)[case]
    g = torch.Generator().manual_seed(11)
    x = torch.rand(Projector(traj, vol, det, **kw).volume_shape, dtype=dtype, generator=g)
    grads = {}
    for backend in ("cpu", "cuda-emulated"):
        params = {f: getattr(traj, f).clone().requires_grad_(True) for f in FIELDS}
        t = dataclasses.replace(traj, **params)
        p = Projector(traj, vol, det, backend=backend, volume_chunk_shape=4, **kw)
        p.project(x, trajectory=t).square().sum().backward()
        grads[backend] = torch.cat([params[f].grad for f in FIELDS])
    assert_parity(grads["cuda-emulated"], grads["cpu"], dtype, f"{name} geometry vjp")


def test_launches_use_the_backends_launch_configuration():
    """Every one-thread-per-item launch covers the items with whole blocks and no spare block."""
    from ctbench.engine.cuda_emulation import _kernel

    name, traj, vol, det, kw = sample_geometries(torch.float64)[0]
    p = Projector(traj, vol, det, backend="cuda-emulated", **kw)
    k = _kernel("joseph", "joseph_forward", "double")
    k.launches.clear()
    p.project(torch.rand(p.volume_shape, dtype=torch.float64))
    from ctbench.engine.cuda import FORWARD_RAYS_PER_THREAD
    n_threads = traj.n_views * -(-det[0] // FORWARD_RAYS_PER_THREAD) * det[1]  # odd U: a last group of one
    assert det[0] % FORWARD_RAYS_PER_THREAD != 0
    assert k.launches == [((launch_config(n_threads)[0][0], 1, 1), (launch_config(n_threads)[1][0], 1, 1))]
    (blocks,), (threads,) = launch_config(n_threads)
    assert blocks * threads >= n_threads > (blocks - 1) * threads


def test_a_launch_with_too_few_blocks_is_caught(monkeypatch):
    """The parity check sees launch-configuration bugs: one block short leaves rays unprojected."""
    name, traj, vol, det, kw = sample_geometries(torch.float64)[0]
    cpu, emu = pair(traj, vol, det, kw)
    x = torch.rand(cpu.volume_shape, dtype=torch.float64)
    real = launch_config
    monkeypatch.setattr(cuda_backend, "launch_config", lambda n, block=256: ((max(real(n, block)[0][0] - 1, 0),),
                                                                            (block,)))
    with pytest.raises(AssertionError, match="max \\|emulated cuda - cpu\\|"):
        assert_parity(emu.project(x), cpu.project(x), torch.float64, "short launch")


def test_emulated_kernels_refuse_arguments_of_the_wrong_width():
    """np.int32/np.int64/np.float64 widths are part of the launch: a Python int for an i64 is refused."""
    from ctbench.engine.cuda_emulation import _kernel

    k = _kernel("joseph", "joseph_forward", "double")
    with pytest.raises(TypeError, match="takes 25 arguments"):
        k((1,), (32,), (1, 2))
    import numpy as np
    args = [None] * 25
    with pytest.raises(TypeError, match="parameter of type"):
        k((1,), (32,), tuple(np.int32(0) if a is None else a for a in args))


def test_python_launch_constants_match_the_kernels():
    """Launch arithmetic in Python and the kernels' compile-time constants agree."""
    import re

    from ctbench.engine.kernel_sources import kernel_dir
    from ctbench.engine.fdk_kernels import CUDA_FDK_ZPT
    from ctbench.engine.geometry_grad import _CUDA_BLOCK

    fdk = (kernel_dir() / "fdk_cuda.cu").read_text()
    assert int(re.search(r"#define FDK_ZPT (\d+)", fdk).group(1)) == CUDA_FDK_ZPT
    grad = (kernel_dir() / "joseph_grad_cuda.cu").read_text()
    assert int(re.search(r"#define CT_GRAD_BLOCK (\d+)", grad).group(1)) == _CUDA_BLOCK


def test_tiled_backprojection_constants_match_the_kernel():
    import re

    from ctbench.engine.kernel_sources import kernel_dir
    from ctbench.engine.cuda import BACKWARD_BOX, BACKWARD_THREADS

    src = (kernel_dir() / "joseph_cuda.cu").read_text()
    got = tuple(int(re.search(rf"#define JB_{n} (\d+)", src).group(1)) for n in ("TX", "TY", "TZ"))
    assert got == BACKWARD_BOX
    assert int(re.search(r"#define JB_THREADS (\d+)", src).group(1)) == BACKWARD_THREADS
    from ctbench.engine.cuda import FORWARD_RAYS_PER_THREAD
    assert int(re.search(r"#define JF_RAYS (\d+)", src).group(1)) == FORWARD_RAYS_PER_THREAD


@pytest.mark.parametrize("kernel", ["tiled", "scatter"])
def test_both_matched_backprojections_equal_the_cpu_backend(kernel, monkeypatch):
    """The box-owning kernel (no global atomics) and the per-ray scatter kernel, with a volume that
    does not divide into boxes, a slab window, a detector tile and a batch."""
    monkeypatch.setattr(cuda_backend, "BACKPROJECT_KERNEL", kernel)
    from ctbench import circular_trajectory_3d

    traj = circular_trajectory_3d(7, 50.0, 95.0, detector_offset=(1.3, -0.7), dtype=torch.float64)
    vol, det = (9, 37, 35), (30, 14)
    kw = dict(voxel_spacing=(1.1, 0.7, 0.8), detector_spacing=(1.5, 1.6))
    cpu, emu = pair(traj, vol, det, kw, volume_chunk_shape=5, detector_chunk_shape=(17, 14))
    y = torch.rand((2, 1, *cpu.projection_shape), dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    assert_parity(emu.backproject(y), cpu.backproject(y), torch.float64, f"{kernel} backprojection")
