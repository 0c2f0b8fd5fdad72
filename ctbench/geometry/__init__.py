"""Scan geometry: the Trajectory type, generators (diffct 2.5's frame), rigid transforms, JSON,
and the conversion of diffct tuples."""

from .convert import as_trajectory, ctbench_beam, from_diffct, resolve_trajectory
from .generators import (
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    custom_trajectory_2d_fan,
    custom_trajectory_2d_parallel,
    custom_trajectory_3d,
    half_fan_offset,
    half_fan_trajectory_3d,
    laminography_trajectory_3d,
    laminography_trajectory_3d_parallel,
    random_trajectory_3d,
    rotation_matrix,
    saddle_trajectory_3d,
    sinusoidal_trajectory_2d_fan,
    sinusoidal_trajectory_2d_parallel,
    sinusoidal_trajectory_3d,
    spiral_trajectory_3d,
    transform_trajectory,
)
from .trajectory import Trajectory, load_trajectory, save_trajectory

# diffct 2.5's generators (tests/test_diffct_compat.py checks the list); ctbench's own follow in __all__
GENERATORS = (
    "circular_trajectory_3d", "spiral_trajectory_3d", "saddle_trajectory_3d", "sinusoidal_trajectory_3d",
    "random_trajectory_3d", "custom_trajectory_3d", "circular_trajectory_3d_parallel",
    "circular_trajectory_2d_fan", "sinusoidal_trajectory_2d_fan", "custom_trajectory_2d_fan",
    "circular_trajectory_2d_parallel", "sinusoidal_trajectory_2d_parallel", "custom_trajectory_2d_parallel",
)

__all__ = [
    "Trajectory", "load_trajectory", "save_trajectory", *GENERATORS, "transform_trajectory", "rotation_matrix",
    "half_fan_offset", "half_fan_trajectory_3d", "laminography_trajectory_3d", "laminography_trajectory_3d_parallel",
    "as_trajectory", "from_diffct", "resolve_trajectory", "ctbench_beam",
]
