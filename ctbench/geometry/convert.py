"""Anything a projector accepts as geometry -> a :class:`Trajectory`.

ctbench trajectories pass through; diffct 2.5 tuples are converted:

- ``(src, det_center, det_u, det_v)``, each ``(n_views, 3)``: a cone beam, or
  with ``beam="parallel3d"`` (or ``"parallel"``) a parallel beam whose first
  part is the ray direction;
- ``(src, det_center, det_u)``, each ``(n_views, 2)``: a 2D fan beam
  (``beam="fan"``) or, with ``beam="parallel"``, ``(ray_dir, det_origin, det_u)``.

diffct names its beams ``cone``, ``fan``, ``parallel`` and ``parallel3d``;
ctbench has ``cone`` (fan = a 2D cone) and ``parallel`` (2D or 3D, from the
trajectory's ``ndim``).  The conversion keeps autograd: gradients of a
projection reach the tuple's tensors.
"""

from __future__ import annotations

from .trajectory import DIFFCT_BEAMS, Trajectory, ctbench_beam, from_diffct  # noqa: F401  (re-exported)

def as_trajectory(trajectory, beam: str | None = None, like: Trajectory | None = None) -> Trajectory:
    """A Trajectory from a Trajectory or a diffct tuple.

    ``beam`` (diffct or ctbench name) tells a 2D tuple's beam; ``like`` (a
    projector's trajectory) supplies it for a per-call override.
    """
    if isinstance(trajectory, Trajectory):
        return trajectory
    if beam is None:  # a diffct-style tuple that knows its beam (ctbench.compat's generators return them)
        beam = getattr(trajectory, "diffct_beam", None)
    if beam is None and like is not None:
        beam = like.beam if like.ndim == 3 or like.beam == "parallel" else "fan"
    return from_diffct(trajectory, beam)


def resolve_trajectory(trajectory, beam: str | None = None) -> tuple[Trajectory, str | None]:
    """(Trajectory, ctbench beam name or None) for a Projector's ``trajectory`` and ``beam`` arguments."""
    return as_trajectory(trajectory, beam), ctbench_beam(beam)
