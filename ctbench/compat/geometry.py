"""diffct 2.5's trajectory generators (``diffct.geometry``): ctbench's own (:mod:`ctbench.geometry`,
diffct's arguments and frame), returning what diffct returns: a tuple of tensors.

The result is a :class:`TrajectoryTuple`: a real ``tuple`` of ``(n_views, 3)`` tensors
``(src, det_center, det_u, det_v)`` (``(n_views, 2)`` ``(src, det_center, det_u)`` or
``(ray_dir, det_origin, det_u)`` in 2D), so indexing, ``len``, unpacking, tensor methods and item
assignment into the parts behave as in diffct; it also carries ``diffct_beam``, so that a 2D tuple
passed back to ctbench needs no ``beam=``.  ``TrajectoryTuple.trajectory()`` is the ctbench
:class:`~ctbench.geometry.Trajectory` of the current parts.  The top-level ``ctbench`` generators
keep returning a Trajectory (which unpacks like the tuple but indexes views).
"""

from __future__ import annotations

import functools

from .. import geometry as _g
from ..geometry import Trajectory, as_trajectory

__all__ = ["transform_trajectory", "circular_trajectory_3d_parallel", "circular_trajectory_3d", "random_trajectory_3d",
           "spiral_trajectory_3d", "sinusoidal_trajectory_3d", "saddle_trajectory_3d", "custom_trajectory_3d",
           "circular_trajectory_2d_fan", "sinusoidal_trajectory_2d_fan", "custom_trajectory_2d_fan",
           "circular_trajectory_2d_parallel", "sinusoidal_trajectory_2d_parallel", "custom_trajectory_2d_parallel",
           "TrajectoryTuple"]


class TrajectoryTuple(tuple):
    """diffct's tuple of per-view tensors, knowing its beam (module docstring)."""

    def __new__(cls, parts, diffct_beam: str):
        obj = super().__new__(cls, parts)
        obj.diffct_beam = diffct_beam
        return obj

    def trajectory(self) -> Trajectory:
        return as_trajectory(tuple(self), self.diffct_beam)

    def __reduce__(self):
        return (TrajectoryTuple, (tuple(self), self.diffct_beam))


def _tuple_result(fn):
    @functools.wraps(fn)
    def generator(*args, **kwargs):
        result = fn(*args, **kwargs)
        if isinstance(result, Trajectory):
            return TrajectoryTuple(result.to_diffct(), result.diffct_beam)
        return result

    return generator


transform_trajectory = _tuple_result(_g.transform_trajectory)
circular_trajectory_3d_parallel = _tuple_result(_g.circular_trajectory_3d_parallel)
circular_trajectory_3d = _tuple_result(_g.circular_trajectory_3d)
random_trajectory_3d = _tuple_result(_g.random_trajectory_3d)
spiral_trajectory_3d = _tuple_result(_g.spiral_trajectory_3d)
sinusoidal_trajectory_3d = _tuple_result(_g.sinusoidal_trajectory_3d)
saddle_trajectory_3d = _tuple_result(_g.saddle_trajectory_3d)
custom_trajectory_3d = _tuple_result(_g.custom_trajectory_3d)
custom_trajectory_3d.__doc__ = (custom_trajectory_3d.__doc__ or "") + """
    Example: a source that rises and falls twice per turn (a figure 8 on the unrolled cylinder)::

        >>> def figure8_path(angles, sid):
        ...     height = 0.1 * sid * torch.sin(2 * angles)
        ...     return torch.stack((sid * torch.cos(angles), sid * torch.sin(angles), height), dim=1)
        >>> src_pos, det_center, det_u_vec, det_v_vec = custom_trajectory_3d(
        ...     90, 500.0, 800.0, figure8_path)
        >>> tuple(src_pos.shape)
        (90, 3)
"""
circular_trajectory_2d_fan = _tuple_result(_g.circular_trajectory_2d_fan)
sinusoidal_trajectory_2d_fan = _tuple_result(_g.sinusoidal_trajectory_2d_fan)
custom_trajectory_2d_fan = _tuple_result(_g.custom_trajectory_2d_fan)
circular_trajectory_2d_parallel = _tuple_result(_g.circular_trajectory_2d_parallel)
sinusoidal_trajectory_2d_parallel = _tuple_result(_g.sinusoidal_trajectory_2d_parallel)
custom_trajectory_2d_parallel = _tuple_result(_g.custom_trajectory_2d_parallel)
