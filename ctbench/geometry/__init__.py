"""Scan geometry: the Trajectory type, generators, rigid transforms, JSON."""

from .generators import (
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    custom_trajectory_3d,
    rotation_matrix,
    saddle_trajectory_3d,
    sinusoidal_trajectory_3d,
    spiral_trajectory_3d,
    transform_trajectory,
)
from .trajectory import Trajectory, load_trajectory, save_trajectory

__all__ = [
    "Trajectory", "load_trajectory", "save_trajectory",
    "circular_trajectory_3d", "spiral_trajectory_3d", "saddle_trajectory_3d", "sinusoidal_trajectory_3d",
    "circular_trajectory_3d_parallel", "circular_trajectory_2d_fan", "circular_trajectory_2d_parallel",
    "custom_trajectory_3d", "transform_trajectory", "rotation_matrix",
]
