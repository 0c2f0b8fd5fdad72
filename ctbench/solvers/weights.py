"""Geometry of circular and helical orbits for analytic reconstruction, and the weights FBP/FDK need.

Everything here is computed from the trajectory's per-view vectors (never
from its ``meta``), in float64 on the CPU: the rotation angle of every view,
the source-to-axis and source-to-detector distances, the pixel offsets from
the principal point (the foot of the perpendicular from the source on the
detector), and from them

- angular weights: the arc of the orbit that each view stands for (half the
  gap to each neighbour), on the circle for full scans so that duplicated
  end views (0 and 360 degrees) share one weight;
- cosine weights ``Dsd / |pixel - source|`` of cone/fan beams;
- Parker weights for short scans (Parker 1982, with the overscan
  ``delta = (coverage - pi) / 2``), chosen automatically when a cone/fan
  scan covers less than a full turn.

Angles follow the orbit convention of :mod:`ctbench.geometry.generators`
(diffct's, docs/GEOMETRY.md): a source at ``sid * (-sin t, cos t, z)``, a
parallel ray direction ``(cos t, sin t, 0)``.  Nothing else assumes the
convention: the handedness of the detector (whether u turns with the orbit
or against it, which sets the sign of Parker's fan angle) is read from the
vectors, so mirrored geometries (diffct's custom paths, external data) get
the right weights too.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

F64 = torch.float64


@dataclass(frozen=True)
class Orbit:
    """Per-view quantities of a rotation about the z axis (float64, CPU)."""

    angles: torch.Tensor       # (n,) unwrapped rotation angle t of every view (rad)
    direction: int             # +1 if t increases from view to view, -1 if it decreases
    step: float                # typical angular step (rad, > 0)
    coverage: float            # angular range covered: span of the angles + one step (rad)
    radius: torch.Tensor       # (n,) source distance to the z axis (cone), zeros (parallel)
    sdd: torch.Tensor          # (n,) source distance to the detector plane (cone), ones (parallel)
    source_z: torch.Tensor     # (n,) source z (cone), zeros (parallel)
    pixel_u: torch.Tensor      # (n, U) u offset (mm) of each pixel column from the principal point
    pixel_v: torch.Tensor      # (n, V) v offset (mm) of each pixel row from the principal point
    cone: bool
    handedness: int = 1        # +1 if a pixel at +u sees a ray turned anticlockwise (about +z) from the centre ray


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t / t.norm(dim=-1, keepdim=True)


def orbit_of(projector, *, require: str = "circular", who: str = "fdk") -> Orbit:
    """Analyse the projector's trajectory as a rotation about z.

    ``require="circular"``: sources (cone) at constant z and constant distance
    from the axis; ``"helical"``: constant distance, z affine in the angle.
    Parallel beams need ray directions perpendicular to z.  Detector rows
    (u) must be perpendicular to z.  Raises ValueError naming the problem.
    """
    traj = projector.trajectory
    src, ctr, u, v = (t.detach().to(device="cpu", dtype=F64) for t in traj.tensors())
    du, dv = projector.detector_spacing
    U, V = projector.detector_shape
    n = traj.n_views
    cone = projector.beam == "cone"
    uhat = _unit(u)
    if (uhat[:, 2].abs() > 1e-4).any():
        raise ValueError(f"{who} filters detector rows, so the detector u axis must be perpendicular to the rotation "
                         "(z) axis; this trajectory tilts it. Use an iterative solver (sirt, cgls) instead")
    if cone:
        radius = src[:, :2].norm(dim=1)
        if (radius <= 0).any():
            raise ValueError(f"{who}: a source lies on the rotation axis")
        angles = torch.atan2(-src[:, 0], src[:, 1])
        scale = float(radius.max())
        if float(radius.max() - radius.min()) > 1e-3 * scale:
            raise ValueError(f"{who} needs a circular orbit about the z axis: the source distance to the axis varies "
                             f"from {float(radius.min()):.4g} to {float(radius.max()):.4g} mm. Use an iterative "
                             "solver (sirt, cgls, tv_reconstruction) for general trajectories")
    else:
        if (src[:, 2].abs() > 1e-4 * src.norm(dim=1)).any():
            raise ValueError(f"{who} needs parallel rays perpendicular to the z axis (a rotation about z); "
                             "use an iterative solver for tilted parallel geometries")
        radius = torch.zeros(n, dtype=F64)
        scale = 1.0
        angles = torch.atan2(src[:, 1], src[:, 0])
    angles = _unwrap(angles)
    diffs = angles[1:] - angles[:-1]
    if n > 1:
        if not ((diffs > 0).all() or (diffs < 0).all()):
            raise ValueError(f"{who} needs the views in rotation order (angles strictly increasing or strictly "
                             "decreasing, no repeated consecutive angle)")
        direction = 1 if float(diffs[0]) > 0 else -1
        step = float(diffs.abs().median())
    else:
        direction, step = 1, 2 * math.pi
    span = float((angles[-1] - angles[0]).abs())
    coverage = span + step

    z = src[:, 2] if cone else torch.zeros(n, dtype=F64)
    if cone and require == "circular":
        if float(z.max() - z.min()) > 1e-4 * scale:
            raise ValueError(f"{who} needs a circular orbit (sources at one z); the source z varies from "
                             f"{float(z.min()):.4g} to {float(z.max()):.4g} mm. Use helical_fdk for helical "
                             "orbits or an iterative solver (sirt, cgls) for other trajectories")
    if cone and require == "helical" and n > 2:
        # z affine in the angle: residual of the least-squares line
        A = torch.stack([angles, torch.ones_like(angles)], dim=1)
        coef = torch.linalg.lstsq(A, z[:, None]).solution[:, 0]
        if float((A @ coef - z).abs().max()) > 1e-3 * scale:
            raise ValueError(f"{who} needs a helical orbit (source z proportional to the rotation angle); "
                             "use an iterative solver for this trajectory")

    # Detector frame per view: normal towards the detector, principal point, pixel offsets.
    nrm = _unit(torch.linalg.cross(u, v, dim=1))
    if cone:
        depth = ((ctr - src) * nrm).sum(1)
        nrm = nrm * torch.sign(depth)[:, None]
        sdd = depth.abs()
        principal = src + sdd[:, None] * nrm
    else:
        sdd = torch.ones(n, dtype=F64)
        d = _unit(src)
        # the point of the detector plane on the ray through the origin
        t = ((ctr * nrm).sum(1) / (d * nrm).sum(1))
        principal = t[:, None] * d
    vhat = _unit(v)
    off = ctr - principal
    iu = (torch.arange(U, dtype=F64) - (U - 1) / 2) * du
    iv = (torch.arange(V, dtype=F64) - (V - 1) / 2) * dv
    # pixel (i, j) sits at ctr + i*du*u + j*dv*v (u, v need not be unit vectors)
    pu = (off * uhat).sum(1)[:, None] + iu[None, :] * u.norm(dim=1)[:, None]
    pv = (off * vhat).sum(1)[:, None] + iv[None, :] * v.norm(dim=1)[:, None]
    # z . (ray x u) > 0: moving along +u turns the ray anticlockwise seen from +z
    ray = nrm if cone else _unit(src)
    turn = torch.linalg.cross(ray, uhat, dim=1)[:, 2]
    if cone and ((turn > 0).any() and (turn < 0).any()):
        raise ValueError(f"{who}: the detector u axis turns with the orbit in some views and against it in "
                         "others; flip u consistently (or use an iterative solver)")
    handedness = 1 if float(turn.sum()) >= 0 else -1
    return Orbit(angles, direction, step, coverage, radius, sdd, z, pu, pv, cone, handedness)


def _unwrap(a: torch.Tensor) -> torch.Tensor:
    if a.numel() < 2:
        return a.clone()
    d = a[1:] - a[:-1]
    d = d - 2 * math.pi * torch.round(d / (2 * math.pi))
    return torch.cat([a[:1], a[:1] + torch.cumsum(d, 0)])


def circular_arc_weights(angles: torch.Tensor, period: float) -> torch.Tensor:
    """Half the gaps to the neighbours of each angle on a circle of circumference ``period``.

    The weights sum to ``period``; views at the same angle (mod period) share.
    """
    n = angles.numel()
    if n == 1:
        return torch.full((1,), period, dtype=F64)
    a = torch.remainder(angles, period)
    order = torch.argsort(a)
    s = a[order]
    gaps = torch.remainder(torch.roll(s, -1) - s, period)  # gap to the next (last wraps round)
    gaps[gaps > period - 1e-12] = 0.0                      # identical angles
    w_sorted = 0.5 * (gaps + torch.roll(gaps, 1))
    w = torch.empty_like(w_sorted)
    w[order] = w_sorted
    return w


def linear_arc_weights(angles: torch.Tensor) -> torch.Tensor:
    """Half the gaps to the neighbours along an open arc; the end views get one full gap."""
    n = angles.numel()
    if n == 1:
        return torch.ones(1, dtype=F64)
    gaps = (angles[1:] - angles[:-1]).abs()
    w = torch.empty(n, dtype=F64)
    w[1:-1] = 0.5 * (gaps[1:] + gaps[:-1])
    w[0], w[-1] = gaps[0], gaps[-1]
    return w


def parker_weights(orbit: Orbit) -> torch.Tensor:
    """Parker's short-scan weights (n_views, U) for a cone/fan orbit covering less than a full turn.

    With ``beta`` the angle from the start of the covered arc (in the
    rotation sense, views standing for half a step on each side) and
    ``gamma`` the fan angle of a detector column, signed so that the
    conjugate of ray (beta, gamma) is (beta + pi + 2 gamma, -gamma), the
    weights of a ray and its conjugate add up to one wherever
    ``delta = (coverage - pi)/2`` is at least the largest |gamma|.
    """
    # The pixel at u offset p on a view at angle t sees the ray of direction
    # angle t + h atan(p / Dsd) (h the detector's handedness, +1 in ctbench's and
    # diffct's convention); its conjugate comes from t + pi + 2 h atan(p / Dsd).
    # So Parker's gamma is h atan(p / Dsd) for increasing angles, and its
    # opposite when the orbit turns backwards.
    gamma = orbit.direction * orbit.handedness * torch.atan(orbit.pixel_u / orbit.sdd[:, None])
    beta = ((orbit.angles - orbit.angles[0]) * orbit.direction + 0.5 * orbit.step)[:, None]
    delta = 0.5 * (orbit.coverage - math.pi)
    end = math.pi + 2 * delta
    quarter = math.pi / 4
    d1 = delta - gamma
    d2 = delta + gamma
    safe1 = torch.where(d1 > 0, d1, torch.ones_like(d1))
    safe2 = torch.where(d2 > 0, d2, torch.ones_like(d2))
    w_rise = torch.sin(quarter * beta / safe1) ** 2
    w_fall = torch.sin(quarter * (end - beta) / safe2) ** 2
    w = torch.ones_like(gamma.expand(beta.shape[0], -1)).clone()
    rise = (beta < 2 * d1) & (d1 > 0)
    fall = (beta > math.pi - 2 * gamma) & (d2 > 0)
    w = torch.where(rise, w_rise, w)
    w = torch.where(fall, w_fall, w)
    w = torch.where((beta < 0) | (beta > end), torch.zeros_like(w), w)
    return w


def fan_half_angle(orbit: Orbit) -> float:
    """Largest |fan angle| of the detector columns (rad)."""
    return float(torch.atan(orbit.pixel_u.abs() / orbit.sdd[:, None]).max())


def is_full_scan(orbit: Orbit) -> bool:
    period = 2 * math.pi if orbit.cone else math.pi
    return orbit.coverage >= period - 0.5 * orbit.step


def cosine_weights(orbit: Orbit, views: tuple[int, int] | None = None) -> torch.Tensor:
    """Cone/fan pre-weights ``Dsd / |pixel - source|``, (n_views, U, V); with ``views=(k0, k1)`` those
    of views [k0, k1) only, (k1-k0, U, V) (a batch of views costs its own share, not the whole scan's)."""
    k0, k1 = (0, orbit.sdd.shape[0]) if views is None else views
    pu2 = orbit.pixel_u[k0:k1, :, None] ** 2
    pv2 = orbit.pixel_v[k0:k1, None, :] ** 2
    sdd = orbit.sdd[k0:k1, None, None]
    return sdd / torch.sqrt(sdd * sdd + pu2 + pv2)


def redundancy_weights(orbit: Orbit, short_scan: str | bool = "auto", who: str = "fdk"):
    """Per-view angular weights (n,) and optional per-column redundancy weights (n, U).

    Cone/fan: a full turn gives arc weights / 2 (each ray measured twice);
    less than a full turn gives Parker weights times the open-arc weights
    (``short_scan="auto"``), or plain open-arc weights with ``short_scan=False``.
    Parallel: arc weights on the half circle (angles mod pi) once the scan
    covers 180 degrees, plain open-arc weights for a limited angle (with a warning).
    """
    if short_scan not in ("auto", True, False):
        raise ValueError(f"short_scan must be 'auto', True or False, got {short_scan!r}")
    if orbit.cone:
        full = is_full_scan(orbit)
        if full and short_scan is not True:
            return circular_arc_weights(orbit.angles, 2 * math.pi) / 2, None
        if short_scan is False:
            return linear_arc_weights(orbit.angles), None
        need = math.pi + 2 * fan_half_angle(orbit)
        if orbit.coverage < need - 0.5 * orbit.step:
            warnings.warn(f"{who}: the scan covers {math.degrees(orbit.coverage):.1f} degrees, less than the "
                          f"{math.degrees(need):.1f} degrees (180 + fan angle) a short scan needs; Parker weights "
                          "cannot complete the data and the reconstruction will show limited-angle artefacts",
                          RuntimeWarning, stacklevel=3)
        return linear_arc_weights(orbit.angles), parker_weights(orbit)
    if orbit.coverage >= math.pi - 0.5 * orbit.step:
        return circular_arc_weights(orbit.angles, math.pi), None
    warnings.warn(f"{who}: the parallel scan covers {math.degrees(orbit.coverage):.1f} degrees, less than 180; "
                  "expect limited-angle artefacts", RuntimeWarning, stacklevel=3)
    return linear_arc_weights(orbit.angles), None
