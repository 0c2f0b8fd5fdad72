"""Trajectory generators.

The frame is diffct 2.5's (docs/GEOMETRY.md has a figure), so a diffct
user gets the same scan with the same arguments.  For every orbit about z,
at angle ``t``:

- cone / fan: the source at ``sid * (-sin t, cos t, 0)``, the detector
  centre at ``(sdd - sid) * (sin t, -cos t, 0)`` (opposite the source), the
  detector u axis ``(cos t, sin t, 0)`` and v ``+z``;
- parallel: the ray direction ``(cos t, sin t, 0)``, the detector u axis
  ``(-sin t, cos t, 0)``, the detector centre ``d * u`` for a transverse
  offset ``d`` (diffct's ``detector_distance``) and v ``+z``.

In both, ``u x v`` points along the rays (from the source to the detector),
and the source turns anticlockwise seen from +z as ``t`` grows.  Angles are
``start_angle + k * (end_angle - start_angle) / n_views`` (the end is
excluded), exactly diffct's arithmetic, so the tensors are equal too.

Signatures follow diffct (positional order, names, defaults) with three
differences kept on purpose: ``device`` defaults to None (the CPU, or the
device of an angle tensor) instead of ``"cuda"``; every generator returns a
:class:`Trajectory`, which unpacks like diffct's tuple
(``src, det_center, det_u, det_v = circular_trajectory_3d(...)``); and the
ctbench keywords ``angles=``, ``angle_range=`` and ``detector_offset=``
remain.  Angles may be a tensor that requires grad; every generator builds
its vectors with differentiable torch ops.
"""

from __future__ import annotations

import math
import operator
from typing import Callable, Sequence

import torch

from .trajectory import Trajectory

# ------------------------------------------------------------------ helpers


def _check_views(n_views) -> int:
    # diffct's exception types: a count that is not an integer (2.5, 3.0, True, a numpy float) is a
    # TypeError, an integer below 1 a ValueError
    try:
        n = operator.index(n_views)
    except TypeError:
        n = None
    if n is None or isinstance(n_views, bool):
        raise TypeError(f"n_views must be a positive integer, got {n_views!r}")
    if n < 1:
        raise ValueError(f"n_views must be a positive integer, got {n_views!r}")
    return n


def _check_distances(sid, sdd):
    for name, v in (("sid", sid), ("sdd", sdd)):
        if not math.isfinite(float(v)) or float(v) <= 0:
            raise ValueError(f"{name} must be a positive finite distance in mm, got {v!r}")
    if float(sdd) < float(sid):
        raise ValueError(f"sdd (source-detector distance, {sdd}) must be >= sid (source-isocentre distance, {sid})")


def _as_angles(a, n_views, device, dtype) -> torch.Tensor:
    if not isinstance(a, torch.Tensor):
        a = torch.as_tensor(a, dtype=dtype, device=device)
    if a.ndim != 1 or a.numel() == 0:
        raise ValueError(f"angles must be a nonempty 1D tensor of length n_views, got shape {tuple(a.shape)}")
    if not a.is_floating_point():
        raise TypeError(f"angles must be floating point, got {a.dtype}")
    if not torch.isfinite(a.detach()).all():
        raise ValueError("angles must be finite")
    if n_views is not None and not isinstance(n_views, torch.Tensor) and a.shape[0] != n_views:
        raise ValueError(f"angles has {a.shape[0]} entries but n_views={n_views}")
    return a


def _angles(n_views, angles, start_angle, end_angle, angle_range, default_range, device, dtype,
            absolute_default_end: bool = False) -> torch.Tensor:
    """The view angles: ``angles=`` or an angle tensor passed as ``n_views`` (diffct), else
    ``start + k * (end - start) / n`` with diffct's float arithmetic."""
    if isinstance(n_views, torch.Tensor):
        if angles is not None:
            raise ValueError("pass the view angles either as n_views (a tensor) or as angles=, not both")
        angles = n_views
    if angles is not None:
        return _as_angles(angles, n_views if not isinstance(n_views, torch.Tensor) else None, device, dtype)
    n = _check_views(n_views)
    if end_angle is not None and angle_range is not None:
        raise ValueError("give either end_angle (diffct) or angle_range (ctbench), not both")
    if angle_range is not None:
        end_angle = start_angle + angle_range
    elif end_angle is None:
        # diffct's circular generators default to an absolute end (2 pi or pi); the others to one turn on
        end_angle = default_range if absolute_default_end else start_angle + default_range
    step = (end_angle - start_angle) / n
    return start_angle + torch.arange(n, device=device, dtype=dtype) * step


def _vec(*parts):
    return torch.stack(parts, dim=1)


def _orbit(theta, radius, sdd, z):
    """Cone/fan frame at angles ``theta``: (source, detector centre, u, v), each (n, 3).
    ``radius`` (source-axis distance) and ``z`` may vary per view; the source-detector distance is ``sdd``."""
    s, c = torch.sin(theta), torch.cos(theta)
    zero, one = torch.zeros_like(theta), torch.ones_like(theta)
    idd = sdd - radius
    zz = z + zero
    source = _vec(-radius * s, radius * c, zz)
    centre = _vec(idd * s, -idd * c, zz)
    return source, centre, _vec(c, s, zero), _vec(zero, zero, one)


def _parallel(theta, offset):
    """Parallel frame: (ray direction, detector centre, u, v), the centre ``offset`` along u."""
    s, c = torch.sin(theta), torch.cos(theta)
    zero, one = torch.zeros_like(theta), torch.ones_like(theta)
    return _vec(c, s, zero), _vec(-offset * s, offset * c, zero), _vec(-s, c, zero), _vec(zero, zero, one)


def _shift(centre, u, v, offset_u, offset_v):
    """Move the detector centre by a (u, v) offset in mm; zero offsets leave it bit-identical."""
    if float(offset_u) != 0.0:
        centre = centre + float(offset_u) * u
    if float(offset_v) != 0.0:
        centre = centre + float(offset_v) * v
    return centre


def _offset2(detector_offset) -> tuple[float, float]:
    if isinstance(detector_offset, (int, float)):
        return float(detector_offset), 0.0
    o = tuple(map(float, detector_offset))
    if len(o) != 2:
        raise ValueError(f"detector_offset must be (offset_u, offset_v) in mm, got {detector_offset!r}")
    return o


def _meta(kind, theta, **params):
    return {"kind": kind, "angles": theta.detach().cpu().to(torch.float64).tolist(), **params}


# ------------------------------------------------------------ cone beam 3D


def circular_trajectory_3d(n_views=None, sid: float = 500.0, sdd: float = 1000.0, start_angle: float = 0.0,
                           end_angle: float | None = None, device=None, dtype=torch.float32, *, angles=None,
                           angle_range: float | None = None, detector_offset: Sequence[float] = (0.0, 0.0),
                           z: float = 0.0) -> Trajectory:
    """Circular cone-beam orbit about z.

    ``n_views`` is a view count or (diffct) a 1D tensor of angles.  The views
    span ``[start_angle, end_angle)`` (default end 2 pi) or
    ``[start_angle, start_angle + angle_range)``; less than a full turn is a
    short scan.  ``detector_offset`` shifts the detector (u, v) in mm; ``z``
    lifts the whole orbit.
    """
    _check_distances(sid, sdd)
    theta = _angles(n_views, angles, start_angle, end_angle, angle_range, 2 * math.pi, device, dtype,
                    absolute_default_end=True)
    src, ctr, u, v = _orbit(theta, sid, sdd, z)
    ou, ov = _offset2(detector_offset)
    ctr = _shift(ctr, u, v, ou, ov)
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta(
        "circular", theta, sid=sid, sdd=sdd, z=z, detector_offset=[ou, ov]))


def spiral_trajectory_3d(n_views, sid: float, sdd: float, z_range: float = 100.0, n_turns: float = 2.0,
                         start_angle: float = 0.0, device=None, dtype=torch.float32, *, angles=None,
                         detector_offset=(0.0, 0.0)) -> Trajectory:
    """Helical orbit: ``n_turns`` turns while source and detector rise linearly through ``z_range`` (mm),
    centred on z=0 (first view at ``-z_range/2``, last at ``+z_range/2``)."""
    _check_distances(sid, sdd)
    n = _check_views(n_views)
    theta = _angles(n, angles, start_angle, None, None, 2 * math.pi * n_turns, device, dtype)
    z = torch.linspace(-z_range / 2, z_range / 2, n, device=theta.device, dtype=theta.dtype)
    src, ctr, u, v = _orbit(theta, sid, sdd, z)
    ou, ov = _offset2(detector_offset)
    ctr = _shift(ctr, u, v, ou, ov)
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta(
        "spiral", theta, sid=sid, sdd=sdd, z_range=float(z_range), n_turns=float(n_turns),
        detector_offset=[ou, ov]))


def sinusoidal_trajectory_3d(n_views, sid: float, sdd: float, amplitude: float = 50.0, frequency: float = 2.0,
                             start_angle: float = 0.0, device=None, dtype=torch.float32, *,
                             angles=None) -> Trajectory:
    """One turn whose source distance to the axis oscillates: ``sid + amplitude * sin(frequency t)``
    (in the plane z=0; the source-detector distance stays ``sdd``), as diffct."""
    _check_distances(sid, sdd)
    theta = _angles(n_views, angles, start_angle, None, None, 2 * math.pi, device, dtype)
    radius = sid + amplitude * torch.sin(frequency * theta)
    src, ctr, u, v = _orbit(theta, radius, sdd, 0.0)
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta(
        "sinusoidal", theta, sid=sid, sdd=sdd, amplitude=float(amplitude), frequency=float(frequency)))


def saddle_trajectory_3d(n_views, sid: float, sdd: float, z_amplitude: float = 50.0, radial_amplitude: float = 30.0,
                         start_angle: float = 0.0, device=None, dtype=torch.float32, *,
                         angles=None) -> Trajectory:
    """Saddle orbit over one turn: source and detector at ``z = z_amplitude * cos(2t)``, the source
    distance to the axis ``sid + radial_amplitude * sin(2t)`` (``radial_amplitude=0`` for a pure saddle)."""
    _check_distances(sid, sdd)
    theta = _angles(n_views, angles, start_angle, None, None, 2 * math.pi, device, dtype)
    z = z_amplitude * torch.cos(2 * theta)
    radius = sid + radial_amplitude * torch.sin(2 * theta)
    src, ctr, u, v = _orbit(theta, radius, sdd, z)
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta(
        "saddle", theta, sid=sid, sdd=sdd, z_amplitude=float(z_amplitude),
        radial_amplitude=float(radial_amplitude)))


def random_trajectory_3d(n_views, sid_mean: float, sdd_mean: float, sid_std: float = 0.0, pos_std: float = 0.0,
                         angle_std: float = 0.0, device=None, dtype=torch.float32, seed=None) -> Trajectory:
    """A circular orbit with random errors, as a robot C-arm: per-view source distance
    ``sid_mean + N(0, sid_std)`` (the detector moves with it), source and detector positions
    ``+ N(0, pos_std)`` per coordinate, detector in-plane rotation ``N(0, angle_std)`` rad.

    ``seed`` seeds torch's global generator, and the draws come in diffct's order, so the same
    seed gives diffct's tensors.
    """
    n = _check_views(n_views)
    if seed is not None:
        torch.manual_seed(seed)
    theta = _angles(n, None, 0.0, None, None, 2 * math.pi, device, dtype, absolute_default_end=True)
    src, ctr, u, v = _orbit(theta, sid_mean, sdd_mean, 0.0)
    if sid_std > 0.0:
        dr = torch.randn(n, device=device, dtype=dtype) * sid_std
        # diffct re-reads the angles from the sources; doing the same keeps the tensors equal
        theta_src = torch.atan2(-src[:, 0], src[:, 1])
        # the detector keeps its distance from the source
        src, ctr, _, _ = _orbit(theta_src, sid_mean + dr, sdd_mean + dr, 0.0)
    if pos_std > 0.0:
        src = src + torch.randn_like(src) * pos_std
        ctr = ctr + torch.randn_like(ctr) * pos_std
    if angle_std > 0.0:
        a = torch.randn(n, device=device, dtype=dtype) * angle_std
        ca, sa = torch.cos(a), torch.sin(a)
        u = _vec(u[:, 0] * ca - u[:, 1] * sa, u[:, 0] * sa + u[:, 1] * ca, u[:, 2])
    u = u / u.norm(dim=1, keepdim=True)
    if (src.detach().norm(dim=1) == 0).any() or not torch.isfinite(src.detach()).all():
        raise ValueError("random_trajectory_3d drew a source at the isocentre or a non-finite source; "
                         "use a smaller pos_std")
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta(
        "random", theta, sid=float(sid_mean), sdd=float(sdd_mean), sid_std=float(sid_std),
        pos_std=float(pos_std), angle_std=float(angle_std), seed=seed))


def _path_angles(n_views, start_angle, span, device, dtype):
    return _angles(_check_views(n_views), None, start_angle, None, None, span, device, dtype)


def _check_path(points, n, dims, what):
    if not isinstance(points, torch.Tensor) or tuple(points.shape) != (n, dims):
        got = tuple(points.shape) if isinstance(points, torch.Tensor) else type(points).__name__
        raise ValueError(f"{what} must return a tensor of shape ({n}, {dims}), got {got}")
    if not torch.isfinite(points.detach()).all():
        raise ValueError(f"{what} returned non-finite values")
    if (points.detach().norm(dim=1) == 0).any():
        raise ValueError(f"{what} returned a zero vector (a source at the isocentre or a null ray direction)")


def custom_trajectory_3d(*args, **kwargs) -> Trajectory:
    """A trajectory from explicit vectors, or (diffct) from a source path.

    ``custom_trajectory_3d(source, detector_center, detector_u, detector_v, *, beam="cone", ndim=3,
    device=None, dtype=None)``: four ``(n_views, 3)`` arrays; tensors keep their autograd history.

    ``custom_trajectory_3d(n_views, sid, sdd, source_path_fn, start_angle=0.0, device=None, dtype=float32)``
    (diffct): ``source_path_fn(angles, sid)`` gives the ``(n_views, 3)`` sources over one turn; each
    detector faces its source through the origin at distance ``sdd`` from it, with u horizontal
    (perpendicular to the source and z) and v = source direction x u.
    """
    first = args[0] if args else kwargs.get("n_views", kwargs.get("source"))
    if "source_path_fn" in kwargs or "n_views" in kwargs or (
            not isinstance(first, bool) and isinstance(first, int)):
        return _custom_path_3d(*args, **kwargs)
    return _custom_vectors(*args, **kwargs)


def _custom_vectors(source, detector_center, detector_u, detector_v, *, beam: str = "cone", ndim: int = 3,
                    device=None, dtype=None) -> Trajectory:
    def conv(x):
        if isinstance(x, torch.Tensor):
            return x.to(device=device or x.device, dtype=dtype or x.dtype)
        return torch.as_tensor(x, device=device, dtype=dtype or torch.float32)
    return Trajectory(conv(source), conv(detector_center), conv(detector_u), conv(detector_v),
                      beam=beam, ndim=ndim, meta={"kind": "custom"})


def _custom_path_3d(n_views, sid, sdd, source_path_fn: Callable, start_angle: float = 0.0, device=None,
                    dtype=torch.float32) -> Trajectory:
    if not callable(source_path_fn):
        raise TypeError(f"source_path_fn must be a callable f(angles, sid) -> (n_views, 3), got {source_path_fn!r}")
    theta = _path_angles(n_views, start_angle, 2 * math.pi, device, dtype)
    src = source_path_fn(theta, sid)
    _check_path(src, theta.shape[0], 3, "source_path_fn")
    unit = src / torch.linalg.vector_norm(src, dim=1, keepdim=True)
    ctr = src - sdd * unit
    u = _vec(-src[:, 1], src[:, 0], torch.zeros_like(src[:, 0]))
    on_axis = (src[:, :2].abs() < 1e-6).all(dim=1, keepdim=True)  # a source on z: any horizontal u will do
    u = torch.where(on_axis, src.new_tensor([1.0, 0.0, 0.0]), u)
    u = u / torch.linalg.vector_norm(u, dim=1, keepdim=True)
    v = torch.linalg.cross(unit, u, dim=1)
    v = v / torch.linalg.vector_norm(v, dim=1, keepdim=True)
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta=_meta("custom_path", theta, sid=sid, sdd=sdd))


def circular_trajectory_3d_parallel(n_views=None, detector_distance: float = 0.0, start_angle: float = 0.0,
                                    end_angle: float | None = None, device=None, dtype=torch.float32, *,
                                    angles=None, angle_range: float | None = None,
                                    detector_offset=(0.0, 0.0)) -> Trajectory:
    """Parallel-beam rotation about z (default 180 degrees, end ``pi``); ``detector_distance``
    (diffct's name) offsets the detector along u, ``detector_offset`` by (u, v) in mm."""
    theta = _angles(n_views, angles, start_angle, end_angle, angle_range, math.pi, device, dtype,
                    absolute_default_end=True)
    d, ctr, u, v = _parallel(theta, detector_distance)
    ou, ov = _offset2(detector_offset)
    ctr = _shift(ctr, u, v, ou, ov)
    return Trajectory(d, ctr, u, v, beam="parallel", ndim=3, meta=_meta(
        "parallel3d", theta, detector_offset=[ou + float(detector_distance), ov]))


# ---------------------------------------------------- half-fan and laminography


def half_fan_offset(detector_width: float, overlap: float) -> float:
    """The detector offset along u (mm) that makes a detector ``detector_width`` mm wide reach
    ``overlap`` mm past its principal point on the short side: ``detector_width / 2 - overlap``.

    Over a full turn such a displaced (half-fan, offset) detector sees a field of view about twice
    as wide as a centred one; ``overlap`` is the band both halves of the turn see (Wang's weights
    blend it), a few percent of the width or more."""
    w, o = float(detector_width), float(overlap)
    if not (math.isfinite(w) and w > 0):
        raise ValueError(f"detector_width must be a positive length in mm, got {detector_width!r}")
    if not (math.isfinite(o) and 0 <= o <= w / 2):
        raise ValueError(f"overlap must be between 0 and half the detector width ({w / 2:g} mm), got {overlap!r}")
    return w / 2 - o


def half_fan_trajectory_3d(n_views=None, sid: float = 500.0, sdd: float = 1000.0, detector_width: float = 400.0,
                           overlap: float = 20.0, start_angle: float = 0.0, device=None, dtype=torch.float32, *,
                           angles=None, detector_offset_v: float = 0.0) -> Trajectory:
    """A full-turn circular cone-beam orbit with the detector displaced sideways (half fan, offset detector:
    lab, dental and C-arm CT's way of doubling the field of view): ``detector_offset`` along u is
    :func:`half_fan_offset` ``(detector_width, overlap)`` (``detector_width`` = U * du of the projector).
    FDK weights it with Wang's displaced-detector weights automatically (docs/RECONSTRUCTION.md)."""
    offset = half_fan_offset(detector_width, overlap)
    t = circular_trajectory_3d(n_views, sid, sdd, start_angle, start_angle + 2 * math.pi, device, dtype,
                               angles=angles, detector_offset=(offset, float(detector_offset_v)))
    return t.replace(meta={**t.meta, "kind": "half_fan", "detector_width": float(detector_width),
                           "overlap": float(overlap)})


def _tilted(frame, theta, tilt):
    """Turn every view's (source or ray, centre, u, v) about its own u axis through the origin by ``tilt``
    (rad): the rotation axis leans towards the beam (laminography; calibration's ``axis_tilt``)."""
    src, ctr, u, v = frame
    c, s = math.cos(tilt), math.sin(tilt)

    def turn(x):  # Rodrigues about the unit vector u (u . x = 0 for the frames the generators build)
        return x * c + torch.linalg.cross(u, x, dim=1) * s + u * (u * x).sum(1, keepdim=True) * (1 - c)

    return turn(src), turn(ctr), u, turn(v)


def _check_tilt(tilt) -> float:
    t = float(tilt)
    if not (math.isfinite(t) and abs(t) < math.pi / 2):
        raise ValueError(f"tilt must be an angle in radians strictly between -pi/2 and pi/2 (0: ordinary CT), "
                         f"got {tilt!r}")
    return t


def laminography_trajectory_3d(n_views=None, sid: float = 500.0, sdd: float = 1000.0, tilt: float = math.pi / 6,
                               start_angle: float = 0.0, end_angle: float | None = None, device=None,
                               dtype=torch.float32, *, angles=None, angle_range: float | None = None,
                               detector_offset: Sequence[float] = (0.0, 0.0)) -> Trajectory:
    """Cone-beam laminography: the rotation axis (z, the object's axis: a flat object lies in the x-y
    plane) tilted towards the beam by ``tilt`` radians (0 is the circular orbit; the missing cone of
    frequencies about z has the half-angle ``tilt``).

    Every view of :func:`circular_trajectory_3d` is turned about its detector u axis through the
    origin: the source circles at height ``sid sin(tilt)`` with radius ``sid cos(tilt)``, the
    detector faces the origin (its normal along the central ray, u horizontal).  Default a full turn.
    """
    tilt = _check_tilt(tilt)
    base = circular_trajectory_3d(n_views, sid, sdd, start_angle, end_angle, device, dtype, angles=angles,
                                  angle_range=angle_range, detector_offset=detector_offset)
    src, ctr, u, v = _tilted(base.tensors(), None, tilt)
    return Trajectory(src, ctr, u, v, beam="cone", ndim=3, meta={**base.meta, "kind": "laminography",
                                                                   "tilt": tilt})


def laminography_trajectory_3d_parallel(n_views=None, tilt: float = math.pi / 6, start_angle: float = 0.0,
                                        end_angle: float | None = None, device=None, dtype=torch.float32, *,
                                        angles=None, angle_range: float | None = None,
                                        detector_offset=(0.0, 0.0)) -> Trajectory:
    """Parallel-beam laminography (synchrotron): :func:`circular_trajectory_3d_parallel`'s views turned
    about their u axis by ``tilt`` radians, over a full turn by default (tilted rays from opposite
    views are different lines, so a half turn does not suffice)."""
    tilt = _check_tilt(tilt)
    if end_angle is None and angle_range is None and angles is None and not isinstance(n_views, torch.Tensor):
        end_angle = start_angle + 2 * math.pi
    base = circular_trajectory_3d_parallel(n_views, 0.0, start_angle, end_angle, device, dtype, angles=angles,
                                           angle_range=angle_range, detector_offset=detector_offset)
    src, ctr, u, v = _tilted(base.tensors(), None, tilt)
    return Trajectory(src, ctr, u, v, beam="parallel", ndim=3, meta={**base.meta, "kind": "laminography_parallel",
                                                                       "tilt": tilt})


# ------------------------------------------------------------------- 2D scans
# 2D trajectories hold the same (n, 3) vectors in the plane z=0 (v = +z);
# Trajectory.to_diffct() gives diffct's three (n, 2) parts.


def circular_trajectory_2d_fan(n_views=None, sid: float = 500.0, sdd: float = 1000.0, start_angle: float = 0.0,
                               end_angle: float | None = None, device=None, dtype=torch.float32, *, angles=None,
                               angle_range: float | None = None, detector_offset: float = 0.0) -> Trajectory:
    """2D fan beam with a flat detector (one row in the plane z=0); default a full turn."""
    _check_distances(sid, sdd)
    theta = _angles(n_views, angles, start_angle, end_angle, angle_range, 2 * math.pi, device, dtype,
                    absolute_default_end=True)
    src, ctr, u, v = _orbit(theta, sid, sdd, 0.0)
    ctr = _shift(ctr, u, v, float(detector_offset), 0.0)
    return Trajectory(src, ctr, u, v, beam="cone", ndim=2, meta=_meta(
        "fan2d", theta, sid=sid, sdd=sdd, detector_offset=[float(detector_offset), 0.0]))


def sinusoidal_trajectory_2d_fan(n_views, sid: float, sdd: float, amplitude: float = 50.0, frequency: float = 2.0,
                                 start_angle: float = 0.0, device=None, dtype=torch.float32) -> Trajectory:
    """2D fan beam over one turn with the source distance ``sid + amplitude * sin(frequency t)``."""
    _check_distances(sid, sdd)
    theta = _path_angles(n_views, start_angle, 2 * math.pi, device, dtype)
    radius = sid + amplitude * torch.sin(frequency * theta)
    src, ctr, u, v = _orbit(theta, radius, sdd, 0.0)
    return Trajectory(src, ctr, u, v, beam="cone", ndim=2, meta=_meta(
        "sinusoidal2d", theta, sid=sid, sdd=sdd, amplitude=float(amplitude), frequency=float(frequency)))


def custom_trajectory_2d_fan(n_views, sid: float, sdd: float, source_path_fn: Callable, start_angle: float = 0.0,
                             device=None, dtype=torch.float32) -> Trajectory:
    """2D fan beam from a source path ``source_path_fn(angles, sid) -> (n_views, 2)`` over one turn;
    each detector faces its source through the origin, ``sdd`` from it, with u the source
    direction turned a quarter anticlockwise (diffct's choice)."""
    if not callable(source_path_fn):
        raise TypeError(f"source_path_fn must be a callable f(angles, sid) -> (n_views, 2), got {source_path_fn!r}")
    _check_distances(sid, sdd)
    theta = _path_angles(n_views, start_angle, 2 * math.pi, device, dtype)
    src2 = source_path_fn(theta, sid)
    _check_path(src2, theta.shape[0], 2, "source_path_fn")
    r = torch.linalg.vector_norm(src2, dim=1, keepdim=True)
    unit = src2 / r
    ctr2 = -unit * (sdd - r)
    u2 = torch.stack([-unit[:, 1], unit[:, 0]], dim=1)
    return Trajectory.from_diffct((src2, ctr2, u2), beam="fan").replace(
        meta=_meta("custom_fan2d", theta, sid=sid, sdd=sdd))


def circular_trajectory_2d_parallel(n_views=None, detector_distance: float = 0.0, start_angle: float = 0.0,
                                    end_angle: float | None = None, device=None, dtype=torch.float32, *,
                                    angles=None, angle_range: float | None = None,
                                    detector_offset: float = 0.0) -> Trajectory:
    """2D parallel beam (one detector row in the plane z=0), default 180 degrees (end ``pi``)."""
    theta = _angles(n_views, angles, start_angle, end_angle, angle_range, math.pi, device, dtype,
                    absolute_default_end=True)
    d, ctr, u, v = _parallel(theta, detector_distance)
    ctr = _shift(ctr, u, v, float(detector_offset), 0.0)
    return Trajectory(d, ctr, u, v, beam="parallel", ndim=2, meta=_meta(
        "parallel2d", theta, detector_offset=[float(detector_offset) + float(detector_distance), 0.0]))


def sinusoidal_trajectory_2d_parallel(n_views, amplitude: float = 50.0, frequency: float = 2.0,
                                      start_angle: float = 0.0, device=None, dtype=torch.float32) -> Trajectory:
    """2D parallel beam over 180 degrees with the detector shifted along u by ``amplitude * sin(frequency t)``."""
    theta = _path_angles(n_views, start_angle, math.pi, device, dtype)
    d, ctr, u, v = _parallel(theta, amplitude * torch.sin(frequency * theta))
    return Trajectory(d, ctr, u, v, beam="parallel", ndim=2, meta=_meta(
        "sinusoidal_parallel2d", theta, amplitude=float(amplitude), frequency=float(frequency)))


def custom_trajectory_2d_parallel(n_views, ray_dir_fn: Callable, det_origin_fn: Callable, start_angle: float = 0.0,
                                  device=None, dtype=torch.float32) -> Trajectory:
    """2D parallel beam over 180 degrees from ``ray_dir_fn(angles)`` and ``det_origin_fn(angles)``
    (each ``(n_views, 2)``); rays are normalised and u is the ray direction turned a quarter anticlockwise."""
    for name, fn in (("ray_dir_fn", ray_dir_fn), ("det_origin_fn", det_origin_fn)):
        if not callable(fn):
            raise TypeError(f"{name} must be a callable f(angles) -> (n_views, 2), got {fn!r}")
    theta = _path_angles(n_views, start_angle, math.pi, device, dtype)
    n = theta.shape[0]
    ray = ray_dir_fn(theta)
    origin = det_origin_fn(theta)
    _check_path(ray, n, 2, "ray_dir_fn")
    if not isinstance(origin, torch.Tensor) or tuple(origin.shape) != (n, 2):
        raise ValueError(f"det_origin_fn must return a tensor of shape ({n}, 2)")
    ray = ray / torch.linalg.vector_norm(ray, dim=1, keepdim=True)
    u2 = torch.stack([-ray[:, 1], ray[:, 0]], dim=1)
    return Trajectory.from_diffct((ray, origin, u2), beam="parallel").replace(
        meta=_meta("custom_parallel2d", theta))


# --------------------------------------------------------------- transforms
def rotation_matrix(rotation: torch.Tensor) -> torch.Tensor:
    """A (3,3) matrix from a rotation vector (axis * angle, Rodrigues) or a (3,3) matrix
    (a (n,3,3) stack of per-view matrices passes through)."""
    r = rotation
    if r.shape[-2:] == (3, 3) and r.ndim in (2, 3):
        return r
    if r.shape != (3,):
        raise ValueError(f"rotation must be a (3,) rotation vector, a (3,3) matrix or (n_views,3,3) matrices, "
                         f"got {tuple(r.shape)}")
    theta = torch.sqrt((r * r).sum() + torch.finfo(r.dtype).tiny)
    k = r / theta
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    K = torch.stack([torch.stack([zero, -k[2], k[1]]),
                     torch.stack([k[2], zero, -k[0]]),
                     torch.stack([-k[1], k[0], zero])])
    eye = torch.eye(3, dtype=r.dtype, device=r.device)
    return eye + torch.sin(theta) * K + (1 - torch.cos(theta)) * (K @ K)


def transform_trajectory(trajectory, rotation=None, translation=None, *, beam: str | None = None):
    """Apply a rigid transform ``x -> R x + t`` to the whole scan (differentiable).

    Positions (source of a cone beam, detector centres) are rotated and
    translated; directions (detector axes, parallel ray directions) only
    rotated.  ``rotation``: a (3,) rotation vector, a (3,3) matrix or
    (n_views,3,3) per-view matrices; ``translation``: (3,) or (n_views,3).
    A diffct tuple (with diffct's ``beam=``; 2D parts take (2,2)/(2,) transforms)
    comes back as a tuple, a :class:`Trajectory` as a Trajectory.
    """
    from .convert import as_trajectory

    was_tuple = not isinstance(trajectory, Trajectory)
    traj = as_trajectory(trajectory, beam=beam if was_tuple else None)
    ref = traj.source
    planar = was_tuple and traj.ndim == 2

    def lift(x, is_rot):
        if x is None:
            return None
        x = torch.as_tensor(x, dtype=ref.dtype, device=ref.device) if not isinstance(x, torch.Tensor) \
            else x.to(ref.dtype)
        if planar:  # diffct 2D: embed (2,2) / (n,2,2) rotations and (2,) / (n,2) shifts in 3D
            if is_rot:
                if x.shape[-2:] != (2, 2):
                    raise ValueError(f"rotation of a 2D trajectory must be (2,2) or (n_views,2,2), got {tuple(x.shape)}")
                top = torch.cat([x, torch.zeros_like(x[..., :1])], dim=-1)
                bottom = torch.zeros_like(top[..., :1, :])
                bottom = bottom + torch.tensor([0.0, 0.0, 1.0], dtype=x.dtype, device=x.device)
                return torch.cat([top, bottom], dim=-2)
            if x.shape[-1:] != (2,):
                raise ValueError(f"translation of a 2D trajectory must be (2,) or (n_views,2), got {tuple(x.shape)}")
            return torch.cat([x, torch.zeros_like(x[..., :1])], dim=-1)
        return x

    R = None
    if rotation is not None:
        R = rotation_matrix(lift(rotation, True))
        if R.ndim == 3 and R.shape[0] != traj.n_views:
            raise ValueError(f"per-view rotations must be ({traj.n_views}, 3, 3), got {tuple(R.shape)}")
    t = lift(translation, False)
    if t is not None and tuple(t.shape) not in ((3,), (traj.n_views, 3)):
        raise ValueError(f"translation must have shape (3,) or (n_views, 3), got {tuple(t.shape)}")

    def rot(x):
        if R is None:
            return x
        return x @ R.T if R.ndim == 2 else torch.einsum("nij,nj->ni", R, x)

    def pos(x):
        x = rot(x)
        return x if t is None else x + t

    src = pos(traj.source) if traj.beam == "cone" else rot(traj.source)
    out = traj.replace(source=src, detector_center=pos(traj.detector_center),
                       detector_u=rot(traj.detector_u), detector_v=rot(traj.detector_v),
                       meta={**traj.meta, "transformed": True})
    return out.to_diffct() if was_tuple else out
