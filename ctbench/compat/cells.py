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
from ..engine.plan import check_chunk_options
from ..engine.reference import pixel_rays
from ..projector import check_frames
from ..storage.completion import same_location, store_location
from .cell_stats import record_cell_stats
from .first_order import first_order_rays

__all__ = ["cell_project", "cell_backproject", "CellStrategy", "check_cell_geometry", "check_diffct_geometry",
           "cell_project_into", "cell_backproject_into"]

_BUDGET = 1 << 19  # batch x ray x plane intermediates per group (elements: 4 MiB in float64)


def _boundaries(n: int, spacing: float, dtype, device):
    # computed as (k - n/2) * spacing, the cell edges' own expression (no accumulated round-off)
    return (torch.arange(n + 1, dtype=torch.float64, device=device) - n / 2).mul(spacing).to(dtype)


def _cells(grid: VolumeGrid, z0: int, z1: int, origin, direction, segment: bool, axis: int = 2):
    """Cell indices (flat in the slab ``[z0, z1)`` of world axis ``axis``: 2 is z, 1 is y, the rows
    of a 2D volume split over ranks), lengths and validity of every piece of every ray:
    ``(flat, length)`` of shape (R, P) with zero length where a piece is empty."""
    dtype, device = origin.dtype, origin.device
    if segment and bool((direction == 0).all(dim=1).any()):  # (in the dtype the pixels were staged in)
        raise ValueError("source and detector pixels must differ")
    if segment:
        # set the segment up from its endpoint nearer the volume centre, so that a far endpoint
        # (1e15 voxels away) does not round the ray parameters of the cells near the centre away
        end = origin + direction
        flip = (end.detach().norm(dim=1) < origin.detach().norm(dim=1))[:, None]
        origin, direction = torch.where(flip, end, origin), torch.where(flip, -direction, direction)
    sizes = (grid.W, grid.H, grid.D)  # world x, y, z
    dz, dy, dx = grid.spacing
    edges = [_boundaries(n, s, dtype, device) for n, s in zip(sizes, (dx, dy, dz))]
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
    local = list(sizes)
    local[axis] = z1 - z0
    strides = (1, local[0], local[0] * local[1])
    for a in range(3):
        o, d = origin[:, a, None].detach(), direction[:, a, None].detach()
        # a constant axis keeps the origin's coordinate exactly (no t*0 round-off)
        pos = torch.where(zero[:, a, None], o.expand_as(mid), o + mid * d)
        index = torch.searchsorted(edges[a], pos.contiguous(), right=True) - 1
        index = index.clamp(0, sizes[a] - 1)
        if a == axis:
            valid &= (index >= z0) & (index < z1)
            index = index - z0
        flat += index * strides[a]
    flat = torch.where(valid, flat, torch.zeros_like(flat))
    length = torch.where(valid, length, torch.zeros_like(length))
    return flat, length


def _work(rays: Rays) -> Rays:
    # ray set-up in float64 whatever the data dtype: a far endpoint (1e6 voxels away) minus a
    # plane position keeps its digits; only the lengths are rounded to the data's dtype
    return rays if rays.source.device.type == "mps" else rays.to(dtype=torch.float64)


def _groups(grid: VolumeGrid, rays: Rays, batch: int, view_chunk=None, tile=None):
    """(ray indices, origin, direction) of ray groups: a view chunk times a detector tile (the
    user's ``view_chunk_size``/``detector_chunk_shape``, else whole views), narrowed further so
    that the ray-by-plane intermediates stay under the element budget."""
    U, V = rays.detector_shape
    step, tu, tv = group_plan(grid, rays.detector_shape, rays.n_views, batch, view_chunk, tile)
    index = torch.arange(rays.n_views * U * V, device=rays.source.device).reshape(rays.n_views, U, V)
    for v0 in range(0, rays.n_views, step):
        part = rays.views(v0, min(v0 + step, rays.n_views))
        for u0 in range(0, U, tu):
            for w0 in range(0, V, tv):
                t = Tile(u0, min(u0 + tu, U), w0, min(w0 + tv, V))
                if U == V == 1:  # one-pixel views (a curved detector's pixels): the pixel is the centre,
                    # composed already (compat/surfaces.py); no second world-point array
                    origin, direction = (part.source, part.center - part.source) if part.cone else \
                        (part.center, part.source)
                else:
                    origin, direction = pixel_rays(part, t)
                yield index[v0:v0 + part.n_views, t.u0:t.u1, t.v0:t.v1].reshape(-1), origin, direction


def group_plan(grid: VolumeGrid, detector_shape, n_views: int, batch: int, view_chunk=None, tile=None):
    """(views, tile u, tile v) of one ray group of :func:`_groups`: the user's chunks, narrowed so
    that the ray-by-plane intermediates stay under the element budget."""
    U, V = detector_shape
    tu, tv = tile if tile is not None else (U, V)
    planes = grid.W + grid.H + grid.D + 5
    per_ray = planes * max(batch, 1)
    rays_cap = max(1, _BUDGET // per_ray)
    if tu * tv > rays_cap:  # one tile is already too many rays: thinner tiles, whole rows of v first
        tv = max(1, min(tv, rays_cap))
        tu = max(1, min(tu, rays_cap // tv))
    return max(1, min(view_chunk or n_views, rays_cap // (tu * tv))), tu, tv


def _batch_step(grid: VolumeGrid, batch: int) -> int:
    # a huge batch is split too: even one ray's planes times the whole batch may exceed the budget
    return max(1, min(batch, _BUDGET // (grid.W + grid.H + grid.D + 5)))


def cell_project(volume, grid: VolumeGrid, z0: int, rays: Rays, view_chunk=None, tile=None, axis: int = 2):
    """Cell-length projection of a slab ``volume`` (B, nz, H, W) starting at plane ``z0`` of
    ``grid`` (``axis=1``: rows ``(B, D, ny, W)`` from row ``z0``): (B, n_views, U, V)."""
    B, nz = volume.shape[0], volume.shape[3 - axis]
    step = _batch_step(grid, B)
    if B > step:
        return torch.cat([cell_project(volume[b:b + step], grid, z0, rays, view_chunk, tile, axis)
                          for b in range(0, B, step)])
    U, V = rays.detector_shape
    rays = _work(rays)
    flat_vol = volume.reshape(B, math.prod(volume.shape[1:]))  # (explicit: B may be 0)
    out = volume.new_zeros((B, rays.n_views * U * V))
    for ray, origin, direction in _groups(grid, rays, B, view_chunk, tile):
        flat, length = _cells(grid, z0, z0 + nz, origin, direction, rays.cone, axis)
        if flat_vol.shape[1] == 0:  # an empty slab sees nothing (and keeps the geometry in the graph)
            value = volume.new_zeros((B, ray.numel())) + 0 * length.sum()
        else:
            value = (flat_vol[:, flat] * length.to(volume.dtype)).sum(dim=-1)
        out = out.index_add(1, ray, value)
    return out.reshape(B, rays.n_views, U, V)


def cell_backproject(sinogram, grid: VolumeGrid, z0: int, z1: int, rays: Rays, view_chunk=None, tile=None,
                     axis: int = 2):
    """The transpose of :func:`cell_project`: (B, n_views, U, V) -> (B, z1 - z0, H, W)
    (``axis=1``: (B, D, z1 - z0, W))."""
    B = sinogram.shape[0]
    step = _batch_step(grid, B)
    if B > step:
        return torch.cat([cell_backproject(sinogram[b:b + step], grid, z0, z1, rays, view_chunk, tile, axis)
                          for b in range(0, B, step)])
    rays = _work(rays)
    shape = list(grid.shape)
    shape[2 - axis] = z1 - z0
    values = sinogram.reshape(B, rays.n_views * rays.detector_shape[0] * rays.detector_shape[1])
    total = sinogram.new_zeros((B, math.prod(shape)))
    for ray, origin, direction in _groups(grid, rays, B, view_chunk, tile):
        flat, length = _cells(grid, z0, z1, origin, direction, rays.cone, axis)
        if total.shape[1] == 0:
            total = total + 0 * (values[:, ray].sum() * length.sum())
            continue
        contrib = values[:, ray, None] * length.to(sinogram.dtype)
        total = total.index_add(1, flat.reshape(-1), contrib.reshape(B, flat.numel()))
    return total.reshape(B, *shape)


def cell_windows(projector):
    """(view chunk | None, detector tile | None) of the user's chunk options, checked."""
    _, view_chunk, tile = check_chunk_options(
        projector.grid.shape, projector.detector_shape, projector.options.get("volume_chunk_shape"),
        projector.options.get("view_chunk_size"), projector.options.get("detector_chunk_shape"))
    return view_chunk, tile


class CellStrategy:
    """The one-process strategy of a diffct-face Projector with ``backend="torch"``: the cell
    model on the input's device (the core Projector's strategy interface), in the windows the
    user asked for (``view_chunk_size``, ``detector_chunk_shape``)."""

    def __init__(self, projector):
        self.p = projector
        self.view_chunk, self.tile = cell_windows(projector)

    def _run(self, operation, data, rays, compute):
        # the diffct face: diffct's first-order-only geometry derivatives and its execution report
        # (None while a call runs and after a failed one, as diffct's)
        if not getattr(self.p, "_AUTO_IS_DIFFCT", False):
            return compute(rays)
        self.p.last_execution_stats = None
        out = compute(first_order_rays(rays))
        B, step = data.shape[0], _batch_step(self.p.grid, data.shape[0])
        plans = [group_plan(self.p.grid, rays.detector_shape, rays.n_views, min(step, B - b), self.view_chunk,
                            self.tile) for b in range(0, max(B, 1), step)]  # one per batch split
        record_cell_stats(self.p, operation, data, rays, plans)
        return out

    def project(self, vol4, rays):
        p = self.p
        return self._run("project", vol4, rays, lambda r: cell_project(vol4, p.grid, p.volume_slice.start, r,
                                                                       self.view_chunk, self.tile))

    def backproject(self, sino4, rays):
        p = self.p
        return self._run("backproject", sino4, rays, lambda r: cell_backproject(
            sino4, p.grid, p.volume_slice.start, p.volume_slice.stop, r, self.view_chunk, self.tile))

    def inner_volume(self, a, b):
        return (a * b).sum()

    def inner_projection(self, a, b):
        return (a * b).sum()


def check_cell_geometry(trajectory, beam: str) -> None:
    """What the cell model needs of a trajectory: finite values, non-zero detector axes and
    parallel directions.  A source inside the volume or a detector cutting it is a valid segment
    (the model clips rays at both ends), so ctbench's stricter Joseph checks do not apply."""
    check_frames(trajectory, beam)


def check_diffct_geometry(trajectory, beam: str, voxel_spacing, float32: bool) -> None:
    """diffct's construction checks of a flat-detector trajectory, with its messages: unit and
    orthogonal axes, a source apart from the detector centre that does not see the detector
    edge-on, and (float32 work) endpoints within diffct's range in voxels of the volume centre."""
    src, ctr, u, v = (t.detach().to(torch.float64) for t in trajectory.tensors())
    parallel3d = beam == "parallel" and trajectory.ndim == 3
    # diffct's parallel3d: unit ray directions that may be oblique to the detector (u, v orthogonal)
    axes = (src, u, v) if parallel3d else (src, u) if beam == "parallel" else ((u, v) if trajectory.ndim == 3 else (u,))
    for axis in axes:
        if not torch.isclose(axis.norm(dim=1), torch.ones(len(axis), dtype=axis.dtype), rtol=1e-4, atol=1e-4).all():
            raise ValueError("trajectory direction axes must be unit vectors")
    pair = axes[1:] if parallel3d else axes
    if len(pair) == 2 and ((pair[0] * pair[1]).sum(dim=1).abs() > 1e-4).any():
        raise ValueError("trajectory direction axes must be orthogonal")
    if parallel3d and (torch.linalg.matrix_rank(torch.stack((src, u, v), dim=-1)) < 3).any():
        raise ValueError("parallel3d rays must not be tangent to the detector plane")
    if beam == "parallel":
        return
    principal = ctr - src
    lengths = principal.norm(dim=1)
    if (lengths == 0).any():
        raise ValueError("source and detector center must differ in every view")
    facing = ((principal / lengths[:, None]) * torch.linalg.cross(u, v, dim=1)).sum(dim=1)
    if (facing.abs() < 1e-4).any():
        raise ValueError("the detector must not be edge-on to the source in any view")
    if float32:
        dz, dy, dx = voxel_spacing
        pitch = torch.tensor((dx, dy, dz), dtype=torch.float64)
        distances = torch.stack([(t / pitch).norm(dim=1) for t in (src, ctr)])
        if (distances.min(dim=0).values > 1e6).any():
            raise ValueError("the source or the detector center must lie within 1e6 voxels of the volume "
                             "center in every view")
        if (distances > 1e15).any():
            raise ValueError("the source and the detector center must lie within 1e15 voxels of the volume center")


def _check_store(store, shape, name):
    if not (hasattr(store, "read") and hasattr(store, "write") and hasattr(store, "shape")):
        raise TypeError(f"{name} must be a block store (read/write/shape) or a tensor, got {type(store).__name__}")
    if tuple(store.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(store.shape)}")



def _check_output_dtype(projector, store, name):
    # as diffct: the output holds the working precision's values, no silent widening or narrowing
    want = getattr(projector, "dtype", None)
    if want is not None and getattr(store, "dtype", want) != want:
        raise TypeError(f"{name} must have dtype {want} (precision={projector.precision!r}), got {store.dtype}")


def _refuse_alias(volume_store, sinogram_store):
    # the same refusal as ctbench's engine streaming (storage/streaming.py): an output over its input
    if volume_store is sinogram_store or same_location(volume_store, sinogram_store):
        raise ValueError(f"volume_store and sinogram_store must be different stores; both are "
                         f"{store_location(volume_store) or volume_store!r} (the output would alias the input "
                         "and overwrite it)")


def cell_project_into(projector, volume_store, sinogram_store, trajectory=None):
    """Stream the cell-model projection store to store: z-slabs of the volume (the user's
    ``volume_chunk_shape`` planes, else all) summed into the sinogram, written view chunk by view
    chunk.  The sum of slab projections is the projection (each cell lies in one slab)."""
    p = projector
    _check_store(volume_store, p.volume_shape, "volume_store")
    _check_store(sinogram_store, p.projection_shape, "sinogram_store")
    _check_output_dtype(p, sinogram_store, "sinogram_store")
    _refuse_alias(volume_store, sinogram_store)
    D = p.grid.shape[0]
    nz = p.options.get("volume_chunk_shape") or D
    with torch.no_grad():
        sino = None
        for z0 in range(0, D, nz):
            z1 = min(z0 + nz, D)
            slab = volume_store.read((slice(z0, z1),) + tuple(slice(0, n) for n in p.volume_shape[1:])) \
                if not p.is_2d else volume_store.read(tuple(slice(0, n) for n in p.volume_shape))
            vol4 = slab.reshape(1, z1 - z0, *p.grid.shape[1:])
            rays = p._rays(trajectory, vol4.dtype, vol4.device)
            part = cell_project(vol4, p.grid, z0, rays, p._strategy.view_chunk, p._strategy.tile)
            sino = part if sino is None else sino + part
        sino = sino.reshape(p.projection_shape)
        step = p._strategy.view_chunk or p.n_views
        rest = tuple(slice(0, n) for n in p.projection_shape[1:])
        for v0 in range(0, p.n_views, step):
            window = (slice(v0, min(v0 + step, p.n_views)),) + rest
            sinogram_store.write(window, sino[window].to(sinogram_store.dtype))
    if hasattr(sinogram_store, "flush"):
        sinogram_store.flush()
    return sinogram_store


def cell_backproject_into(projector, sinogram_store, volume_store, trajectory=None):
    """Stream the cell-model backprojection: the sinogram read view chunk by view chunk, each
    z-slab of the volume accumulated over them and written once."""
    p = projector
    _check_store(sinogram_store, p.projection_shape, "sinogram_store")
    _check_store(volume_store, p.volume_shape, "volume_store")
    _check_output_dtype(p, volume_store, "volume_store")
    _refuse_alias(volume_store, sinogram_store)
    D = p.grid.shape[0]
    nz = p.options.get("volume_chunk_shape") or D
    step = p._strategy.view_chunk or p.n_views
    rest = tuple(slice(0, n) for n in p.projection_shape[1:])
    with torch.no_grad():
        for z0 in range(0, D, nz):
            z1 = min(z0 + nz, D)
            acc = None
            for v0 in range(0, p.n_views, step):
                v1 = min(v0 + step, p.n_views)
                block = sinogram_store.read((slice(v0, v1),) + rest).reshape(1, v1 - v0, *p.detector_shape)
                rays = p._rays(trajectory, block.dtype, block.device).views(v0, v1)
                part = cell_backproject(block, p.grid, z0, z1, rays, p._strategy.view_chunk, p._strategy.tile)
                acc = part if acc is None else acc + part
            value = acc.reshape(p.volume_shape if p.is_2d else (z1 - z0, *p.volume_shape[1:]))
            window = tuple(slice(0, n) for n in p.volume_shape) if p.is_2d else \
                (slice(z0, z1),) + tuple(slice(0, n) for n in p.volume_shape[1:])
            volume_store.write(window, value.to(volume_store.dtype))
    if hasattr(volume_store, "flush"):
        volume_store.flush()
    return volume_store
