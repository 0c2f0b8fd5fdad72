"""The cuda backend: the single-source kernels through CuPy's RawModule (NVRTC).

Kernels compile at first use; launches run on torch's current stream and
read/write torch tensors in place through ``__cuda_array_interface__``, so
no data is copied.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from .base import Backend, Rays, Tile, VolumeGrid, backproject_buffers, project_buffers
from .kernel_sources import kernel_dir
from .geometry_grad import _CUDA_BLOCK, _CUDA_MAX_GRID_Y, _FAMILY, _check, _split, _zeros

_CTYPE = {torch.float32: "float", torch.float64: "double"}
_BLOCK = 256

# Every templated __global__ kernel of each CUDA entry file (kernels/<family>_cuda.cu).
CUDA_KERNELS = {
    "joseph": ("joseph_forward", "joseph_backward", "joseph_backward_tiled"),
    "joseph_grad": ("joseph_geometry_vjp",),
    "fdk": ("fdk_view_matrices", "fdk_backproject"),
}


def _cupy():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeError(
            "backend='cuda' needs CuPy: pip install 'ctbench[gpu]' (cupy-cuda12x)") from e
    return cupy


def entry_source(family: str) -> str:
    return (kernel_dir() / f"{family}_cuda.cu").read_text()


def nvrtc_program(family: str, names: tuple[str, ...]) -> tuple[str, tuple[str, ...], list[str]]:
    """(source, options, name expressions) that the backend hands to CuPy's RawModule (NVRTC).

    One function, so that the NVRTC test without a GPU compiles exactly what CuPy compiles.
    """
    return entry_source(family), ("-std=c++17", f"-I{kernel_dir()}"), list(names)


def name_expressions(family: str) -> tuple[str, ...]:
    """Every templated kernel of a family, for both dtypes: ``("joseph_forward<float>", ...)``."""
    return tuple(f"{n}<{t}>" for n in CUDA_KERNELS[family] for t in _CTYPE.values())


def launch_config(n_threads: int, block: int = _BLOCK) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) of a one-thread-per-item launch over ``n_threads`` items.

    Pure arithmetic shared by the CuPy launch and the host emulation, so the
    emulated grids are the ones a GPU runs.
    """
    return (max(0, math.ceil(n_threads / block)),), (block,)


# Rays per thread of joseph_forward (JF_RAYS in kernels/joseph_cuda.cu), along the detector's u axis.
FORWARD_RAYS_PER_THREAD = 2
# Box of one block of joseph_backward_tiled: JB_TX, JB_TY, JB_TZ and JB_THREADS in kernels/joseph_cuda.cu.
BACKWARD_BOX = (32, 16, 4)
BACKWARD_THREADS = 256
# The matched backprojection kernel: "tiled" (per-box shared memory, no global atomics) or
# "scatter" (one thread per ray, four global atomics per sample; kept for comparison).
BACKPROJECT_KERNEL = "tiled"


def tiled_launch_config(W: int, H: int, nz: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) of joseph_backward_tiled over a (nz, H, W) slab: one block per box."""
    tx, ty, tz = BACKWARD_BOX
    n = math.ceil(W / tx) * math.ceil(H / ty) * math.ceil(nz / tz) if W and H and nz else 0
    return (n,), (BACKWARD_THREADS,)


@lru_cache(maxsize=None)
def _module(family: str, names: tuple[str, ...], device_index: int):
    cp = _cupy()
    source, options, exprs = nvrtc_program(family, names)
    with cp.cuda.Device(device_index):
        mod = cp.RawModule(code=source, options=options, name_expressions=exprs)
        mod.compile()
    return mod


def as_cupy(t: torch.Tensor):
    """A CuPy view of a CUDA tensor (strides kept), without copies or host syncs.

    ``cupy.asarray`` through ``__cuda_array_interface__`` would block the host on
    the producer's stream at every launch; wrapping the raw pointer does not.
    The tensor must stay alive for the launch (callers hold it).
    """
    cp = _cupy()
    es = t.element_size()
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
    mem = cp.cuda.UnownedMemory(t.data_ptr(), max(span, 1) * es, t, t.device.index or 0)
    return cp.ndarray(tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""),
                      memptr=cp.cuda.MemoryPointer(mem, 0), strides=tuple(st * es for st in t.stride()))


class CupyRuntime:
    """Kernels, arrays and streams through CuPy on a real GPU."""

    name = "cuda"

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def kernel(self, family: str, name: str, dtype: torch.dtype, device: torch.device):
        return _module(family, name_expressions(family), device.index or 0).get_function(
            f"{name}<{_CTYPE[dtype]}>")

    def array(self, t: torch.Tensor):
        return as_cupy(t)

    def on_stream(self, device: torch.device):
        """Launches inside run on torch's current stream of ``device``."""
        cp = _cupy()
        idx = device.index or 0
        stream = torch.cuda.current_stream(device)
        return _Both(cp.cuda.Device(idx), cp.cuda.ExternalStream(stream.cuda_stream, idx))


class _Both:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __enter__(self):
        self.a.__enter__()
        self.b.__enter__()

    def __exit__(self, *exc):
        self.b.__exit__(*exc)
        self.a.__exit__(*exc)


def runtime_for(name: str):
    """The runtime of backend ``name``: ``"cuda"`` (CuPy) or ``"cuda-emulated"`` (host emulation)."""
    if name == "cuda-emulated":
        from .cuda_emulation import EmulatedRuntime
        return EmulatedRuntime()
    return CupyRuntime()


def launch(runtime, kernel, n_threads: int, args, device: torch.device):
    """Launch ``kernel`` over ``n_threads`` threads on ``runtime``'s stream for ``device``."""
    if n_threads <= 0:
        return
    grid, block = launch_config(n_threads)
    with runtime.on_stream(device):
        kernel(grid, block, args)


class CudaBackend(Backend):
    """The CUDA entry files through a runtime: CuPy on a GPU, or the host emulation (``"cuda-emulated"``)."""

    def __init__(self, runtime=None):
        self.runtime = runtime if runtime is not None else CupyRuntime()
        self.name = self.runtime.name

    def supports(self, device: torch.device) -> bool:
        return self.runtime.supports(device)

    def project(self, volume, grid: VolumeGrid, z0, rays: Rays, tile: Tile, out=None):
        B, nz, H, W = volume.shape
        nu, nv = tile.shape
        vol, out, accumulate = project_buffers(volume, rays, tile, out)
        geo = [t.detach().to(device=vol.device, dtype=vol.dtype).contiguous() for t in rays.tensors()]
        U, V = rays.detector_shape
        dz, dy, dx = grid.spacing
        rt = self.runtime
        k = rt.kernel("joseph", "joseph_forward", vol.dtype, vol.device)
        args = (rt.array(vol), np.int64(nz * H * W), np.int32(B), np.int32(grid.D), np.int32(grid.H),
                np.int32(grid.W), np.int32(z0), np.int32(z0 + nz), np.float64(dx), np.float64(dy), np.float64(dz),
                *[rt.array(t) for t in geo], np.int32(rays.cone), np.int32(rays.n_views), np.int32(U), np.int32(V),
                np.int32(tile.u0), np.int32(tile.u1), np.int32(tile.v0), np.int32(tile.v1), rt.array(out),
                np.int32(accumulate))
        launch(rt, k, rays.n_views * -(-nu // FORWARD_RAYS_PER_THREAD) * nv, args, vol.device)
        return out

    def backproject(self, sinogram, grid: VolumeGrid, z0, z1, rays: Rays, tile: Tile, out=None):
        B = sinogram.shape[0]
        sino, out = backproject_buffers(sinogram, grid, z0, z1, out)
        geo = [t.detach().to(device=sino.device, dtype=sino.dtype).contiguous() for t in rays.tensors()]
        U, V = rays.detector_shape
        dz, dy, dx = grid.spacing
        nu, nv = tile.shape
        rt = self.runtime
        tiled = BACKPROJECT_KERNEL == "tiled"
        k = rt.kernel("joseph", "joseph_backward_tiled" if tiled else "joseph_backward", sino.dtype, sino.device)
        args = (rt.array(sino), np.int32(B), np.int32(grid.D), np.int32(grid.H), np.int32(grid.W), np.int32(z0),
                np.int32(z1), np.float64(dx), np.float64(dy), np.float64(dz), *[rt.array(t) for t in geo],
                np.int32(rays.cone), np.int32(rays.n_views), np.int32(U), np.int32(V), np.int32(tile.u0),
                np.int32(tile.u1), np.int32(tile.v0), np.int32(tile.v1), rt.array(out),
                np.int64((z1 - z0) * grid.H * grid.W))
        if not tiled:
            launch(rt, k, rays.n_views * nu * nv, args, sino.device)
        elif rays.n_views * nu * nv > 0:
            grid_, block = tiled_launch_config(grid.W, grid.H, z1 - z0)
            if grid_[0] > 0:
                with rt.on_stream(sino.device):
                    k(grid_, block, args)
        return out

    def geometry_vjp(self, volume, grid: VolumeGrid, z0, grad_sino, rays: Rays, tile: Tile):
        """d<A(g) volume, grad_sino>/d(source, center, ustep, vstep) with the CUDA kernel."""
        return cuda_geometry_vjp(volume, grid, z0, grad_sino, rays, tile, runtime=self.runtime)


# The CUDA side of the geometry gradient lives here, above geometry_grad (the CPU side and the shared
# checks), so that the arrow points one way: cuda -> geometry_grad.
def cuda_geometry_vjp(volume: torch.Tensor, grid: VolumeGrid, z0: int, grad_sino: torch.Tensor, rays: Rays,
                      tile: Tile, runtime=None):
    """Geometry VJP of one window with the CUDA kernel (NVRTC through CuPy), on torch's current stream."""
    runtime = runtime if runtime is not None else CupyRuntime()
    as_cupy = runtime.array

    _check(volume, grid, z0, grad_sino, rays, tile)
    dtype, device = volume.dtype, volume.device
    B, nz, H, W = volume.shape
    nu, nv = tile.shape
    if rays.n_views == 0 or B == 0 or nz == 0 or nu == 0 or nv == 0:
        return _zeros(rays, dtype, device)
    vol = volume.detach().contiguous()
    g = grad_sino.detach().contiguous()
    geo = [t.detach().to(device=device, dtype=dtype).contiguous() for t in rays.tensors()]
    out = torch.zeros((rays.n_views, 12), dtype=torch.float64, device=device)
    kernel = runtime.kernel(_FAMILY, "joseph_geometry_vjp", dtype, device)
    dz, dy, dx = grid.spacing
    U, V = rays.detector_shape
    (blocks_x,), block = launch_config(nu * nv, _CUDA_BLOCK)
    with runtime.on_stream(device):
        for k0 in range(0, rays.n_views, _CUDA_MAX_GRID_Y):
            n_k = min(_CUDA_MAX_GRID_Y, rays.n_views - k0)
            args = (as_cupy(vol), np.int64(nz * H * W), np.int32(B), np.int32(grid.D), np.int32(grid.H),
                    np.int32(grid.W), np.int32(z0), np.int32(z0 + nz), np.float64(dx), np.float64(dy),
                    np.float64(dz), *[as_cupy(t) for t in geo], np.int32(rays.cone), np.int32(rays.n_views),
                    np.int32(U), np.int32(V), np.int32(tile.u0), np.int32(tile.u1), np.int32(tile.v0),
                    np.int32(tile.v1), np.int32(k0), as_cupy(g), as_cupy(out))
            kernel((blocks_x, n_k), block, args)
    return _split(out, dtype)
