"""Ring (stripe) filter: remove the part of each detector column's response that is constant over views.

A pixel whose gain is wrong by a few percent adds the same offset to its
line integral in every view: a vertical stripe in the sinogram, a ring in
the reconstruction.  The filter takes each view's fine detail along u (the
view minus its median filter of width ``size``), then the median of that
detail over all views: a stripe is there in every view, an edge of the
object moves from view to view and drops out.  That estimate of the
stripes is subtracted from every view.

Non-finite values do not spread: the estimate is made with them replaced by
the median of their neighbours (see
:func:`ctbench.preprocessing.correction.replace_nonfinite`) and they are
returned unchanged where they were, every other value filtered.
"""

from __future__ import annotations

import numpy as np

from ._arrays import int_at_least


def remove_stripes(images, size: int = 9) -> np.ndarray:
    """Ring-filtered copy of ``(view, row, col)`` line integrals; ``size`` is the smoothing width (odd, >= 3,
    at most the number of columns)."""
    from scipy.ndimage import median_filter

    from .correction import replace_nonfinite

    try:
        int_at_least(size, "size", 3)
    except ValueError:
        raise ValueError(f"ring filter size must be an integer >= 3 (pixels), got {size!r:.60}") from None
    p = np.asarray(images, dtype=np.float32)
    if p.ndim != 3:
        raise ValueError(f"images must be (view, row, col), got shape {p.shape}")
    if size > max(3, p.shape[2]):      # a wider window is meaningless and would only allocate
        raise ValueError(f"ring filter size must be at most the detector width ({p.shape[2]} columns), "
                         f"got {size!r:.60}")
    bad = ~np.isfinite(p)
    work = p
    if bad.any():
        work, _, left = replace_nonfinite(p.copy())
        work[left] = 0.0 if not np.isfinite(work).any() else float(np.median(work[np.isfinite(work)]))
    detail = work - median_filter(work, size=(1, 1, int(size)), mode="nearest")
    stripes = np.median(detail, axis=0)                      # (rows, cols): what every view shares
    out = p - stripes[None]
    out[bad] = p[bad]            # a non-finite input stays where it was; it spreads nowhere
    return out
