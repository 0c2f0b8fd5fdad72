"""Analytic reconstruction: FDK (circular cone beam), FBP (fan 2D, parallel 2D/3D), approximate helical FDK.

All three are one filtered backprojection:

1. pre-weight the projections: cosine weights ``Dsd/|pixel - source|`` for
   cone/fan beams, times Parker weights when a cone/fan scan covers less
   than a full turn;
2. ramp-filter every detector row (along u) with the physical pixel pitch
   (:mod:`ctbench.solvers.filtering`);
3. backproject with the voxel-driven weighted kernel
   (:mod:`ctbench.engine.fdk_kernels`): view ``k`` adds
   ``c_k * m_k(x)^2 * q_k(pixel(x))`` (cone) or ``c_k * q_k(pixel(x))``
   (parallel), with ``m_k(x)`` the magnification of the voxel and
   ``c_k = dbeta_k * R_k / Dsd_k`` (cone; ``R`` source-axis distance,
   ``Dsd`` source-detector distance, ``dbeta`` the view's share of the arc,
   halved on a full turn) or ``c_k = dtheta_k`` (parallel).

With line integrals in (attenuation x mm) the result is the attenuation
coefficient per mm: a unit-density object reconstructs to 1 without any
further scaling.
"""

from __future__ import annotations

import math
import warnings

import torch

from ..engine.base import Rays, VolumeGrid
from ..geometry.trajectory import check_finite
from ..engine.fdk_autograd import WeightedBackproject
from ..engine.fdk_kernels import CYLINDER, detector_coordinates, voxel_centres, weighted_backproject
from ._checks import check_sinogram
from .filtering import check_filter, check_oversample, check_padding, ramp_filter
from .weights import (F64, Orbit, cosine_weights, detector_padding, linear_arc_weights, orbit_of, redundancy_weights,
                      weighting_of)

__all__ = ["fdk", "fbp", "helical_fdk", "field_of_view", "fdk_weighting"]


def _layout(projector, sinogram: torch.Tensor):
    """(batch shape, sinogram as (B, n, U, V))."""
    n_core = len(projector.projection_shape)
    batch = tuple(sinogram.shape[:sinogram.ndim - n_core])
    s = sinogram.reshape(math.prod(batch), *projector.projection_shape)  # -1 is ambiguous on zero-view ranks
    if projector.is_2d:
        s = s.unsqueeze(-1)
    return batch, s


def _local_views(projector) -> tuple[int, int]:
    vs = getattr(projector, "view_slice", slice(0, projector.n_views))
    return vs.start, vs.stop


def _slab(projector) -> tuple[int, int]:
    sl = getattr(projector, "volume_slice", slice(0, projector.global_volume_shape[0]))
    return sl.start, sl.stop


def fdk_rays(projector, dtype, device, k0: int, k1: int, oversample: int = 1, pad="auto") -> Rays:
    """Rays of the local views for the filtered rows :func:`filtered_views` returns: the detector extended by
    ``pad = (before, after)`` columns (a displaced detector made symmetric, :func:`~ctbench.solvers.weights.
    detector_padding`; ``"auto"``: as the geometry's default weighting needs), and with oversampled rows a
    detector of (U'-1)*m+1 columns at pitch du/m with the same centre."""
    rays = projector._rays(None, dtype, device).views(k0, k1)
    before, after = _auto_padding(projector) if isinstance(pad, str) and pad == "auto" else pad
    if before or after:
        rays = _padded_rays(rays, int(before), int(after))
    if oversample == 1:
        return rays
    U, V = rays.detector_shape
    return Rays(rays.source, rays.center, rays.ustep / oversample, rays.vstep, rays.cone,
                ((U - 1) * oversample + 1, V))


def _auto_padding(projector) -> tuple[int, int]:
    """The padding of the geometry's default weighting (none where FDK's orbit analysis does not apply)."""
    try:
        return detector_padding(orbit_of(projector, require="circular", who="fdk"))
    except ValueError:
        return 0, 0


def _padded_rays(rays: Rays, before: int, after: int) -> Rays:
    """The views' detectors extended by ``before`` columns ahead of column 0 and ``after`` past the last one."""
    U, V = rays.detector_shape
    shift = 0.5 * (after - before)
    if rays.cone != CYLINDER:
        return Rays(rays.source, rays.center + shift * rays.ustep, rays.ustep, rays.vstep, rays.cone,
                    (U + before + after, V))
    # a cylinder centred on the source: the centre moves along the arc, the frame turns with it about v
    s, c, u, v = (t.to(F64) for t in rays.tensors())
    vh = v / v.norm(dim=1, keepdim=True)
    radius = (c - s).norm(dim=1, keepdim=True)
    phi = shift * u.norm(dim=1, keepdim=True) / radius

    def turn(x):
        return x * torch.cos(phi) + torch.linalg.cross(vh, x, dim=1) * torch.sin(phi) \
            + vh * (vh * x).sum(1, keepdim=True) * (1 - torch.cos(phi))

    # the sense of the turn that carries the centre towards +u
    sign = torch.sign((torch.linalg.cross(vh, c - s, dim=1) * u).sum(1, keepdim=True))
    phi = phi * torch.where(sign == 0, torch.ones_like(sign), sign)
    dt = rays.source.dtype
    return Rays(rays.source, (s + turn(c - s)).to(dt), turn(u).to(dt), rays.vstep, rays.cone, (U + before + after, V))


def filtered_views(projector, orbit: Orbit, sino4: torch.Tensor, k0: int, k1: int, filter: str, cutoff: float,
              padding: float, parker: torch.Tensor | None, oversample: int, pad="auto") -> torch.Tensor:
    """Pre-weighted, ramp-filtered projections of the local views, (B, n, (U'-1)*oversample+1, V) with
    U' = U + before + after.

    ``orbit`` is the whole scan's (:func:`~ctbench.solvers.weights.orbit_of`); ``parker`` the per-column
    redundancy weights of the whole scan, (n_views, U), or None (``redundancy_weights``'s second value);
    ``pad = (before, after)``: zero columns added to the weighted rows before filtering (a displaced
    detector: :func:`~ctbench.solvers.weights.detector_padding`; ``"auto"``: the default weighting's).
    Pass the same ``pad`` to :func:`fdk_rays`."""
    dtype, device = sino4.dtype, sino4.device
    data = sino4
    if orbit.cone:
        pre = cosine_weights(orbit, (k0, k1))
        if parker is not None:
            pre = pre * parker[k0:k1, :, None]
        data = data * pre.to(device=device, dtype=dtype)
    elif parker is not None:
        data = data * parker[k0:k1, :, None].to(device=device, dtype=dtype)
    before, after = detector_padding(orbit) if isinstance(pad, str) and pad == "auto" else pad
    if before or after:
        data = torch.nn.functional.pad(data, (0, 0, int(before), int(after)))
    du = projector.detector_spacing[0] * float(projector.trajectory.detector_u[0].detach().norm())
    curvature = 1.0 / float(orbit.sdd.median()) if orbit.detector == "cylinder" else 0.0
    # Rows are filtered as they are, as RTK's FDK does, also on a rolled detector: filtering along the rotation
    # plane instead (shearing each view's columns by band-limited shifts and back) changed no measured RMSE
    # (docs/RECONSTRUCTION.md, "Per-view geometry").
    return ramp_filter(data, du, dim=-2, filter=filter, cutoff=cutoff, padding=padding, oversample=oversample,
                       curvature=curvature)


def view_scale(orbit: Orbit) -> torch.Tensor:
    """Factor of each view's backprojection besides its arc weight: R/Dsd (cone; R the source's distance to
    the axis, Dsd its distance to the detector plane along the normal, or the radius of a cylindrical
    detector), cos(elevation) for parallel rays (1 perpendicular to z; parallel laminography)."""
    if orbit.cone:
        return orbit.radius / orbit.sdd
    if orbit.elevation is not None:
        return torch.cos(orbit.elevation)
    return torch.ones_like(orbit.angles)


def _reduce_views(projector, vol: torch.Tensor) -> torch.Tensor:
    """Sum the partial backprojections of view-sharded ranks (views and hybrid partitions):
    over the ranks that share this slab (``view_group``; None when there is nothing to sum)."""
    group = getattr(projector, "view_group", None)
    if group is not None:
        from ..distributed.collectives import all_reduce_sum
        vol = all_reduce_sum(vol, group)
    return vol


def _backproject_all(projector, filt: torch.Tensor, weights: torch.Tensor, k0: int, k1: int, backend: str,
                     oversample: int = 1, planes=None, pad=(0, 0)) -> torch.Tensor:
    """Backproject every batch item into this process's slab; ``planes`` optionally gives
    per-plane (z, weights, (v0, v1)) overrides (helical)."""
    B, n, U, V = filt.shape
    z0, z1 = _slab(projector)
    grid = projector.grid
    rays = fdk_rays(projector, filt.dtype, filt.device, k0, k1, oversample, pad)
    w = weights[k0:k1].to(device=filt.device, dtype=filt.dtype)
    if filt.requires_grad and torch.is_grad_enabled() and planes is None and (z0, z1) == (0, grid.D):
        # differentiable in the sinogram: the kernel forward, its exact transpose backward
        return torch.stack([WeightedBackproject.apply(filt[b], w, rays, grid) for b in range(B)])
    out = torch.zeros((B, z1 - z0, grid.H, grid.W), dtype=filt.dtype, device=filt.device)
    for b in range(B):
        if planes is None:
            weighted_backproject(filt[b], rays, grid, w, z0=z0, z1=z1, out=out[b], backend=backend)
            continue
        for z, wz, (v0, v1) in planes:
            v0, v1 = max(v0, k0) - k0, min(v1, k1) - k0
            if v1 <= v0:
                continue
            weighted_backproject(filt[b], rays, grid, wz[k0:k1].to(device=filt.device, dtype=filt.dtype),
                                 z0=z, z1=z + 1, views=(v0, v1), out=out[b, z - z0:z - z0 + 1],
                                 backend=backend)
    return out


def _finish(projector, out: torch.Tensor, batch) -> torch.Tensor:
    out = _reduce_views(projector, out)
    return out.reshape(*batch, *projector.volume_shape)


def _filtered_backprojection(projector, sinogram, who: str, *, filter, cutoff, padding, oversample, short_scan,
                             displaced, backend) -> torch.Tensor:
    graph = sinogram if isinstance(sinogram, torch.Tensor) and sinogram.requires_grad else None
    sinogram = check_sinogram(projector, sinogram, allow_batch=True)
    if graph is not None and torch.is_grad_enabled():
        sinogram = graph  # keep the autograd graph: fdk/fbp are differentiable in the sinogram
    filter = check_filter(filter)
    oversample = check_oversample(oversample)
    check_padding(padding)
    check_finite(projector.trajectory.tensors())  # before the orbit fit reads the geometry
    orbit = orbit_of(projector, require="circular", who=who)
    arc, parker = redundancy_weights(orbit, short_scan, who=who, displaced=displaced)
    pad = detector_padding(orbit, displaced)
    weights = arc * view_scale(orbit)
    k0, k1 = _local_views(projector)
    batch, sino4 = _layout(projector, sinogram)
    filt = filtered_views(projector, orbit, sino4, k0, k1, filter, cutoff, padding, parker, oversample, pad)
    out = _backproject_all(projector, filt, weights, k0, k1, backend, oversample, pad=pad)
    return _finish(projector, out, batch)


def fdk_weighting(projector, *, short_scan="auto", displaced="auto") -> dict:
    """What :func:`fdk` / :func:`fbp` will do with this projector's geometry, as a JSON-able dict for
    reports and layer metadata: the redundancy weighting chosen (``kind``: "full", "parker",
    "displaced", "displaced+parker", "open-arc", "parallel", "parallel-limited"), in words
    (``description``), the coverage, fan angles, detector asymmetry, field-of-view radius, tilt
    (laminography) and the detector (flat or cylinder), the largest roll and the spread of the
    source distances.  Raises ValueError as :func:`fdk` would for a geometry FDK cannot use."""
    who = "fdk" if projector.beam == "cone" else "fbp"
    check_finite(projector.trajectory.tensors())
    orbit = orbit_of(projector, require="circular", who=who)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w = weighting_of(orbit, short_scan, who, displaced=displaced)
    out = w.to_dict()
    out["detector"] = orbit.detector
    if orbit.roll is not None and orbit.roll.numel():
        out["max_roll_deg"] = round(math.degrees(float(orbit.roll.abs().max())), 4)
    if orbit.cone:
        out["source_distance_mm"] = [round(float(orbit.radius.min()), 4), round(float(orbit.radius.max()), 4)]
        out["source_z_mm"] = [round(float(orbit.source_z.min()), 4), round(float(orbit.source_z.max()), 4)]
    out["warnings"] = [str(c.message) for c in caught]
    return out


def fdk(projector, sinogram: torch.Tensor, *, filter: str = "ram-lak", cutoff: float = 1.0, padding: float = 2.0,
        oversample: int = 1, short_scan="auto", displaced="auto", backend: str = "auto") -> torch.Tensor:
    """Feldkamp-Davis-Kress reconstruction of a circular cone-beam scan (or a 2D fan-beam scan).

    Every view keeps its own geometry, as in RTK: per-view source positions,
    detector centres and axes (offsets, an in-plane roll, small out-of-plane
    tilts), per-view distances, a tilted orbit (laminography), a detector
    displaced sideways (half-fan, Wang's weights) and cylindrical detectors
    centred on the source (:class:`~ctbench.solvers.CylindricalProjector`).

    Parameters
    ----------
    projector : the :class:`~ctbench.Projector` of the scan (trajectory, volume grid, detector).
    sinogram : ``(*batch, n_views, U, V)`` line integrals (``(*batch, n_views, U)`` for fan 2D).
    filter : ramp window: "ram-lak", "shepp-logan", "cosine", "hamming" or "hann".
    cutoff : window cut-off as a fraction of the Nyquist frequency (0, 1].
    padding : rows are zero-padded to at least ``padding`` times their length (>= 2: no wrap-around).
    oversample : filtered rows are interpolated (band-limited, by FFT) to ``oversample`` times the
        detector sampling before the bilinear backprojection; 1 (default) is the classical method,
        2 keeps more resolution (sharper edges, more ringing with ram-lak; pair it with shepp-logan).
    short_scan : "auto" applies Parker weights when the orbit covers less than a full turn;
        False uses plain arc weights; True forces Parker weights.
    displaced : "auto" applies Wang's displaced-detector weights when the detector's fan reaches one
        side of the axis more than the other (by more than 10 % of its span); True forces them, False
        turns them off.  :func:`fdk_weighting` says which weights a geometry gets.
    backend : "auto", "cpu", "cuda" or "reference" (the pure-torch oracle).

    Returns the volume ``(*batch, *projector.volume_shape)`` in attenuation per mm
    (the data's line-integral unit per mm), dtype and device of the sinogram.  Differentiable in
    the sinogram (one process, no space partition): its gradient is the exact transpose of the
    filtered backprojection (:mod:`ctbench.engine.fdk_autograd`).
    Raises ValueError, with the reason and the alternative, for trajectories FDK cannot represent
    (:func:`~ctbench.solvers.weights.orbit_of`): source heights that vary (helix: :func:`helical_fdk`),
    views out of rotation order, a detector rolled by more than 10 degrees or facing along the axis.
    """
    if projector.beam != "cone":
        raise ValueError("fdk reconstructs cone/fan-beam scans; for parallel beams use fbp")
    return _filtered_backprojection(projector, sinogram, "fdk", filter=filter, cutoff=cutoff, padding=padding,
                                    oversample=oversample, short_scan=short_scan, displaced=displaced,
                                    backend=backend)


def fbp(projector, sinogram: torch.Tensor, *, filter: str = "ram-lak", cutoff: float = 1.0, padding: float = 2.0,
        oversample: int = 1, short_scan="auto", displaced="auto", backend: str = "auto") -> torch.Tensor:
    """Filtered backprojection of a 2D fan-beam scan or a parallel-beam scan (2D or 3D).

    Same parameters and units as :func:`fdk`.  Parallel scans need at least
    180 degrees (views beyond are averaged with their opposites); parallel
    rays tilted out of the plane perpendicular to z (parallel laminography)
    need a full turn and are weighted by the cosine of their tilt; fan scans
    of less than a full turn get Parker weights.
    """
    if projector.beam == "cone" and not projector.is_2d:
        raise ValueError("fbp reconstructs fan 2D and parallel scans; for a 3D cone-beam scan use fdk "
                         "(circular orbit) or helical_fdk")
    return _filtered_backprojection(projector, sinogram, "fbp", filter=filter, cutoff=cutoff, padding=padding,
                                    oversample=oversample, short_scan=short_scan, displaced=displaced,
                                    backend=backend)


def helical_fdk(projector, sinogram: torch.Tensor, *, filter: str = "ram-lak", cutoff: float = 1.0,
                padding: float = 2.0, oversample: int = 1, backend: str = "auto") -> torch.Tensor:
    """Approximate FDK for a helical (spiral) cone-beam scan.

    Every volume plane at height ``z`` is reconstructed from the one turn of
    the helix centred on the view whose source is at ``z`` (Wang et al.'s
    generalised FDK): views ``|beta - beta(z)| <= pi`` with the full-scan
    weights, the ends of the turn tapered over one angular step so each
    plane sees exactly 360 degrees.  Rows are filtered along u as in FDK
    (the helical tilt of the ideal filtering lines is ignored, hence
    "approximate": accurate for small pitch and cone angle).  Planes near
    the ends of the helix, with less than a full turn available, are
    normalised by the data they have; planes with less than a quarter of a
    turn are set to zero.  Units as :func:`fdk`.
    """
    if projector.beam != "cone" or projector.is_2d:
        raise ValueError("helical_fdk reconstructs 3D cone-beam helical scans")
    sinogram = check_sinogram(projector, sinogram, allow_batch=True)
    filter = check_filter(filter)
    oversample = check_oversample(oversample)
    check_padding(padding)
    check_finite(projector.trajectory.tensors())
    orbit = orbit_of(projector, require="helical", who="helical_fdk")
    k0, k1 = _local_views(projector)
    batch, sino4 = _layout(projector, sinogram)
    filt = filtered_views(projector, orbit, sino4, k0, k1, filter, cutoff, padding, None, oversample, (0, 0))
    arc = linear_arc_weights(orbit.angles) / 2
    base = arc * view_scale(orbit)
    # source z as an affine function of the angle
    A = torch.stack([orbit.angles, torch.ones_like(orbit.angles)], dim=1)
    slope, icpt = torch.linalg.lstsq(A, orbit.source_z[:, None]).solution[:, 0].tolist()
    if abs(slope) * 2 * math.pi < 1e-9 * float(orbit.radius.max()):
        return fdk(projector, sinogram, filter=filter, cutoff=cutoff, padding=padding, oversample=oversample,
                   backend=backend)
    grid = projector.grid
    dz = grid.spacing[0]
    z0, z1 = _slab(projector)
    planes = []
    for z in range(z0, z1):
        zc = (z - (grid.D - 1) / 2) * dz
        beta_c = (zc - icpt) / slope
        taper = ((math.pi - (orbit.angles - beta_c).abs()) / orbit.step + 0.5).clamp(0.0, 1.0)
        have = float((taper * arc * 2).sum()) / (2 * math.pi)  # fraction of a full turn available
        if have < 0.25:
            continue
        wz = base * taper / have
        idx = (taper > 0).nonzero()[:, 0]
        planes.append((z, wz, (int(idx.min()), int(idx.max()) + 1)))
    out = _backproject_all(projector, filt, base, k0, k1, backend, oversample, planes=planes)
    return _finish(projector, out, batch)


def field_of_view(projector, *, margin: float = 0.0, short_scan="auto", displaced="auto") -> torch.Tensor:
    """Boolean mask of the voxels (of this process's ``volume_shape``) that FDK/FBP reconstruct from complete
    data: whose centre projects within the span of the pixel centres (shrunk by ``margin`` pixels) in every
    view.  For a displaced (half-fan) detector, where :func:`fdk` uses Wang's weights, a voxel needs every line
    through it in the rotation plane measured once: in each view it must lie on the detector's columns or on
    those of the view that sees the same line from the other side (checked in the plane z = 0), and within
    the rows in every view.  ``short_scan``/``displaced`` as for :func:`fdk`.
    """
    traj = projector.trajectory
    rays = projector._rays(None, F64, torch.device("cpu"))
    grid: VolumeGrid = projector.grid
    z0, z1 = _slab(projector)
    U, V = projector.detector_shape
    pts = voxel_centres(grid, z0, z1)
    half_fan = _is_half_fan(projector, short_scan, displaced)
    inside = torch.ones(pts.shape[0], dtype=torch.bool)
    for k in range(traj.n_views):
        fi, fj, _, front = detector_coordinates(rays, k, pts)
        ok = front.clone()
        if not half_fan:
            ok &= (fi >= margin) & (fi <= U - 1 - margin)
        if not projector.is_2d:
            ok &= (fj >= margin) & (fj <= V - 1 - margin)
        inside &= ok
    inside = inside.reshape(projector.volume_shape if not projector.is_2d else (1, *projector.volume_shape))
    if half_fan:
        inside &= _lines_measured(projector, rays, margin)[None]
    return inside.reshape(projector.volume_shape)


def _is_half_fan(projector, short_scan, displaced) -> bool:
    try:
        orbit = orbit_of(projector, require="circular", who="field_of_view")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return weighting_of(orbit, short_scan, "field_of_view", displaced=displaced).kind.startswith("displaced")
    except ValueError:
        return False


def _lines_measured(projector, rays: Rays, margin: float) -> torch.Tensor:
    """(H, W): the voxels of the plane z = 0 every line through which (in that plane) some view measures on
    its detector columns: in view k directly, or in the view nearest to the other end of that line."""
    grid = projector.grid
    U = projector.detector_shape[0]
    pts = voxel_centres(grid, 0, 1)
    pts[:, 2] = 0.0
    n = rays.n_views
    on = torch.zeros((n, pts.shape[0]), dtype=torch.bool)
    for k in range(n):
        fi, _, _, front = detector_coordinates(rays, k, pts)
        on[k] = front & (fi >= margin) & (fi <= U - 1 - margin)
    src = rays.source.to(F64)
    if rays.cone:
        view_angle = torch.atan2(-src[:, 0], src[:, 1])
    else:
        view_angle = torch.atan2(src[:, 1], src[:, 0])
    period = 2 * math.pi
    order = torch.argsort(torch.remainder(view_angle, period))
    sorted_angles = torch.remainder(view_angle, period)[order]
    step = float((sorted_angles[1:] - sorted_angles[:-1]).median()) if n > 1 else 2 * math.pi
    measured = torch.ones(pts.shape[0], dtype=torch.bool)
    for k in range(n):
        if rays.cone:
            s = src[k, :2]
            d = pts[:, :2] - s
            t = -2 * (d @ s) / (d * d).sum(1).clamp_min(1e-30)
            other = s + t[:, None] * d       # where the line through the voxel meets the orbit again
            a = torch.atan2(-other[:, 0], other[:, 1])
        else:
            a = torch.full((pts.shape[0],), float(view_angle[k]) + math.pi, dtype=F64)
        a = torch.remainder(a, period)
        found = torch.searchsorted(sorted_angles, a)
        idx, prev = found % n, (found - 1) % n  # the views on either side, round the circle
        gap_next = torch.remainder(sorted_angles[idx] - a, period)
        gap_prev = torch.remainder(a - sorted_angles[prev], period)
        nearest = order[torch.where(gap_next < gap_prev, idx, prev)]
        # the other end must lie on the scanned arc (a short scan's gap measures nothing)
        conj = on[nearest, torch.arange(pts.shape[0])] & (torch.minimum(gap_next, gap_prev) <= 1.5 * step)
        measured &= on[k] | conj
    return measured.reshape(grid.H, grid.W)
