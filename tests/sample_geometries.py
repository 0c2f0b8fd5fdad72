"""Small geometries of every beam type, shared by the projector and FDK tests."""

from ctbench import (
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    spiral_trajectory_3d,
)


def sample_geometries(dtype):
    """(name, trajectory, volume_shape, detector_shape, kwargs) covering every beam type,
    with off-centre detectors and non-cubic voxels."""
    return [
        ("cone", circular_trajectory_3d(9, 40.0, 80.0, detector_offset=(1.7, -0.9), dtype=dtype),
         (10, 12, 11), (15, 13), dict(voxel_spacing=(1.1, 0.9, 1.3), detector_spacing=(1.6, 1.4))),
        ("helical", spiral_trajectory_3d(11, sid=45.0, sdd=90.0, z_range=8.0, n_turns=1.5, dtype=dtype),
         (12, 10, 10), (14, 9), dict(voxel_spacing=(0.8, 1.0, 1.0), detector_spacing=2.0)),
        ("parallel3d", circular_trajectory_3d_parallel(8, detector_offset=(0.6, 0.3), dtype=dtype),
         (9, 11, 10), (16, 12), dict(voxel_spacing=(1.0, 1.2, 0.9), detector_spacing=(1.0, 1.1))),
        ("fan2d", circular_trajectory_2d_fan(13, 40.0, 70.0, detector_offset=2.3, dtype=dtype),
         (14, 12), 21, dict(voxel_spacing=(1.0, 1.25), detector_spacing=1.7)),
        ("parallel2d", circular_trajectory_2d_parallel(12, detector_offset=-1.1, dtype=dtype),
         (13, 15), 19, dict(voxel_spacing=0.9, detector_spacing=1.2)),
    ]
