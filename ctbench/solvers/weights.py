"""Geometry of an orbit about z for analytic reconstruction, and the weights FBP/FDK need.

Everything here is computed from the trajectory's per-view vectors (never
from its ``meta``), in float64 on the CPU.  Every view keeps its own
geometry, as RTK's FDK does: the source's rotation angle and its distance to
the axis, the source-to-detector distance along the detector's own normal,
the pixel offsets from the view's principal point (the foot of the
perpendicular from the source on the detector), the in-plane fan angle of
every detector column, the detector's roll and the rate at which the source
distance changes.  From them:

- angular weights: the arc of the orbit that each view stands for (half the
  gap to each neighbour), on the circle for full scans so that duplicated
  end views (0 and 360 degrees) share one weight;
- cosine weights: the cosine of the angle between a pixel's ray and the
  view's principal ray (``Dsd / |pixel - source|`` on a flat detector), with
  the factor a varying source distance adds (:func:`cosine_weights`);
- redundancy weights per detector column: Parker's for short scans (Parker
  1982, with the overscan ``delta = (coverage - pi) / 2``), Wang's for a
  detector displaced sideways over a full turn (half-fan scans, Wang 2002),
  and the normalised product of both for a short scan with a displaced
  detector; chosen from the geometry (:func:`redundancy_weights`,
  :func:`weighting_of` says which and why).

Angles follow the orbit convention of :mod:`ctbench.geometry.generators`
(diffct's, docs/GEOMETRY.md): a source at ``R * (-sin t, cos t, z)``, a
parallel ray direction ``(cos t, sin t, 0)``.  Nothing else assumes the
convention: fan angles are measured from the vectors (anticlockwise about
+z, from the direction the source looks at the axis), so mirrored detector
frames (diffct's custom paths, external data) get the right weights too.

What FDK cannot represent is refused with the reason (:func:`orbit_of`):
source heights that vary (a helix: ``helical_fdk``; other paths: an
iterative solver), a detector rolled so far that its rows are no longer
near the rotation plane, a detector facing along the axis, views out of
rotation order.  Small per-view motion, rolls, tilts and varying distances
(a calibrated trajectory), a tilted orbit (laminography) and cylindrical
detectors centred on the source are accepted.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import torch

F64 = torch.float64

# Source heights may vary by this fraction of the detector's height seen at the axis (a calibrated vertical
# drift of the object, a robot's wobble: every view is still a view of one circular orbit, of a shifted
# object); more is another trajectory (a saddle: an iterative solver).  Heights that rise steadily with the
# angle (a helix) by more than HELIX_SPREAD_LIMIT of that height go to helical_fdk (a slow linear drift less).
Z_SPREAD_LIMIT = 0.5
HELIX_SPREAD_LIMIT = 0.1
# Rows are filtered as they are: a detector rolled by r filters along lines r off the rotation plane (error
# first order in r times the data's v-gradient; docs/RECONSTRUCTION.md).  Beyond this, resample the images
# onto an unrolled detector first or use an iterative solver.
ROLL_LIMIT_DEG = 10.0
# Parallel rays may leave the plane perpendicular to the axis (parallel laminography) by a constant angle;
# their elevation may vary across views by at most this much.
ELEVATION_SPREAD_LIMIT_DEG = 1.0
# A detector whose fan covers one side more than the other by this fraction of its span is "displaced":
# it gets Wang's weights (RTK's rule for its displaced-detector filter: 10 % of the span, 5 % of the width).
DISPLACED_ASYMMETRY = 0.1

ITERATIVE = "use an iterative solver (sirt, cgls, tv_reconstruction), which takes any trajectory"


@dataclass(frozen=True)
class Orbit:
    """Per-view quantities of a rotation about the z axis (float64, CPU)."""

    angles: torch.Tensor       # (n,) unwrapped rotation angle t of every view (rad)
    direction: int             # +1 if t increases from view to view, -1 if it decreases
    step: float                # typical angular step (rad, > 0)
    coverage: float            # angular range covered: span of the angles + one step (rad)
    radius: torch.Tensor       # (n,) source distance to the z axis (cone), zeros (parallel)
    sdd: torch.Tensor          # (n,) source distance to the detector plane along its normal (cone), ones (parallel)
    source_z: torch.Tensor     # (n,) source z (cone), zeros (parallel)
    pixel_u: torch.Tensor      # (n, U) u offset (mm) of each pixel column from the principal point (arc length
                               # on a cylindrical detector)
    pixel_v: torch.Tensor      # (n, V) v offset (mm) of each pixel row from the principal point
    cone: bool
    handedness: int = 1        # +1 if a pixel at +u sees a ray turned anticlockwise (about +z) from the centre ray
    fan: torch.Tensor | None = None          # (n, U) in-plane fan angle of each column's ray (rad, anticlockwise
                                             # about +z from the source-to-axis direction); None: from pixel_u
    uv_cos: torch.Tensor | None = None       # (n,) cosine of the angle between the detector's u and v axes
    radius_rate: torch.Tensor | None = None  # (n,) dR/dt of the source distance (mm/rad), cone
    elevation: torch.Tensor | None = None    # (n,) parallel rays: angle out of the plane perpendicular to z (rad)
    roll: torch.Tensor | None = None         # (n,) detector roll: angle of u out of the rotation plane (rad)
    detector: str = "flat"                   # "flat" or "cylinder" (centred on the source, radius sdd)

    def fan_angles(self) -> torch.Tensor:
        """(n, U) anticlockwise in-plane fan angle of every column's ray."""
        if self.fan is not None:
            return self.fan
        if self.detector == "cylinder":
            return self.handedness * self.pixel_u / self.sdd[:, None]
        return self.handedness * torch.atan(self.pixel_u / self.sdd[:, None])

    def lateral(self) -> torch.Tensor:
        """(n, U) where each column's ray passes the axis: its fan angle (cone/fan, rad) or its offset along u
        from the ray through the axis (parallel, mm).  The conjugate of a ray at ``x`` lies at ``-x``."""
        return self.fan_angles() if self.cone else self.pixel_u

    def views(self, a: int, b: int) -> "Orbit":
        """The per-pixel quantities of views [a, b) (angles and arc quantities stay the whole orbit's)."""
        cut = {name: getattr(self, name)[a:b] for name in ("sdd", "pixel_u", "pixel_v", "fan", "uv_cos",
                                                           "radius_rate", "radius")
               if getattr(self, name) is not None}
        return replace(self, **cut)

    @property
    def tilt(self) -> float:
        """Angle (rad) of the sources above (+) or below the plane through the origin perpendicular to z:
        the tilt of a laminography orbit, 0 for an ordinary circular scan."""
        if not self.cone:
            return 0.0 if self.elevation is None else float(self.elevation.mean())
        return math.atan2(float(self.source_z.mean()), float(self.radius.mean()))


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t / t.norm(dim=-1, keepdim=True)


def detector_kind(projector) -> str:
    """``"flat"`` or ``"cylinder"`` (a :class:`~ctbench.solvers.cylindrical.CylindricalProjector`)."""
    return str(getattr(projector, "curved_detector", None) or "flat")


def orbit_of(projector, *, require: str = "circular", who: str = "fdk") -> Orbit:
    """Analyse the projector's trajectory as a rotation about z, view by view.

    ``require="circular"``: one turn (or part of one) about z, every view
    with its own source distance, detector distance, offsets, roll and tilt;
    the source heights may vary by at most ``Z_SPREAD_LIMIT`` of the source
    distance (a constant height off the volume's centre is a laminography
    orbit).  ``"helical"``: source z affine in the angle.  Parallel beams:
    ray directions at one elevation (0: perpendicular to z).  The detector
    rows (u) must lie within ``ROLL_LIMIT_DEG`` of the rotation plane.
    Raises ValueError naming the problem and what to use instead.
    """
    traj = projector.trajectory
    src, ctr, u, v = (t.detach().to(device="cpu", dtype=F64) for t in traj.tensors())
    du, dv = projector.detector_spacing
    U, V = projector.detector_shape
    n = traj.n_views
    cone = projector.beam == "cone"
    kind = detector_kind(projector)
    if kind == "cylinder" and getattr(projector, "radius", None) is None:
        from .cylindrical import source_centred_frames
        u, v = source_centred_frames(src, ctr, u, v)
    uhat, vhat = _unit(u), _unit(v)
    nrm = _unit(torch.linalg.cross(u, v, dim=1))
    if bool((nrm[:, 2].abs() > 1 - 1e-6).any()):
        raise ValueError(f"{who}: a detector faces along the rotation (z) axis; FDK cannot use such views. "
                         f"{ITERATIVE[0].upper()}{ITERATIVE[1:]}")
    # Roll: the angle of u out of the rotation plane, measured in the detector plane.
    level = _unit(torch.linalg.cross(torch.tensor([0.0, 0.0, 1.0], dtype=F64).expand(n, 3), nrm, dim=1))
    upright = torch.linalg.cross(nrm, level, dim=1)
    roll = torch.atan2((uhat * upright).sum(1), (uhat * level).sum(1))
    roll = roll - math.pi * torch.round(roll / math.pi)  # u and -u filter the same rows
    worst = float(roll.abs().max()) if n else 0.0
    if math.degrees(worst) > ROLL_LIMIT_DEG:
        raise ValueError(f"{who} filters detector rows, so the detector u axis must lie near the rotation plane "
                         f"(perpendicular to the z axis); this trajectory rolls it by up to "
                         f"{math.degrees(worst):.3g} degrees (at most {ROLL_LIMIT_DEG:g} are accepted). Resample the "
                         f"images onto an unrolled detector (ctbench.io.orientation.unroll_images) or {ITERATIVE}")
    elevation = None
    if cone:
        radius = src[:, :2].norm(dim=1)
        if (radius <= 0).any():
            raise ValueError(f"{who}: a source lies on the rotation axis")
        angles = torch.atan2(-src[:, 0], src[:, 1])
        scale = float(radius.max())
    else:
        d = _unit(src)
        elevation = torch.asin(d[:, 2].clamp(-1.0, 1.0))
        spread = float(elevation.max() - elevation.min()) if n else 0.0
        if math.degrees(spread) > ELEVATION_SPREAD_LIMIT_DEG or float(elevation.abs().max()) > math.radians(80):
            raise ValueError(f"{who} needs parallel rays at one angle to the plane perpendicular to the z axis (a "
                             "rotation about z; a constant tilt is parallel laminography); the ray elevation varies "
                             f"from {math.degrees(float(elevation.min())):.4g} to "
                             f"{math.degrees(float(elevation.max())):.4g} degrees. {ITERATIVE[0].upper()}{ITERATIVE[1:]}")
        radius = torch.zeros(n, dtype=F64)
        scale = 1.0
        angles = torch.atan2(d[:, 1], d[:, 0])
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
        z_spread = float(z.max() - z.min())
        # the detector's height seen at the axis (the smallest over the views)
        height = (V - 1) * dv * float((radius / ((ctr - src) * nrm).sum(1).abs().clamp_min(1e-30)).min())
        helix = z_spread > HELIX_SPREAD_LIMIT * height and _is_helix(angles, z, scale)
        if helix or z_spread > Z_SPREAD_LIMIT * height:
            how = ("use helical_fdk for this helical orbit" if helix else ITERATIVE)
            raise ValueError(f"{who} needs a circular orbit (sources at one z, up to a drift of "
                             f"{100 * Z_SPREAD_LIMIT:g}% of the {height:.4g} mm the detector spans at the axis, "
                             f"{100 * HELIX_SPREAD_LIMIT:g}% for a steady rise); the source z varies from "
                             f"{float(z.min()):.4g} to {float(z.max()):.4g} mm: {how}")
    if cone and require == "helical" and n > 2 and not _is_helix(angles, z, scale):
        raise ValueError(f"{who} needs a helical orbit (source z proportional to the rotation angle); for this "
                         f"trajectory {ITERATIVE}")

    # Detector frame per view: normal towards the detector, principal point, pixel offsets.
    if cone:
        depth = ((ctr - src) * nrm).sum(1)
        if bool((depth == 0).any()):
            raise ValueError(f"{who}: a source lies in its detector's plane")
        nrm = nrm * torch.sign(depth)[:, None]
        sdd = depth.abs()
        principal = src + sdd[:, None] * nrm
    else:
        sdd = torch.ones(n, dtype=F64)
        d = _unit(src)
        dn = (d * nrm).sum(1)
        if bool((dn == 0).any()):
            raise ValueError(f"{who}: parallel rays run along a detector's plane")
        # the point of the detector plane on the ray through the origin
        t = ((ctr * nrm).sum(1) / dn)
        principal = t[:, None] * d
    off = ctr - principal
    iu = (torch.arange(U, dtype=F64) - (U - 1) / 2) * du
    iv = (torch.arange(V, dtype=F64) - (V - 1) / 2) * dv
    uv_cos = (uhat * vhat).sum(1)
    # pixel (i, j) sits at ctr + i*du*u + j*dv*v (u, v need not be unit vectors); offsets along u-hat and
    # v-hat (for oblique axes the in-plane distance adds 2 pu pv cos(u, v): cosine_weights)
    ou, ov = _oblique_coordinates(off, uhat, vhat, uv_cos)
    pu = ou[:, None] + iu[None, :] * u.norm(dim=1)[:, None]
    pv = ov[:, None] + iv[None, :] * v.norm(dim=1)[:, None]
    if cone and kind == "cylinder" and not getattr(projector, "centred_on_source", True):
        raise ValueError(f"{who} reconstructs cylindrical detectors centred on the source (radius=None: the "
                         "cylinder's axis through the source); this one has a fixed radius that differs from the "
                         f"source-detector distance. {ITERATIVE[0].upper()}{ITERATIVE[1:]}")
    # z . (ray x u) > 0: moving along +u turns the ray anticlockwise seen from +z
    ray = nrm if cone else _unit(src)
    turn = torch.linalg.cross(ray, uhat, dim=1)[:, 2]
    if cone and ((turn > 1e-9).any() and (turn < -1e-9).any()):
        raise ValueError(f"{who}: the detector u axis turns with the orbit in some views and against it in "
                         "others; flip u consistently (or use an iterative solver)")
    handedness = 1 if float(turn.sum()) >= 0 else -1
    fan = _fan_angles(src, principal, nrm, uhat, pu, sdd, kind) if cone else None
    rate = _radius_rate(angles, radius, coverage) if cone else None
    return Orbit(angles, direction, step, coverage, radius, sdd, z, pu, pv, cone, handedness, fan, uv_cos, rate,
                 elevation, roll, kind if cone else "flat")


def _oblique_coordinates(off, uhat, vhat, c):
    """Coordinates (a, b) of in-plane vectors ``off = a uhat + b vhat`` (oblique axes with cosine ``c``)."""
    pu, pv = (off * uhat).sum(1), (off * vhat).sum(1)
    det = 1 - c * c
    return (pu - c * pv) / det, (pv - c * pu) / det


def _is_helix(angles, z, scale) -> bool:
    if angles.numel() < 3:
        return False
    A = torch.stack([angles, torch.ones_like(angles)], dim=1)
    coef = torch.linalg.lstsq(A, z[:, None]).solution[:, 0]
    return float((A @ coef - z).abs().max()) <= 1e-3 * scale


def _fan_angles(src, principal, nrm, uhat, pu, sdd, kind) -> torch.Tensor:
    """(n, U) anticlockwise in-plane angle between each column's ray (through the principal row) and the
    direction from the source to the axis."""
    if kind == "cylinder":
        g = pu / sdd[:, None]
        ray = sdd[:, None, None] * (torch.cos(g)[..., None] * nrm[:, None, :] + torch.sin(g)[..., None] * uhat[:, None, :])
    else:
        ray = (principal - src)[:, None, :] + pu[..., None] * uhat[:, None, :]
    ref = -src[:, None, :2]
    cross = ref[..., 0] * ray[..., 1] - ref[..., 1] * ray[..., 0]
    dot = ref[..., 0] * ray[..., 0] + ref[..., 1] * ray[..., 1]
    return torch.atan2(cross, dot)


def _radius_rate(angles: torch.Tensor, radius: torch.Tensor, coverage: float) -> torch.Tensor:
    """dR/dt by central differences over the views (wrapping round on a full turn); zeros where R is constant
    (to 1e-5 of itself: float32 vectors round the distance of a circular orbit by about 1e-7)."""
    n = angles.numel()
    if n < 3 or float(radius.max() - radius.min()) <= 1e-5 * float(radius.max()):
        return torch.zeros(n, dtype=F64)
    full = coverage >= 2 * math.pi - 1e-9
    if full:
        a_next = torch.roll(angles, -1)
        a_prev = torch.roll(angles, 1)
        sign = 1.0 if float(angles[-1] - angles[0]) > 0 else -1.0
        a_next[-1] += sign * 2 * math.pi
        a_prev[0] -= sign * 2 * math.pi
        return (torch.roll(radius, -1) - torch.roll(radius, 1)) / (a_next - a_prev)
    rate = torch.empty(n, dtype=F64)
    rate[1:-1] = (radius[2:] - radius[:-2]) / (angles[2:] - angles[:-2])
    rate[0] = (radius[1] - radius[0]) / (angles[1] - angles[0])
    rate[-1] = (radius[-1] - radius[-2]) / (angles[-1] - angles[-2])
    return rate


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


def _parker(beta: torch.Tensor, gamma: torch.Tensor, delta: float) -> torch.Tensor:
    """Parker's weight at arc position ``beta`` (from the start of the covered arc) and fan angle ``gamma``
    (signed so that the conjugate of (beta, gamma) is (beta + pi + 2 gamma, -gamma)); any broadcast shapes."""
    end = math.pi + 2 * delta
    quarter = math.pi / 4
    d1 = delta - gamma
    d2 = delta + gamma
    safe1 = torch.where(d1 > 0, d1, torch.ones_like(d1))
    safe2 = torch.where(d2 > 0, d2, torch.ones_like(d2))
    w_rise = torch.sin(quarter * beta / safe1) ** 2
    w_fall = torch.sin(quarter * (end - beta) / safe2) ** 2
    beta, gamma = torch.broadcast_tensors(beta, gamma)
    w = torch.ones_like(gamma)
    rise = (beta < 2 * d1) & (d1 > 0)
    fall = (beta > math.pi - 2 * gamma) & (d2 > 0)
    w = torch.where(rise, w_rise, w)
    w = torch.where(fall, w_fall, w)
    return torch.where((beta < 0) | (beta > end), torch.zeros_like(w), w)


def _parker_coordinates(orbit: Orbit):
    """(beta (n, 1), gamma (n, U), delta): Parker's arc position, signed fan angle and overscan."""
    # A ray at anticlockwise fan angle g from a view at angle t has its conjugate at t + pi + 2 g (about +z); for
    # an orbit turning backwards Parker's gamma is -g.
    gamma = orbit.direction * orbit.fan_angles()
    beta = ((orbit.angles - orbit.angles[0]) * orbit.direction + 0.5 * orbit.step)[:, None]
    return beta, gamma, 0.5 * (orbit.coverage - math.pi)


def parker_weights(orbit: Orbit) -> torch.Tensor:
    """Parker's short-scan weights (n_views, U) for a cone/fan orbit covering less than a full turn.

    With ``beta`` the angle from the start of the covered arc (in the
    rotation sense, views standing for half a step on each side) and
    ``gamma`` the fan angle of a detector column, signed so that the
    conjugate of ray (beta, gamma) is (beta + pi + 2 gamma, -gamma), the
    weights of a ray and its conjugate add up to one wherever
    ``delta = (coverage - pi)/2`` is at least the largest |gamma|.
    """
    beta, gamma, delta = _parker_coordinates(orbit)
    return _parker(beta, gamma, delta)


def fan_half_angle(orbit: Orbit) -> float:
    """Largest |fan angle| of the detector columns (rad)."""
    return float(orbit.fan_angles().abs().max())


def is_full_scan(orbit: Orbit) -> bool:
    """Whether the views go round the whole circle (half circle for parallel rays perpendicular to z),
    allowing a gap of up to 2.5 steps where the ends meet (per-view jitter of the angles, a missing view)."""
    period = 2 * math.pi if orbit.cone else math.pi
    if not orbit.cone and orbit.elevation is not None and abs(orbit.tilt) > 1e-6:
        period = 2 * math.pi  # tilted parallel rays: opposite views are other lines
    return orbit.coverage >= period - 1.5 * orbit.step


# ------------------------------------------------------------------ displaced (half-fan) detectors
@dataclass(frozen=True)
class Displacement:
    """How far a cone/fan detector's columns reach on each side of the source-to-axis ray."""

    low: float         # the most negative anticlockwise fan angle covered in every view (rad)
    high: float        # the most positive one (rad)
    overlap: float     # the half-width of the band both sides see (rad): min(-low, high), 0 if one side is absent
    side: int          # +1 if the detector reaches further anticlockwise, -1 if clockwise, 0 if exactly centred
    asymmetry: float   # (high + low) / (high - low)

    @property
    def displaced(self) -> bool:
        return abs(self.asymmetry) > DISPLACED_ASYMMETRY


def displacement_of(orbit: Orbit) -> Displacement:
    """The detector's reach on each side (fan angles for cone/fan beams, mm along u for parallel beams)."""
    g = orbit.lateral()
    # the first and last column of every view (the detector's edges; a fan angle is monotone along u)
    edges = torch.stack([g[:, 0], g[:, -1]], dim=1)
    low = float(edges.min(1).values.max())
    high = float(edges.max(1).values.min())
    span = high - low
    asym = (high + low) / span if span > 0 else 0.0
    side = 0 if asym == 0 else (1 if asym > 0 else -1)
    return Displacement(low, high, max(0.0, min(-low, high)), side, asym)


def detector_padding(orbit: Orbit, displaced: str | bool = "auto") -> tuple[int, int]:
    """Columns of zeros to add before column 0 and after the last column so that a displaced detector reaches as
    far on its short side as on its long one (0, 0 for other detectors; ``displaced`` as for
    :func:`weighting_of`).  The ramp filter's output runs past the data it filters: a half-fan view's filtered row
    has values beyond its short edge, and the voxels whose rays cross there (those only the other half of the
    turn measures directly) need them (RTK pads the same way)."""
    _check_choice("displaced", displaced)
    disp = displacement_of(orbit)
    if not (disp.displaced if displaced == "auto" else bool(displaced)) or disp.side == 0 or orbit.pixel_u.shape[1] < 2:
        return 0, 0
    # flat detectors and parallel beams: offsets from the principal point; a cylinder: fan angles (equiangular)
    pu = orbit.fan_angles() if orbit.detector == "cylinder" else orbit.pixel_u
    pitch = float((pu[:, 1] - pu[:, 0]).abs().median())
    first, last = pu[:, 0].abs(), pu[:, -1].abs()
    missing = int(math.ceil(float((last - first).abs().max()) / pitch - 1e-9))
    return (missing, 0) if float(first.mean()) < float(last.mean()) else (0, missing)


def _wang_taper(gamma: torch.Tensor, disp: Displacement) -> torch.Tensor:
    """Wang's weight of a displaced detector at anticlockwise fan angle ``gamma``: 0 beyond the short edge,
    1 beyond the overlap on the long side, sin^2 across the overlap (a ray and its conjugate sum to 1)."""
    o = disp.overlap
    x = disp.side * gamma  # positive towards the long side
    if o <= 0:
        return (x > 0).to(gamma.dtype)
    w = torch.sin(math.pi / 4 * (x + o) / o) ** 2
    w = torch.where(x >= o, torch.ones_like(w), w)
    return torch.where(x <= -o, torch.zeros_like(w), w)


def displaced_weights(orbit: Orbit) -> torch.Tensor:
    """(n, U) Wang's redundancy weights of a displaced detector over a full turn (module docstring): of fan
    angles for cone/fan beams, of the offset along u for parallel beams (the conjugate of a parallel ray at
    ``t`` is the opposite view's ray at ``-t``)."""
    return _wang_taper(orbit.lateral(), displacement_of(orbit))


def displaced_short_scan_weights(orbit: Orbit) -> torch.Tensor:
    """(n, U) redundancy weights of a short scan with a displaced detector: Parker's weight of the
    detector made symmetric (its long side mirrored) times Wang's taper, normalised over each ray and its
    conjugate so that every line's measurements sum to 1 (a line measured once weighs 1)."""
    beta, gamma, delta = _parker_coordinates(orbit)
    disp = displacement_of(orbit)
    g_ccw = orbit.fan_angles()
    m = _parker(beta, gamma, delta) * _wang_taper(g_ccw, disp)
    end = math.pi + 2 * delta
    m_c = torch.zeros_like(m)
    for beta_c in (beta + math.pi + 2 * gamma, beta - math.pi + 2 * gamma):  # the conjugate, either way round
        inside = (beta_c >= 0) & (beta_c <= end)
        m_c = m_c + torch.where(inside, _parker(beta_c, -gamma, delta) * _wang_taper(-g_ccw, disp), torch.zeros_like(m))
    total = m + m_c
    alone = (m_c == 0) & (beta >= 0) & (beta <= end) & (_wang_taper(g_ccw, disp) > 0)
    w = torch.where(total > 1e-12, m / total.clamp_min(1e-12), torch.zeros_like(m))
    return torch.where(alone, torch.ones_like(w), w)


def cosine_weights(orbit: Orbit, views: tuple[int, int] | None = None) -> torch.Tensor:
    """Cone/fan pre-weights, (n_views, U, V); with ``views=(k0, k1)`` those of views [k0, k1) only,
    (k1-k0, U, V) (a batch of views costs its own share, not the whole scan's).

    The cosine of the angle between a pixel's ray and the view's principal ray: ``Dsd / |pixel - source|``
    on a flat detector (oblique axes included), ``cos(u/R) R / sqrt(R^2 + v^2)`` on a cylinder of radius
    ``R = Dsd``; times ``|1 - (R'/R) tan(gamma)|`` where the source distance ``R`` changes with the angle
    (``R' = dR/dt``, ``gamma`` the column's fan angle): the Jacobian of a non-circular planar orbit."""
    k0, k1 = (0, orbit.sdd.shape[0]) if views is None else views
    pu = orbit.pixel_u[k0:k1, :, None]
    pv = orbit.pixel_v[k0:k1, None, :]
    sdd = orbit.sdd[k0:k1, None, None]
    if orbit.detector == "cylinder":
        w = torch.cos(pu / sdd) * sdd / torch.sqrt(sdd * sdd + pv * pv)
    else:
        cross = 0.0 if orbit.uv_cos is None else 2 * orbit.uv_cos[k0:k1, None, None] * pu * pv
        w = sdd / torch.sqrt(sdd * sdd + pu * pu + pv * pv + cross)
    if orbit.radius_rate is not None and bool((orbit.radius_rate[k0:k1] != 0).any()):
        rel = (orbit.radius_rate[k0:k1] / orbit.radius[k0:k1])[:, None, None]
        w = w * (1 - rel * torch.tan(orbit.fan_angles()[k0:k1, :, None])).abs()
    return w


# ------------------------------------------------------------------ the choice of weights
@dataclass(frozen=True)
class Weighting:
    """The weights an analytic reconstruction of this orbit uses, and why (:func:`weighting_of`)."""

    arc: torch.Tensor                 # (n,) angular weight of every view (rad)
    per_column: torch.Tensor | None   # (n, U) redundancy weight of every column, or None (all 1)
    kind: str                         # "full", "parker", "displaced", "displaced+parker", "open-arc", "parallel",
                                      # "parallel-limited"
    description: str                  # words for reports and layer metadata
    details: dict                     # numbers behind the choice (JSON-able)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "description": self.description, **self.details}


def _check_choice(name: str, value) -> None:
    if value not in ("auto", True, False):
        raise ValueError(f"{name} must be 'auto', True or False, got {value!r}")


def weighting_of(orbit: Orbit, short_scan: str | bool = "auto", who: str = "fdk", *,
                 displaced: str | bool = "auto") -> Weighting:
    """Choose the angular and redundancy weights from the geometry (module docstring).

    Cone/fan: a full turn with a centred detector gives arc weights / 2 (each
    ray measured twice); a full turn with a displaced detector (its fan
    reaching one side more than the other by more than ``DISPLACED_ASYMMETRY``
    of its span) gives Wang's weights; less than a full turn gives Parker
    weights (``short_scan="auto"``), combined with Wang's taper for a
    displaced detector; ``short_scan=False`` uses plain open-arc weights,
    ``True`` forces Parker weights.  ``displaced`` forces (True) or turns off
    (False) the displaced-detector weights.  Parallel: arc weights on the half
    circle once the scan covers 180 degrees (360 for tilted rays), plain
    open-arc weights for a limited angle (with a warning).
    """
    _check_choice("short_scan", short_scan)
    _check_choice("displaced", displaced)
    deg = math.degrees
    if orbit.cone:
        full = is_full_scan(orbit)
        disp = displacement_of(orbit)
        is_displaced = disp.displaced if displaced == "auto" else bool(displaced)
        if is_displaced and disp.side == 0:
            raise ValueError(f"{who}: displaced=True needs a detector that reaches further on one side of the "
                             "source-to-axis ray than on the other; this one is centred")
        details = {"coverage_deg": round(deg(orbit.coverage), 4),
                   "fan_deg": [round(deg(disp.low), 4), round(deg(disp.high), 4)],
                   "detector_asymmetry": round(disp.asymmetry, 4)}
        tilt = orbit.tilt
        if abs(tilt) > 1e-6:
            details["tilt_deg"] = round(deg(tilt), 4)
            if not full:
                warnings.warn(f"{who}: a tilted (laminography) orbit needs a full turn; this one covers "
                              f"{deg(orbit.coverage):.1f} degrees", RuntimeWarning, stacklevel=4)
        radius_fov = float(orbit.radius.min()) * math.sin(max(-disp.low, disp.high) if is_displaced
                                                           else min(-disp.low, disp.high))
        details["fov_radius_mm"] = round(radius_fov, 4)
        if full and short_scan is not True:
            if is_displaced:
                details["overlap_deg"] = round(deg(disp.overlap), 4)
                return Weighting(circular_arc_weights(orbit.angles, 2 * math.pi), displaced_weights(orbit),
                                 "displaced", f"displaced detector over a full turn (half-fan): Wang's weights over "
                                 f"the {2 * deg(disp.overlap):.2f} degree overlap", details)
            return Weighting(circular_arc_weights(orbit.angles, 2 * math.pi) / 2, None, "full",
                             "full turn: every ray measured twice, arc weights halved", details)
        if short_scan is False:
            return Weighting(linear_arc_weights(orbit.angles), None, "open-arc", "open arc weights (short_scan=False)",
                             details)
        need = math.pi + 2 * fan_half_angle(orbit)
        if orbit.coverage < need - 0.5 * orbit.step:
            warnings.warn(f"{who}: the scan covers {deg(orbit.coverage):.1f} degrees, less than the "
                          f"{deg(need):.1f} degrees (180 + fan angle) a short scan needs; Parker weights "
                          "cannot complete the data and the reconstruction will show limited-angle artefacts",
                          RuntimeWarning, stacklevel=4)
        if is_displaced:
            warnings.warn(f"{who}: a short scan with a displaced detector measures the rays beyond the "
                          f"{2 * deg(disp.overlap):.2f} degree overlap only in part; outside a radius of "
                          f"{float(orbit.radius.min()) * math.sin(disp.overlap):.4g} mm expect limited-angle "
                          "artefacts (scan a full turn for a half-fan detector)", RuntimeWarning, stacklevel=4)
            details["overlap_deg"] = round(deg(disp.overlap), 4)
            return Weighting(linear_arc_weights(orbit.angles), displaced_short_scan_weights(orbit),
                             "displaced+parker", "short scan with a displaced detector: Parker's weights times "
                             "Wang's taper, normalised over conjugate rays", details)
        return Weighting(linear_arc_weights(orbit.angles), parker_weights(orbit), "parker",
                         f"short scan of {deg(orbit.coverage):.1f} degrees: Parker weights", details)
    details = {"coverage_deg": round(deg(orbit.coverage), 4)}
    tilted = orbit.elevation is not None and abs(orbit.tilt) > 1e-6
    period = 2 * math.pi if tilted else math.pi
    if tilted:
        details["tilt_deg"] = round(deg(orbit.tilt), 4)
    disp = displacement_of(orbit)
    is_displaced = disp.displaced if displaced == "auto" else bool(displaced)
    if is_displaced and disp.side == 0:
        raise ValueError(f"{who}: displaced=True needs a detector that reaches further on one side of the "
                         "axis than on the other; this one is centred")
    details["detector_reach_mm"] = [round(disp.low, 4), round(disp.high, 4)]
    details["detector_asymmetry"] = round(disp.asymmetry, 4)
    full_turn = orbit.coverage >= 2 * math.pi - 1.5 * orbit.step
    if is_displaced and full_turn:
        details["overlap_mm"] = round(disp.overlap, 4)
        details["fov_radius_mm"] = round(max(-disp.low, disp.high), 4)
        return Weighting(circular_arc_weights(orbit.angles, 2 * math.pi), displaced_weights(orbit), "displaced",
                         f"displaced detector over a full turn (half acquisition): Wang's weights over the "
                         f"{2 * disp.overlap:.4g} mm overlap", details)
    if is_displaced:
        warnings.warn(f"{who}: a parallel scan with a displaced detector needs a full turn to measure the rays "
                      f"beyond the {2 * disp.overlap:.4g} mm overlap; this one covers {deg(orbit.coverage):.1f} "
                      "degrees", RuntimeWarning, stacklevel=4)
    details["fov_radius_mm"] = round(min(-disp.low, disp.high), 4)
    if orbit.coverage >= period - 1.5 * orbit.step:
        return Weighting(circular_arc_weights(orbit.angles, math.pi) if not tilted
                         else circular_arc_weights(orbit.angles, 2 * math.pi) / 2, None, "parallel",
                         "parallel beam: arc weights" + (" over the full turn (tilted rays)" if tilted else
                                                         " on the half circle"), details)
    warnings.warn(f"{who}: the parallel scan covers {deg(orbit.coverage):.1f} degrees, less than "
                  f"{deg(period):.0f}; expect limited-angle artefacts", RuntimeWarning, stacklevel=4)
    return Weighting(linear_arc_weights(orbit.angles), None, "parallel-limited",
                     "limited-angle parallel scan: open arc weights", details)


def redundancy_weights(orbit: Orbit, short_scan: str | bool = "auto", who: str = "fdk", *,
                       displaced: str | bool = "auto"):
    """Per-view angular weights (n,) and optional per-column redundancy weights (n, U): the
    pair :func:`weighting_of` chooses (its ``arc`` and ``per_column``)."""
    w = weighting_of(orbit, short_scan, who, displaced=displaced)
    return w.arc, w.per_column
