"""diffct 2.5's trajectory generators (``diffct.geometry``): ctbench's own (:mod:`ctbench.geometry`),
which take diffct's arguments and return a :class:`~ctbench.geometry.Trajectory` that unpacks and
indexes as diffct's tuple of tensors."""

from ..geometry import (  # noqa: F401
    Trajectory,
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    custom_trajectory_2d_fan,
    custom_trajectory_2d_parallel,
    custom_trajectory_3d,
    random_trajectory_3d,
    saddle_trajectory_3d,
    sinusoidal_trajectory_2d_fan,
    sinusoidal_trajectory_2d_parallel,
    sinusoidal_trajectory_3d,
    spiral_trajectory_3d,
    transform_trajectory,
)

__all__ = ["transform_trajectory", "circular_trajectory_3d_parallel", "circular_trajectory_3d", "random_trajectory_3d",
           "spiral_trajectory_3d", "sinusoidal_trajectory_3d", "saddle_trajectory_3d", "custom_trajectory_3d",
           "circular_trajectory_2d_fan", "sinusoidal_trajectory_2d_fan", "custom_trajectory_2d_fan",
           "circular_trajectory_2d_parallel", "sinusoidal_trajectory_2d_parallel", "custom_trajectory_2d_parallel"]
