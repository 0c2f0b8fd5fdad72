"""Preprocessing of measured scans: flat/dark correction, -log, crop/bin/subset, ring filters, outliers,
phase retrieval, beam-hardening linearisation, centre finding.

Numpy and scipy on ``(view, row, col)`` stacks (see :mod:`ctbench.io.scan`
for the axis convention); the centre finder's cross-check uses the FBP of
:mod:`ctbench.solvers`.  Corrections: docs/CORRECTIONS.md.
"""

from .centre import CentreResult, conjugate_mismatch, find_centre, mid_plane_sinogram, offset_by_conjugate_rays, \
    offset_by_sharpness
from .correction import CorrectionReport, average_frames, flat_dark_correct, minus_log
from .hardening import fit_linearisation, linearise
from .outliers import OutlierReport, remove_outliers
from .phase import PhaseReport, paganin, paganin_filter, wavelength_mm
from .reshape import DetectorChange, bin_pixels, crop, view_subset
from .rings import remove_stripes
from .rings_sorting import remove_stripes_sorting
from .rings_wavelet import remove_stripes_wavelet

__all__ = ["CentreResult", "find_centre", "mid_plane_sinogram", "offset_by_conjugate_rays", "offset_by_sharpness",
           "conjugate_mismatch", "CorrectionReport", "average_frames", "flat_dark_correct", "minus_log",
           "DetectorChange", "bin_pixels", "crop", "view_subset", "remove_stripes", "remove_stripes_sorting",
           "remove_stripes_wavelet", "OutlierReport", "remove_outliers", "PhaseReport", "paganin", "paganin_filter",
           "wavelength_mm", "fit_linearisation", "linearise"]
