"""One output policy for every ctbench writer: what may be written where, and how a path is replaced.

Used by ``ctbench recon`` (ctbench/pipeline), :func:`ctbench.io.export.export_volume`,
:func:`ctbench.workbench.dataset.save_dataset`, job results (jobs/worker) and
the napari writer.  The rules (docs/RELIABILITY.md, "Outputs and durability"):

1. An output may not be, contain or lie inside any input (resolved paths;
   the same file through a hard link counts as the same file).
2. An existing path is replaced only with ``overwrite`` and only if ctbench
   wrote it (:func:`written_by_ctbench`: a ctbench dataset, a TIFF or HDF5
   export carrying ctbench's marker, or an empty folder), unless the user
   forces it (``force=True``, ``--force``).
3. Replacement is by exchange (:func:`replace_into_place`): the complete new
   output and the old one swap names atomically (Linux ``renameat2``
   RENAME_EXCHANGE; two renames elsewhere) and only then is the old one
   deleted.  What a kill between the two fallback renames leaves is put back
   by :func:`recover_interrupted_replace` on the next write or open.

This module is on the ground floor: it imports nothing of ctbench but the
atomic file helpers, and reads the markers itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import json
import os
import secrets
import shutil
import stat
import sys
from pathlib import Path
from typing import Callable, Iterable

from .atomic_files import fsync_dir, fsync_tree, pid_alive

#: The marker of a TIFF or HDF5 export: ImageJ description key / HDF5 root attribute, and its value.
MARKER_KEY = "ctbench_output"
MARKER_VALUE = "ctbench.export"
DATASET_FORMAT = "ctbench.dataset"
_NEW, _OLD = ".new-", ".old-"
_MAX_SCAN = 10000          # entries of a folder looked at for hard links (bounded: never a long walk)
_MAX_META = 1 << 20        # bytes of a zarr.json read to find the dataset marker


class OutputOverlapError(ValueError):
    """The output is, contains or lies inside one of the inputs."""


class ForeignOutputError(FileExistsError):
    """The output path holds something ctbench did not write (replace it only with force)."""


# ------------------------------------------------------------------ markers
def _is_dataset_folder(path: Path) -> bool:
    meta = path / "zarr.json"
    try:
        st = os.stat(meta, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_META:
            return False
        doc = json.loads(meta.read_bytes())
    except (OSError, ValueError):
        return False
    attrs = doc.get("attributes") if isinstance(doc, dict) else None
    return isinstance(attrs, dict) and doc.get("node_type") == "group" and (
        attrs.get("format") == DATASET_FORMAT or attrs.get(MARKER_KEY) == MARKER_VALUE)    # dataset, OME-Zarr


def _tiff_marked(path: Path) -> bool:
    try:
        import tifffile
        with tifffile.TiffFile(path) as tif:
            desc = tif.pages[0].description or ""
    except Exception:  # noqa: BLE001 - a damaged or foreign file is simply not ours
        return False
    # ImageJ descriptions are "key=value" lines; ctbench exports before the marker carried "ctbench=".
    return f"\n{MARKER_KEY}={MARKER_VALUE}" in desc or "\nctbench=" in desc


def _hdf5_marked(path: Path) -> bool:
    try:
        import h5py
        with h5py.File(path, "r") as f:
            if f.attrs.get(MARKER_KEY) in (MARKER_VALUE, MARKER_VALUE.encode()):
                return True
            ds = f.get("volume")   # exports before the marker: /volume with ctbench's attributes
            return ds is not None and ds.attrs.get("values") in ("linear attenuation per mm",
                                                                 b"linear attenuation per mm") \
                and "meta" in ds.attrs and "voxel_spacing" in ds.attrs
    except Exception:  # noqa: BLE001
        return False


def written_by_ctbench(path) -> bool:
    """Whether ``path`` holds an output ctbench wrote: a ctbench dataset or OME-Zarr folder, a TIFF or HDF5 file with
    ctbench's export marker, or an empty folder.  Never opens a FIFO or device; a link is judged by its target
    (replacing it replaces the link, never the target)."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        try:
            with os.scandir(path) as it:
                if next(it, None) is None:
                    return True
        except OSError:
            return False
        return _is_dataset_folder(path)
    if not stat.S_ISREG(st.st_mode):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return _tiff_marked(path)
    if head == b"\x89HDF\r\n\x1a\n":
        return _hdf5_marked(path)
    return False


# ------------------------------------------------------------------ overlap
def _inodes(path: Path) -> set[tuple[int, int]]:
    """(st_dev, st_ino) of ``path`` and, for a folder, of the entries under it (bounded)."""
    out = set()
    try:
        st = os.stat(path)
    except OSError:
        return out
    out.add((st.st_dev, st.st_ino))
    if stat.S_ISDIR(st.st_mode):
        n = 0
        for root, dirs, files in os.walk(path):
            for name in files:
                n += 1
                if n > _MAX_SCAN:
                    return out
                with contextlib.suppress(OSError):
                    s = os.stat(os.path.join(root, name), follow_symlinks=False)
                    if stat.S_ISREG(s.st_mode):
                        out.add((s.st_dev, s.st_ino))
    return out


def check_overlap(path, inputs: Iterable = ()) -> None:
    """Refuse (:class:`OutputOverlapError`) an output that is, contains or lies inside one of ``inputs``."""
    out = Path(os.path.realpath(path))
    out_ids = None
    for inp in inputs:
        if inp is None:
            continue
        src = Path(os.path.realpath(inp))
        if out == src:
            raise OutputOverlapError(f"the output {path} is the input {inp}; write the result elsewhere")
        if src in out.parents:
            raise OutputOverlapError(f"the output {path} lies inside the input {inp}; write the result elsewhere")
        if out in src.parents:
            raise OutputOverlapError(f"the output {path} contains the input {inp}; replacing it would delete the "
                                     "input: write the result elsewhere")
        if os.path.lexists(out) and os.path.exists(src):
            if out_ids is None:
                out_ids = _inodes(out)
            if out_ids & _inodes(src):
                raise OutputOverlapError(f"the output {path} and the input {inp} share a file (a hard link); "
                                         "write the result elsewhere")


def check_output(path, inputs: Iterable = (), *, overwrite: bool = False, force: bool = False,
                 what: str = "output") -> Path:
    """Apply the output policy to ``path`` before anything is written; returns it as a Path.

    ``overwrite`` allows replacing an existing output that ctbench wrote; ``force`` (implies overwrite)
    allows replacing anything that is not an input.  Leftovers of an interrupted replace are recovered first.
    """
    if not isinstance(overwrite, bool) or not isinstance(force, bool):
        raise TypeError(f"overwrite and force must be True or False, got overwrite={overwrite!r}, force={force!r}")
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise ValueError(f"{what} must name a file or folder, got {str(path)!r}")
    inputs = list(inputs)
    check_overlap(path, inputs)
    recover_interrupted_replace(path)
    if os.path.lexists(path):
        if not (overwrite or force):
            raise FileExistsError(f"{what} {path} exists; pass overwrite=True (--overwrite) to replace it")
        if not force and not written_by_ctbench(path):
            raise ForeignOutputError(f"{what} {path} exists and is not a ctbench dataset or export (no ctbench "
                                     "marker); refusing to replace it: remove it yourself, choose another path, or "
                                     "force it (force=True, --force)")
    return path


# ------------------------------------------------------------------ replace
def staging_path(path) -> Path:
    """A fresh hidden sibling ``.NAME.new-PID-RANDOM`` to write a new output into (not created)."""
    path = Path(path)
    return path.with_name(f".{path.name}{_NEW}{os.getpid()}-{secrets.token_hex(4)}")


def _old_name(new: Path, path: Path) -> Path:
    tail = new.name[len(f".{path.name}{_NEW}"):] if new.name.startswith(f".{path.name}{_NEW}") else \
        f"{os.getpid()}-{secrets.token_hex(4)}"
    return path.with_name(f".{path.name}{_OLD}{tail}")


def _renameat2(a: Path, b: Path, flags: int) -> bool | None:
    """renameat2(a, b, flags): True done, False unsupported here; OSError otherwise."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(-100, os.fsencode(a), -100, os.fsencode(b), flags) == 0:   # -100: AT_FDCWD
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV, errno.EPERM):
        return False
    raise OSError(err, f"could not move {a} to {b}: {os.strerror(err)}")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (RENAME_EXCHANGE); False where unsupported."""
    return bool(_renameat2(a, b, 2))


def _rename_noreplace(a: Path, b: Path) -> bool:
    """Rename that fails with FileExistsError if ``b`` appeared (RENAME_NOREPLACE); False where unsupported."""
    try:
        return bool(_renameat2(a, b, 1))
    except OSError as e:
        if e.errno == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, f"{b} appeared while the output was being written") from None
        raise


def remove_path(p) -> None:
    """Delete a file, link (never its target) or folder tree; missing is fine."""
    p = Path(p)
    if p.is_symlink() or (os.path.lexists(p) and not p.is_dir()):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
    elif p.is_dir():
        shutil.rmtree(p, ignore_errors=True)


def replace_into_place(new, path, *, may_replace: Callable[[Path], bool] | None = None) -> None:
    """Put the complete output ``new`` (a file or folder written at :func:`staging_path`) at ``path``.

    Crash-safe: killed at any point, ``path`` holds the old output or the new one, complete (or nothing
    and the pair of hidden siblings that :func:`recover_interrupted_replace` resolves).  ``may_replace(old)``
    is asked about what stood at ``path`` *after* it was swapped out, so a path someone else filled since
    the policy check is swapped back untouched (ForeignOutputError).  Durable: ``new`` is flushed before the
    commit and the folder after it.
    """
    new, path = Path(new), Path(path)
    fsync_tree(new)
    if not os.path.lexists(path):
        try:
            done = _rename_noreplace(new, path)
        except FileExistsError:
            done = False   # something appeared at path meanwhile: judge it below
        else:
            if not done and not os.path.lexists(path):
                os.rename(new, path)   # no renameat2 here: the policy check just before is all we have
                done = True
        if done:
            fsync_dir(path.parent)
            return
    if _exchange(new, path):
        old = new    # the exchange left what stood at path under the staging name
        if may_replace is not None and not may_replace(old):
            _exchange(new, path)   # not ours to delete: put it back as it was
            fsync_dir(path.parent)
            raise ForeignOutputError(f"{path} was created by someone else while this output was written; "
                                     f"it was left as it was and the new output removed")
    else:
        if may_replace is not None and not may_replace(path):
            raise ForeignOutputError(f"{path} was created by someone else while this output was written; "
                                     f"it was left as it was and the new output removed")
        old = _old_name(new, path)
        os.rename(path, old)      # killed after this: recover_interrupted_replace() puts `new` in place
        os.rename(new, path)
    fsync_dir(path.parent)
    remove_path(old)


def _siblings(path: Path, tag: str) -> list[Path]:
    return sorted(path.parent.glob(f".{glob.escape(path.name)}{tag}*"))


def _pid_of(p: Path, path: Path, tag: str) -> int | None:
    pid = p.name[len(f".{path.name}{tag}"):].split("-")[0]
    return int(pid) if pid.isdigit() else None


def _dead(p: Path, path: Path, tag: str) -> bool:
    pid = _pid_of(p, path, tag)
    return pid is not None and pid != os.getpid() and not pid_alive(pid)


def recover_interrupted_replace(path, *, is_complete: Callable[[Path], bool] | None = None) -> list[str]:
    """Resolve what a killed writer left beside ``path``; returns what was done, one line each.

    With ``path`` missing and a dead writer's ``.NAME.old-*`` beside it, the writer died between the two
    renames of a replace: its new output (``.NAME.new-*`` of the same name tail) was complete and goes into
    place, else the old one goes back.  Then staging leftovers of dead writers are removed.  Writers still
    running are left alone.  ``is_complete`` (for folders with a manifest) may veto a candidate.
    """
    path = Path(path)
    done = []
    if not path.parent.is_dir():
        return done
    if not os.path.lexists(path):
        for old in _siblings(path, _OLD):
            if not _dead(old, path, _OLD):
                continue
            tail = old.name[len(f".{path.name}{_OLD}"):]
            new = path.with_name(f".{path.name}{_NEW}{tail}")
            legacy = path.with_name(f".{path.name}.tmp-{tail}")   # exports of ctbench before this policy
            for cand in (new, legacy, old):
                if os.path.lexists(cand) and (is_complete is None or is_complete(cand)):
                    os.rename(cand, path)
                    fsync_dir(path.parent)
                    done.append(f"recovered {path} from {cand.name} (a replace was interrupted)")
                    break
            if os.path.lexists(path):
                break
    if os.path.lexists(path) or not _siblings(path, _OLD):
        for tag in (_NEW, _OLD, ".tmp-"):
            for cand in _siblings(path, tag):
                if _dead(cand, path, tag):
                    remove_path(cand)
                    done.append(f"removed {cand.name}, left by an interrupted write of {path}")
    return done
