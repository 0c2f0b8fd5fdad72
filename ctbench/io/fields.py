"""Values read from a vendor's parameter file, checked where they enter, and the record of where each came from.

Every reader turns the text or numbers of its format into ctbench's
quantities through :func:`number` (finite, optionally positive, whole or
bounded, with an error naming the file and the field) and records for each
quantity where it came from in a :class:`Provenance`: a named field of the
file, a default of the reader (and whose reading that default follows), or a
value derived from other fields.  The record travels with the scan
(``RawScan.provenance``) to ``ctbench inspect`` and the reports.
"""

from __future__ import annotations

import math
import re

from .errors import ScanFileError

_NUMBER = re.compile(r"^\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)")
# a detector roll beyond this is not a small misalignment (the recon config refuses it too): the images are turned
MAX_ROLL_DEG = 45.0


def number(raw, key: str, where, *, positive: bool = False, whole: bool = False, nonnegative: bool = False,
           bound: float | None = None, prefix: bool = False) -> float:
    """``raw`` (text or a number) as a finite float; ScanFileError naming ``where`` and ``key`` otherwise.

    ``prefix``: read the number at the start of the text ("400 ms", "ON (3)" is not a number); ``whole``: it
    must have no fraction (a count: 16.9 is refused, not truncated); ``bound``: its magnitude at most that.
    """
    text = raw if isinstance(raw, str) else None
    if isinstance(raw, bool):
        raise ScanFileError(where, f"{key} must be a number, got {raw!r}")
    if text is not None:
        m = _NUMBER.match(text)
        if m is None or (not prefix and text.strip() != m.group(1)):
            raise ScanFileError(where, f"{key} must be a number, got {text.strip()!r}")
        try:
            v = float(m.group(1))
        except (OverflowError, ValueError):
            raise ScanFileError(where, f"{key} must be a number, got {text.strip()!r}") from None
    else:
        try:
            v = float(raw)
        except (TypeError, ValueError, OverflowError):
            raise ScanFileError(where, f"{key} must be a number, got {raw!r}") from None
    shown = text.strip() if text is not None else raw
    if not math.isfinite(v):
        raise ScanFileError(where, f"{key} must be a finite number, got {shown!r}")
    if positive and not v > 0:
        raise ScanFileError(where, f"{key} must be a positive number, got {shown!r}")
    if nonnegative and v < 0:
        raise ScanFileError(where, f"{key} must not be negative, got {shown!r}")
    if whole and v != int(v):
        raise ScanFileError(where, f"{key} must be a whole number, got {shown!r} (not truncated)")
    if bound is not None and abs(v) > bound:
        raise ScanFileError(where, f"{key}={shown} is beyond the bound of {bound:g}")
    return v


def max_views() -> int:
    """The reader's bound on a scan's number of views (``CTBENCH_READER_MAX_VIEWS``, default 10^6)."""
    from .. import guarded_open

    return guarded_open.reader_limit("CTBENCH_READER_MAX_VIEWS", 1_000_000)


def count(raw, key: str, where, *, limit: int | None = None) -> int:
    """A positive whole number (views, rows, columns), at most ``limit``."""
    v = number(raw, key, where, positive=True, whole=True)
    if limit is not None and v > limit:
        raise ScanFileError(where, f"{key}={int(v)} is more than the reader's bound of {limit}; raise "
                                   "CTBENCH_READER_MAX_VIEWS (views) if the file is right")
    return int(v)


def roll(raw, key: str, where) -> float:
    """A detector or axis roll in degrees, within the +-45 degrees that ctbench applies (the config's bound)."""
    v = number(raw, key, where)
    if abs(v) > MAX_ROLL_DEG:
        raise ScanFileError(where, f"{key}={v:g} deg is beyond the +-{MAX_ROLL_DEG:g} deg that ctbench applies "
                                   "as a detector roll (geometry.detector_roll_deg): a larger turn means the images "
                                   "themselves are turned; turn them, or check the field")
    return v


class Provenance:
    """Where each quantity of a scan came from: ``{quantity: {"value", "from", "field", "file", "note"}}``.

    ``from`` is ``"field"`` (a named field of a file), ``"default"`` (the reader's default; ``note`` says whose
    reading it follows), ``"derived"`` (computed from the fields named) or ``"check"`` (a consistency check of
    the data).  JSON-able: :meth:`as_dict` is what ``RawScan.provenance`` holds.
    """

    def __init__(self, file=None):
        self.file = None if file is None else str(file)
        self.items: dict[str, dict] = {}

    def _put(self, quantity: str, value, how: str, field, note, file) -> None:
        entry = {"value": _plain(value), "from": how}
        if field:
            entry["field"] = field
        f = self.file if file is None else str(file)
        if f and how in ("field", "derived"):
            entry["file"] = f
        if note:
            entry["note"] = note
        self.items[quantity] = entry

    def field(self, quantity: str, value, field: str, *, note: str | None = None, file=None) -> None:
        self._put(quantity, value, "field", field, note, file)

    def default(self, quantity: str, value, note: str) -> None:
        self._put(quantity, value, "default", None, note, None)

    def derived(self, quantity: str, value, fields: str, *, note: str | None = None, file=None) -> None:
        self._put(quantity, value, "derived", fields, note, file)

    def as_dict(self) -> dict:
        return {k: dict(v) for k, v in self.items.items()}


def _plain(v):
    """JSON-able form of a value (tuples to lists, numpy scalars to floats)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            return v.item()
        except (ValueError, AttributeError):
            return v
    return v


def rotation_of(angles) -> str:
    """"ccw" when ctbench angles grow with the view index, "cw" when they fall (the source's sense of turning)."""
    import numpy as np

    a = np.asarray(angles, dtype=np.float64).reshape(-1)
    if a.size < 2:
        return "ccw"
    return "cw" if float(np.median(np.diff(a))) < 0 else "ccw"


def angles_summary(angles_rad) -> dict | None:
    """First, last, step and range of a scan's angles in degrees, for reports."""
    import numpy as np

    if angles_rad is None:
        return None
    d = np.degrees(np.asarray(angles_rad, dtype=np.float64).reshape(-1))
    if d.size == 0:
        return {"n": 0}
    step = float(np.median(np.diff(d))) if d.size > 1 else 0.0
    return {"n": int(d.size), "first_deg": round(float(d[0]), 6), "last_deg": round(float(d[-1]), 6),
            "step_deg": round(step, 6), "range_deg": round(float(d.max() - d.min()), 6),
            "sense": rotation_of(np.radians(d))}
