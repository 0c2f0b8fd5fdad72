"""The cpu backend: compiled C++/OpenMP kernels called through ctypes."""

from __future__ import annotations

import threading

import torch

from ..base import Backend, Rays, Tile, VolumeGrid, backproject_buffers, project_buffers
from . import joseph_paths
from .library import cpu_function, load_cpu_library

_FORWARD_ARGS = joseph_paths.FORWARD_ARGS
_BACKWARD_ARGS = joseph_paths.BACKWARD_ARGS


# A calling thread may take a share of the cores (several CPU "devices" in one
# process, ctbench.engine.devices); otherwise kernels use torch's thread count.
_THREAD_SHARE = threading.local()


def num_threads() -> int:
    share = getattr(_THREAD_SHARE, "count", None)
    return share if share else max(1, torch.get_num_threads())


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


# The kernels' vector lanes and scatter offsets index a plane by 32-bit global voxel numbers; a window whose
# planes lie past 2^31 voxels of the global grid (z1 * H * W, e.g. z >= 1024 of a 2048^3 volume streamed in
# windows) is traced as a standalone volume of its own planes, the rays moved by the same distance.
_INDEX_LIMIT = 2**31 - 1


def standalone_window(grid: VolumeGrid, z0: int, z1: int, rays: Rays) -> tuple[VolumeGrid, int, Rays]:
    """(grid, z0, rays) for the window [z0, z1): unchanged while its global voxel numbers fit 32 bits, else
    the window as a grid of z1 - z0 planes at z0 = 0 and the rays translated along z by the distance between
    the window's centre and the grid's (plane k's centre is at (k - (D - 1) / 2) dz)."""
    if z1 * grid.H * grid.W <= _INDEX_LIMIT:
        return grid, z0, rays
    nz = z1 - z0
    shift = (z0 + (nz - grid.D) / 2.0) * grid.spacing[0]  # exact in float64; one rounding to the ray dtype
    move = torch.zeros(3, dtype=torch.float64)
    move[2] = shift
    move = move.to(device=rays.source.device, dtype=rays.source.dtype)
    source = rays.source - move if rays.cone else rays.source  # parallel beams: source is a direction
    local = Rays(source, rays.center - move, rays.ustep, rays.vstep, rays.cone, rays.detector_shape)
    return VolumeGrid((nz, grid.H, grid.W), grid.spacing), 0, local


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
        grid, z0, rays = standalone_window(grid, z0, z0 + nz, rays)
        keep, g = _geometry(rays, vol.dtype)
        dz, dy, dx = grid.spacing
        U, V = rays.detector_shape
        joseph_paths.apply(load_cpu_library("joseph"))  # the measured (or forced) inner loops
        cpu_function("joseph", "joseph_forward", vol.dtype, _FORWARD_ARGS)(
            _ptr(vol), nz * H * W, B, grid.D, grid.H, grid.W, z0, z0 + nz, dx, dy, dz, *g, int(rays.cone),
            rays.n_views, U, V, tile.u0, tile.u1, tile.v0, tile.v1, _ptr(out), int(accumulate), num_threads())
        return out

    def backproject(self, sinogram, grid: VolumeGrid, z0, z1, rays: Rays, tile: Tile, out=None):
        B = sinogram.shape[0]
        sino, out = backproject_buffers(sinogram, grid, z0, z1, out)
        if rays.n_views == 0 or z1 <= z0:
            return out
        grid, z0, rays = standalone_window(grid, z0, z1, rays)
        z1 = z0 + out.shape[1]
        keep, g = _geometry(rays, sino.dtype)
        dz, dy, dx = grid.spacing
        U, V = rays.detector_shape
        joseph_paths.apply(load_cpu_library("joseph"))
        cpu_function("joseph", "joseph_backward", sino.dtype, _BACKWARD_ARGS)(
            _ptr(sino), B, grid.D, grid.H, grid.W, z0, z1, dx, dy, dz, *g, int(rays.cone), rays.n_views, U, V,
            tile.u0, tile.u1, tile.v0, tile.v1, _ptr(out), (z1 - z0) * grid.H * grid.W, num_threads())
        return out

    def geometry_vjp(self, volume, grid: VolumeGrid, z0, grad_sino, rays: Rays, tile: Tile):
        """d<A(g) volume, grad_sino>/d(source, center, ustep, vstep) with the OpenMP kernel."""
        from .geometry_vjp import cpu_geometry_vjp
        grid, z0, moved = standalone_window(grid, z0, z0 + volume.shape[1], rays)
        return cpu_geometry_vjp(volume, grid, z0, grad_sino, moved, tile, num_threads())
