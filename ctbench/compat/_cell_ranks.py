"""diffct's cell model on torchrun ranks: ctbench's distributed strategy with a cell-length local operator.

The collectives (``copy_to_ranks`` of the slab over the view group, ``all_reduce_sum`` of the
partial projections over the space group, of the partial backprojections over the view group, and
of the geometry gradients over the parent group) are ctbench's own
(:class:`ctbench.distributed.strategy.DistributedStrategy`); only the rank-local operator changes,
so a distributed diffct-face projector computes the same cell lengths as a single-process one.

A 2D volume (one plane of ctbench's grid) is split as diffct splits it, by its first axis (rows of
y): the rank owns ``rows`` (``projector._rows``) and the cell model restricts its cells to them.
"""

from __future__ import annotations

from ..distributed.collectives import copy_to_ranks
from ..distributed.partition import balanced_split
from ..distributed.strategy import DistributedStrategy
import torch

from ..engine.plan import check_chunk_options
from .cells import cell_backproject, cell_project

__all__ = ["CellDistributedStrategy", "ranks_into"]


class CellDistributedStrategy(DistributedStrategy):
    def __init__(self, projector, layout):
        super().__init__(projector, layout)
        p = projector
        if p.is_2d:  # the grid's single plane stays whole; the rows are split instead
            p.volume_slice = slice(0, 1)
            p.__dict__["_rows"] = balanced_split(p.grid.shape[1], layout.space_world_size, layout.space_rank)
        _, self.view_chunk, self.tile = check_chunk_options(
            projector.grid.shape, projector.detector_shape, projector.options.get("volume_chunk_shape"),
            projector.options.get("view_chunk_size"), projector.options.get("detector_chunk_shape"))

    def project(self, vol4, rays):
        # trainable geometry: every rank runs the backward, so every rank joins the view group's sum of
        # volume cotangents, also one whose own data needs no gradient (else its peers wait; diffct's rule)
        if self.layout.view_group is not None:
            vol4 = _joining(vol4, rays)
        return super().project(vol4, rays)

    def backproject(self, sino4, rays):
        # diffct's rule: a backprojection's input is replicated over the space group and the gradient
        # reaching it is the whole gradient on every rank (ctbench's own engine leaves the rank's share,
        # docs/DISTRIBUTED.md); with trainable geometry every rank joins that sum, also one whose own
        # sinogram needs no gradient
        group = self.layout.space_group
        if group is not None:
            sino4 = copy_to_ranks(_joining(sino4, rays), group)
        return super().backproject(sino4, rays)

    def _window(self, z0, z1):
        rows = self.p.__dict__.get("_rows")
        return (z0, z1, 2) if rows is None else (rows.start, rows.stop, 1)

    def _local_project(self, vol, local, z0):
        start, _, axis = self._window(z0, None)
        return cell_project(vol, self.p.grid, start, local, self.view_chunk, self.tile, axis)

    def _local_backproject(self, sino4, local, z0, z1):
        start, stop, axis = self._window(z0, z1)
        return cell_backproject(sino4, self.p.grid, start, stop, local, self.view_chunk, self.tile, axis)


def _joining(data, rays):
    """``data`` made part of the backward graph when the geometry requires grad and it does not."""
    if torch.is_grad_enabled() and not data.requires_grad and any(t.requires_grad for t in rays.tensors()):
        return data.detach().requires_grad_()
    return data


def ranks_into(projector, kind, source, output, trajectory=None):
    """``project_into``/``backproject_into`` of a distributed cell-model projector: this rank's
    share of the input (its slab, or its views) is read, the operator runs with its collectives on
    every rank, and the rank's share of the result is written in view chunks (projections) or
    at once (its slab).  The rank's share is held in memory; every check runs before any write."""
    p = projector
    src_shape, out_shape = ((p.volume_shape, p.projection_shape) if kind == "project"
                            else (p.projection_shape, p.volume_shape))
    for store, shape, name in ((source, src_shape, "source"), (output, out_shape, "output")):
        if not (hasattr(store, "read") and hasattr(store, "write") and hasattr(store, "shape")):
            raise TypeError(f"{name} must be a block store (read/write/shape) or a tensor, got {type(store).__name__}")
        if tuple(store.shape) != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)} (this rank's share), got {tuple(store.shape)}")
    if source is output:
        raise ValueError("source and output must be different stores (the output would overwrite the input)")
    with torch.no_grad():
        value = source.read(tuple(slice(0, n) for n in src_shape))
        result = (p.project(value, trajectory=trajectory) if kind == "project"
                  else p.backproject(value, trajectory=trajectory))
        step = (p.options.get("view_chunk_size") or max(1, out_shape[0])) if kind == "project" else max(1, out_shape[0])
        rest = tuple(slice(0, n) for n in out_shape[1:])
        for v0 in range(0, out_shape[0], step):
            window = (slice(v0, min(v0 + step, out_shape[0])),) + rest
            output.write(window, result[window].to(output.dtype))
    if hasattr(output, "flush"):
        output.flush()
    return output
