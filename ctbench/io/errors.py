"""The one error type of the readers and exporters: it names the file and what was wrong.

Inputs are opened through :mod:`ctbench.guarded_open` (regular files only,
bounded whole reads); its refusals become :class:`ScanFileError` here so that
callers catch one type.
"""

from __future__ import annotations

from pathlib import Path

from .. import guarded_open as _guard


class ScanFileError(_guard.InputError):
    """A file cannot be read (or written) as asked; ``path`` is the file, the message says why."""


def as_scan_error(e: _guard.InputError) -> ScanFileError:
    return e if isinstance(e, ScanFileError) else ScanFileError(e.path, e.problem)


def check_input(path, *, root=None):
    """``path`` is a regular file (not a FIFO, device or folder; inside ``root`` if given); its stat."""
    try:
        return _guard.check_regular(path, root=root)
    except _guard.InputError as e:
        raise as_scan_error(e) from None


def check_frame(path, shape, itemsize: int, what: str = "a frame") -> int:
    """Refuse a declared frame larger than the reader's bound before it is allocated (ScanFileError)."""
    try:
        return _guard.check_frame(path, shape, itemsize, what)
    except _guard.InputError as e:
        raise as_scan_error(e) from None


def read_json_any(path, *, root=None):
    """The JSON document in ``path`` (a regular file within the whole-read bound); ScanFileError otherwise."""
    try:
        return _guard.read_json(path, root=root)
    except _guard.InputError as e:
        raise as_scan_error(e) from None


def read_json_object(path, *, root=None) -> dict:
    """The JSON object in file ``path``; ScanFileError when it is not valid JSON or not an object."""
    path = Path(path)
    doc = read_json_any(path, root=root)
    if not isinstance(doc, dict):
        raise ScanFileError(path, "must hold a JSON object")
    return doc


def read_text(path, *, root=None, limit: int | None = None) -> str:
    """A parameter file (INI, log, CSV) read whole through the guarded opener and decoded as Latin-1.

    Scanner PCs write these files in a Windows code page; Latin-1 maps every byte, so a stray accented
    character never stops a read (the keys ctbench uses are ASCII)."""
    try:
        return _guard.read_bytes(path, root=root, limit=limit).decode("latin-1")
    except _guard.InputError as e:
        raise as_scan_error(e) from None


def read_head(path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of a regular file (format detection: a FIFO or device is refused, never read)."""
    try:
        with _guard.open_regular(path) as f:
            return f.read(int(n))
    except _guard.InputError as e:
        raise as_scan_error(e) from None


def open_input(path, *, root=None):
    """``path`` opened for binary reading once it has passed the guarded checks (a regular file), for container
    libraries (h5py, olefile) that are given the file object instead of the name."""
    try:
        return _guard.open_regular(path, root=root)
    except _guard.InputError as e:
        raise as_scan_error(e) from None


IO_EXTRA = 'pip install "ctbench[io]"'


def require(module: str, what: str, path=None):
    """Import ``module`` for reading ``what``; a missing optional package is one ScanFileError line naming the
    extra that installs it, never a bare ModuleNotFoundError."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ScanFileError(path, f"reading {what} needs the Python package {module!r}, which is not installed: "
                                  f"{IO_EXTRA} (or pip install {module})") from None
