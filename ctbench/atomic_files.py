"""Crash-safe file writes and process liveness, shared by every layer that writes to disk.

A file is written to a temporary sibling and renamed over its final name, so a
kill at any moment leaves the old file or the new one, never a mixture.

Durability (a power cut, not only a kill): at a commit point the new bytes
and the directory entry that names them are flushed with :func:`fsync_tree` /
:func:`fsync_dir` before the commit and after it.  ``CTBENCH_FSYNC=0`` (or
:func:`durability` ``(False)``) turns the flushes off, e.g. for a scratch disk
or to measure their cost (benchmarks/bench_durability.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import threading
from pathlib import Path

_local = threading.local()


def durable() -> bool:
    """Whether commit points flush to disk: on unless ``CTBENCH_FSYNC=0`` or inside ``durability(False)``."""
    forced = getattr(_local, "durable", None)
    if forced is not None:
        return forced
    return os.environ.get("CTBENCH_FSYNC", "1").strip().lower() not in ("0", "false", "no", "off")


@contextlib.contextmanager
def durability(enabled: bool):
    """Flush at commit points (``True``) or not (``False``) inside the block, in this thread."""
    before = getattr(_local, "durable", None)
    _local.durable = bool(enabled)
    try:
        yield
    finally:
        _local.durable = before


def fsync_dir(path) -> None:
    """Flush a directory's entries (a rename or create inside it) to disk; a no-op where unsupported."""
    if not durable():
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return   # Windows and some file systems cannot open a directory: nothing to flush there
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path) -> None:
    """Flush one regular file's bytes to disk (links and special files are left alone)."""
    if not durable():
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path) -> None:
    """Flush a file, or every file and folder under a folder (never following links), before a commit."""
    if not durable():
        return
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        if path.is_file() and not path.is_symlink():
            fsync_file(path)
        return
    for root, dirs, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                fsync_file(p)
        fsync_dir(root)


_EXCL_FLAGS = (os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def create_exclusive(folder, prefix: str, suffix: str = "", mode: int = 0o600) -> tuple[int, Path]:
    """``(descriptor, path)`` of a new file ``folder/<prefix><random><suffix>``, created exclusively.

    ``O_CREAT | O_EXCL | O_NOFOLLOW``: a name that already exists, a planted
    link included, is never opened or written through; another random name is
    tried instead.  ``mode`` is subject to the umask (0o666 gives the user's
    usual permissions for an output, the default 0o600 keeps a file private).
    """
    folder = Path(folder)
    for _ in range(64):
        path = folder / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            return os.open(path, _EXCL_FLAGS, mode), path
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a new temporary file {prefix}*{suffix} in {folder}")


def write_all(fd: int, data) -> int:
    """Write every byte of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data).cast("B")
    total = len(view)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    return total


def atomic_write_bytes(path: Path, data, fsync: bool = False, suffix: str = ".partial", mode: int = 0o600) -> int:
    """Write ``data`` to ``path`` through a new temporary sibling ``.<name>.*<suffix>`` (created exclusively,
    :func:`create_exclusive`) and an atomic rename; ``fsync`` flushes it to disk before the rename; a failure
    removes the temporary file.  Returns the number of bytes written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_exclusive(path.parent, f".{path.name}.", suffix, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            n = f.write(data)
            if fsync and durable():
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if fsync:
            fsync_dir(path.parent)
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
