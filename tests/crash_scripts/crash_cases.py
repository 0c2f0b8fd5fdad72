"""The small projector shared by the crash tests and their child processes."""

import torch

from ctbench import Projector, circular_trajectory_3d

VOLUME_SHAPE, DETECTOR_SHAPE, N_VIEWS = (8, 10, 10), (10, 6), 12


def projector(fdk: bool = False) -> Projector:
    # Small windows: several view batches and slabs, so a kill lands between windows.
    traj = circular_trajectory_3d(N_VIEWS, 60.0, 120.0, dtype=torch.float64)
    if fdk:
        return Projector(traj, VOLUME_SHAPE, DETECTOR_SHAPE, view_chunk_size=3, volume_chunk_shape=2)
    return Projector(traj, VOLUME_SHAPE, DETECTOR_SHAPE, view_chunk_size=2, volume_chunk_shape=4)
