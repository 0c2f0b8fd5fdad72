"""The cpu backend: compiled C++/OpenMP kernels called through ctypes."""

from __future__ import annotations

import threading

import torch

from .base import Backend, Rays, Tile, VolumeGrid, backproject_buffers, project_buffers
from . import cpu_joseph_paths
from .cpu_build import cpu_function, load_cpu_library

_FORWARD_ARGS = cpu_joseph_paths.FORWARD_ARGS
_BACKWARD_ARGS = cpu_joseph_paths.BACKWARD_ARGS


# A calling thread may take a share of the cores (several CPU "devices" in one
# process, ctbench.engine.devices); otherwise kernels use torch's thread count.
_THREAD_SHARE = threading.local()


def num_threads() -> int:
    share = getattr(_THREAD_SHARE, "count", None)
    return share if share else max(1, torch.get_num_threads())


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def _geometry(rays: Rays, dtype):
    ts = [t.detach().to(dtype=dtype).contiguous() for t in rays.tensors()]
    return ts, [_ptr(t) for t in ts]


class CpuBackend(Backend):
    name = "cpu"

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def project(self, volume, grid: VolumeGrid, z0, rays: Rays, tile: Tile, out=None):
        B, nz, H, W = volume.shape
        nu, nv = tile.shape
        vol, out, accumulate = project_buffers(volume, rays, tile, out)
        if rays.n_views == 0 or nu == 0 or nv == 0:
            return out
        keep, g = _geometry(rays, vol.dtype)
        dz, dy, dx = grid.spacing
        U, V = rays.detector_shape
        cpu_joseph_paths.apply(load_cpu_library("joseph"))  # the measured (or forced) inner loops
        cpu_function("joseph", "joseph_forward", vol.dtype, _FORWARD_ARGS)(
            _ptr(vol), nz * H * W, B, grid.D, grid.H, grid.W, z0, z0 + nz, dx, dy, dz, *g, int(rays.cone),
            rays.n_views, U, V, tile.u0, tile.u1, tile.v0, tile.v1, _ptr(out), int(accumulate), num_threads())
        return out

    def backproject(self, sinogram, grid: VolumeGrid, z0, z1, rays: Rays, tile: Tile, out=None):
        B = sinogram.shape[0]
        sino, out = backproject_buffers(sinogram, grid, z0, z1, out)
        if rays.n_views == 0 or z1 <= z0:
            return out
        keep, g = _geometry(rays, sino.dtype)
        dz, dy, dx = grid.spacing
        U, V = rays.detector_shape
        cpu_joseph_paths.apply(load_cpu_library("joseph"))
        cpu_function("joseph", "joseph_backward", sino.dtype, _BACKWARD_ARGS)(
            _ptr(sino), B, grid.D, grid.H, grid.W, z0, z1, dx, dy, dz, *g, int(rays.cone), rays.n_views, U, V,
            tile.u0, tile.u1, tile.v0, tile.v1, _ptr(out), (z1 - z0) * grid.H * grid.W, num_threads())
        return out

    def geometry_vjp(self, volume, grid: VolumeGrid, z0, grad_sino, rays: Rays, tile: Tile):
        """d<A(g) volume, grad_sino>/d(source, center, ustep, vstep) with the OpenMP kernel."""
        from .geometry_grad import cpu_geometry_vjp
        return cpu_geometry_vjp(volume, grid, z0, grad_sino, rays, tile, num_threads())
