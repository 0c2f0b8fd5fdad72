"""Strict JSON for the reports ctbench prints and writes: no ``NaN`` or ``Infinity`` tokens.

Python's ``json`` writes ``NaN``, ``Infinity`` and ``-Infinity``, which are not JSON: ``jq``, JavaScript's
``JSON.parse``, Go, Rust's serde and most other readers refuse the whole document.  A report goes through
:func:`dumps` instead.  Each non-finite number becomes ``null``, and the dict that held it gets a sibling
key ``<key>_note`` that says why: the reason the caller gave for that key (``notes={"sharpness": "not
computed: ..."}``), else the value it replaced::

    dumps({"sharpness": nan, "split_px": inf}, notes={"sharpness": "not computed: ..."})
    # {"sharpness": null, "split_px": null,
    #  "sharpness_note": "not computed: ...", "split_px_note": "not finite (Infinity)"}

A list that holds non-finite numbers (say, residuals) keeps its length, with ``null`` in their places, and
its key's note lists the positions.  The rest of the document is unchanged, so a reader that knew the old
report finds every key where it was.  :func:`loads` is the matching strict reader.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

__all__ = ["strict", "dumps", "loads", "NOTE_SUFFIX"]

NOTE_SUFFIX = "_note"


def _token(x: float) -> str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _non_finite(x) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def _clean(obj, notes: Mapping[str, str]):
    """A copy of ``obj`` with non-finite floats as None and a note beside each key that held one."""
    if isinstance(obj, dict):
        out, added = {}, {}
        for k, v in obj.items():
            if _non_finite(v):
                out[k] = None
                added[k] = notes.get(k, f"not finite ({_token(v)})")
            elif isinstance(v, (list, tuple)):
                out[k], where = _clean_list(v, notes)
                if where:
                    added[k] = notes.get(k, "not finite at " + ", ".join(f"{i} ({t})" for i, t in where))
            else:
                out[k] = _clean(v, notes)
        for k, note in added.items():
            key = f"{k}{NOTE_SUFFIX}"
            if key in out and out[key] not in (None, note):  # a note the report already carries comes first
                note = f"{out[key]}; {note}"
            out[key] = note
        return out
    if isinstance(obj, (list, tuple)):
        return _clean_list(obj, notes)[0]
    if _non_finite(obj):
        return None
    return obj


def _clean_list(items, notes):
    """(cleaned list, [(position such as "[3]" or "[3][0]", token)] of the non-finite numbers replaced)."""
    out, where = [], []
    for i, v in enumerate(items):
        if _non_finite(v):
            out.append(None)
            where.append((f"[{i}]", _token(v)))
        elif isinstance(v, (list, tuple)):
            inner, w = _clean_list(v, notes)
            out.append(inner)
            where.extend((f"[{i}]{j}", t) for j, t in w)
        else:
            out.append(_clean(v, notes))
    return out, where


def strict(obj: Any, notes: Mapping[str, str] | None = None) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, scalars) that strict JSON can hold: see the module docstring."""
    return _clean(obj, notes or {})


def dumps(obj: Any, *, notes: Mapping[str, str] | None = None, **kwargs) -> str:
    """``json.dumps`` of :func:`strict` ``(obj, notes)``; refuses (ValueError) anything still not finite."""
    return json.dumps(strict(obj, notes), allow_nan=False, **kwargs)


def _refuse(token: str):
    raise ValueError(f"not strict JSON: {token} is not a JSON number")


def loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity`` (ValueError)."""
    return json.loads(text, parse_constant=_refuse)
