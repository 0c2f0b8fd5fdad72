"""Ring (stripe) removal by sorting (after Vo, Atwood and Drakopoulos, Opt. Express 26, 28396, 2018).

A stripe is a detector column whose values are all shifted (or scaled) by
the same amount in every view.  Sorting each column's values over the views
turns the sinogram into a smooth, monotone image in which an object's edges
no longer move from view to view; there a stripe is simply a column that
does not match its neighbours, so a median filter across the columns
removes it.  The values are then put back in their original view order.
Each detector row is its own sinogram.
"""

from __future__ import annotations

import numpy as np

from ._arrays import finite_stack, int_in_range


def remove_stripes_sorting(images, size: int = 21) -> np.ndarray:
    """Stripe-corrected copy of ``(view, row, col)`` line integrals (or one ``(view, col)`` sinogram).

    ``size`` is the width (columns) of the median filter applied to the
    sorted sinogram: wider than the widest stripe, narrower than the object's
    features along u; at most the number of columns (a wider window only
    allocates: ``size=10**9`` once asked for 7.5 GiB).
    """
    from scipy.ndimage import median_filter

    p = finite_stack(images, "images")
    k = int_in_range(size, "size", 3, max(3, p.shape[-1]), "pixels: at most the detector width")
    one = p.ndim == 2
    stack = p[:, None, :] if one else p
    order = np.argsort(stack, axis=0, kind="stable")            # per (row, col): views from low to high
    ranked = np.take_along_axis(stack, order, axis=0)
    smooth = median_filter(ranked, size=(1, 1, k), mode="reflect")
    out = np.empty_like(stack)
    np.put_along_axis(out, order, smooth, axis=0)               # back to the views' own order
    return out[:, 0, :] if one else out
