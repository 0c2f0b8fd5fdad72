"""Writes and deletes under the bridge's data directory that no planted link can redirect.

``PUT /data/PATH`` writes ``PATH.part`` and renames it onto ``PATH``; both are
reached from a descriptor of the data directory, every folder on the way
opened with ``O_NOFOLLOW`` (a link in the path is refused, not followed) and
the part created with ``O_EXCL`` (a link named ``PATH.part`` is removed, never
written through).  A continued chunk (``?offset=N``) opens the existing part
with ``O_NOFOLLOW`` and checks that it is a regular file of exactly N bytes.
``DELETE /data/PATH`` on a link removes the link only.

The resolved-path check of :meth:`Bridge.data_path` still runs first (it
gives the 403 for escapes); this module closes the gap between that check and
the write.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from ..guarded_open import InputError, open_beneath, open_parent


class DataPathError(ValueError):
    """A data path that cannot be written or deleted as asked (the bridge answers 409)."""


def _root_fd(data_dir: Path) -> int:
    return os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))


def _unlink_quiet(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)       # unlink never follows a link: a planted link goes, its target stays
    except FileNotFoundError:
        pass


def write_chunk(data_dir: Path, rel: str, offset: int, body: bytes, final: bool) -> int:
    """Write ``body`` at ``offset`` of ``rel + '.part'`` and, when ``final``, rename it onto ``rel``; the size."""
    root = _root_fd(data_dir)
    try:
        try:
            parent, name = open_parent(root, rel, create=offset == 0)
        except InputError as e:
            raise DataPathError(e.problem) from None
        try:
            part = name + ".part"
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise DataPathError(f"{rel} is a directory")
            except FileNotFoundError:
                pass
            if offset == 0:
                try:
                    _unlink_quiet(parent, part)       # a stale part or a planted link: removed, not followed
                except IsADirectoryError:
                    raise DataPathError(f"{rel}.part is a directory") from None
                fd = open_beneath(parent, part)
            else:
                try:
                    fd = open_beneath(parent, part, append_at=offset)
                except InputError as e:
                    raise DataPathError(e.problem) from None
            try:
                os.lseek(fd, offset, os.SEEK_SET)
                view = memoryview(body)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                os.close(fd)
            if final:
                os.replace(part, name, src_dir_fd=parent, dst_dir_fd=parent)   # replaces a link, never follows it
            return offset + len(body)
        finally:
            os.close(parent)
    finally:
        os.close(root)


def discard_part(data_dir: Path, rel: str) -> None:
    """Remove ``rel + '.part'`` (a refused upload leaves nothing); links are removed, not followed."""
    try:
        root = _root_fd(data_dir)
    except OSError:
        return
    try:
        parent, name = open_parent(root, rel)
    except (InputError, OSError):
        os.close(root)
        return
    try:
        try:
            _unlink_quiet(parent, name + ".part")
        except OSError:
            pass
    finally:
        os.close(parent)
        os.close(root)


def delete_entry(data_dir: Path, rel: str) -> bool:
    """Delete file, folder or link ``rel`` under the data directory; a link is removed itself, never resolved
    into what it points at.  False when nothing is there."""
    root = _root_fd(data_dir)
    try:
        try:
            parent, name = open_parent(root, rel)
        except InputError as e:
            if "does not exist" in e.problem:
                return False
            raise DataPathError(e.problem) from None
        try:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if stat.S_ISDIR(st.st_mode):        # a real folder (lstat): a link to one is the else branch
                _rmtree_at(parent, name)
            else:
                os.unlink(name, dir_fd=parent)
            return True
        finally:
            os.close(parent)
    finally:
        os.close(root)


def _rmtree_at(parent: int, name: str) -> None:
    """``shutil.rmtree`` of folder ``name`` in ``parent`` (its fd-based walk does not follow links inside)."""
    try:
        shutil.rmtree(name, dir_fd=parent)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return
        raise
