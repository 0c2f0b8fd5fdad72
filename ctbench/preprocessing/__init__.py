"""Preprocessing of measured scans: flat/dark correction, -log, crop/bin/subset, ring filter, centre finding.

Numpy and scipy on ``(view, row, col)`` stacks (see :mod:`ctbench.io.scan`
for the axis convention); the centre finder's cross-check uses the FBP of
:mod:`ctbench.solvers`.
"""

from .centre import CentreResult, conjugate_mismatch, find_centre, mid_plane_sinogram, offset_by_conjugate_rays, \
    offset_by_sharpness
from .correction import CorrectionReport, average_frames, flat_dark_correct, minus_log
from .reshape import DetectorChange, bin_pixels, crop, view_subset
from .rings import remove_stripes

__all__ = ["CentreResult", "find_centre", "mid_plane_sinogram", "offset_by_conjugate_rays", "offset_by_sharpness",
           "conjugate_mismatch", "CorrectionReport", "average_frames", "flat_dark_correct", "minus_log",
           "DetectorChange", "bin_pixels", "crop", "view_subset", "remove_stripes"]
