"""diffct 2.5's analytic weighted backprojections, on ctbench's voxel-driven FDK kernel.

- ``parallel_weighted_backproject(sinogram, ray_dir, det_origin, det_u_vec, detector_spacing, H, W,
  voxel_spacing=1.0)``, ``fan_weighted_backproject(..., *, isocenter=None)`` and
  ``cone_weighted_backproject(sinogram, src, det_center, det_u, det_v, D, H, W, du, dv,
  voxel_spacing=1.0, *, isocenter=None)`` take projections already ramp-filtered with
  :func:`ctbench.ramp_filter_1d` (diffct's scaling) and weighted (cosine and angular weights), and
  add, for every voxel ``x`` and view ``k``, ``s_k m_k(x)^2 q_k(pixel(x))`` (cone, fan) or
  ``q_k(pixel(x)) / 2 pi`` (parallel), ``m_k`` the voxel's magnification and
  ``s_k = sid_k / (2 pi sdd_k)`` with both distances measured along the detector normal
  (``sid_k`` to the isocenter, given or fitted to the source-normal lines).  This is diffct's
  ``sdd/(2 pi sid) (sid/U)^2`` weight, so a unit-density object reconstructs to 1.
- ``helical_view_weights(angles, source_z, slice_z)``: per slice, each view's share of the
  ``2 pi`` window centred on the angle at which the source passes the slice (the views' angular
  cells clipped to the window, halved for the redundancy of a full turn); the window must lie
  within the acquired angles.
- ``helical_weighted_backproject(sinogram, trajectory, volume_shape, view_weights, *, isocenter,
  detector_spacing=1.0, voxel_spacing=1.0)``: plane ``z`` gathers view ``k`` with weight
  ``view_weights[z, k] * s_k``.

The forward pass is ctbench's kernel (:func:`ctbench.engine.fdk_kernels.weighted_backproject`).
Gradients reach the sinogram (and ``view_weights``) through the exact transpose of the same
interpolation, computed view by view with the pure-torch reference formulas in float64 (slower
than the forward pass).  Geometry gradients are refused, as in diffct.
"""

from __future__ import annotations

import math

import torch

from ..engine.fdk_autograd import WeightedBackproject

__all__ = ["parallel_weighted_backproject", "fan_weighted_backproject", "cone_weighted_backproject",
           "helical_view_weights", "helical_weighted_backproject"]

_F64 = torch.float64


# ------------------------------------------------------------------ checks
def _check_sinogram(sinogram, ndim: int) -> torch.Tensor:
    if not isinstance(sinogram, torch.Tensor) or not sinogram.is_floating_point():
        raise TypeError(f"sinogram must be a real floating-point tensor, got {type(sinogram).__name__}")
    if sinogram.ndim != ndim:
        raise ValueError(f"sinogram must have {ndim} dimensions (n_views, {'U, V' if ndim == 3 else 'U'}), "
                         f"got shape {tuple(sinogram.shape)}")
    if min(sinogram.shape[1:]) < 2:
        raise ValueError(f"sinogram needs at least two detector bins on each detector axis, got shape "
                         f"{tuple(sinogram.shape)}")
    return sinogram


def _check_geometry(geometry, names, n_views: int, dims: int):
    out = []
    for name, g in zip(names, geometry):
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(g).__name__}")
        if g.requires_grad:
            raise ValueError(f"{name}: analytic backprojection does not support geometry gradients")
        if tuple(g.shape) != (n_views, dims):
            raise ValueError(f"{name} must have shape ({n_views}, {dims}) (one row per view), got {tuple(g.shape)}")
        if not torch.isfinite(g).all():
            raise ValueError(f"{name} must be finite")
        out.append(g.detach())
    return out


def _projector(beam, geometry, volume_shape, detector_shape, detector_spacing, voxel_spacing, dtype, device):
    from ..projector import Projector

    frames = tuple(g.to(device=device, dtype=dtype) for g in geometry)
    return Projector(frames, volume_shape, detector_shape, beam=beam, detector_spacing=detector_spacing,
                     voxel_spacing=voxel_spacing)


def _normals(P) -> torch.Tensor:
    """Unit detector normals pointing from the source towards the detector, float64 (n, 3)."""
    tr = P.trajectory
    s, c, u, v = (t.detach().to(device="cpu", dtype=_F64) for t in tr.tensors())
    n = torch.linalg.cross(u, v, dim=1)
    n = n / n.norm(dim=1, keepdim=True)
    return torch.where((((c - s) * n).sum(1) < 0)[:, None], -n, n)


def _isocenter(P, isocenter, dims: int) -> torch.Tensor:
    """The isocenter (x, y, z) in float64: given, or the point closest (least squares) to the lines
    through every source along its detector normal."""
    tr = P.trajectory
    if isocenter is not None:
        iso = torch.as_tensor(isocenter).detach().to(device="cpu", dtype=_F64).reshape(-1)
        if iso.numel() != dims or not torch.isfinite(iso).all():
            raise ValueError(f"isocenter must be {dims} finite coordinates, got {isocenter!r}")
        return torch.cat([iso, torch.zeros(3 - dims, dtype=_F64)])
    s = tr.source.detach().to(device="cpu", dtype=_F64)
    n = _normals(P)
    proj = torch.eye(3, dtype=_F64) - n[:, :, None] * n[:, None, :]  # removes the normal component
    if dims == 2:
        proj[:, 2, :] = 0.0
        proj[:, :, 2] = 0.0
    ref = s.mean(0)
    A = proj.sum(0)[:dims, :dims]
    b = (proj @ (s - ref)[:, :, None]).sum(0)[:dims, 0]
    sv = torch.linalg.svdvals(A)
    if float(sv.min()) <= 1e-9 * float(sv.max()):
        raise ValueError("cannot infer the isocenter from these views (the source-normal lines do not meet in "
                         "one point); pass isocenter=")
    iso = ref[:dims] + torch.linalg.solve(A, b)
    return torch.cat([iso, torch.zeros(3 - dims, dtype=_F64)])


def _cone_scale(P, isocenter, dims: int) -> torch.Tensor:
    """``sid_k / (2 pi sdd_k)`` per view (float64), distances along the detector normal."""
    iso = _isocenter(P, isocenter, dims)
    s, c = (t.detach().to(device="cpu", dtype=_F64) for t in P.trajectory.tensors()[:2])
    n = _normals(P)
    sid = ((iso - s) * n).sum(1)
    sdd = ((c - s) * n).sum(1)
    if not (sid > 0).all() or not (sdd > 0).all():
        raise ValueError("source-to-isocenter and source-to-detector distances (along the detector normal) must "
                         "be positive in every view")
    return sid / (2 * math.pi * sdd)


def _gather(P, sinogram, weights) -> torch.Tensor:
    """Run the gather of ``sinogram`` (n, U[, V]) with per-view or per-(plane, view) ``weights``."""
    dtype = P_dtype = sinogram.dtype if sinogram.dtype in (torch.float32, torch.float64) else torch.float32
    q = sinogram.to(P_dtype)
    if P.is_2d:
        q = q.unsqueeze(-1)
    rays = P._rays(None, dtype, q.device)
    out = WeightedBackproject.apply(q, weights.to(device=q.device, dtype=dtype), rays, P.grid)
    return out[0] if P.is_2d else out


# ------------------------------------------------------------------ public
def parallel_weighted_backproject(sinogram, ray_dir, det_origin, det_u_vec, detector_spacing, H, W,
                                  voxel_spacing=1.0):
    """diffct's voxel-driven parallel-beam FBP gather with the ``1 / (2 pi)`` constant (see the module)."""
    sinogram = _check_sinogram(sinogram, 2)
    geo = _check_geometry((ray_dir, det_origin, det_u_vec), ("ray_dir", "det_origin", "det_u_vec"),
                          sinogram.shape[0], 2)
    P = _projector("parallel", geo, (int(H), int(W)), sinogram.shape[1], detector_spacing, voxel_spacing,
                   sinogram.dtype if sinogram.dtype == _F64 else torch.float32, sinogram.device)
    w = torch.full((sinogram.shape[0],), 1 / (2 * math.pi), dtype=_F64)
    return _gather(P, sinogram, w)


def fan_weighted_backproject(sinogram, src_pos, det_center, det_u_vec, detector_spacing, H, W, voxel_spacing=1.0,
                             *, isocenter=None):
    """diffct's voxel-driven fan-beam FBP gather with the ``sdd/(2 pi sid) (sid/U)^2`` weight."""
    sinogram = _check_sinogram(sinogram, 2)
    geo = _check_geometry((src_pos, det_center, det_u_vec), ("src_pos", "det_center", "det_u_vec"),
                          sinogram.shape[0], 2)
    P = _projector("fan", geo, (int(H), int(W)), sinogram.shape[1], detector_spacing, voxel_spacing,
                   sinogram.dtype if sinogram.dtype == _F64 else torch.float32, sinogram.device)
    return _gather(P, sinogram, _cone_scale(P, isocenter, 2))


def cone_weighted_backproject(sinogram, src_pos, det_center, det_u_vec, det_v_vec, D, H, W, du, dv,
                              voxel_spacing=1.0, *, isocenter=None):
    """diffct's voxel-driven FDK gather with the ``sdd/(2 pi sid) (sid/U)^2`` weight."""
    sinogram = _check_sinogram(sinogram, 3)
    geo = _check_geometry((src_pos, det_center, det_u_vec, det_v_vec),
                          ("src_pos", "det_center", "det_u_vec", "det_v_vec"), sinogram.shape[0], 3)
    P = _projector("cone", geo, (int(D), int(H), int(W)), tuple(sinogram.shape[1:]), (du, dv), voxel_spacing,
                   sinogram.dtype if sinogram.dtype == _F64 else torch.float32, sinogram.device)
    return _gather(P, sinogram, _cone_scale(P, isocenter, 3))


def _vector(value, name, dtype=_F64) -> torch.Tensor:
    if isinstance(value, torch.Tensor) and value.requires_grad:
        raise ValueError(f"{name} must not require grad (the acquisition coordinates are fixed)")
    t = torch.as_tensor(value).detach()
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)) or t.ndim != 1:
        raise ValueError(f"{name} must be a real 1D vector, got {tuple(t.shape)} {t.dtype}")
    t = t.to(device="cpu", dtype=dtype)
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} must be finite")
    return t


def helical_view_weights(angles, source_z, slice_z):
    """``(n_slices, n_views)`` weights of a helical scan: for each slice, every view's angular cell
    (half-way to its neighbours, the end cells ending at the first and last angle) clipped to the
    ``2 pi`` window centred on the angle at which the source height equals the slice's height
    (interpolated linearly), times 1/2 (each ray is measured twice in a turn); each row sums to
    ``pi``.  ``angles`` (unwrapped radians) and ``source_z`` must be strictly monotone, of equal
    length >= 2; a slice whose window reaches past the acquired angles raises ValueError.
    Returned in the dtype and on the device of ``angles``."""
    if not isinstance(angles, torch.Tensor):
        angles = torch.as_tensor(angles, dtype=_F64)
    if not angles.is_floating_point() or angles.ndim != 1 or angles.shape[0] < 2:
        raise ValueError(f"angles must be a real floating-point vector of at least two views, got "
                         f"{tuple(angles.shape)} {angles.dtype}")
    out_dtype, out_device = angles.dtype, angles.device
    a = _vector(angles, "angles")
    z = _vector(source_z, "source_z")
    zs = _vector(slice_z, "slice_z")
    if z.shape != a.shape:
        raise ValueError(f"source_z must have one height per view ({a.shape[0]}), got {tuple(z.shape)}")
    if zs.numel() == 0:
        raise ValueError("slice_z must hold at least one slice height")
    for t, name in ((a, "angles"), (z, "source_z")):
        d = t[1:] - t[:-1]
        if not ((d > 0).all() or (d < 0).all()):
            raise ValueError(f"{name} must be strictly monotone (a zero pitch is a circular scan: use fdk)")
    a = a - a[0]  # relative angles: large absolute angles keep their precision
    by_z = torch.argsort(z)
    zz, az = z[by_z], a[by_z]
    if (zs < zz[0]).any() or (zs > zz[-1]).any():
        raise ValueError(f"slice_z must lie within the source heights [{float(zz[0]):g}, {float(zz[-1]):g}]")
    hi = torch.searchsorted(zz, zs).clamp(1, zz.numel() - 1)
    t = (zs - zz[hi - 1]) / (zz[hi] - zz[hi - 1])
    centre = az[hi - 1] + t * (az[hi] - az[hi - 1])
    by_a = torch.argsort(a)
    sa = a[by_a]
    slack = 8 * torch.finfo(out_dtype if out_dtype in (torch.float32, torch.float64) else torch.float32).eps \
        * max(1.0, float(sa[-1] - sa[0]))
    lo_w, hi_w = centre - math.pi, centre + math.pi
    short = (lo_w < sa[0] - slack) | (hi_w > sa[-1] + slack)
    if short.any():
        raise ValueError(f"slices {short.nonzero()[:, 0].tolist()[:10]} lack a fully acquired 2 pi window of "
                         "angles around them; reconstruct fewer slices or acquire more turns")
    edges = torch.cat([sa[:1], (sa[1:] + sa[:-1]) / 2, sa[-1:]])
    cells = (torch.minimum(edges[None, 1:], hi_w[:, None]) - torch.maximum(edges[None, :-1], lo_w[:, None]))
    w_sorted = cells.clamp_min(0) / 2
    w = torch.empty_like(w_sorted)
    w[:, by_a] = w_sorted
    return w.to(device=out_device, dtype=out_dtype)


def helical_weighted_backproject(sinogram, trajectory, volume_shape, view_weights, *, isocenter,
                                 detector_spacing=1.0, voxel_spacing=1.0):
    """Gather filtered cone-beam projections ``(n_views, U, V)`` plane by plane with the
    ``(D, n_views)`` ``view_weights`` (applied after filtering), times each view's
    ``sid/(2 pi sdd)`` and the voxel's squared magnification.  ``trajectory``: diffct's
    ``(src, det_center, det_u, det_v)`` or a ctbench Trajectory; ``isocenter``: (x, y, z).
    Gradients reach ``sinogram`` and ``view_weights``."""
    from ..geometry import as_trajectory

    sinogram = _check_sinogram(sinogram, 3)
    traj = as_trajectory(trajectory, beam="cone")
    if traj.ndim != 3 or traj.beam != "cone":
        raise ValueError("helical_weighted_backproject needs a 3D cone-beam trajectory")
    geo = _check_geometry(traj.tensors(), ("src", "det_center", "det_u", "det_v"), sinogram.shape[0], 3)
    if isocenter is None:
        raise ValueError("isocenter is required: the (x, y, z) point on the rotation axis")
    vs = tuple(int(n) for n in volume_shape)
    if len(vs) != 3:
        raise ValueError(f"volume_shape must be (D, H, W), got {volume_shape!r}")
    dtype = sinogram.dtype if sinogram.dtype == _F64 else torch.float32
    P = _projector("cone", geo, vs, tuple(sinogram.shape[1:]), detector_spacing, voxel_spacing, dtype,
                   sinogram.device)
    if not isinstance(view_weights, torch.Tensor):
        view_weights = torch.as_tensor(view_weights, dtype=dtype)
    if tuple(view_weights.shape) != (vs[0], sinogram.shape[0]):
        raise ValueError(f"view_weights must have shape (D, n_views) = ({vs[0]}, {sinogram.shape[0]}), got "
                         f"{tuple(view_weights.shape)}")
    if not torch.isfinite(view_weights.detach()).all():
        raise ValueError("view_weights must be finite")
    scale = _cone_scale(P, isocenter, 3).to(device=view_weights.device)
    return _gather(P, sinogram, view_weights * scale.to(view_weights.dtype if view_weights.is_floating_point()
                                                         else _F64)[None, :])
