"""The reference backend: Joseph's model in plain torch, the slow oracle.

Written independently of the kernels (vectorised over rays and planes,
plane positions from the ray parameter ``t`` rather than the kernels'
per-plane affine form), it is what the tests compare the compiled kernels
against.  Because it is ordinary torch code, autograd differentiates it with
respect to the geometry too: the oracle for the geometry-gradient kernels.
"""

from __future__ import annotations

import torch

from .base import Backend, Rays, Tile, VolumeGrid

_CHUNK = 1 << 21  # ray-plane samples per step, bounds memory


def pixel_rays(rays: Rays, tile: Tile):
    """Origins and directions (n_views*nu*nv, 3) of the rays of a pixel tile, v fastest."""
    U, V = rays.detector_shape
    dt, dev = rays.source.dtype, rays.source.device
    su = torch.arange(tile.u0, tile.u1, dtype=dt, device=dev) - 0.5 * (U - 1)
    sv = torch.arange(tile.v0, tile.v1, dtype=dt, device=dev) - 0.5 * (V - 1)
    pix = (rays.center[:, None, None, :] + su[None, :, None, None] * rays.ustep[:, None, None, :]
           + sv[None, None, :, None] * rays.vstep[:, None, None, :])
    src = rays.source[:, None, None, :].expand_as(pix)
    if rays.cone:
        origin, direction = src, pix - src
    else:
        origin, direction = pix, src
    return origin.reshape(-1, 3), direction.reshape(-1, 3)


def _samples(grid: VolumeGrid, zlo: int, zhi: int, origin, direction):
    """Yield (ray index, flat slab index, weight) triples of every stencil entry.

    Weights include the bilinear factor and the plane spacing, so the
    projection is the weighted sum of the gathered voxels.
    """
    dz, dy, dx = grid.spacing
    sizes = (grid.W, grid.H, grid.D)
    spacing = torch.tensor((dx, dy, dz), dtype=origin.dtype, device=origin.device)
    lo = (0, 0, zlo)
    hi = (grid.W, grid.H, zhi)
    half = torch.tensor([(n - 1) / 2 for n in sizes], dtype=origin.dtype, device=origin.device)
    fo = origin / spacing + half
    fd = direction / spacing
    dominant = fd.abs().argmax(dim=1)
    length = direction.norm(dim=1)
    strides = (1, grid.W, grid.W * grid.H)
    for a in range(3):
        sel = (dominant == a).nonzero()[:, 0]
        if sel.numel() == 0 or hi[a] <= lo[a]:
            continue
        others = [x for x in range(3) if x != a]
        planes = torch.arange(lo[a], hi[a], dtype=origin.dtype, device=origin.device)
        per = max(1, _CHUNK // (4 * planes.numel()))
        for start in range(0, sel.numel(), per):
            idx = sel[start:start + per]
            t = (planes[None, :] - fo[idx, a, None]) / fd[idx, a, None]
            w = length[idx, None] / fd[idx, a, None].abs()
            coords = {a: planes[None, :].expand_as(t)}
            for b in others:
                coords[b] = fo[idx, b, None] + t * fd[idx, b, None]
            b, c = others
            fb, fc = torch.floor(coords[b]), torch.floor(coords[c])
            tb, tc = coords[b] - fb, coords[c] - fc
            for db in (0, 1):
                for dc in (0, 1):
                    ib, ic = fb.long() + db, fc.long() + dc
                    wb = tb if db else 1 - tb
                    wc = tc if dc else 1 - tc
                    ia = coords[a].long()
                    index = {a: ia, b: ib, c: ic}
                    valid = torch.ones_like(ib, dtype=torch.bool)
                    for ax in range(3):
                        valid &= (index[ax] >= lo[ax]) & (index[ax] < hi[ax])
                    flat = ((index[2] - zlo) * strides[2] + index[1] * strides[1] + index[0] * strides[0])
                    ray = idx[:, None].expand_as(ib)
                    weight = wb * wc * w
                    yield ray[valid], flat[valid], weight[valid]


class ReferenceBackend(Backend):
    name = "reference"

    def supports(self, device: torch.device) -> bool:
        return True

    def project(self, volume, grid: VolumeGrid, z0, rays: Rays, tile: Tile, out=None):
        B, nz = volume.shape[:2]
        nu, nv = tile.shape
        rays = rays.to(dtype=volume.dtype)
        origin, direction = pixel_rays(rays, tile)
        flat_vol = volume.reshape(B, -1)
        total = volume.new_zeros((B, origin.shape[0]))
        for ray, flat, weight in _samples(grid, z0, z0 + nz, origin, direction):
            total = total.index_add(1, ray, flat_vol[:, flat] * weight)
        result = total.reshape(B, rays.n_views, nu, nv)
        return result if out is None else out.add_(result)

    def backproject(self, sinogram, grid: VolumeGrid, z0, z1, rays: Rays, tile: Tile, out=None):
        B = sinogram.shape[0]
        rays = rays.to(dtype=sinogram.dtype)
        origin, direction = pixel_rays(rays, tile)
        values = sinogram.reshape(B, -1)
        total = sinogram.new_zeros((B, (z1 - z0) * grid.H * grid.W))
        for ray, flat, weight in _samples(grid, z0, z1, origin, direction):
            total = total.index_add(1, flat, values[:, ray] * weight)
        result = total.reshape(B, z1 - z0, grid.H, grid.W)
        return result if out is None else out.add_(result)
