"""Argument checks shared by the corrections: one message style for a bad array or a bad number."""

from __future__ import annotations

import math

import numpy as np


def finite_stack(a, name: str, ndims=(2, 3)) -> np.ndarray:
    """``a`` as float32 with ``ndim`` in ``ndims``; a clear ValueError for other shapes or non-finite values.

    The corrections refuse NaN/inf rather than spread them: a median or an
    FFT would turn one bad value into a patch or a whole image of NaN.
    """
    try:
        arr = np.asarray(a.compute() if hasattr(a, "compute") else a, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a numeric array, got {type(a).__name__} ({e})") from None
    if arr.ndim not in ndims:
        want = " or ".join({2: "(view, col)", 3: "(view, row, col)"}.get(n, f"{n}-D") for n in ndims)
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name} has {int(bad.sum())} non-finite values (NaN or inf) of {arr.size}; "
                         "correct or mask them first (flat/dark correction clips and counts them)")
    return arr


def positive_number(x, name: str, *, allow_zero: bool = False) -> float:
    """``x`` as a finite float > 0 (or >= 0); ValueError naming ``name`` otherwise."""
    if isinstance(x, bool):
        raise ValueError(f"{name} must be a number, got {x!r}")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {x!r}") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {x!r}")
    return v


def int_at_least(x, name: str, lo: int = 3) -> int:
    """``x`` as an integer >= ``lo`` (filter widths, levels)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer, float, np.floating)) \
            or (isinstance(x, (float, np.floating)) and not math.isfinite(x)) or int(x) != x or int(x) < lo:
        raise ValueError(f"{name} must be an integer >= {lo} (pixels), got {x!r}")
    return int(x)


def int_in_range(x, name: str, lo: int, hi: int, unit: str = "pixels") -> int:
    """``x`` as an integer in ``[lo, hi]``: the bound keeps a filter width or a pad from asking for an
    allocation (or a run time) out of all proportion to the data."""
    k = int_at_least(x, name, lo)
    if k > hi:
        raise ValueError(f"{name} must be at most {hi} ({unit}), got {x!r}")
    return k


def finite_result(out: np.ndarray, what: str, hint: str) -> np.ndarray:
    """``out`` if every value is finite; else the ValueError of the function that made it (never NaN returned)."""
    bad = ~np.isfinite(out)
    if bad.any():
        raise ValueError(f"{what} came out non-finite (NaN or infinite) in {int(bad.sum())} of {out.size} values: "
                         f"{hint}")
    return out
