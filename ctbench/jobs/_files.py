"""Crash-safe small-file writes shared by the bridge and the worker."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from ..atomic_files import durable, fsync_dir


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON beside ``path`` and rename it into place: readers see the old or the new file, never half."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
            f.flush()
            if durable():
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):   # a full disk: no half-written sibling stays behind
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
