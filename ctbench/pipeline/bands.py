"""Bands of detector rows read from the work store and put in ctbench's frame as they are read.

The work store holds the corrected views as the file has them (``(view, row,
col)``, row 0 at the top of the file's image).  What maps them onto ctbench's
frame is applied to each band read, never written back: the per-view shifts
the scanner recorded (file frame, linear, edges held), the image orientation
(rows, then columns: the column sense is often decided from the data after
the store is written) and, for filtered backprojection, the detector roll
(:func:`ctbench.io.orientation.unroll_images`).  A band is read with the
margin of rows these resamplings reach into, so every row of it has the
values the whole image would give (the same interpolation of the same
pixels; at the detector's own edges the band's edge is the image's).

ctbench image rows run along -v (row 0 at +v); :meth:`BandReader.sinogram`
returns the ``(view, U, V)`` layout the projector and the kernels use, for a
range of V (row) indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class ViewFrame:
    """How stored views map onto ctbench's image frame."""

    flip_rows: bool = False
    flip_columns: bool = False
    shift_x: tuple | None = None     # per-view shifts (file frame, corrected pixels), or None
    shift_y: tuple | None = None
    roll_deg: float = 0.0            # detector roll resampled away (filtered backprojection), 0: none
    pitch: tuple[float, float] = (1.0, 1.0)

    def with_(self, **changes) -> "ViewFrame":
        return replace(self, **changes)


class BandReader:
    """Row bands of a ``(view, row, col)`` store in ctbench's frame (module doc)."""

    def __init__(self, array, frame: ViewFrame):
        self.array = array
        self.frame = frame
        self.n_views, self.rows, self.cols = (int(s) for s in array.shape)
        f = frame
        self._shift_margin = 0
        if f.shift_y is not None:
            self._shift_margin = int(math.ceil(max(abs(v) for v in f.shift_y))) + 2 if len(f.shift_y) else 0
        self._roll_margin = 0
        if f.roll_deg:
            from ..io.orientation import unroll_margin
            self._roll_margin = unroll_margin(f.roll_deg, f.pitch, self.cols, self.rows)

    def images(self, a: int, b: int, r0: int, r1: int, *, orient_columns: bool = True,
               unroll: bool = True) -> np.ndarray:
        """Views ``[a, b)``, ctbench image rows ``[r0, r1)``: float32 ``(b-a, r1-r0, cols)``.

        ``orient_columns=False`` keeps the file's column order (before the column sense is known);
        ``unroll=False`` leaves the detector roll in."""
        f = self.frame
        R = self.rows
        roll = f.roll_deg if unroll else 0.0
        m = self._roll_margin if roll else 0
        q0, q1 = max(0, r0 - m), min(R, r1 + m)               # ctbench rows the unrolling samples
        f0, f1 = (R - q1, R - q0) if f.flip_rows else (q0, q1)  # the same rows in the file's frame
        s0, s1 = max(0, f0 - self._shift_margin), min(R, f1 + self._shift_margin)
        block = np.asarray(self.array[a:b, s0:s1, :], dtype=np.float32)
        if f.shift_x is not None:
            from ..io.view_shifts import shift_images
            block = shift_images(block, f.shift_x[a:b], f.shift_y[a:b])
        block = block[:, f0 - s0:f1 - s0]
        if f.flip_rows:
            block = block[:, ::-1]
        if orient_columns and f.flip_columns:
            block = block[:, :, ::-1]
        if roll:
            from ..io.orientation import unroll_images
            return unroll_images(block, roll, f.pitch, rows=(r0, r1), first_row=q0, detector_rows=R)
        return np.ascontiguousarray(block[:, r0 - q0:r1 - q0])

    def sinogram(self, a: int, b: int, lo: int, hi: int):
        """Views ``[a, b)`` of detector rows ``[lo, hi)`` (V index, +v up) as a torch ``(b-a, cols, hi-lo)``."""
        import torch

        img = self.images(a, b, self.rows - hi, self.rows - lo)       # V index j is image row rows-1-j
        return torch.from_numpy(np.ascontiguousarray(img[:, ::-1, :].transpose(0, 2, 1)))


def centre_rows(rows: int, pitch_v: float, offset_v_mm: float, half: int = 8) -> tuple[int, int, float]:
    """A band of image rows around the mid-plane (row of v = 0) and the vertical offset that puts the
    mid-plane at the same place within the band: ``(r0, r1, offset_v_mm_in_band)``.

    The band is centred on the mid-plane's row (or pair of rows) where the detector allows, so the offset
    within it is the fractional part only (the centre finders' row choice stays the same)."""
    centre = (rows - 1) / 2 + offset_v_mm / pitch_v
    lo, hi = math.floor(centre), math.ceil(centre)
    r0, r1 = max(0, lo - half), min(rows, hi + half + 1)
    return r0, r1, (centre - r0 - (r1 - r0 - 1) / 2) * pitch_v
