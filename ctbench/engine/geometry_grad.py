"""Python side of the geometry-gradient kernels (kernels/joseph_grad*).

``cpu_geometry_vjp`` (:mod:`ctbench.engine.cpu.geometry_vjp`) and ``cuda_geometry_vjp``
(:mod:`ctbench.engine.cuda`) compute, for one window (a volume slab starting at global plane ``z0`` and a
detector tile),

    d <A(g) volume, grad_sino> / d(source, center, ustep, vstep)

per view, summed over the batch.  The kernels accumulate per view in float64;
the four results come back in the rays' dtype, each ``(n_views, 3)``.
"""

from __future__ import annotations

import torch

from .base import Rays, Tile, VolumeGrid

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
