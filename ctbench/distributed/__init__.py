"""Distributed execution: one process per device under torchrun.

``Projector(..., distributed=True, partition="views"|"space"|"hybrid")``
builds a :class:`~ctbench.distributed.strategy.DistributedStrategy`; the
ownership and loss-scaling rules are in docs/DISTRIBUTED.md.  This package
holds the differentiable collectives (:mod:`.collectives`), the rank grid
(:mod:`.partition`), the strategy (:mod:`.strategy`) and the halo exchange
for regularizers on spatial slabs (:mod:`.halo`).
"""

from .collectives import (
    COMM_STATS,
    DistributedError,
    all_gather,
    all_reduce_sum,
    copy_to_ranks,
    count_communication,
    global_sum,
    scale_grad,
)
from .fingerprint import ConfigurationMismatchError, check_same_configuration, config_digest
from .halo import divergence_distributed, gradient_distributed, neighbour_planes, total_variation_distributed
from .partition import PARTITIONS, balanced_split

__all__ = [
    "COMM_STATS", "ConfigurationMismatchError", "DistributedError", "check_same_configuration", "config_digest", "PARTITIONS", "all_gather", "all_reduce_sum", "balanced_split",
    "copy_to_ranks", "count_communication", "divergence_distributed", "global_sum", "gradient_distributed",
    "neighbour_planes", "scale_grad",
    "total_variation_distributed",
]
