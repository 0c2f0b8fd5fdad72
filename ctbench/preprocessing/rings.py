"""Ring (stripe) filter: remove the part of each detector column's response that is constant over views.

A pixel whose gain is wrong by a few percent adds the same offset to its
line integral in every view: a vertical stripe in the sinogram, a ring in
the reconstruction.  The filter takes each view's fine detail along u (the
view minus its median filter of width ``size``), then the median of that
detail over all views: a stripe is there in every view, an edge of the
object moves from view to view and drops out.  That estimate of the
stripes is subtracted from every view.
"""

from __future__ import annotations

import numpy as np


def remove_stripes(images, size: int = 9) -> np.ndarray:
    """Ring-filtered copy of ``(view, row, col)`` line integrals; ``size`` is the smoothing width (odd, >= 3)."""
    from scipy.ndimage import median_filter

    if isinstance(size, bool) or int(size) != size or size < 3:
        raise ValueError(f"ring filter size must be an integer >= 3 (pixels), got {size!r}")
    p = np.asarray(images, dtype=np.float32)
    if p.ndim != 3:
        raise ValueError(f"images must be (view, row, col), got shape {p.shape}")
    detail = p - median_filter(p, size=(1, 1, int(size)), mode="nearest")
    stripes = np.median(detail, axis=0)                      # (rows, cols): what every view shares
    return p - stripes[None]
