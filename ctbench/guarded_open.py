"""One guarded way to open an input: regular files only, optionally confined to a root, bounded when read whole.

Every reader of ctbench (scan folders, TIFF, NeXus, raw, recon configs, the
napari plugin) opens its inputs through this module, and the job bridge
writes uploads through its descriptor-relative half, so that:

- a FIFO never blocks: files are opened with ``O_NONBLOCK`` and then checked
  with ``fstat`` (a FIFO without a writer opens at once and is refused);
- a device (``/dev/zero``), socket or folder is never read: only ``S_ISREG``;
- with ``root=``, a path (or a link in it) that resolves outside the root is
  refused;
- a file read whole (JSON, logs, metadata) is at most a byte bound, by default
  64 MiB, and a single image frame at most 2 GiB; ``CTBENCH_READER_MAX_BYTES``
  is the explicit override of both (the same variable the napari reader uses);
- the bridge creates ``PATH.part`` relative to the data directory's
  descriptor, every component opened with ``O_NOFOLLOW`` and the part with
  ``O_EXCL``, so a planted link cannot redirect a write.

What it does not promise: a library that reopens a path by name after
:func:`check_regular` (h5py, tifffile's memory map) can be raced by someone
swapping the file in between; the check stops accidents and plain hostile
files, not an attacker with write access racing the reader.

This is the ground floor: it imports nothing from ctbench.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path

WHOLE_FILE_DEFAULT = 64 << 20      # JSON, logs, metadata read in one piece
FRAME_DEFAULT = 2 << 30            # one image frame (a view) of a scan or volume file
LIMIT_ENV = "CTBENCH_READER_MAX_BYTES"


class InputError(ValueError):
    """An input that is refused; ``path`` is the file, ``problem`` says why (the message names both)."""

    def __init__(self, path, problem: str):
        self.path = None if path is None else Path(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def reader_limit(name: str = LIMIT_ENV, default: int = WHOLE_FILE_DEFAULT) -> int:
    """A bound from the environment variable ``name`` (the explicit override), else ``default``."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return int(default)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a positive number of bytes, got {raw!r}") from None
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{name} must be a positive number of bytes, got {raw!r}")
    return int(value)


def whole_file_limit() -> int:
    return reader_limit(LIMIT_ENV, WHOLE_FILE_DEFAULT)


def frame_limit() -> int:
    return reader_limit(LIMIT_ENV, FRAME_DEFAULT)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def check_inside(path: Path, root) -> None:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise InputError(path, f"resolves to {real}, outside {real_root}; links may not leave the folder")


def open_fd(path, *, root=None, follow_links: bool = True) -> int:
    """A read-only descriptor of the regular file ``path``; InputError for anything else (never blocks)."""
    path = Path(path)
    if root is not None:
        check_inside(path, root)
    nonblock = getattr(os, "O_NONBLOCK", 0)       # POSIX; Windows has no FIFOs to block on
    flags = os.O_RDONLY | nonblock | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputError(path, "does not exist") from None
    except IsADirectoryError:
        raise InputError(path, "is a folder, not a file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(path, "is a symbolic link, which is not followed here") from None
        raise InputError(path, f"cannot be opened ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(path, f"is {_kind(st.st_mode)}, not a regular file; not reading it")
        if nonblock:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path, *, root=None, follow_links: bool = True):
    """``open(path, "rb")`` for regular files only (see the module doc)."""
    f = os.fdopen(open_fd(path, root=root, follow_links=follow_links), "rb")
    f.raw.name = os.fspath(path)     # libraries (tifffile) name the file by it, as with open(path)
    return f


def check_regular(path, *, root=None) -> os.stat_result:
    """The stat of ``path`` after the same checks as :func:`open_regular`, for libraries that open by name."""
    fd = open_fd(path, root=root)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def read_bytes(path, *, limit: int | None = None, root=None) -> bytes:
    """All bytes of a regular file of at most ``limit`` bytes (default :func:`whole_file_limit`)."""
    limit = whole_file_limit() if limit is None else int(limit)
    with open_regular(path, root=root) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise InputError(path, f"is {size} bytes, more than the bound of {limit} bytes for a file read "
                                   f"whole; raise {LIMIT_ENV} to read it")
        data = f.read(limit + 1)
    if len(data) > limit:    # grew while being read
        raise InputError(path, f"holds more than the bound of {limit} bytes; raise {LIMIT_ENV} to read it")
    return data


def parse_json(text, where) -> object:
    """``json.loads`` whose failures (nesting too deep included) are InputErrors naming ``where``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(where, "is not valid JSON (nested too deeply)") from None
    except ValueError as e:       # JSONDecodeError and UnicodeDecodeError
        raise InputError(where, f"is not valid JSON ({e})") from None


def read_json(path, *, limit: int | None = None, root=None) -> object:
    """The JSON document in a regular file of bounded size."""
    return parse_json(read_bytes(path, limit=limit, root=root), path)


def check_frame(path, shape, itemsize: int, what: str = "a frame") -> int:
    """Refuse ``what`` of ``shape`` x ``itemsize`` bytes above :func:`frame_limit` before anything allocates it."""
    n = 1
    for s in shape:
        n *= int(s)
    nbytes = n * int(itemsize)
    limit = frame_limit()
    if nbytes > limit:
        dims = " x ".join(str(int(s)) for s in shape)
        raise InputError(path, f"declares {what} of {dims} values ({nbytes / 2**30:.3g} GiB), more than the "
                               f"reader's bound of {limit} bytes; raise {LIMIT_ENV} to read it")
    return nbytes


# ------------------------------------------------- descriptor-relative (the bridge)
def _parts(rel: str) -> list[str]:
    parts = [p for p in str(rel).split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise InputError(rel, "must be a relative path without '..'")
    return parts


def open_parent(root_fd: int, rel: str, *, create: bool = False) -> tuple[int, str]:
    """(descriptor of the folder holding ``rel``, its last name), walking from ``root_fd`` without following links.

    ``create`` makes missing folders (mode 0700 relative to the umask).  The
    caller closes the descriptor.  A component that is a link or not a folder
    is an InputError.
    """
    parts = _parts(rel)
    cur = os.dup(root_fd)
    try:
        for name in parts[:-1]:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            try:
                nxt = os.open(name, flags, dir_fd=cur)
            except FileNotFoundError:
                if not create:
                    raise InputError(rel, f"folder {name!r} does not exist") from None
                try:
                    os.mkdir(name, 0o700, dir_fd=cur)
                except FileExistsError:
                    pass
                nxt = os.open(name, flags, dir_fd=cur)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise InputError(rel, f"{name!r} is a link or a file, not a folder") from None
                raise
            os.close(cur)
            cur = nxt
    except BaseException:
        os.close(cur)
        raise
    return cur, parts[-1]


def open_beneath(dir_fd: int, name: str, *, append_at: int | None = None, mode: int = 0o600) -> int:
    """A write descriptor of ``name`` in folder ``dir_fd``: created new (``O_EXCL``) when ``append_at`` is None,
    else an existing regular file of exactly ``append_at`` bytes; never through a link."""
    base = os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
    if append_at is None:
        fd = os.open(name, base | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
    else:
        try:
            fd = os.open(name, base, dir_fd=dir_fd)
        except FileNotFoundError:
            raise InputError(name, f"no earlier chunk to continue at offset {append_at}") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise InputError(name, "is a symbolic link; refusing to write through it") from None
            raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(name, f"is {_kind(st.st_mode)}, not a regular file")
        if append_at is not None and st.st_size != append_at:
            raise InputError(name, f"offset {append_at} does not continue the upload (have {st.st_size} bytes)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
