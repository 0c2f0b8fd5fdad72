"""Block stores (an in-memory tensor, zarr v3 on disk) and the loops that stream projector calls through them.

``TensorStore`` and ``ZarrStore`` implement the :class:`BlockStore` protocol;
:func:`project_into` and :func:`backproject_into` run a projector window by
window between two stores, so that memory stays bounded by the plan whatever
the store size (docs/LARGE_VOLUMES.md).  Solvers that stream through stores
(``fdk_into``, the disk-backed CGLS) live in :mod:`ctbench.solvers`.
"""

from .base import (BlockStore, IncompleteStoreError, StoreIntegrityError, check_store, is_chunk_aligned,
                   normalize_window)
from .memory import TensorStore
from .zarr_store import ZarrStore

__all__ = ["BlockStore", "IncompleteStoreError", "StoreIntegrityError", "TensorStore", "ZarrStore", "check_store", "is_chunk_aligned", "normalize_window",
           "project_into", "backproject_into", "plan_into"]


def __getattr__(name):
    # The streaming loops import the projector; load them on first use.
    if name in ("project_into", "backproject_into", "plan_into"):
        from . import streaming
        return getattr(streaming, name)
    raise AttributeError(f"module 'ctbench.storage' has no attribute {name!r}")
