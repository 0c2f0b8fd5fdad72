"""The geometry VJP of one window with the OpenMP kernel (kernels/joseph_grad_cpu.cpp); the checks and the
result's layout are shared with the cuda backend (:mod:`ctbench.engine.geometry_grad`)."""

from __future__ import annotations

import torch

from ..base import Rays, Tile, VolumeGrid
from ..geometry_grad import _FAMILY, _check, _split, _zeros
from .library import F64, I64, INT, PTR, cpu_function

_P, _I, _L, _D = PTR, INT, I64, F64
_CPU_ARGS = [_P, _L, _I, _I, _I, _I, _I, _I, _D, _D, _D, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I,
             _P, _P, _I]


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
