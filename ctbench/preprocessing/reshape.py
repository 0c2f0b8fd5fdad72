"""Cropping, binning and view subsets of ``(view, row, col)`` stacks, with the geometry they imply.

Cropping or binning moves the centre of the detector when it is not
symmetric; :class:`DetectorChange` keeps that shift (in mm, along u and v)
and the new pixel pitch so that the scan geometry stays exact.  Columns run
along +u, rows along -v (row 0 at the top).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DetectorChange:
    """Accumulated effect of crops and binning: pitch factor and centre shift (mm)."""

    pitch_factor: tuple[int, int] = (1, 1)     # (u, v)
    shift_u: float = 0.0
    shift_v: float = 0.0


def _whole(x) -> bool:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        return False
    return bool(np.isfinite(x)) and x == int(x)


def _range(r, n: int, name: str) -> tuple[int, int]:
    if r is None:
        return 0, n
    try:
        a, b = r
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be (start, stop) pixel indices, got {r!r}") from None
    # Indices are whole numbers: (0.5, 3.9) is refused, not truncated to (0, 3); True is not an index.
    if not all(_whole(x) for x in (a, b)):
        raise ValueError(f"{name} must be (start, stop) whole pixel indices, got {r!r}")
    a, b = int(a), int(b)
    if not 0 <= a < b <= n:
        raise ValueError(f"{name} must satisfy 0 <= start < stop <= {n}, got {r!r}")
    return a, b


def crop(stack, rows=None, cols=None, *, pitch=(1.0, 1.0), change: DetectorChange | None = None):
    """``stack[:, r0:r1, c0:c1]`` (lazy stays lazy); ``change`` gets the centre shift for ``pitch`` (du, dv)."""
    n_rows, n_cols = stack.shape[1:]
    r0, r1 = _range(rows, n_rows, "rows")
    c0, c1 = _range(cols, n_cols, "cols")
    if change is not None:
        du, dv = (float(p) * f for p, f in zip(pitch, change.pitch_factor))
        change.shift_u += ((c0 + c1 - 1) / 2 - (n_cols - 1) / 2) * du
        change.shift_v -= ((r0 + r1 - 1) / 2 - (n_rows - 1) / 2) * dv   # rows run along -v
    return stack[:, r0:r1, c0:c1]


def bin_pixels(stack, factor: int, *, pitch=(1.0, 1.0), change: DetectorChange | None = None) -> np.ndarray:
    """Average ``factor x factor`` detector pixels (numpy result).  A remainder is cropped evenly from both ends."""
    if isinstance(factor, bool) or int(factor) != factor or factor < 1:
        raise ValueError(f"bin factor must be a positive integer, got {factor!r}")
    factor = int(factor)
    if factor == 1:
        return stack
    n, rows, cols = stack.shape
    if rows < factor or cols < factor:
        raise ValueError(f"bin factor {factor} is larger than the detector ({rows} x {cols})")
    rr, rc = rows % factor, cols % factor
    s = crop(stack, (rr // 2, rows - (rr - rr // 2)), (rc // 2, cols - (rc - rc // 2)), pitch=pitch, change=change)
    s = np.asarray(s.compute() if hasattr(s, "compute") else s, dtype=np.float32)
    n, rows, cols = s.shape
    out = s.reshape(n, rows // factor, factor, cols // factor, factor).mean(axis=(2, 4))
    if change is not None:
        change.pitch_factor = (change.pitch_factor[0] * factor, change.pitch_factor[1] * factor)
    return out


def view_subset(n_views: int, angles=None, *, every: int = 1, angle_range_deg=None) -> np.ndarray:
    """Indices of the views to keep: every ``every``-th view within ``angle_range_deg`` = (start, stop) degrees.

    The angular range needs angles (radians); a range that keeps no view is an error.
    """
    if isinstance(every, bool) or int(every) != every or every < 1:
        raise ValueError(f"every must be a positive integer (keep every k-th view), got {every!r}")
    idx = np.arange(n_views)
    if angle_range_deg is not None:
        if angles is None:
            raise ValueError("an angular range needs the rotation angles of the views")
        try:
            a0, a1 = (float(x) for x in angle_range_deg)
        except (TypeError, ValueError):
            raise ValueError(f"angle_range_deg must be (start, stop) in degrees, got {angle_range_deg!r}") from None
        if not a0 < a1:
            raise ValueError(f"angle_range_deg must have start < stop, got {angle_range_deg!r}")
        deg = np.degrees(np.asarray(angles, dtype=np.float64))
        idx = idx[(deg >= a0) & (deg < a1)]
    idx = idx[::int(every)]
    if idx.size == 0:
        raise ValueError(f"the view subset (every={every}, angle_range_deg={angle_range_deg}) keeps no view")
    return idx
