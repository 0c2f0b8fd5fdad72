"""diffct's cell model on torchrun ranks: ctbench's distributed strategy with a cell-length local operator.

The collectives (``copy_to_ranks`` of the slab over the view group, ``all_reduce_sum`` of the
partial projections over the space group, of the partial backprojections over the view group, and
of the geometry gradients over the parent group) are ctbench's own
(:class:`ctbench.distributed.strategy.DistributedStrategy`); only the rank-local operator changes,
so a distributed diffct-face projector computes the same cell lengths as a single-process one.
"""

from __future__ import annotations

from ..distributed.strategy import DistributedStrategy
from ..engine.plan import check_chunk_options
from .cells import cell_backproject, cell_project

__all__ = ["CellDistributedStrategy"]


class CellDistributedStrategy(DistributedStrategy):
    def __init__(self, projector, layout):
        super().__init__(projector, layout)
        _, self.view_chunk, self.tile = check_chunk_options(
            projector.grid.shape, projector.detector_shape, projector.options.get("volume_chunk_shape"),
            projector.options.get("view_chunk_size"), projector.options.get("detector_chunk_shape"))

    def _local_project(self, vol, local, z0):
        return cell_project(vol, self.p.grid, z0, local, self.view_chunk, self.tile)

    def _local_backproject(self, sino4, local, z0, z1):
        return cell_backproject(sino4, self.p.grid, z0, z1, local, self.view_chunk, self.tile)
