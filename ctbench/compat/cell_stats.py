"""diffct's ``last_execution_stats`` for the cell model of the diffct face (compat/cells.py).

diffct's portable backend reports the plan it ran: the volume tile (``chunk_shape``), the
views and the detector tile of one ray batch (``view_chunk_size``, ``detector_chunk_shape``),
the devices and the number of ray-batch x volume-tile pairs.  Passing the reported plan back as
explicit hints runs the same plan.  The cell model never tiles the volume (a ray's cells are
found over the whole owned volume at once), so ``chunk_shape`` is the owned volume; its ray
groups are the user's view and detector chunks narrowed to the element budget
(:func:`ctbench.compat.cells.group_plan`), reported in diffct's order ((tu,) for 2D scans).
Only what is measured is reported: one process, tensors in and out (no store or transfer
counts).
"""

from __future__ import annotations

import math

import torch

__all__ = ["record_cell_stats"]


def record_cell_stats(projector, operation: str, data: torch.Tensor, rays, plans) -> None:
    """Set ``projector.last_execution_stats`` for one call; ``plans`` holds the (views, tu, tv) of
    each batch split of the call (the first one is the reported plan)."""
    n_views = rays.n_views
    U, V = rays.detector_shape
    step, tu, tv = plans[0]
    pairs = sum(math.ceil(n_views / s) * math.ceil(U / a) * math.ceil(V / b) for s, a, b in plans)
    projector.last_execution_stats = dict(
        operation=operation, backend="torch", model="cells",
        precision=getattr(projector, "precision", None), dtype=str(data.dtype),
        chunk_shape=tuple(projector.volume_shape), view_chunk_size=step,
        detector_chunk_shape=(tu,) if projector.is_2d else (tu, tv),
        devices=[str(data.device)], ray_tile_pairs=pairs, batch_splits=len(plans))


def surface_stats(surface, inner_stats):
    """The report of a curved-detector call in the surface projector's own terms: its pixels run as
    one-pixel views of an inner projector (compat/surfaces.py), composed ``view_chunk_size`` views
    at a time over whole detectors, so those are its view and detector chunks; the ray groups the
    inner projector ran are counted in ``ray_tile_pairs``.  None where the inner call reported
    nothing (ctbench's engine)."""
    if inner_stats is None:
        return None
    flat = surface.flat
    views = flat.options.get("view_chunk_size") or flat.n_views
    detector = tuple(flat.detector_shape[:1]) if flat.is_2d else tuple(flat.detector_shape)
    return dict(inner_stats, chunk_shape=tuple(surface.volume_shape), view_chunk_size=min(views, flat.n_views),
                detector_chunk_shape=detector, pixel_views_per_group=inner_stats["view_chunk_size"])
