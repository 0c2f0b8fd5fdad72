"""Outlier (zinger) removal: values far from their neighbourhood's median are replaced by that median.

A zinger is a single bright (or dark) pixel in one projection: a gamma ray
or a hot pixel hitting the camera.  In the reconstruction it becomes a
streak through the whole slice.  Each image is compared with its median
filter over ``size x size`` pixels of the same view; where the difference
exceeds ``threshold`` (in the data's own units) the value is replaced by
the median.  The images are not smoothed anywhere else, and every
replacement is counted in :class:`OutlierReport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ._arrays import finite_stack, int_in_range, positive_number

# A zinger is one pixel; a median window wider than this is no longer an outlier filter, and its footprint
# (size x size per pixel) grows quadratically: size 10^5 asked for a 9 GiB mask.
MAX_SIZE = 31


@dataclass
class OutlierReport:
    """How many values were replaced (and in how many views)."""

    n_values: int = 0
    n_replaced: int = 0
    n_views_touched: int = 0
    threshold: float = 0.0

    @property
    def replaced_fraction(self) -> float:
        return self.n_replaced / self.n_values if self.n_values else 0.0

    def text(self) -> str:
        return (f"replaced {self.n_replaced} outliers of {self.n_values} values "
                f"({100 * self.replaced_fraction:.3g}%) in {self.n_views_touched} views")

    def to_dict(self) -> dict:
        return {"n_values": self.n_values, "n_replaced": self.n_replaced, "n_views_touched": self.n_views_touched,
                "threshold": self.threshold, "replaced_fraction": self.replaced_fraction}


def remove_outliers(images, threshold: float, size: int = 3, *, sign: Literal["both", "bright", "dark"] = "both",
                    report: OutlierReport | None = None) -> np.ndarray:
    """Copy of ``(view, row, col)`` images (or one ``(row, col)`` image) with outliers replaced by the local median.

    A value is an outlier when it differs from the median of its
    ``size x size`` neighbourhood in the same view by more than
    ``threshold``; ``sign`` restricts that to values above ("bright": zingers
    in counts or transmission) or below ("dark": zingers in line integrals)
    the median.  ``size`` is at most ``MAX_SIZE`` (31).  Non-finite input is refused.
    """
    from scipy.ndimage import median_filter

    p = finite_stack(images, "images")
    thr = positive_number(threshold, "threshold")
    k = int_in_range(size, "size", 3, MAX_SIZE)
    if sign not in ("both", "bright", "dark"):
        raise ValueError(f"sign must be 'both', 'bright' or 'dark', got {sign!r}")
    one = p.ndim == 2
    stack = p[None] if one else p
    med = median_filter(stack, size=(1, k, k), mode="reflect")
    diff = stack - med
    bad = np.abs(diff) > thr if sign == "both" else (diff > thr if sign == "bright" else diff < -thr)
    out = np.where(bad, med, stack).astype(np.float32)
    if report is not None:
        report.n_values += stack.size
        report.n_replaced += int(bad.sum())
        report.n_views_touched += int(bad.any(axis=(1, 2)).sum())
        report.threshold = thr
    return out[0] if one else out
