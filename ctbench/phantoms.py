"""Analytic ellipsoid phantoms: the 3D Shepp-Logan head and a chiral phantom, voxelised and as exact line
integrals.

A phantom is a list of :class:`Ellipsoid` objects whose values add up.  Each
ellipsoid lives in *normalised* coordinates (the Shepp-Logan head fits in
``[-1, 1]^3``) and is mapped to the world (mm) by an isotropic ``scale``: the
physical length that normalised coordinate 1.0 becomes.

Conventions (docs/ARCHITECTURE.md): a volume ``(D, H, W)`` holds world axes ``(z, y, x)``
and is centred on the origin, so voxel ``(k, j, i)`` sits at
``x = (i-(W-1)/2)*dx``, ``y = (j-(H-1)/2)*dy``, ``z = (k-(D-1)/2)*dz``.  World
vectors are ``(x, y, z)``.  Detector pixel ``(i, j)`` of a ``(U, V)`` detector
sits at ``det_center + (i-(U-1)/2)*du*u + (j-(V-1)/2)*dv*v``; a cone-beam ray
is the whole line through the source and that point, a parallel-beam ray the
line through that point along the view's direction.

The line integrals are exact (closed-form chord lengths), so they are the
ground truth that the discrete projectors are measured against.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

__all__ = [
    "Ellipsoid",
    "shepp_logan_ellipsoids",
    "default_scale",
    "ellipsoids_volume",
    "ellipsoid_phantom",
    "shepp_logan_3d",
    "ellipsoid_values",
    "ellipsoid_line_integrals",
    "ellipsoid_projections",
    "shepp_logan_line_integrals",
    "chiral_ellipsoids",
    "chiral_phantom",
    "chiral_line_integrals",
]

_IDENTITY = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))
_RAY_CHUNK = 1 << 17     # rays per step: big enough to amortise Python, small enough to stay in cache
_VOXEL_CHUNK = 1 << 21   # voxels (or sub-samples) per step of the voxeliser


# ---------------------------------------------------------------- the ellipsoid
@dataclass(frozen=True)
class Ellipsoid:
    """One ellipsoid of constant value.

    ``intensity`` is added inside; ``semi_axes`` ``(a, b, c)`` are the half
    lengths along the ellipsoid's local x, y, z axes; ``center`` is
    ``(x0, y0, z0)``; ``rotation`` is a 3x3 rotation matrix (rows of a nested
    tuple) whose *columns* are the local axes in world coordinates, so a world
    point ``p`` has local coordinates ``rotation^T (p - center)``.  All lengths
    are in normalised units; the functions below multiply them by ``scale``.
    """

    intensity: float
    semi_axes: tuple[float, float, float]
    center: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rotation: tuple[tuple[float, float, float], ...] = _IDENTITY

    def __post_init__(self) -> None:
        # Normalise to plain floats so the dataclass is hashable and prints cleanly.
        object.__setattr__(self, "intensity", float(self.intensity))
        axes = _triple(self.semi_axes, "semi_axes")
        if not all(math.isfinite(a) and a > 0 for a in axes):
            raise ValueError(f"semi_axes must be three positive finite lengths, got {axes}")
        object.__setattr__(self, "semi_axes", axes)
        centre = _triple(self.center, "center")
        if not all(math.isfinite(c) for c in centre):
            raise ValueError(f"center must be finite, got {centre}")
        object.__setattr__(self, "center", centre)
        rot = self.rotation
        if isinstance(rot, torch.Tensor):
            rot = rot.detach().cpu().tolist()
        try:
            rows = tuple(_triple(r, "rotation row") for r in rot)
        except TypeError:
            raise ValueError("rotation must be a 3x3 matrix") from None
        if len(rows) != 3:
            raise ValueError(f"rotation must be a 3x3 matrix, got {len(rows)} rows")
        # Orthonormality is what makes `R^T` the inverse; a sloppy matrix would shear the shape.
        for p in range(3):
            for q in range(3):
                dot = sum(rows[k][p] * rows[k][q] for k in range(3))
                if abs(dot - (1.0 if p == q else 0.0)) > 1e-6:
                    raise ValueError("rotation must be orthonormal (R^T R = I)")
        det = (rows[0][0] * (rows[1][1] * rows[2][2] - rows[1][2] * rows[2][1])
               - rows[0][1] * (rows[1][0] * rows[2][2] - rows[1][2] * rows[2][0])
               + rows[0][2] * (rows[1][0] * rows[2][1] - rows[1][1] * rows[2][0]))
        if det < 0:
            raise ValueError("rotation must be a proper rotation (determinant +1), not a reflection")
        object.__setattr__(self, "rotation", rows)

    # -------------------------------------------------------------- builders
    @classmethod
    def sphere(cls, radius: float, center: Sequence[float] = (0.0, 0.0, 0.0),
               intensity: float = 1.0) -> "Ellipsoid":
        """A ball of the given radius (a uniform ball with ``intensity=1`` by default)."""
        r = float(radius)
        return cls(intensity, (r, r, r), tuple(center))

    @classmethod
    def from_euler(cls, intensity: float, semi_axes: Sequence[float],
                   center: Sequence[float] = (0.0, 0.0, 0.0), phi: float = 0.0, theta: float = 0.0,
                   psi: float = 0.0, *, degrees: bool = True) -> "Ellipsoid":
        """An ellipsoid rotated about its own centre by z-x-z Euler angles.

        With ``theta = psi = 0`` the local x axis points along
        ``(cos phi, sin phi, 0)``: a rotation by ``phi`` about z, anticlockwise
        seen from +z.  The matrix is the transpose of the one in Schabel's
        ``phantom3d`` (which maps world to local coordinates).
        """
        return cls(intensity, tuple(semi_axes), tuple(center), euler_rotation(phi, theta, psi, degrees=degrees))

    def scaled(self, scale: float) -> "Ellipsoid":
        """The same ellipsoid with centre and semi-axes multiplied by ``scale``."""
        s = float(scale)
        return Ellipsoid(self.intensity, tuple(s * a for a in self.semi_axes),
                         tuple(s * c for c in self.center), self.rotation)

    def world_to_unit(self, scale: float = 1.0) -> tuple[list[list[float]], list[float]]:
        """``(M, c)`` such that ``M (p - c)`` maps the scaled ellipsoid onto the unit ball."""
        s = float(scale)
        M = [[self.rotation[k][r] / (s * self.semi_axes[r]) for k in range(3)] for r in range(3)]
        return M, [s * c for c in self.center]

    def half_extent(self, scale: float = 1.0) -> list[float]:
        """Half widths of the axis-aligned bounding box along world x, y, z."""
        return [float(scale) * math.sqrt(sum((self.rotation[k][j] * self.semi_axes[j]) ** 2 for j in range(3)))
                for k in range(3)]


def euler_rotation(phi: float, theta: float = 0.0, psi: float = 0.0, *, degrees: bool = True):
    """Local-to-world rotation (columns = local axes) of z-x-z Euler angles, as nested tuples."""
    if degrees:
        phi, theta, psi = (math.radians(float(a)) for a in (phi, theta, psi))
    cf, sf = math.cos(phi), math.sin(phi)
    ct, st = math.cos(theta), math.sin(theta)
    cp, sp = math.cos(psi), math.sin(psi)
    # World -> local matrix of phantom3d; we store its transpose.
    alpha = ((cp * cf - ct * sf * sp, cp * sf + ct * cf * sp, sp * st),
             (-sp * cf - ct * sf * cp, -sp * sf + ct * cf * cp, cp * st),
             (st * sf, -st * cf, ct))
    return tuple(tuple(alpha[c][r] + 0.0 for c in range(3)) for r in range(3))  # + 0.0 drops -0.0


def _triple(x, name) -> tuple[float, float, float]:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().tolist()
    t = tuple(float(v) for v in x)
    if len(t) != 3:
        raise ValueError(f"{name} must have three entries, got {len(t)}")
    return t


# ------------------------------------------------------------- Shepp-Logan
# Kak & Slaney, "Principles of Computerized Tomographic Imaging" (1988), table 3.2
# (p. 102) with the published errata: the printed table repeats row f in place of
# row e and has typos in rows g and h.  Rotation about z, about the ellipsoid's
# own centre, angle from +x to the local x axis.
#        A      a       b      c      x0      y0      z0     phi
_KAK_SLANEY = (
    (2.00, 0.6900, 0.920, 0.900, 0.00, 0.000, 0.000, 0.0),
    (-0.98, 0.6624, 0.874, 0.880, 0.00, 0.000, 0.000, 0.0),
    (-0.02, 0.4100, 0.160, 0.210, -0.22, 0.000, -0.250, 108.0),
    (-0.02, 0.3100, 0.110, 0.220, 0.22, 0.000, -0.250, 72.0),
    (0.02, 0.2100, 0.250, 0.500, 0.00, 0.350, -0.250, 0.0),
    (0.02, 0.0460, 0.046, 0.046, 0.00, 0.100, -0.250, 0.0),
    (0.01, 0.0460, 0.023, 0.020, -0.08, -0.650, -0.250, 0.0),
    (0.01, 0.0460, 0.023, 0.020, 0.06, -0.650, -0.250, 90.0),
    (0.02, 0.0560, 0.040, 0.100, 0.06, -0.105, 0.625, 90.0),
    (-0.02, 0.0560, 0.056, 0.100, 0.00, 0.100, 0.625, 0.0),
)

# The high-contrast "Modified Shepp-Logan" of Toft (1996) extended to 3D by
# M. Schabel's phantom3d (MATLAB File Exchange 9416); its z-x-z Euler angles act on
# world coordinates *before* the centre is subtracted, so the tabulated centre is
# in the rotated frame (kept here so the volume matches phantom3d's).
#       A      a       b       c      x0     y0      z0     phi  theta  psi
_MODIFIED = (
    (1.0, 0.6900, 0.9200, 0.810, 0.00, 0.0000, 0.00, 0.0, 0.0, 0.0),
    (-0.8, 0.6624, 0.8740, 0.780, 0.00, -0.0184, 0.00, 0.0, 0.0, 0.0),
    (-0.2, 0.1100, 0.3100, 0.220, 0.22, 0.0000, 0.00, -18.0, 0.0, 10.0),
    (-0.2, 0.1600, 0.4100, 0.280, -0.22, 0.0000, 0.00, 18.0, 0.0, 10.0),
    (0.1, 0.2100, 0.2500, 0.410, 0.00, 0.3500, -0.15, 0.0, 0.0, 0.0),
    (0.1, 0.0460, 0.0460, 0.050, 0.00, 0.1000, 0.25, 0.0, 0.0, 0.0),
    (0.1, 0.0460, 0.0460, 0.050, 0.00, -0.1000, 0.25, 0.0, 0.0, 0.0),
    (0.1, 0.0460, 0.0230, 0.050, -0.08, -0.6050, 0.00, 0.0, 0.0, 0.0),
    (0.1, 0.0230, 0.0230, 0.020, 0.00, -0.6060, 0.00, 0.0, 0.0, 0.0),
    (0.1, 0.0230, 0.0460, 0.020, 0.06, -0.6050, 0.00, 0.0, 0.0, 0.0),
)


def shepp_logan_ellipsoids(modified: bool = True) -> list[Ellipsoid]:
    """The ten ellipsoids of the 3D Shepp-Logan head in normalised coordinates.

    ``modified=True``: the high-contrast Toft / ``phantom3d`` "Modified
    Shepp-Logan" (intensities 1, -0.8, -0.2, -0.2, 0.1 x 6; brain 0.2).
    ``modified=False``: the original Kak & Slaney 3D table (intensities 2.0,
    -0.98, -0.02, -0.02, 0.02, 0.02, 0.01, 0.01, 0.02, -0.02; brain 1.02).
    The two tables differ in geometry as well as in intensity.
    """
    if modified:
        out = []
        for A, a, b, c, x0, y0, z0, phi, theta, psi in _MODIFIED:
            R = euler_rotation(phi, theta, psi)
            # phantom3d tests alpha @ p - c0 with alpha = R^T, i.e. the world centre is R @ c0.
            centre = tuple(sum(R[r][k] * (x0, y0, z0)[k] for k in range(3)) for r in range(3))
            out.append(Ellipsoid(A, (a, b, c), centre, R))
        return out
    return [Ellipsoid.from_euler(A, (a, b, c), (x0, y0, z0), phi)
            for A, a, b, c, x0, y0, z0, phi in _KAK_SLANEY]


# --------------------------------------------------------- argument checks
def _check_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, torch.Size):
        shape = tuple(shape)
    if not isinstance(shape, (tuple, list)) or len(shape) not in (2, 3):
        raise ValueError(f"shape must be a tuple (D, H, W) or (H, W) of positive integers, got {shape!r}")
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"shape must contain positive integers, got {tuple(shape)!r}")
    return tuple(int(n) for n in shape)


def _positive_float(value, name) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def _spacing(spacing, n: int, name: str, accept: Iterable[int] = ()) -> tuple[float, ...]:
    """A scalar or a tuple of ``n`` (or one of ``accept``, keeping the last ``n``) positive numbers."""
    if isinstance(spacing, torch.Tensor):
        spacing = spacing.detach().cpu().tolist()
    if isinstance(spacing, (tuple, list)):
        if len(spacing) != n and len(spacing) not in tuple(accept):
            raise ValueError(f"{name} must be a scalar or have {n} entries, got {tuple(spacing)!r}")
        vals = tuple(_positive_float(s, name) for s in spacing)
        return vals[len(vals) - n:]
    return (_positive_float(spacing, name),) * n


def _check_supersample(supersample) -> int:
    if isinstance(supersample, bool) or not isinstance(supersample, numbers.Integral) or supersample < 1:
        raise ValueError(f"supersample must be a positive integer, got {supersample!r}")
    return int(supersample)


def _check_ellipsoids(ellipsoids) -> list[Ellipsoid]:
    ells = list(ellipsoids)
    for e in ells:
        if not isinstance(e, Ellipsoid):
            raise TypeError(f"ellipsoids must be Ellipsoid instances, got {type(e).__name__}")
    return ells


def _grid(shape, voxel_spacing):
    """(D, H, W), (dz, dy, dx) and whether the request was a 2D (H, W) slice."""
    shape = _check_shape(shape)
    if len(shape) == 2:
        dy, dx = _spacing(voxel_spacing, 2, "voxel_spacing", accept=(3,))
        return (1, *shape), (1.0, dy, dx), True
    return shape, _spacing(voxel_spacing, 3, "voxel_spacing"), False


def default_scale(shape, voxel_spacing=1.0) -> float:
    """Half the smallest physical extent of the volume: ``min(D*dz, H*dy, W*dx) / 2``.

    For a 2D shape ``(H, W)`` it is ``min(H*dy, W*dx) / 2``.  The phantom's
    normalised cube ``[-1, 1]`` then spans the shortest side of the volume.
    """
    (D, H, W), (dz, dy, dx), flat = _grid(shape, voxel_spacing)
    extents = (H * dy, W * dx) if flat else (D * dz, H * dy, W * dx)
    return min(extents) / 2.0


# ----------------------------------------------------------------- voxels
def ellipsoids_volume(ellipsoids, shape, voxel_spacing=1.0, scale=None, supersample: int = 1, *,
                      dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Sample a sum of ellipsoids on the voxel grid; the worker of :func:`ellipsoid_phantom`.

    Every voxel gets the average over ``supersample**3`` sub-samples (a
    regular ``s x s x s`` grid of cell centres inside the voxel) of the
    pointwise phantom, whose ellipsoids are closed sets (the boundary counts
    as inside).  ``scale=None`` means :func:`default_scale`.  A 2D ``shape``
    ``(H, W)`` samples the plane z=0 (and sub-samples only in x and y).
    """
    ells = _check_ellipsoids(ellipsoids)
    (D, H, W), spacing, flat = _grid(shape, voxel_spacing)
    s = _check_supersample(supersample)
    scale = default_scale(shape, voxel_spacing) if scale is None else _positive_float(scale, "scale")
    device = torch.device(device) if device is not None else torch.device("cpu")
    f64 = torch.float64
    sizes = (W, H, D)                       # world axis order x, y, z
    steps = (spacing[2], spacing[1], spacing[0])
    coords = [(torch.arange(n, dtype=f64, device=device) - (n - 1) / 2) * d for n, d in zip(sizes, steps)]
    sub_axes = 2 if flat else 3             # a 2D slice is not averaged across z
    offs1 = [((m + 0.5) / s - 0.5) for m in range(s)]
    # Sub-sample offsets of one voxel, (s^k, 3) in world units (x, y, z).
    grids = torch.meshgrid(*[torch.tensor(offs1 if a < sub_axes else [0.0], dtype=f64, device=device) * steps[a]
                             for a in range(3)], indexing="ij")
    offsets = torch.stack([g.reshape(-1) for g in grids], dim=1)
    # Half diagonal of a voxel's sampled region: beyond it no sub-sample can lie.
    half_diag = 0.5 * math.sqrt(sum(steps[a] ** 2 for a in range(sub_axes))) if s > 1 else 0.0

    acc = torch.zeros((D, H, W), dtype=f64, device=device)
    for e in ells:
        Ml, cl = e.world_to_unit(scale)
        M = torch.tensor(Ml, dtype=f64, device=device)
        c = torch.tensor(cl, dtype=f64, device=device)
        # Index window of the bounding box, widened by one voxel for the sub-samples.
        ext = e.half_extent(scale)
        lo, hi = [], []
        for a in range(3):
            n, d = sizes[a], steps[a]
            first = math.floor((cl[a] - ext[a]) / d + (n - 1) / 2) - 1
            last = math.ceil((cl[a] + ext[a]) / d + (n - 1) / 2) + 1
            lo.append(max(first, 0))
            hi.append(min(last, n - 1) + 1)
        if any(h <= l for l, h in zip(lo, hi)):
            continue
        x = coords[0][lo[0]:hi[0]] - c[0]
        y = coords[1][lo[1]:hi[1]] - c[1]
        nz_per = max(1, _VOXEL_CHUNK // ((hi[0] - lo[0]) * (hi[1] - lo[1])))
        # A world step of length r moves the unit-ball point by at most ||M||_2 * r.
        reach = half_diag * float(torch.linalg.matrix_norm(M, ord=2))
        for k0 in range(lo[2], hi[2], nz_per):
            k1 = min(k0 + nz_per, hi[2])
            z = coords[2][k0:k1] - c[2]
            # Unit-ball coordinates by broadcasting the separable grid: (nz, ny, nx) each.
            q = [M[r, 0] * x[None, None, :] + M[r, 1] * y[None, :, None] + M[r, 2] * z[:, None, None]
                 for r in range(3)]
            rho2 = q[0] * q[0] + q[1] * q[1] + q[2] * q[2]
            block = acc[k0:k1, lo[1]:hi[1], lo[0]:hi[0]]
            if s == 1:
                block += e.intensity * (rho2 <= 1.0).to(f64)
                continue
            rho = rho2.sqrt()
            # Voxels whose whole sampled region is inside (or outside) need no sub-samples;
            # the small slack keeps borderline voxels on the exact path.
            full = rho + reach <= 1.0 - 1e-9
            mixed = ~full & (rho - reach <= 1.0 + 1e-9)
            block += e.intensity * full.to(f64)
            idx = mixed.nonzero()
            if idx.numel() == 0:
                continue
            per = max(1, _VOXEL_CHUNK // offsets.shape[0])
            for m0 in range(0, idx.shape[0], per):
                kk, jj, ii = idx[m0:m0 + per].unbind(1)
                centre = torch.stack([x[ii], y[jj], z[kk]], dim=1)           # relative to ellipsoid centre
                pts = centre[:, None, :] + offsets[None, :, :]               # (n, s^k, 3)
                loc = pts @ M.T
                inside = ((loc * loc).sum(-1) <= 1.0).to(f64).mean(dim=1)
                block.index_put_((kk, jj, ii), e.intensity * inside, accumulate=True)
    out = acc[0] if flat else acc
    return out.to(dtype)


def ellipsoid_phantom(ellipsoids, shape, voxel_spacing=1.0, *, scale=None, supersample: int = 1,
                      dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """A voxelised phantom of any list of :class:`Ellipsoid`, shape ``(D, H, W)`` or ``(H, W)``.

    ``scale`` (mm per normalised unit) defaults to :func:`default_scale`;
    pass ``scale=1.0`` when the ellipsoids are already in mm.  A uniform ball
    of radius ``r`` mm: ``ellipsoid_phantom([Ellipsoid.sphere(r)], shape, spacing, scale=1.0)``.
    """
    return ellipsoids_volume(ellipsoids, shape, voxel_spacing, scale, supersample, dtype=dtype, device=device)


def shepp_logan_3d(shape, voxel_spacing=1.0, *, modified: bool = True, scale=None, supersample: int = 1,
                   dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The 3D Shepp-Logan head sampled at voxel centres, a tensor of shape ``shape``.

    ``shape`` is ``(D, H, W)`` or ``(H, W)`` (then the cut of the 3D phantom at
    z=0); ``voxel_spacing`` a scalar or ``(dz, dy, dx)`` (``(dy, dx)`` for 2D),
    in mm.  ``scale`` is the length in mm of normalised coordinate 1.0,
    default ``min(D*dz, H*dy, W*dx) / 2`` (:func:`default_scale`).
    ``supersample > 1`` averages ``supersample**3`` sub-samples per voxel
    (``**2`` in 2D).  ``modified`` picks the table, see
    :func:`shepp_logan_ellipsoids`.
    """
    return ellipsoids_volume(shepp_logan_ellipsoids(modified), shape, voxel_spacing, scale, supersample,
                             dtype=dtype, device=device)


def ellipsoid_values(ellipsoids, points: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The pointwise phantom at world points ``(..., 3)`` (x, y, z), in float64."""
    ells = _check_ellipsoids(ellipsoids)
    scale = _positive_float(scale, "scale")
    p = torch.as_tensor(points, dtype=torch.float64)
    if p.shape[-1:] != (3,):
        raise ValueError(f"points must have shape (..., 3), got {tuple(p.shape)}")
    out = torch.zeros(p.shape[:-1], dtype=torch.float64, device=p.device)
    for e in ells:
        Ml, cl = e.world_to_unit(scale)
        M = torch.tensor(Ml, dtype=torch.float64, device=p.device)
        loc = (p - torch.tensor(cl, dtype=torch.float64, device=p.device)) @ M.T
        out += e.intensity * ((loc * loc).sum(-1) <= 1.0).to(torch.float64)
    return out


# ------------------------------------------------------------ line integrals
def ellipsoid_line_integrals(ellipsoids, origins: torch.Tensor, directions: torch.Tensor,
                             scale: float = 1.0) -> torch.Tensor:
    """Exact integrals of a sum of ellipsoids along whole lines ``origin + t * direction``.

    ``origins`` and ``directions`` are ``(N, 3)`` world vectors (x, y, z);
    directions need not be unit length (a zero direction gives 0).  Returns
    ``(N,)`` in the inputs' floating dtype (float64 is advised; integer
    inputs become float64), in intensity x mm.

    Per ellipsoid the line is mapped into the frame where the ellipsoid is
    the unit ball, ``o' = M (o - c)``, ``d' = M d``.  The line meets the ball
    where ``|o' + t d'|^2 = 1``; the two roots are ``2 sqrt(disc) / |d'|^2``
    apart in ``t`` with ``disc = |d'|^2 - |o' x d'|^2``, and ``t`` measures
    world length in units of ``|d|``.  The cross-product form of the
    discriminant avoids the cancellation of ``b^2 - a c`` for far origins.
    """
    ells = _check_ellipsoids(ellipsoids)
    scale = _positive_float(scale, "scale")
    o = torch.as_tensor(origins)
    d = torch.as_tensor(directions)
    if o.ndim != 2 or o.shape[1] != 3 or d.shape != o.shape:
        raise ValueError(f"origins and directions must both have shape (N, 3), got "
                         f"{tuple(o.shape)} and {tuple(d.shape)}")
    dt = torch.promote_types(o.dtype, d.dtype)
    if not dt.is_floating_point:
        dt = torch.float64
    o = o.to(dtype=dt)
    d = d.to(device=o.device, dtype=dt)
    n = o.shape[0]
    mats = [(torch.tensor(Ml, dtype=dt, device=o.device), torch.tensor(cl, dtype=dt, device=o.device), e.intensity)
            for e in ells for Ml, cl in [e.world_to_unit(scale)]]
    pieces = []
    for start in range(0, max(n, 1), _RAY_CHUNK):
        oc, dc = o[start:start + _RAY_CHUNK], d[start:start + _RAY_CHUNK]
        dlen = torch.linalg.vector_norm(dc, dim=1)
        total = torch.zeros(oc.shape[0], dtype=dt, device=o.device)
        for M, c, A in mats:
            op = (oc - c) @ M.T
            dp = dc @ M.T
            a = (dp * dp).sum(1)
            cr = torch.linalg.cross(op, dp, dim=1)
            disc = a - (cr * cr).sum(1)
            hit = (disc > 0) & (a > 0)
            # Safe operands keep sqrt and division (and their gradients) finite off the ellipsoid.
            root = torch.sqrt(torch.where(hit, disc, torch.ones_like(disc)))
            chord = 2.0 * root / torch.where(hit, a, torch.ones_like(a)) * dlen
            total = total + A * torch.where(hit, chord, torch.zeros_like(chord))
        pieces.append(total)
    return torch.cat(pieces)[:n]


def _detector(trajectory, detector_shape, detector_spacing):
    """Validate the detector arguments: ``(U, V)``, ``(du, dv)`` and whether to drop V."""
    from .geometry import Trajectory  # local import keeps this module importable on its own

    if not isinstance(trajectory, Trajectory):
        raise TypeError(f"trajectory must be a ctbench.geometry.Trajectory, got {type(trajectory).__name__}")
    squeeze = False
    if isinstance(detector_shape, numbers.Integral) and not isinstance(detector_shape, bool):
        if trajectory.ndim != 2:
            raise ValueError("detector_shape must be a pair (U, V) for a 3D trajectory; "
                             f"an int U is only accepted for ndim=2, got {detector_shape!r}")
        detector_shape, squeeze = (detector_shape, 1), True
    if isinstance(detector_shape, torch.Size):
        detector_shape = tuple(detector_shape)
    if not isinstance(detector_shape, (tuple, list)) or len(detector_shape) != 2:
        raise ValueError(f"detector_shape must be a pair (U, V) of positive integers, got {detector_shape!r}")
    for n in detector_shape:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"detector_shape must contain positive integers, got {tuple(detector_shape)!r}")
    U, V = (int(n) for n in detector_shape)
    if trajectory.ndim == 2 and V != 1:
        raise ValueError(f"detector_shape of a 2D trajectory must have V=1 (one row in z=0), got {(U, V)}")
    du, dv = _spacing(detector_spacing, 2, "detector_spacing")
    return U, V, du, dv, squeeze


def _box_corners(e: Ellipsoid, scale: float, device) -> torch.Tensor:
    """The 8 corners (8, 3) of the ellipsoid's oriented bounding box, in world mm."""
    R = torch.tensor(e.rotation, dtype=torch.float64, device=device)
    half = R * torch.tensor(e.semi_axes, dtype=torch.float64, device=device) * scale  # columns: scaled axes
    signs = torch.tensor([[x, y, z] for x in (-1.0, 1.0) for y in (-1.0, 1.0) for z in (-1.0, 1.0)],
                         dtype=torch.float64, device=device)
    return torch.tensor(e.center, dtype=torch.float64, device=device) * scale + signs @ half.T


def _shadow_window(corners, src, ctr, u, v, cone: bool, U: int, V: int, du: float, dv: float):
    """Pixel index ranges (slices) covering the shadow of a box on the detector, for a chunk of views.

    The shadow of a convex box is the convex hull of its projected corners,
    so their (u, v) bounding rectangle (plus one pixel of slack) bounds every
    pixel whose ray meets the ellipsoid.  A cone-beam ray is a whole line, so
    this holds only if every corner lies strictly on the detector side of the
    source; otherwise (or for rays parallel to the detector) the whole
    detector is returned.
    """
    full = (slice(0, U), slice(0, V))
    n = torch.linalg.cross(u, v, dim=1)                                 # detector normal, (n, 3)
    if cone:
        num = ((ctr - src) * n).sum(1, keepdim=True)                      # (n, 1)
        rel = corners[None, :, :] - src[:, None, :]                       # (n, 8, 3)
        den = (rel * n[:, None, :]).sum(-1)                               # (n, 8)
        if not bool((num * den > 0).all()):
            return full
        q = src[:, None, :] + (num / den)[..., None] * rel
    else:
        den = (src * n).sum(1, keepdim=True)                              # direction . normal
        if not bool((den != 0).all()):
            return full
        t = ((ctr[:, None, :] - corners[None, :, :]) * n[:, None, :]).sum(-1) / den
        q = corners[None, :, :] + t[..., None] * src[:, None, :]
    # Coordinates in the (possibly oblique) detector basis: solve the 2x2 Gram system.
    r = q - ctr[:, None, :]
    uu, uv, vv = (u * u).sum(1), (u * v).sum(1), (v * v).sum(1)
    ru, rv = (r * u[:, None, :]).sum(-1), (r * v[:, None, :]).sum(-1)
    det = (uu * vv - uv * uv)[:, None]
    alpha = (vv[:, None] * ru - uv[:, None] * rv) / det
    beta = (uu[:, None] * rv - uv[:, None] * ru) / det
    fi = alpha / du + (U - 1) / 2
    fj = beta / dv + (V - 1) / 2
    if not (bool(torch.isfinite(fi).all()) and bool(torch.isfinite(fj).all())):
        return full
    i0 = max(int(math.floor(float(fi.min()))) - 1, 0)
    i1 = min(int(math.ceil(float(fi.max()))) + 2, U)
    j0 = max(int(math.floor(float(fj.min()))) - 1, 0)
    j1 = min(int(math.ceil(float(fj.max()))) + 2, V)
    return slice(i0, max(i1, i0)), slice(j0, max(j1, j0))


def ellipsoid_projections(ellipsoids, trajectory, detector_shape, detector_spacing=1.0, *,
                          scale: float = 1.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Exact line integrals of any ellipsoids for every pixel of a scan: ``(n_views, U, V)``.

    Same arguments as :func:`shepp_logan_line_integrals`; ``scale`` defaults
    to 1.0 (ellipsoids given in mm).  Computed in float64 on the trajectory's
    device, returned as ``dtype``.

    Same chord formula as :func:`ellipsoid_line_integrals`, but it uses the
    structure of a view: one of origin and direction is constant over the
    detector and the other is affine in the pixel offsets ``(su, sv)``, so
    ``d'`` and ``o' x d'`` are affine too and are built by one broadcast add
    from per-view vectors instead of per-ray matrix products.
    """
    ells = _check_ellipsoids(ellipsoids)
    U, V, du, dv, squeeze = _detector(trajectory, detector_shape, detector_spacing)
    scale = _positive_float(scale, "scale")
    f64 = torch.float64
    src, ctr, u, v = (t.to(f64) for t in trajectory.tensors())
    dev = src.device
    cone = trajectory.beam == "cone"
    su = (torch.arange(U, dtype=f64, device=dev) - (U - 1) / 2) * du
    sv = (torch.arange(V, dtype=f64, device=dev) - (V - 1) / 2) * dv
    mats = [(torch.tensor(Ml, dtype=f64, device=dev), torch.tensor(cl, dtype=f64, device=dev), e.intensity)
            for e in ells for Ml, cl in [e.world_to_unit(scale)]]
    boxes = [_box_corners(e, scale, dev) for e in ells]

    def field(f0, fu, fv, iu, jv):
        """Per-view vectors (n, 3) -> affine field f0 + su*fu + sv*fv over a pixel window, (n, u, v, 3)."""
        return ((f0[:, None, :] + su[iu][None, :, None] * fu[:, None, :])[:, :, None, :]
                + (sv[jv][None, :, None] * fv[:, None, :])[:, None, :, :])

    full = (slice(0, U), slice(0, V))
    per = max(1, _RAY_CHUNK // (U * V))  # views per step: bounds the (views, U, V, 3) temporaries
    out = []
    for v0 in range(0, trajectory.n_views, per):
        s_, c_, u_, v_ = src[v0:v0 + per], ctr[v0:v0 + per], u[v0:v0 + per], v[v0:v0 + per]
        # World direction length of every ray: t in the chord formula counts units of |d|.
        if cone:
            dlen = torch.linalg.vector_norm(field(c_ - s_, u_, v_, *full), dim=-1)
        else:
            dlen = torch.linalg.vector_norm(s_, dim=1)[:, None, None].expand(-1, U, V)
        total = torch.zeros((s_.shape[0], U, V), dtype=f64, device=dev)
        for (M, c, A), corners in zip(mats, boxes):
            # Only the pixels in the shadow of the ellipsoid's box can see it (small ones cover few).
            iu, jv = _shadow_window(corners, *(t.detach() for t in (s_, c_, u_, v_)), cone, U, V, du, dv)
            if iu.stop <= iu.start or jv.stop <= jv.start:
                continue
            Mu, Mv = u_ @ M.T, v_ @ M.T
            if cone:
                op = (s_ - c) @ M.T                        # origin: the source, same for the whole view
                d0 = (c_ - s_) @ M.T
                dp = field(d0, Mu, Mv, iu, jv)
                cr = field(torch.linalg.cross(op, d0, dim=1), torch.linalg.cross(op, Mu, dim=1),
                           torch.linalg.cross(op, Mv, dim=1), iu, jv)
                a = (dp * dp).sum(-1)
            else:
                dp = s_ @ M.T                              # direction: the same for the whole view
                o0 = (c_ - c) @ M.T
                cr = field(torch.linalg.cross(o0, dp, dim=1), torch.linalg.cross(Mu, dp, dim=1),
                           torch.linalg.cross(Mv, dp, dim=1), iu, jv)
                a = (dp * dp).sum(-1)[:, None, None]
            disc = a - (cr * cr).sum(-1)
            hit = (disc > 0) & (a > 0)
            root = torch.sqrt(torch.where(hit, disc, torch.ones_like(disc)))
            chord = 2.0 * root / torch.where(hit, a, torch.ones_like(a)) * dlen[:, iu, jv]
            total[:, iu, jv] += A * torch.where(hit, chord, torch.zeros_like(chord))
        out.append(total)
    sino = torch.cat(out) if out else torch.zeros((0, U, V), dtype=f64, device=dev)
    if squeeze:
        sino = sino[..., 0]
    return sino.to(dtype)


def shepp_logan_line_integrals(trajectory, detector_shape, detector_spacing=1.0, *, modified: bool = True,
                               scale: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Exact line integrals of the 3D Shepp-Logan head for every detector pixel of a scan.

    ``detector_shape`` is ``(U, V)`` and the result ``(n_views, U, V)``; for a
    2D trajectory (``ndim=2``, one row in z=0) it may be an int ``U`` and the
    result is ``(n_views, U)``.  ``detector_spacing`` is a scalar or
    ``(du, dv)`` in mm; ``scale`` is the length in mm of normalised
    coordinate 1.0 (use the same value as for :func:`shepp_logan_3d`, e.g.
    :func:`default_scale` of its shape).  Rays in the plane z=0 integrate the
    2D ``shepp_logan_3d((H, W))`` slice phantom.
    """
    return ellipsoid_projections(shepp_logan_ellipsoids(modified), trajectory, detector_shape, detector_spacing,
                                 scale=scale, dtype=dtype)


# ---------------------------------------------------------------- chiral phantom
# An "F" (no mirror line in any axial slice), a helix of balls that climbs anticlockwise seen from +z (a
# handedness in 3D), and one tilted ellipsoid, in a soft body.  A reconstruction that comes out mirrored in
# x, in y or in z correlates worse with this phantom than with the mirror image.  Normalised units, like the
# Shepp-Logan head: everything stays inside the ball of radius 0.85.
#        A      a      b      c       x0      y0      z0
_CHIRAL_BODY = (0.2, (0.80, 0.80, 0.58), (0.0, 0.0, 0.0))
_CHIRAL_F = (
    (0.8, (0.09, 0.46, 0.62), (-0.22, -0.02, 0.0)),    # stem
    (0.8, (0.26, 0.08, 0.62), (0.05, 0.36, 0.0)),      # top arm (long)
    (0.8, (0.15, 0.07, 0.62), (-0.04, 0.02, 0.0)),     # middle arm (short)
)
_CHIRAL_HELIX = 5          # balls, at 72 degrees steps, radius 0.1, on a circle of radius 0.56


def chiral_ellipsoids() -> list[Ellipsoid]:
    """The ellipsoids of ctbench's chiral test phantom in normalised coordinates (see :func:`chiral_phantom`)."""
    A, axes, centre = _CHIRAL_BODY
    out = [Ellipsoid(A, axes, centre)]
    out += [Ellipsoid(a, ax, c) for a, ax, c in _CHIRAL_F]
    for k in range(_CHIRAL_HELIX):
        t = math.radians(200.0 + 72.0 * k)       # anticlockwise seen from +z as z rises
        z = -0.42 + 0.21 * k
        out.append(Ellipsoid.sphere(0.1, (0.56 * math.cos(t), 0.56 * math.sin(t), z), intensity=0.6))
    out.append(Ellipsoid.from_euler(-0.15, (0.16, 0.07, 0.22), (0.38, -0.40, -0.18), phi=35.0, theta=40.0))
    return out


def chiral_phantom(shape, voxel_spacing=1.0, *, scale=None, supersample: int = 1,
                   dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """A phantom without mirror symmetry, for orientation tests: shape ``(D, H, W)`` or ``(H, W)``.

    Every axial slice with any content holds the letter "F" (which is a little taller than the body) (upright with
    +y up and +x to the right, the arms pointing to +x), so no slice equals
    its mirror image; five balls climb anticlockwise (seen from +z) as z
    grows, so the volume is not its own mirror in z either; a tilted
    ellipsoid sits in the (+x, -y) quadrant.  Same ``scale`` rule as
    :func:`shepp_logan_3d`; exact line integrals: :func:`chiral_line_integrals`.
    """
    return ellipsoids_volume(chiral_ellipsoids(), shape, voxel_spacing, scale, supersample, dtype=dtype,
                             device=device)


def chiral_line_integrals(trajectory, detector_shape, detector_spacing=1.0, *, scale: float,
                          dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Exact line integrals of :func:`chiral_phantom` (same arguments as :func:`shepp_logan_line_integrals`)."""
    return ellipsoid_projections(chiral_ellipsoids(), trajectory, detector_shape, detector_spacing, scale=scale,
                                 dtype=dtype)
