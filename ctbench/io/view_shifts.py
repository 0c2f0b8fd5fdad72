"""Per-view image shifts that scanners record, read into one form and applied to the prepared images.

Some scanners measure how far each projection moved against the others
(thermal drift, stage runout, deliberate "random movement" against ring
artefacts) and store the correction beside the images.  ctbench keeps them
in ``scan.scanner["view_shifts_px"]``::

    {"x": [...], "y": [...], "source": "where the file stores them"}

one value per view of the file, in the file's own (unbinned) image pixels:
the shift to *apply* to image ``k`` to align it, ``x`` along the column
index, ``y`` along the row index (down), i.e. the aligned image is
``aligned[r, c] = image[r - y_k, c - x_k]``.  This is how the open Xradia
readers apply Zeiss's ``Alignment/X-Shifts`` / ``Y-Shifts`` (CIL's
ZEISSDataReader and txrm2tiff roll each image by ``(y, x)``); the SkyScan list
is read as TIGRE reads it, a moved detector, which aligns with the opposite
vertical sign (:func:`read_skyscan_shift_list`).

The pipeline applies them after flat/dark correction, ring removal and
binning (rings belong to detector pixels, so they are removed before the
views move) and before the image orientation is resolved, by linear
interpolation (edge values continue outwards).  ``preprocess.view_shifts:
false`` leaves them out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ScanFileError

KEY = "view_shifts_px"


def shifts_entry(x, y, n_views: int, source: str, where, *, shape=None) -> dict:
    """The scanner entry for per-view shifts ``x`` / ``y`` (``y`` may be None: zeros), checked.

    ``shape``: the stored images' ``(rows, cols)``; a shift that moves a view off its own detector (more than
    the image's size) is an error naming ``source``, not an interpolation of nothing."""
    xs = np.asarray(x, dtype=np.float64).reshape(-1)
    ys = np.zeros_like(xs) if y is None else np.asarray(y, dtype=np.float64).reshape(-1)
    if xs.size != n_views or ys.size != n_views:
        raise ScanFileError(where, f"{source}: {xs.size} x and {ys.size} y shifts for {n_views} views")
    if not (np.isfinite(xs).all() and np.isfinite(ys).all()):
        raise ScanFileError(where, f"{source}: the per-view shifts contain NaN or infinite values")
    if shape is not None:
        rows, cols = (int(v) for v in shape)
        for name, v, size in (("x (columns)", xs, cols), ("y (rows)", ys, rows)):
            worst = float(np.abs(v).max()) if v.size else 0.0
            if worst > size:
                raise ScanFileError(where, f"{source}: a per-view shift {name} of {worst:.4g} px moves a view off "
                                           f"its {size}-pixel detector; the shifts are not in pixels, or damaged")
    return {"x": xs.tolist(), "y": ys.tolist(), "source": source}


def read_skyscan_shift_list(path, n_views: int) -> tuple[np.ndarray, np.ndarray]:
    """A SkyScan per-view shift list (``<prefix>_TS.csv``) -> ``(x, y)``: the aligning shift of each view in the
    camera's unbinned pixels (divide by the camera binning for the stored images' pixels).

    The layout as the scanner writes it: a ``Format,  CSV`` line, a
    ``Property of the curves, 2 <n> ...`` line, a ``CURVE, Y1, Y2`` line,
    then ``index, Y1, Y2`` per projection; ``Y1`` is the horizontal shift
    (bounded by the log's ``Maximum horizontal TS``), ``Y2`` the vertical one
    (``Maximum vertical TS``).  Read as TIGRE's BrukerDataLoader reads them: the
    detector of view ``k`` moved by ``Y1`` camera pixels along the columns and
    ``Y2`` up (its ``offDetector`` gains ``(Y2, Y1)`` times the *unbinned* camera
    pixel), i.e. ``x = Y1`` and ``y = -Y2`` camera pixels.  The list
    may stop one view short of the files (the scanner lists ``Number of Files -
    1`` views): the last view then keeps the last shift.
    """
    from .errors import read_text
    from .fields import number

    path = Path(path)
    rows = []
    for line in read_text(path).splitlines():
        parts = [p.strip() for p in line.split(",")]
        if not parts[0] or not (parts[0][0].isdigit() or parts[0][0] in "+-."):
            continue                                     # header lines ("Format", "Property...", "CURVE")
        try:
            vals = [number(p, "a shift", path) for p in parts if p]
        except ScanFileError:
            raise ScanFileError(path, f"has a line that is not 'index, Y1, Y2' (finite numbers): {line.strip()!r}") \
                from None
        if len(vals) < 3:
            raise ScanFileError(path, f"has a line that is not 'index, Y1, Y2': {line.strip()!r}")
        rows.append(vals[:3])
        if len(rows) > n_views:
            raise ScanFileError(path, f"lists shifts for more than the scan's {n_views} views")
    if not rows:
        raise ScanFileError(path, "holds no 'index, Y1, Y2' lines")
    a = np.array(sorted(rows), dtype=np.float64)
    if a.shape[0] == n_views - 1:
        a = np.vstack([a, a[-1:]])
    if a.shape[0] != n_views:
        raise ScanFileError(path, f"lists shifts for {a.shape[0]} views; the scan has {n_views}")
    return a[:, 1], -a[:, 2]


def shift_images(images: np.ndarray, x, y) -> np.ndarray:
    """``(view, row, col)`` images, view ``k`` moved by ``x[k]`` columns and ``y[k]`` rows (linear, edges held)."""
    from scipy.ndimage import shift

    a = np.asarray(images, dtype=np.float32)
    out = np.empty_like(a)
    for k in range(a.shape[0]):
        if x[k] == 0 and y[k] == 0:
            out[k] = a[k]
        else:
            out[k] = shift(a[k], (float(y[k]), float(x[k])), order=1, mode="nearest")
    return out


def apply_recorded_shifts(images: np.ndarray, scanner: dict, views, bin_factor: int = 1):
    """The prepared images with the file's per-view shifts applied, and a summary (None when there are none).

    ``views``: the file's view index of each prepared view (None: all);
    ``bin_factor``: the binning applied since (shifts are in unbinned pixels).
    """
    entry = scanner.get(KEY)
    if not entry:
        return images, None
    x = np.asarray(entry["x"], dtype=np.float64)
    y = np.asarray(entry["y"], dtype=np.float64)
    if views is not None:
        x, y = x[views], y[views]
    if x.size != images.shape[0]:
        raise ValueError(f"{KEY}: {x.size} shifts for {images.shape[0]} prepared views")
    x, y = x / bin_factor, y / bin_factor
    summary = {"source": entry.get("source", ""), "n_views": int(x.size),
               "max_abs_x_px": float(np.abs(x).max()), "max_abs_y_px": float(np.abs(y).max())}
    return shift_images(images, x, y), summary
