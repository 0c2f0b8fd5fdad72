"""Ring (stripe) filter: remove the part of each detector column's response that is constant over views.

A pixel whose gain is wrong by a few percent adds the same offset to its
line integral in every view: a vertical stripe in the sinogram, a ring in
the reconstruction.  The object itself changes from view to view, so the
mean over views of each detector row is smooth along u except for those
offsets; the filter subtracts the difference between that mean and its
median-filtered version (size ``size`` pixels) from every view.
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
    mean = p.mean(axis=0)                                    # (rows, cols)
    smooth = median_filter(mean, size=(1, int(size)), mode="nearest")
    return p - (mean - smooth)[None]
