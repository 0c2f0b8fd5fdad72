"""Open and load a compiled kernel library only after checking who may have written it.

Shared by the JIT cache (``cpu.library``) and the prebuilt libraries shipped in
the wheel (``cpu.prebuilt``): a file must be a regular file (no links), owned by
an accepted user and not writable by group or others, and its bytes must match
a recorded size and SHA-256 before ``dlopen`` sees it.  On Linux the verified
open descriptor itself is loaded (``/proc/self/fd/N``), so the file cannot be
swapped between the check and the load.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import stat
from pathlib import Path

_LOADED_FDS: list[int] = []  # fds of loaded libraries (kept open: see load_verified)


class UntrustedCache(RuntimeError):
    """A cache directory or file that another user could have written."""


class CorruptLibrary(ValueError):
    """A record or library that fails verification; ``file`` is the library the record named."""

    def __init__(self, message: str, file: str = ""):
        super().__init__(message)
        self.file = file


def euid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def check_owned(st: os.stat_result, what: str, owners: tuple[int, ...] | None = None) -> None:
    """Refuse a file or folder that is not owned by ``owners`` (default: the current user) or that
    group or others may write."""
    uid = euid()
    if uid is None:  # no POSIX ownership (Windows): nothing to compare
        return
    owners = (uid,) if owners is None else owners
    if st.st_uid not in owners:
        who = "the current user" if owners == (uid,) else f"uid {' or '.join(map(str, owners))}"
        raise UntrustedCache(f"{what} is owned by uid {st.st_uid}, not by {who} (uid {uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedCache(f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


def open_trusted(path: Path, owners: tuple[int, ...] | None = None) -> int:
    """An fd of the regular file ``path`` (links refused) owned by ``owners`` and not writable by others."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedCache(f"{path} is not a regular file")
        check_owned(st, str(path), owners)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int) -> bytes:
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def read_trusted_json(path: Path, what: str, owners: tuple[int, ...] | None = None):
    """The JSON document in the trusted file ``path`` (see open_trusted); ValueError names it as ``what`` if
    it does not parse."""
    fd = open_trusted(path, owners)
    try:
        return json.loads(read_fd(fd))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path} is unreadable: {e}") from None
    finally:
        os.close(fd)


def load_verified(lib: Path, size, sha256, owners: tuple[int, ...] | None = None,
                  record_name: str = "") -> ctypes.CDLL:
    """dlopen ``lib`` if its owner/mode are trusted and its bytes have this size and SHA-256.

    Raises UntrustedCache (owner/mode) or CorruptLibrary (bytes do not match).
    """
    fd = open_trusted(lib, owners)
    try:
        data = read_fd(fd)
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            raise CorruptLibrary(f"kernel library {lib} does not match its record ({len(data)} bytes; recorded "
                                 f"{size} bytes and another SHA-256): corrupt or replaced", record_name or lib.name)
        proc_fd = f"/proc/self/fd/{fd}"
        if not os.path.exists(proc_fd):
            return ctypes.CDLL(str(lib))
        # dlopen the very file just verified (no window to swap it).  The fd stays
        # open for the life of the process: dlopen recognises loaded objects by
        # name, and a reused fd number would return an earlier library.
        handle = ctypes.CDLL(proc_fd)
        _LOADED_FDS.append(fd)
        fd = -1
        return handle
    finally:
        if fd >= 0:
            os.close(fd)
