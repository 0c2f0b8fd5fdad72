"""Crash-safe small-file writes shared by the bridge and the worker."""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic_files import atomic_write_bytes


def write_json_atomic(path: Path, obj, mode: int = 0o666) -> None:
    """Write JSON beside ``path`` and rename it into place: readers see the old or the new file, never half.

    The temporary sibling is created exclusively (:func:`ctbench.atomic_files.atomic_write_bytes`: a planted
    link is never written through) and removed on any failure (a full disk); the bytes and the rename are
    flushed (``CTBENCH_FSYNC``)."""
    atomic_write_bytes(Path(path), json.dumps(obj, indent=1).encode(), fsync=True, suffix=".tmp", mode=mode)
