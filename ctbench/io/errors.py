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
