"""Python side of the geometry-gradient kernels (kernels/joseph_grad*).

``cpu_geometry_vjp`` (here) and ``cuda_geometry_vjp`` (:mod:`ctbench.engine.cuda`) compute, for one window
(a volume slab starting at global plane ``z0`` and a detector tile),

    d <A(g) volume, grad_sino> / d(source, center, ustep, vstep)

per view, summed over the batch.  The kernels accumulate per view in float64;
the four results come back in the rays' dtype, each ``(n_views, 3)``.
"""

from __future__ import annotations


import torch

from .base import Rays, Tile, VolumeGrid
from .cpu_build import F64, I64, INT, PTR, cpu_function

_P, _I, _L, _D = PTR, INT, I64, F64
_CPU_ARGS = [_P, _L, _I, _I, _I, _I, _I, _I, _D, _D, _D, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I,
             _P, _P, _I]
_DTYPES = (torch.float32, torch.float64)
_FAMILY = "joseph_grad"
_CUDA_BLOCK = 256         # must match CT_GRAD_BLOCK in joseph_grad_cuda.cu
_CUDA_MAX_GRID_Y = 65535  # views per launch (gridDim.y limit)


def _check(volume: torch.Tensor, grid: VolumeGrid, z0: int, grad_sino: torch.Tensor, rays: Rays, tile: Tile):
    if volume.ndim != 4 or tuple(volume.shape[2:]) != (grid.H, grid.W):
        raise ValueError(f"volume must be a (B, nz, {grid.H}, {grid.W}) slab, got {tuple(volume.shape)}")
    B, nz = volume.shape[:2]
    if not 0 <= z0 <= z0 + nz <= grid.D:
        raise ValueError(f"slab [z0={z0}, {z0 + nz}) lies outside the grid's {grid.D} planes")
    want = (B, rays.n_views, *tile.shape)
    if tuple(grad_sino.shape) != want:
        raise ValueError(f"grad_sino must have shape {want}, got {tuple(grad_sino.shape)}")
    if grad_sino.dtype != volume.dtype or volume.dtype not in _DTYPES:
        raise TypeError(f"volume and grad_sino must share a float32/float64 dtype, got {volume.dtype} "
                        f"and {grad_sino.dtype}")


def _split(out: torch.Tensor, dtype: torch.dtype):
    """(n_views, 12) float64 -> (source, center, ustep, vstep), each (n_views, 3)."""
    out = out.to(dtype).reshape(-1, 4, 3)
    return tuple(out[:, i].contiguous() for i in range(4))


def _zeros(rays: Rays, dtype, device):
    return tuple(torch.zeros((rays.n_views, 3), dtype=dtype, device=device) for _ in range(4))


def cpu_geometry_vjp(volume: torch.Tensor, grid: VolumeGrid, z0: int, grad_sino: torch.Tensor, rays: Rays,
                     tile: Tile, nthreads: int):
    """Geometry VJP of one window with the OpenMP kernel (tensors on the CPU)."""
    _check(volume, grid, z0, grad_sino, rays, tile)
    dtype = volume.dtype
    B, nz, H, W = volume.shape
    if rays.n_views == 0 or B == 0 or nz == 0 or tile.shape[0] == 0 or tile.shape[1] == 0:
        return _zeros(rays, dtype, volume.device)
    vol = volume.detach().contiguous()
    g = grad_sino.detach().contiguous()
    geo = [t.detach().to(dtype=dtype).contiguous() for t in rays.tensors()]
    out = torch.empty((rays.n_views, 12), dtype=torch.float64)
    fn = cpu_function(_FAMILY, "joseph_geometry_vjp", dtype, _CPU_ARGS)
    dz, dy, dx = grid.spacing
    U, V = rays.detector_shape
    fn(vol.data_ptr(), nz * H * W, B, grid.D, grid.H, grid.W, z0, z0 + nz, dx, dy, dz,
       *[t.data_ptr() for t in geo], int(rays.cone), rays.n_views, U, V, tile.u0, tile.u1, tile.v0, tile.v1,
       g.data_ptr(), out.data_ptr(), max(1, int(nthreads)))
    return _split(out, dtype)
