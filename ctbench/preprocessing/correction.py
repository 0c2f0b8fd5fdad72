"""Flat/dark correction and -log: raw counts -> transmission -> line integrals.

``T = (P - D) / (F - D)`` with ``F`` and ``D`` the averages of the flat and
dark frames.  Pixels where the numerator or the denominator is not positive
(noise in heavily attenuated areas, dead pixels) cannot be logged; they are
clipped to ``min_transmission`` and counted, so that the user sees how much
of the data was touched.

Non-finite values (NaN, inf) follow one stated rule, and every one is
counted in the :class:`CorrectionReport`:

- a flat or dark frame's non-finite value is left out of that pixel's
  average; a pixel with no finite flat (or dark) value at all is a dead pixel;
- a non-finite count in a projection is replaced by the median of the finite
  values among its 8 neighbours in the same view; with no finite neighbour it
  is clipped like a value that cannot be logged;
- without flats, the flat is the brightest *finite* count.

So no NaN or infinity ever reaches the line integrals unannounced, and
:func:`minus_log` refuses non-finite input outright.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _compute(a) -> np.ndarray:
    return np.asarray(a.compute() if hasattr(a, "compute") else a)


def average_frames(frames, name: str = "frames", chunk: int = 16, *, report: "CorrectionReport | None" = None
                   ) -> np.ndarray:
    """Per-pixel mean of the finite values of a ``(n, rows, cols)`` stack (read ``chunk`` frames at a time).

    Non-finite values are left out (counted in ``report`` under ``name`` "flats"
    or "darks"); a pixel without any finite value is NaN (a dead pixel to
    :func:`flat_dark_correct`).  float64.
    """
    if frames is None or len(frames.shape) != 3 or frames.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (n, rows, cols) stack")
    total = np.zeros(frames.shape[1:], dtype=np.float64)
    count = np.zeros(frames.shape[1:], dtype=np.int64)
    for i in range(0, frames.shape[0], chunk):
        block = _compute(frames[i:i + chunk]).astype(np.float64)
        ok = np.isfinite(block)
        total += np.where(ok, block, 0.0).sum(axis=0)
        count += ok.sum(axis=0)
    n_bad = int(frames.shape[0] * count.size - count.sum())
    if report is not None and n_bad:
        key = {"flats": "n_nonfinite_flat_values", "darks": "n_nonfinite_dark_values"}.get(name)
        if key is not None:
            setattr(report, key, getattr(report, key) + n_bad)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


_NEIGHBOURS = [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)]


def replace_nonfinite(stack: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """Replace each non-finite value of a ``(view, row, col)`` array by the median of its finite 8 neighbours
    in the same view (in place for float arrays).  Returns (array, how many were non-finite, mask of those left
    non-finite because no neighbour was finite)."""
    a = stack if stack.dtype.kind == "f" else stack.astype(np.float32)
    bad = ~np.isfinite(a)
    n_bad = int(bad.sum())
    if not n_bad:
        return a, 0, bad
    v, r, c = np.nonzero(bad)
    rows, cols = a.shape[1:]
    around = np.full((len(_NEIGHBOURS), n_bad), np.nan, dtype=np.float64)
    for k, (dr, dc) in enumerate(_NEIGHBOURS):
        rr, cc = r + dr, c + dc
        inside = (rr >= 0) & (rr < rows) & (cc >= 0) & (cc < cols)
        vals = np.full(n_bad, np.nan)
        vals[inside] = a[v[inside], rr[inside], cc[inside]]
        around[k] = vals
    around[~np.isfinite(around)] = np.nan
    has = np.isfinite(around).any(axis=0)
    fill = np.full(n_bad, np.nan)
    if has.any():
        fill[has] = np.nanmedian(around[:, has], axis=0)
    a[v, r, c] = fill
    left = np.zeros_like(bad)
    left[v[~has], r[~has], c[~has]] = True
    return a, n_bad, left


@dataclass
class CorrectionReport:
    """What the correction did: how many values were clipped and why."""

    n_values: int = 0
    n_clipped: int = 0            # transmissions <= min_transmission (non-positive numerator included)
    n_dead_pixels: int = 0        # detector pixels whose flat minus dark is not positive
    n_above_one: int = 0          # transmissions > 1 (noise, or flats weaker than the beam): kept, counted
    n_nonfinite_counts: int = 0   # NaN/inf projection values: replaced by the median of their neighbours
    n_nonfinite_unfilled: int = 0  # ... of those, without a finite neighbour: clipped (also in n_clipped)
    n_nonfinite_flat_values: int = 0   # NaN/inf flat-frame values left out of the average
    n_nonfinite_dark_values: int = 0   # NaN/inf dark-frame values left out of the average
    n_nonfinite_field_pixels: int = 0  # pixels whose flat or dark had no finite value (also dead pixels)

    @property
    def n_nonfinite(self) -> int:
        return self.n_nonfinite_counts + self.n_nonfinite_flat_values + self.n_nonfinite_dark_values

    @property
    def clipped_fraction(self) -> float:
        return self.n_clipped / self.n_values if self.n_values else 0.0

    def text(self) -> str:
        s = (f"clipped {self.n_clipped} of {self.n_values} values ({100 * self.clipped_fraction:.3g}%) "
             f"to the minimum transmission; {self.n_dead_pixels} dead detector pixels")
        if self.n_nonfinite:
            s += (f"; non-finite values: {self.n_nonfinite_counts} in the projections (replaced by the median of "
                  f"their neighbours, {self.n_nonfinite_unfilled} without one clipped), "
                  f"{self.n_nonfinite_flat_values} in flats and {self.n_nonfinite_dark_values} in darks (left out "
                  f"of the averages)")
        return s

    def to_dict(self) -> dict:
        return {"n_values": self.n_values, "n_clipped": self.n_clipped, "n_dead_pixels": self.n_dead_pixels,
                "n_above_one": self.n_above_one, "clipped_fraction": self.clipped_fraction,
                "n_nonfinite_counts": self.n_nonfinite_counts, "n_nonfinite_unfilled": self.n_nonfinite_unfilled,
                "n_nonfinite_flat_values": self.n_nonfinite_flat_values,
                "n_nonfinite_dark_values": self.n_nonfinite_dark_values,
                "n_nonfinite_field_pixels": self.n_nonfinite_field_pixels,
                "nonfinite_rule": NONFINITE_RULE}


NONFINITE_RULE = ("non-finite counts -> median of the finite 8 neighbours in the view (none: clipped); non-finite "
                  "flat/dark values left out of the average; a pixel without a finite flat or dark is dead")


def flat_dark_correct(projections, flat=None, dark=None, *, min_transmission: float = 1e-4,
                      report: CorrectionReport | None = None) -> np.ndarray:
    """Transmission of ``(n, rows, cols)`` counts (numpy or lazy) given the averaged ``flat`` and ``dark``.

    ``flat`` / ``dark`` are ``(rows, cols)`` (see :func:`average_frames`);
    a missing dark is zero; a missing flat is the brightest value of the
    projections (a scan without flats can still be logged, with rings).
    Returns float32; values <= ``min_transmission`` are clipped to it and
    counted in ``report``.
    """
    if not 0 < min_transmission < 1:
        raise ValueError(f"min_transmission must be in (0, 1), got {min_transmission!r}")
    p = _compute(projections).astype(np.float32)      # a copy: the caller's array is never changed
    if p.ndim != 3:
        raise ValueError(f"projections must be (n, rows, cols), got shape {p.shape}")
    p, n_nonfinite, unfilled = replace_nonfinite(p)
    if flat is None:
        finite = p[np.isfinite(p)]
        if finite.size == 0:
            raise ValueError("projections hold no finite value: nothing to correct")
        f = np.full(p.shape[1:], finite.max(), np.float32)
    else:
        f = np.asarray(flat, np.float32)
    d = np.zeros(p.shape[1:], np.float32) if dark is None else np.asarray(dark, np.float32)
    for name, a in (("flat", f), ("dark", d)):
        if a.shape != p.shape[1:]:
            raise ValueError(f"the {name} field is {a.shape} pixels but the projections are {p.shape[1:]}")
    field_bad = ~np.isfinite(f) | ~np.isfinite(d)
    d = np.where(field_bad, 0.0, d).astype(np.float32)
    gain = np.where(field_bad, 0.0, f - d)
    dead = ~(gain > 0)
    gain = np.where(dead, 1.0, gain).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        t = (np.where(unfilled, 0.0, p) - d) / gain
    bad = ~(t > min_transmission) | ~np.isfinite(t) | dead[None]   # an overflow to inf/NaN is clipped too
    if report is not None:
        report.n_values += t.size
        report.n_clipped += int(bad.sum())
        report.n_dead_pixels = max(report.n_dead_pixels, int(dead.sum()))
        report.n_above_one += int((np.isfinite(t) & (t > 1)).sum())
        report.n_nonfinite_counts += n_nonfinite
        report.n_nonfinite_unfilled += int(unfilled.sum())
        report.n_nonfinite_field_pixels = max(report.n_nonfinite_field_pixels, int(field_bad.sum()))
    t[bad] = min_transmission
    return t


def minus_log(transmission) -> np.ndarray:
    """Line integrals ``-log(T)``; T must be positive (see :func:`flat_dark_correct`)."""
    t = np.asarray(transmission, dtype=np.float32)
    if not np.isfinite(t).all():
        raise ValueError("transmission has NaN or infinite values; flat/dark-correct first (it replaces them)")
    if (t <= 0).any():
        raise ValueError("transmission has non-positive values; flat/dark-correct with clipping first")
    return -np.log(t)
