"""diffct's portable model under ``distributed=True``: ctbench's rank strategy with cell lengths.

One process of the diffct face with ``backend="torch"`` (or ``"auto"`` off NVIDIA CUDA) runs
diffct's cell-length model (compat/cells.py); diffct's distributed portable backend is the same
model split over ranks.  The views/space/hybrid partition, the collectives and their autograd
are ctbench's own (:class:`ctbench.distributed.strategy.DistributedStrategy`); only the rank's
local operator is the cell model, so a two-rank run matches one process up to summation order.

One convention is diffct's on its face: the gradient reaching a ``backproject()`` input that is
replicated over the space group (partition ``"space"``/``"hybrid"``) is the full gradient, the
sum of the slab shares (diffct's "project_reduced" adjoint), where ctbench's own Projector
returns each rank's share (docs/DISTRIBUTED.md, "Who owns what").
"""

from __future__ import annotations

from ..distributed.collectives import copy_to_ranks
from ..distributed.strategy import DistributedStrategy
from .cells import cell_backproject, cell_project, cell_windows
from .first_order import first_order_rays

__all__ = ["DistributedCellStrategy"]


class DistributedCellStrategy(DistributedStrategy):
    """A rank's strategy whose local operator is the cell model, in the user's view and detector
    chunks; geometry derivatives are first order only, as diffct's (compat/first_order.py)."""

    def __init__(self, projector, layout):
        super().__init__(projector, layout)
        self.view_chunk, self.tile = cell_windows(projector)

    def backproject(self, sino4, rays):
        if getattr(self.p, "_AUTO_IS_DIFFCT", False):  # diffct: the replicated input's gradient is summed
            sino4 = copy_to_ranks(sino4, self.layout.space_group)
        return super().backproject(sino4, rays)

    def _rays(self, local):
        return first_order_rays(local) if getattr(self.p, "_AUTO_IS_DIFFCT", False) else local

    def _local_project(self, vol, local, z0):
        return cell_project(vol, self.p.grid, z0, self._rays(local), self.view_chunk, self.tile)

    def _local_backproject(self, sino4, local, z0, z1):
        return cell_backproject(sino4, self.p.grid, z0, z1, self._rays(local), self.view_chunk, self.tile)
