"""Crash-safe file writes and process liveness, shared by every layer that writes to disk.

A file is written to a temporary sibling and renamed over its final name, so a
kill at any moment leaves the old file or the new one, never a mixture.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: Path, data, fsync: bool = False, suffix: str = ".partial") -> int:
    """Write ``data`` to ``path`` through a temporary sibling ``.<name>.*<suffix>`` (mode 0600) and an atomic
    rename; ``fsync`` flushes it to disk before the rename.  Returns the number of bytes written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            n = f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return n


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
