"""diffct's portable projection model (``backend="torch"`` of the diffct face) in plain torch.

diffct 2.5's torch backend is a different discretisation from ctbench's Joseph kernels: a ray's
sample of a voxel is the exact length of the ray inside the voxel's cell (a box of one voxel
spacing around its centre), the volume being constant per cell.  Cone and fan rays are the
segment from the source to the pixel; parallel rays are whole lines.  A ray running exactly in a
cell boundary plane belongs to the cell above it (cells are half-open, ``lo <= p < hi``).

Everything here is ordinary torch code over the same per-view ray tensors as the engine
(:class:`~ctbench.engine.base.Rays`), so autograd gives the data adjoint, geometry gradients,
second derivatives and ``torch.func`` transforms without a hand-written backward; the
backprojection is the transpose of the same cell lengths.  Work is split into groups of rays whose
ray-by-plane intermediates stay under a fixed element budget.
"""

from __future__ import annotations

import math

import torch

from ..engine.base import Rays, Tile, VolumeGrid
from ..engine.reference import pixel_rays

__all__ = ["cell_project", "cell_backproject", "CellStrategy"]

_BUDGET = 1 << 21  # ray x plane intermediates per group (elements)


def _boundaries(n: int, spacing: float, dtype, device):
    # computed as (k - n/2) * spacing, the cell edges' own expression (no accumulated round-off)
    return (torch.arange(n + 1, dtype=torch.float64, device=device) - n / 2).mul(spacing).to(dtype)


def _cells(grid: VolumeGrid, z0: int, z1: int, origin, direction, segment: bool):
    """Cell indices (flat in the slab ``[z0, z1)``), lengths and validity of every piece of every
    ray: ``(flat, length)`` of shape (R, P) with zero length where a piece is empty."""
    dtype, device = origin.dtype, origin.device
    sizes = (grid.W, grid.H, grid.D)  # world x, y, z
    dz, dy, dx = grid.spacing
    edges = [_boundaries(n, s, dtype, device) for n, s in zip(sizes, (dx, dy, dz))]
    R = origin.shape[0]
    zero = direction == 0
    safe = torch.where(zero, torch.ones_like(direction), direction)
    lo = torch.stack([e[0] for e in edges])
    hi = torch.stack([e[-1] for e in edges])
    first, last = (lo - origin) / safe, (hi - origin) / safe
    inf = torch.full_like(first, math.inf)
    enter = torch.where(zero, -inf, torch.minimum(first, last)).amax(dim=1)
    leave = torch.where(zero, inf, torch.maximum(first, last)).amin(dim=1)
    if segment:
        enter = enter.clamp(min=0.0)
        leave = leave.clamp(max=1.0)
    # a constant axis: inside its half-open extent or nowhere
    outside = (zero & ((origin < lo) | (origin >= hi))).any(dim=1)
    hit = (leave > enter) & ~outside
    enter = torch.where(hit, enter, torch.zeros_like(enter))
    leave = torch.where(hit, leave, torch.zeros_like(leave))
    params = [enter[:, None], leave[:, None]]
    for a in range(3):
        t = (edges[a][None, :] - origin[:, a, None]) / safe[:, a, None]
        t = torch.where(zero[:, a, None], enter[:, None], t)
        params.append(torch.minimum(torch.maximum(t, enter[:, None]), leave[:, None]))
    t = torch.sort(torch.cat(params, dim=1), dim=1).values
    length = (t[:, 1:] - t[:, :-1]) * direction.norm(dim=1, keepdim=True)
    mid = (0.5 * (t[:, 1:] + t[:, :-1])).detach()
    flat = torch.zeros(mid.shape, dtype=torch.long, device=device)
    valid = (length.detach() > 0) & hit[:, None]
    strides = (1, grid.W, grid.W * grid.H)
    for a in range(3):
        o, d = origin[:, a, None].detach(), direction[:, a, None].detach()
        # a constant axis keeps the origin's coordinate exactly (no t*0 round-off)
        pos = torch.where(zero[:, a, None], o.expand_as(mid), o + mid * d)
        index = torch.searchsorted(edges[a], pos.contiguous(), right=True) - 1
        index = index.clamp(0, sizes[a] - 1)
        if a == 2:
            valid &= (index >= z0) & (index < z1)
            index = index - z0
        flat += index * strides[a]
    flat = torch.where(valid, flat, torch.zeros_like(flat))
    length = torch.where(valid, length, torch.zeros_like(length))
    del R
    return flat, length


def _groups(grid: VolumeGrid, rays: Rays, batch: int):
    """(first ray, origin, direction) of ray groups within the element budget, views in order."""
    U, V = rays.detector_shape
    per_view = U * V * (grid.W + grid.H + grid.D + 5) * max(batch, 1)
    step = max(1, _BUDGET // max(per_view, 1))
    for v0 in range(0, rays.n_views, step):
        part = rays.views(v0, min(v0 + step, rays.n_views))
        origin, direction = pixel_rays(part, Tile.full(rays.detector_shape))
        yield v0 * U * V, origin, direction


def cell_project(volume, grid: VolumeGrid, z0: int, rays: Rays):
    """Cell-length projection of a slab ``volume`` (B, nz, H, W) starting at plane ``z0`` of
    ``grid``: (B, n_views, U, V)."""
    B, nz = volume.shape[:2]
    U, V = rays.detector_shape
    flat_vol = volume.reshape(B, -1)
    parts = []
    for _, origin, direction in _groups(grid, rays, B):
        flat, length = _cells(grid, z0, z0 + nz, origin, direction, rays.cone)
        if flat_vol.shape[1] == 0:
            parts.append(volume.new_zeros((B, origin.shape[0])) + 0 * length.sum())
            continue
        parts.append((flat_vol[:, flat] * length).sum(dim=-1))
    out = torch.cat(parts, dim=1) if parts else volume.new_zeros((B, 0))
    return out.reshape(B, rays.n_views, U, V)


def cell_backproject(sinogram, grid: VolumeGrid, z0: int, z1: int, rays: Rays):
    """The transpose of :func:`cell_project`: (B, n_views, U, V) -> (B, z1 - z0, H, W)."""
    B = sinogram.shape[0]
    values = sinogram.reshape(B, -1)
    total = sinogram.new_zeros((B, (z1 - z0) * grid.H * grid.W))
    for start, origin, direction in _groups(grid, rays, B):
        flat, length = _cells(grid, z0, z1, origin, direction, rays.cone)
        n = origin.shape[0]
        if total.shape[1] == 0:
            total = total + 0 * (values[:, start:start + n].sum() * length.sum())
            continue
        contrib = values[:, start:start + n, None] * length
        total = total.index_add(1, flat.reshape(-1), contrib.reshape(B, -1))
    return total.reshape(B, z1 - z0, grid.H, grid.W)


class CellStrategy:
    """The one-process strategy of a diffct-face Projector with ``backend="torch"``: the cell
    model on the input's device (the core Projector's strategy interface)."""

    def __init__(self, projector):
        self.p = projector

    def project(self, vol4, rays):
        return cell_project(vol4, self.p.grid, self.p.volume_slice.start, rays.to(dtype=vol4.dtype))

    def backproject(self, sino4, rays):
        p = self.p
        return cell_backproject(sino4, p.grid, p.volume_slice.start, p.volume_slice.stop,
                                rays.to(dtype=sino4.dtype))

    def inner_volume(self, a, b):
        return (a * b).sum()

    def inner_projection(self, a, b):
        return (a * b).sum()
