"""Self-calibration: a scan's geometry corrected from its own data (docs/CALIBRATION.md).

``calibrate(projector, sinogram, free=("offset_u", "roll", "shift"))`` estimates
detector offsets, roll, pitch and yaw, rotation-axis tilt, the source-detector
distance and per-view object shifts by making a reconstruction reproject onto
the data; ``calibrate_iterations`` is the same as a generator (progress, cancel).
"""

from .parameters import ALL, GLOBAL, PER_VIEW, SPECS
from .result import CalibrationResult, ParameterEstimate
from .solver import CalibrationState, calibrate, calibrate_iterations

__all__ = ["calibrate", "calibrate_iterations", "CalibrationState", "CalibrationResult", "ParameterEstimate",
           "ALL", "GLOBAL", "PER_VIEW", "SPECS"]
