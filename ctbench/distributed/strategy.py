"""The projector strategy of one torchrun rank: views, space and hybrid partitions.

All three partitions are one grid ``(view_ranks, space_ranks)`` (see
:mod:`ctbench.distributed.partition`); views is ``(W, 1)`` and space is
``(1, W)``.  With ``V`` the rank's views and ``s`` its slab, a call is

* project:     ``all_reduce_sum_{space group}( A_{V,s} copy_to_ranks_{view group}(x_s) )``
* backproject: ``all_reduce_sum_{view group}( A_{V,s}^T y_V )``

and the geometry tensors (replicated on every rank) pass through
``copy_to_ranks`` over the parent group, so their gradients are the sum of
the local pixel VJPs of all ranks.  Every rank issues the same collectives in
the same order whatever its share: ranks with zero views or an empty slab
run an empty local operator that stays in the autograd graph, so they join
the backward collectives too.
"""

from __future__ import annotations

import torch

from ..engine.base import Rays
from ..engine.ops import backproject_op, project_op
from .collectives import all_reduce_sum, copy_to_ranks, global_sum
from .fingerprint import check_same_configuration
from .partition import PARTITIONS, balanced_split, make_layout


class _EmptyLocal(torch.autograd.Function):
    """Zeros of a given shape that depend (with zero gradient) on the inputs.

    Stands in for the local operator of a rank with zero views or an empty
    slab: the backward still runs, so the rank joins the backward collectives.
    """

    @staticmethod
    def forward(ctx, shape, *inputs):
        ctx.shapes = [(t.shape, t.dtype, t.device) for t in inputs]
        ref = inputs[0]
        return ref.new_zeros(shape)

    @staticmethod
    def backward(ctx, grad):
        return (None, *(torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.shapes))


class DistributedStrategy:
    """Spreads projector calls over the ranks of a process group (one rank per process)."""

    def __init__(self, projector, layout):
        self.p = projector
        self.layout = layout
        p, lay = projector, layout
        if p.is_2d and lay.space_world_size > 1:
            raise ValueError("2D scans have a single volume plane and cannot be split into slabs: use "
                             "partition='views' (or a hybrid grid with space_ranks=1)")
        # What this rank owns (global, half-open); the Projector derives its
        # local shapes from these.
        p.rank, p.world_size = lay.rank, lay.world_size
        p.partition = lay.partition
        p.partition_grid = lay.grid
        p.view_rank, p.space_rank = lay.view_rank, lay.space_rank
        p.view_world_size, p.space_world_size = lay.grid
        p.process_group = lay.group
        p.view_group, p.space_group = lay.view_group, lay.space_group
        p.view_slice = balanced_split(p.n_views, lay.view_world_size, lay.view_rank)
        p.volume_slice = balanced_split(p.global_volume_shape[0], lay.space_world_size, lay.space_rank)

    # ---------------------------------------------------------------- helpers
    def _local_rays(self, rays: Rays) -> Rays:
        # Geometry is replicated: each rank's pixel VJP is a partial gradient,
        # summed over all ranks in backward.
        g = self.layout.group
        shared = Rays(*(copy_to_ranks(t, g) if t.requires_grad else t for t in rays.tensors()),
                      rays.cone, rays.detector_shape)
        return shared.views(self.p.view_slice.start, self.p.view_slice.stop)

    # -------------------------------------------------------------- operators
    def project(self, vol4: torch.Tensor, rays: Rays) -> torch.Tensor:
        p, lay = self.p, self.layout
        vol = copy_to_ranks(vol4, lay.view_group)
        local = self._local_rays(rays)
        z0 = p.volume_slice.start
        if local.n_views == 0 or vol.shape[1] == 0:
            part = _EmptyLocal.apply((vol.shape[0], local.n_views, *p.detector_shape), vol, *local.tensors())
        else:
            part = self._local_project(vol, local, z0)
        return all_reduce_sum(part, lay.space_group)

    def backproject(self, sino4: torch.Tensor, rays: Rays) -> torch.Tensor:
        p, lay = self.p, self.layout
        local = self._local_rays(rays)
        z0, z1 = p.volume_slice.start, p.volume_slice.stop
        if local.n_views == 0 or z1 == z0:
            part = _EmptyLocal.apply((sino4.shape[0], z1 - z0, *p.global_volume_shape[1:]), sino4,
                                     *local.tensors())
        else:
            part = self._local_backproject(sino4, local, z0, z1)
        return all_reduce_sum(part, lay.view_group)

    # the rank's own operator A_{V,s} (a subclass may run another ray model: compat/distributed_cells.py)
    def _local_project(self, vol, local: Rays, z0: int) -> torch.Tensor:
        p = self.p
        return project_op(vol, *local.tensors(), p._executor(vol.device), z0, local.cone, p.detector_shape)

    def _local_backproject(self, sino4, local: Rays, z0: int, z1: int) -> torch.Tensor:
        p = self.p
        return backproject_op(sino4, *local.tensors(), p._executor(sino4.device), z0, z1, local.cone,
                              p.detector_shape)

    # --------------------------------------------------------- inner products
    # Volume tensors are split over the space group and replicated over the
    # view group; ray tensors the other way round.  Each owned part is summed
    # once; replicated parts are counted once.
    def inner_volume(self, a, b):
        return global_sum((a * b).sum(), self.layout.space_group)

    def inner_projection(self, a, b):
        return global_sum((a * b).sum(), self.layout.view_group)


def make_distributed_strategy(projector, options: dict) -> DistributedStrategy:
    """The strategy for ``Projector(..., distributed=True)`` (called by the Projector)."""
    if options.get("devices") is not None:
        raise ValueError("distributed=True runs one device per process; do not pass devices= as well "
                         "(select the process's GPU with torch.cuda.set_device(LOCAL_RANK))")
    partition = options.get("partition") or "views"
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")
    layout = make_layout(partition, options.get("partition_grid"), options.get("process_group"))
    strategy = DistributedStrategy(projector, layout)
    # Every rank must build the same operator: compare, fail together (one small all_gather).
    check_same_configuration(projector, layout.group)
    return strategy
