"""Trajectory generators.

Convention for every circular-type orbit (rotation about z): at angle
``theta`` the source sits at ``sid * (sin t, -cos t, 0)``, the detector
centre at ``(sdd - sid) * (-sin t, cos t, 0)``, the detector u axis is
``(cos t, sin t, 0)`` and v is ``+z``.  This is the fan-flat convention of
ASTRA that the HTC2022 organisers use, so their angles load unchanged.
Angles may be passed as a tensor that requires grad; every generator builds
its vectors with differentiable torch ops.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .trajectory import Trajectory


def _angles(n_views, angles, start_angle, angle_range, device, dtype):
    if angles is not None:
        a = torch.as_tensor(angles, dtype=dtype, device=device) if not isinstance(angles, torch.Tensor) else angles
        if a.ndim != 1:
            raise ValueError(f"angles must be a 1D tensor of length n_views, got shape {tuple(a.shape)}")
        if n_views is not None and a.shape[0] != n_views:
            raise ValueError(f"angles has {a.shape[0]} entries but n_views={n_views}")
        return a
    n = _check_views(n_views)
    step = angle_range / n
    return start_angle + step * torch.arange(n, dtype=dtype, device=device)


def _check_views(n_views) -> int:
    if isinstance(n_views, bool) or not isinstance(n_views, int) or n_views < 1:
        raise ValueError(f"n_views must be a positive integer, got {n_views!r}")
    return n_views


def _check_distances(sid, sdd):
    for name, v in (("sid", sid), ("sdd", sdd)):
        if not math.isfinite(float(v)) or float(v) <= 0:
            raise ValueError(f"{name} must be a positive finite distance in mm, got {v!r}")
    if float(sdd) < float(sid):
        raise ValueError(f"sdd (source-detector distance, {sdd}) must be >= sid (source-isocentre distance, {sid})")


def _orbit(theta, sid, sdd, z, offset_u, offset_v, beam):
    """Vectors of a source/detector pair rotating about z, as (n,3) tensors."""
    s, c = torch.sin(theta), torch.cos(theta)
    zero, one = torch.zeros_like(theta), torch.ones_like(theta)
    radial = torch.stack([s, -c, zero], dim=1)  # isocentre -> source
    u = torch.stack([c, s, zero], dim=1)
    v = torch.stack([zero, zero, one], dim=1)
    zvec = torch.stack([zero, zero, z + zero], dim=1)
    if beam == "cone":
        source = sid * radial + zvec
        centre = -(sdd - sid) * radial + zvec
    else:
        source = -radial  # ray direction, towards the detector
        centre = -(sdd - sid) * radial + zvec if sdd is not None else zvec
    centre = centre + offset_u * u + offset_v * v
    return source, centre, u, v


def circular_trajectory_3d(n_views: int | None = None, sid: float = 500.0, sdd: float = 1000.0, *,
                           angles=None, start_angle: float = 0.0, angle_range: float = 2 * math.pi,
                           detector_offset: Sequence[float] = (0.0, 0.0), z: float = 0.0,
                           device=None, dtype=torch.float32) -> Trajectory:
    """Circular cone-beam orbit. ``angle_range < 2*pi`` gives a short scan."""
    _check_distances(sid, sdd)
    theta = _angles(n_views, angles, start_angle, angle_range, device, dtype)
    src, ctr, u, v = _orbit(theta, sid, sdd, z, detector_offset[0], detector_offset[1], "cone")
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta(
        "circular", theta, sid=sid, sdd=sdd, z=z, detector_offset=list(map(float, detector_offset))))


def spiral_trajectory_3d(n_views: int, sid: float, sdd: float, z_range: float, n_turns: float = 1.0,
                         start_angle: float = 0.0, *, angles=None, detector_offset=(0.0, 0.0),
                         device=None, dtype=torch.float32) -> Trajectory:
    """Helical orbit: ``n_turns`` turns while the source rises through ``z_range`` (mm),
    centred on z=0, first view at ``start_angle``."""
    _check_distances(sid, sdd)
    n = _check_views(n_views)
    theta = _angles(n, angles, start_angle, 2 * math.pi * float(n_turns), device, dtype)
    frac = torch.arange(n, dtype=dtype, device=device) / max(n - 1, 1)
    z = (frac - 0.5) * float(z_range)
    src, ctr, u, v = _orbit(theta, sid, sdd, z, detector_offset[0], detector_offset[1], "cone")
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta(
        "spiral", theta, sid=sid, sdd=sdd, z_range=float(z_range), n_turns=float(n_turns),
        detector_offset=list(map(float, detector_offset))))


def saddle_trajectory_3d(n_views: int, sid: float, sdd: float, amplitude: float, *, start_angle: float = 0.0,
                         angles=None, device=None, dtype=torch.float32) -> Trajectory:
    """Saddle orbit: z = amplitude * cos(2 theta) over one turn."""
    _check_distances(sid, sdd)
    theta = _angles(n_views, angles, start_angle, 2 * math.pi, device, dtype)
    z = float(amplitude) * torch.cos(2 * theta)
    src, ctr, u, v = _orbit(theta, sid, sdd, z, 0.0, 0.0, "cone")
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta(
        "saddle", theta, sid=sid, sdd=sdd, amplitude=float(amplitude)))


def sinusoidal_trajectory_3d(n_views: int, sid: float, sdd: float, amplitude: float, frequency: float = 2.0, *,
                             start_angle: float = 0.0, angles=None, device=None, dtype=torch.float32) -> Trajectory:
    """Sinusoidal orbit: z = amplitude * sin(frequency * theta) over one turn."""
    _check_distances(sid, sdd)
    theta = _angles(n_views, angles, start_angle, 2 * math.pi, device, dtype)
    z = float(amplitude) * torch.sin(float(frequency) * theta)
    src, ctr, u, v = _orbit(theta, sid, sdd, z, 0.0, 0.0, "cone")
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta(
        "sinusoidal", theta, sid=sid, sdd=sdd, amplitude=float(amplitude), frequency=float(frequency)))


def circular_trajectory_3d_parallel(n_views: int | None = None, *, angles=None, start_angle: float = 0.0,
                                    angle_range: float = math.pi, detector_offset=(0.0, 0.0),
                                    device=None, dtype=torch.float32) -> Trajectory:
    """Parallel-beam rotation about z (default 180 degrees)."""
    theta = _angles(n_views, angles, start_angle, angle_range, device, dtype)
    src, ctr, u, v = _orbit(theta, 0.0, None, 0.0, detector_offset[0], detector_offset[1], "parallel")
    return Trajectory(src, ctr, u, v, beam="parallel", ndim=3, meta=_meta(
        "parallel3d", theta, detector_offset=list(map(float, detector_offset))))


def circular_trajectory_2d_fan(n_views: int | None = None, sid: float = 500.0, sdd: float = 1000.0, *,
                               angles=None, start_angle: float = 0.0, angle_range: float = 2 * math.pi,
                               detector_offset: float = 0.0, device=None, dtype=torch.float32) -> Trajectory:
    """2D fan beam with a flat detector (one row in the plane z=0)."""
    _check_distances(sid, sdd)
    theta = _angles(n_views, angles, start_angle, angle_range, device, dtype)
    src, ctr, u, v = _orbit(theta, sid, sdd, 0.0, float(detector_offset), 0.0, "cone")
    return Trajectory(src, ctr, u, v, beam="cone", ndim=2, meta=_meta(
        "fan2d", theta, sid=sid, sdd=sdd, detector_offset=[float(detector_offset), 0.0]))


def circular_trajectory_2d_parallel(n_views: int | None = None, *, angles=None, start_angle: float = 0.0,
                                    angle_range: float = math.pi, detector_offset: float = 0.0,
                                    device=None, dtype=torch.float32) -> Trajectory:
    """2D parallel beam (one detector row in the plane z=0)."""
    theta = _angles(n_views, angles, start_angle, angle_range, device, dtype)
    src, ctr, u, v = _orbit(theta, 0.0, None, 0.0, float(detector_offset), 0.0, "parallel")
    return Trajectory(src, ctr, u, v, beam="parallel", ndim=2, meta=_meta(
        "parallel2d", theta, detector_offset=[float(detector_offset), 0.0]))


def custom_trajectory_3d(source, detector_center, detector_u, detector_v, *, beam: str = "cone", ndim: int = 3,
                         device=None, dtype=None) -> Trajectory:
    """A trajectory from arrays of shape (n_views, 3); tensors keep their autograd history."""
    def conv(x):
        if isinstance(x, torch.Tensor):
            return x.to(device=device or x.device, dtype=dtype or x.dtype)
        return torch.as_tensor(x, device=device, dtype=dtype or torch.float32)
    return Trajectory(conv(source), conv(detector_center), conv(detector_u), conv(detector_v),
                      beam=beam, ndim=ndim, meta={"kind": "custom"})


def _meta(kind, theta, **params):
    return {"kind": kind, "angles": theta.detach().cpu().to(torch.float64).tolist(), **params}


# --------------------------------------------------------------- transforms
def rotation_matrix(rotation: torch.Tensor) -> torch.Tensor:
    """A (3,3) matrix from a rotation vector (axis * angle, Rodrigues) or a (3,3) matrix."""
    r = rotation
    if r.shape == (3, 3):
        return r
    if r.shape != (3,):
        raise ValueError(f"rotation must be a (3,) rotation vector or a (3,3) matrix, got {tuple(r.shape)}")
    theta = torch.sqrt((r * r).sum() + torch.finfo(r.dtype).tiny)
    k = r / theta
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    K = torch.stack([torch.stack([zero, -k[2], k[1]]),
                     torch.stack([k[2], zero, -k[0]]),
                     torch.stack([-k[1], k[0], zero])])
    eye = torch.eye(3, dtype=r.dtype, device=r.device)
    return eye + torch.sin(theta) * K + (1 - torch.cos(theta)) * (K @ K)


def transform_trajectory(trajectory: Trajectory, rotation=None, translation=None) -> Trajectory:
    """Apply a rigid transform ``x -> R x + t`` to the whole scan (differentiable).

    Positions (source of a cone beam, detector centres) are rotated and
    translated; directions (detector axes, parallel ray directions) only rotated.
    """
    ref = trajectory.source
    R = None
    if rotation is not None:
        R = rotation_matrix(torch.as_tensor(rotation, dtype=ref.dtype, device=ref.device)
                            if not isinstance(rotation, torch.Tensor) else rotation.to(ref.dtype))
    t = None
    if translation is not None:
        t = (torch.as_tensor(translation, dtype=ref.dtype, device=ref.device)
             if not isinstance(translation, torch.Tensor) else translation.to(ref.dtype))
        if t.shape != (3,):
            raise ValueError(f"translation must have shape (3,), got {tuple(t.shape)}")

    def rot(x):
        return x if R is None else x @ R.T

    def pos(x):
        x = rot(x)
        return x if t is None else x + t

    src = pos(trajectory.source) if trajectory.beam == "cone" else rot(trajectory.source)
    return trajectory.replace(source=src, detector_center=pos(trajectory.detector_center),
                              detector_u=rot(trajectory.detector_u), detector_v=rot(trajectory.detector_v),
                              meta={**trajectory.meta, "transformed": True})
