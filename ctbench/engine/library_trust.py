"""Open and load a compiled kernel library only after checking who may have written it.

Shared by the JIT cache (``cpu.library``) and the prebuilt libraries shipped in
the wheel (``cpu.prebuilt``): a file must be a regular file (no links), owned by
an accepted user and not writable by group or others, and its bytes must match
a recorded size and SHA-256 before ``dlopen`` sees it.  On Linux the verified
open descriptor itself is loaded (``/proc/self/fd/N``), so the file cannot be
swapped between the check and the load.

Every file here (libraries, their records, the prebuilt manifest, the cached
path choices) is opened with ``O_NONBLOCK`` and checked with ``fstat`` before
anything is read, so a FIFO or device in the cache is refused without
blocking, and read with a bound: a JSON file at most ``MAX_JSON_BYTES``, a
library at most the size its record states (a sparse 4 GiB file is never read
whole).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import stat
from pathlib import Path

_LOADED_FDS: list[int] = []  # fds of loaded libraries (kept open: see load_verified)
# Records, manifests and path choices are a few KiB; anything far larger is damage, not data.
MAX_JSON_BYTES = 4 << 20
# A kernel library is a few MiB; a record stating more is damaged.
MAX_LIBRARY_BYTES = 1 << 30


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


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _open_regular(path: Path, follow_links: bool) -> int:
    """A blocking read fd of the regular file ``path``, opened without blocking (a FIFO is refused, not waited on)."""
    flags = os.O_RDONLY | _NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):     # damage in a trusted folder: removed and rebuilt by the callers
            raise CorruptLibrary(f"{path} is not a regular file (a FIFO, device or socket); not reading it")
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_trusted(path: Path, owners: tuple[int, ...] | None = None) -> int:
    """An fd of the regular file ``path`` (links refused, FIFOs refused without blocking) owned by ``owners``
    and not writable by others."""
    fd = _open_regular(path, follow_links=False)
    try:
        check_owned(os.fstat(fd), str(path), owners)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int | None = None, what: str = "file") -> bytes:
    """All bytes of ``fd``; with ``limit``, ValueError as soon as there are more than ``limit``."""
    chunks, n = [], 0
    while True:
        b = os.read(fd, 1 << 20 if limit is None else min(1 << 20, limit + 1 - n))
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        n += len(b)
        if limit is not None and n > limit:
            raise ValueError(f"{what} holds more than {limit} bytes (damaged)")


def _parse(raw: bytes, what: str, path: Path):
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"{what} {path} is unreadable: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path} is unreadable: {e}") from None


def read_trusted_json(path: Path, what: str, owners: tuple[int, ...] | None = None):
    """The JSON document in the trusted file ``path`` (see open_trusted), at most ``MAX_JSON_BYTES``; ValueError
    names it as ``what`` if it is larger or does not parse."""
    fd = open_trusted(path, owners)
    try:
        return _parse(read_fd(fd, MAX_JSON_BYTES, f"{what} {path}"), what, path)
    finally:
        os.close(fd)


def read_json_quietly(path: Path):
    """The JSON document in ``path`` if it is a regular file of at most ``MAX_JSON_BYTES`` that parses, else None
    (for clean-up decisions about files that already failed a check; never blocks, never reads a bomb)."""
    try:
        fd = _open_regular(path, follow_links=False)
    except (OSError, CorruptLibrary):
        return None
    try:
        return _parse(read_fd(fd, MAX_JSON_BYTES), "file", path)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def load_verified(lib: Path, size, sha256, owners: tuple[int, ...] | None = None,
                  record_name: str = "") -> ctypes.CDLL:
    """dlopen ``lib`` if its owner/mode are trusted and its bytes have this size and SHA-256.

    Raises UntrustedCache (owner/mode) or CorruptLibrary (bytes do not match).
    """
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_LIBRARY_BYTES \
            or not isinstance(sha256, str):
        raise CorruptLibrary(f"the record of kernel library {lib} states an invalid size or SHA-256 "
                             f"({size!r:.40}, {sha256!r:.80})", record_name or lib.name)
    try:
        fd = open_trusted(lib, owners)
    except CorruptLibrary as e:
        raise CorruptLibrary(str(e), record_name or lib.name) from None
    try:
        try:
            data = read_fd(fd, size, f"kernel library {lib}")
        except ValueError:
            data = b""      # longer than recorded: fails the comparison below
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
