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
from .cpu_build import kernel_dir

_CTYPE = {torch.float32: "float", torch.float64: "double"}
_BLOCK = 256


def _cupy():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeError(
            "backend='cuda' needs CuPy: pip install 'ctbench[gpu]' (cupy-cuda12x)") from e
    return cupy


def entry_source(family: str) -> str:
    return (kernel_dir() / f"{family}_cuda.cu").read_text()


@lru_cache(maxsize=None)
def _module(family: str, names: tuple[str, ...], device_index: int):
    cp = _cupy()
    with cp.cuda.Device(device_index):
        mod = cp.RawModule(code=entry_source(family), options=("-std=c++17", f"-I{kernel_dir()}"),
                           name_expressions=list(names))
        mod.compile()
    return mod


def get_kernel(family: str, name: str, dtype: torch.dtype, device: torch.device, all_names: tuple[str, ...]):
    expr = f"{name}<{_CTYPE[dtype]}>"
    names = tuple(f"{n}<{t}>" for n in all_names for t in _CTYPE.values())
    return _module(family, names, device.index or 0).get_function(expr)


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


def launch(kernel, n_threads: int, args, device: torch.device):
    """Launch ``kernel`` over ``n_threads`` threads on torch's current stream."""
    if n_threads <= 0:
        return
    cp = _cupy()
    stream = torch.cuda.current_stream(device)
    with cp.cuda.Device(device.index or 0), cp.cuda.ExternalStream(stream.cuda_stream, device.index or 0):
        kernel((math.ceil(n_threads / _BLOCK),), (_BLOCK,), args)


_JOSEPH = ("joseph_forward", "joseph_backward")


class CudaBackend(Backend):
    name = "cuda"

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def project(self, volume, grid: VolumeGrid, z0, rays: Rays, tile: Tile, out=None):
        B, nz, H, W = volume.shape
        nu, nv = tile.shape
        vol, out, accumulate = project_buffers(volume, rays, tile, out)
        geo = [t.detach().to(device=vol.device, dtype=vol.dtype).contiguous() for t in rays.tensors()]
        U, V = rays.detector_shape
        dz, dy, dx = grid.spacing
        k = get_kernel("joseph", "joseph_forward", vol.dtype, vol.device, _JOSEPH)
        args = (as_cupy(vol), np.int64(nz * H * W), np.int32(B), np.int32(grid.D), np.int32(grid.H),
                np.int32(grid.W), np.int32(z0), np.int32(z0 + nz), np.float64(dx), np.float64(dy), np.float64(dz),
                *[as_cupy(t) for t in geo], np.int32(rays.cone), np.int32(rays.n_views), np.int32(U), np.int32(V),
                np.int32(tile.u0), np.int32(tile.u1), np.int32(tile.v0), np.int32(tile.v1), as_cupy(out),
                np.int32(accumulate))
        launch(k, rays.n_views * nu * nv, args, vol.device)
        return out

    def backproject(self, sinogram, grid: VolumeGrid, z0, z1, rays: Rays, tile: Tile, out=None):
        B = sinogram.shape[0]
        sino, out = backproject_buffers(sinogram, grid, z0, z1, out)
        geo = [t.detach().to(device=sino.device, dtype=sino.dtype).contiguous() for t in rays.tensors()]
        U, V = rays.detector_shape
        dz, dy, dx = grid.spacing
        nu, nv = tile.shape
        k = get_kernel("joseph", "joseph_backward", sino.dtype, sino.device, _JOSEPH)
        args = (as_cupy(sino), np.int32(B), np.int32(grid.D), np.int32(grid.H), np.int32(grid.W), np.int32(z0),
                np.int32(z1), np.float64(dx), np.float64(dy), np.float64(dz), *[as_cupy(t) for t in geo],
                np.int32(rays.cone), np.int32(rays.n_views), np.int32(U), np.int32(V), np.int32(tile.u0),
                np.int32(tile.u1), np.int32(tile.v0), np.int32(tile.v1), as_cupy(out),
                np.int64((z1 - z0) * grid.H * grid.W))
        launch(k, rays.n_views * nu * nv, args, sino.device)
        return out

    def geometry_vjp(self, volume, grid: VolumeGrid, z0, grad_sino, rays: Rays, tile: Tile):
        """d<A(g) volume, grad_sino>/d(source, center, ustep, vstep) with the CUDA kernel."""
        from .geometry_grad import cuda_geometry_vjp
        return cuda_geometry_vjp(volume, grid, z0, grad_sino, rays, tile)
