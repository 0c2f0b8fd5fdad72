"""ctbench: a CT reconstruction workbench.

The engine API follows the ctbench specification: :class:`Projector`,
trajectory generators such as :func:`spiral_trajectory_3d` (diffct 2.5's
frame and signatures, docs/GEOMETRY.md), and the reconstruction solvers in
:mod:`ctbench.solvers`.  The names diffct 2.5 exports at top level exist
here too (:mod:`ctbench.compat`, docs/FROM_DIFFCT.md), so a diffct script
runs with its import changed.
"""

from .compat import (
    NpyStore,
    SolverResult,
    TensorStore,
    angular_integration_weights,
    cgls,
    cgls_into,
    cone_cosine_weights,
    detector_coordinates_1d,
    fan_cosine_weights,
    fbp,
    fbp_into,
    fdk,
    fdk_into,
    helical_fdk,
    parker_weights,
    ramp_filter_1d,
    sirt,
    total_variation,
    tv_reconstruction,
)
from .geometry import (
    GENERATORS,
    Trajectory,
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    custom_trajectory_2d_fan,
    custom_trajectory_2d_parallel,
    custom_trajectory_3d,
    load_trajectory,
    random_trajectory_3d,
    saddle_trajectory_3d,
    save_trajectory,
    sinusoidal_trajectory_2d_fan,
    sinusoidal_trajectory_2d_parallel,
    sinusoidal_trajectory_3d,
    spiral_trajectory_3d,
    transform_trajectory,
)
from .projector import Projector

__version__ = "0.1.0"

__all__ = [
    "Projector", "Trajectory", "load_trajectory", "save_trajectory", *GENERATORS, "transform_trajectory",
    "SolverResult", "cgls", "cgls_into", "sirt", "tv_reconstruction", "total_variation",
    "fdk", "fbp", "helical_fdk", "fdk_into", "fbp_into", "TensorStore", "NpyStore",
    "detector_coordinates_1d", "angular_integration_weights", "fan_cosine_weights", "cone_cosine_weights",
    "parker_weights", "ramp_filter_1d",
]
