"""Flat/dark correction and -log: raw counts -> transmission -> line integrals.

``T = (P - D) / (F - D)`` with ``F`` and ``D`` the averages of the flat and
dark frames.  Pixels where the numerator or the denominator is not positive
(noise in heavily attenuated areas, dead pixels) cannot be logged; they are
clipped to ``min_transmission`` and counted, so that the user sees how much
of the data was touched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _compute(a) -> np.ndarray:
    return np.asarray(a.compute() if hasattr(a, "compute") else a)


def average_frames(frames, name: str = "frames", chunk: int = 16) -> np.ndarray:
    """Mean of a ``(n, rows, cols)`` stack (lazy stacks are read ``chunk`` frames at a time), float64."""
    if frames is None or len(frames.shape) != 3 or frames.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (n, rows, cols) stack")
    total = np.zeros(frames.shape[1:], dtype=np.float64)
    for i in range(0, frames.shape[0], chunk):
        total += _compute(frames[i:i + chunk]).astype(np.float64).sum(axis=0)
    return total / frames.shape[0]


@dataclass
class CorrectionReport:
    """What the correction did: how many values were clipped and why."""

    n_values: int = 0
    n_clipped: int = 0            # transmissions <= min_transmission (non-positive numerator included)
    n_dead_pixels: int = 0        # detector pixels whose flat minus dark is not positive
    n_above_one: int = 0          # transmissions > 1 (noise, or flats weaker than the beam): kept, counted

    @property
    def clipped_fraction(self) -> float:
        return self.n_clipped / self.n_values if self.n_values else 0.0

    def text(self) -> str:
        return (f"clipped {self.n_clipped} of {self.n_values} values ({100 * self.clipped_fraction:.3g}%) "
                f"to the minimum transmission; {self.n_dead_pixels} dead detector pixels")

    def to_dict(self) -> dict:
        return {"n_values": self.n_values, "n_clipped": self.n_clipped, "n_dead_pixels": self.n_dead_pixels,
                "n_above_one": self.n_above_one, "clipped_fraction": self.clipped_fraction}


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
    p = _compute(projections).astype(np.float32)
    if p.ndim != 3:
        raise ValueError(f"projections must be (n, rows, cols), got shape {p.shape}")
    d = np.zeros(p.shape[1:], np.float32) if dark is None else np.asarray(dark, np.float32)
    f = np.full(p.shape[1:], p.max(), np.float32) if flat is None else np.asarray(flat, np.float32)
    for name, a in (("flat", f), ("dark", d)):
        if a.shape != p.shape[1:]:
            raise ValueError(f"the {name} field is {a.shape} pixels but the projections are {p.shape[1:]}")
    gain = f - d
    dead = gain <= 0
    gain = np.where(dead, 1.0, gain).astype(np.float32)
    t = (p - d) / gain
    bad = (t <= min_transmission) | dead[None]
    if report is not None:
        report.n_values += t.size
        report.n_clipped += int(bad.sum())
        report.n_dead_pixels = max(report.n_dead_pixels, int(dead.sum()))
        report.n_above_one += int((t > 1).sum())
    t[bad] = min_transmission
    return t


def minus_log(transmission) -> np.ndarray:
    """Line integrals ``-log(T)``; T must be positive (see :func:`flat_dark_correct`)."""
    t = np.asarray(transmission, dtype=np.float32)
    if (t <= 0).any():
        raise ValueError("transmission has non-positive values; flat/dark-correct with clipping first")
    return -np.log(t)
