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

import torch

from .trajectory import Trajectory

DIFFCT_BEAMS = {"cone": "cone", "fan": "cone", "parallel": "parallel", "parallel3d": "parallel"}


def ctbench_beam(beam: str | None) -> str | None:
    """ctbench's name for a diffct (or ctbench) beam name; None stays None."""
    if beam is None:
        return None
    if beam not in DIFFCT_BEAMS:
        raise ValueError(f"beam must be one of 'cone', 'parallel' (ctbench) or 'fan', 'parallel3d' (diffct), "
                         f"got {beam!r}")
    return DIFFCT_BEAMS[beam]


def from_diffct(parts, beam: str | None = None) -> Trajectory:
    """A Trajectory from a diffct tuple (see the module docstring)."""
    if not isinstance(parts, (tuple, list)) or len(parts) not in (3, 4):
        raise TypeError("trajectory must be a ctbench Trajectory or a diffct tuple: (src, det_center, det_u, det_v) "
                        "of (n_views, 3) tensors, or (src, det_center, det_u) of (n_views, 2) tensors; got "
                        f"{type(parts).__name__}" + (f" of length {len(parts)}" if isinstance(parts, (tuple, list)) else ""))
    names = ("src", "det_center", "det_u", "det_v")[:len(parts)]
    tensors = []
    for name, p in zip(names, parts):
        if not isinstance(p, torch.Tensor):
            try:
                p = torch.as_tensor(p, dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"trajectory part {name} must be a tensor, got {type(p).__name__}") from None
        tensors.append(p)
    dims = 3 if len(parts) == 4 else 2
    for name, t in zip(names, tensors):
        if t.ndim != 2 or t.shape[1] != dims:
            raise ValueError(f"a {len(parts)}-part diffct trajectory has ({'n_views'}, {dims}) parts; "
                             f"{name} has shape {tuple(t.shape)}")
    kind = ctbench_beam(beam)
    if dims == 3:
        if beam == "fan":
            raise ValueError("beam='fan' takes a 2D trajectory (src, det_center, det_u) of (n_views, 2) tensors; "
                             "got 4 parts of (n_views, 3)")
        return Trajectory(*tensors, beam=kind or "cone", ndim=3, meta={"kind": "diffct"})
    if kind is None:
        raise ValueError("a 2D diffct trajectory (3 parts of (n_views, 2)) is a fan or a parallel beam: "
                         "pass beam='fan' or beam='parallel'")
    if beam == "parallel3d":
        raise ValueError("beam='parallel3d' takes (ray_dir, det_center, det_u, det_v) of (n_views, 3) tensors")

    def lift(t):
        return torch.cat([t, torch.zeros_like(t[:, :1])], dim=1)

    src, ctr, u = (lift(t) for t in tensors)
    v = torch.zeros_like(src.detach())
    v[:, 2] = 1.0
    return Trajectory(src, ctr, u, v, beam=kind, ndim=2, meta={"kind": "diffct"})


def as_trajectory(trajectory, beam: str | None = None, like: Trajectory | None = None) -> Trajectory:
    """A Trajectory from a Trajectory or a diffct tuple.

    ``beam`` (diffct or ctbench name) tells a 2D tuple's beam; ``like`` (a
    projector's trajectory) supplies it for a per-call override.
    """
    if isinstance(trajectory, Trajectory):
        return trajectory
    if beam is None and like is not None:
        beam = like.beam if like.ndim == 3 or like.beam == "parallel" else "fan"
    return from_diffct(trajectory, beam)


def resolve_trajectory(trajectory, beam: str | None = None) -> tuple[Trajectory, str | None]:
    """(Trajectory, ctbench beam name or None) for a Projector's ``trajectory`` and ``beam`` arguments."""
    return as_trajectory(trajectory, beam), ctbench_beam(beam)
