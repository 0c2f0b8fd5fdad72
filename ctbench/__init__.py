"""ctbench: a CT reconstruction workbench.

The engine API follows the ctbench specification: :class:`Projector`,
trajectory generators such as :func:`spiral_trajectory_3d`, and the
reconstruction solvers in :mod:`ctbench.solvers`.
"""

from .geometry import (
    Trajectory,
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    custom_trajectory_3d,
    load_trajectory,
    saddle_trajectory_3d,
    save_trajectory,
    sinusoidal_trajectory_3d,
    spiral_trajectory_3d,
    transform_trajectory,
)
from .projector import Projector

__version__ = "0.1.0"

__all__ = [
    "Projector", "Trajectory", "load_trajectory", "save_trajectory",
    "circular_trajectory_3d", "spiral_trajectory_3d", "saddle_trajectory_3d", "sinusoidal_trajectory_3d",
    "circular_trajectory_3d_parallel", "circular_trajectory_2d_fan", "circular_trajectory_2d_parallel",
    "custom_trajectory_3d", "transform_trajectory",
]
