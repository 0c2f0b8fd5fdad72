"""diffct 2.5's ``diffct.distribution.Partition``, the smallest part of it that single-process code
touches (placeholder for the merge with the distributed face; see docs/FROM_DIFFCT.md).

A :class:`Partition` describes who owns which views and volume planes; in one process the single
rank owns everything.  :meth:`Partition.preflight` is where ranks would agree on a request before
any numerical I/O; in one process it raises the request's own validation error, if any.
"""

from __future__ import annotations

__all__ = ["Partition"]


class Partition:
    """Ownership of ``n_views`` views and a ``volume_shape`` volume (one process: all of both)."""

    def __init__(self, volume_shape, n_views, *, distributed=False, process_group=None, partition="views",
                 partition_grid=None):
        if not isinstance(distributed, bool):
            raise TypeError(f"distributed must be a bool, got {type(distributed).__name__}")
        if distributed:
            raise NotImplementedError("distributed=True: use ctbench's distributed projector "
                                      "(ctbench.Projector(..., distributed=True)); see docs/DISTRIBUTED.md")
        if partition not in ("views", "space", "hybrid"):
            raise ValueError(f"partition must be 'views', 'space' or 'hybrid', got {partition!r}")
        self.global_volume_shape = tuple(int(n) for n in volume_shape)
        self.n_views = int(n_views)
        self.partition = partition
        self.partition_grid = partition_grid
        self.process_group = process_group
        self.world_size = 1
        self.rank = 0
        self.view_slice = slice(0, self.n_views)
        self.local_volume_shape = self.global_volume_shape

    def preflight(self, error=None, request=None):
        """Raise ``error`` (a request's validation failure), else accept ``request``: with one rank
        there is nobody to disagree with."""
        if error is not None:
            raise error
