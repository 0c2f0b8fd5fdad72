"""Cylindrical (curved) detectors: a fast exact projector, and the geometry FDK reconstructs them with.

A cylindrical detector bends every view's detector about an axis along its
``v`` direction, towards the source: pixel ``(i, j)`` of view ``k`` sits at

    c + R sin(u/R) u_hat + v v_hat + R (cos(u/R) - 1) n_hat,   u = (i - (U-1)/2) du,  v = (j - (V-1)/2) dv

with ``c``, ``u_hat``, ``v_hat`` the view's detector centre and axes, ``n_hat``
the unit normal pointing away from the source and ``du`` the pitch along the
arc.  ``radius=None`` (the medical scanner's detector) centres the cylinder on
the source: its axis is the line through the source along ``v``, ``R`` is the
distance of the detector centre from that line, ``n_hat`` points from the line to
the centre and ``u_hat`` along the arc (turned, if need be, to the tangent on the
side of the given u); every column is then one fan angle ``u/R`` from the centre
column (equiangular sampling).  A detector centre offset sideways (a half-fan
scan's ``detector_offset``) so sits on a cylinder through that centre.  Flat
trajectories (``circular_trajectory_3d`` and every other generator) describe the
view frames, so calibrated per-view geometry carries over unchanged.

**The projector.**  Every detector column is a straight line along ``v`` with
its ``V`` pixels evenly spaced, so column ``i`` of view ``k`` is exactly a
one-column flat detector: :class:`CylindricalProjector` runs ctbench's Joseph
projector on ``n_views * U`` such column views (``(V, 1)`` pixels each, the
long axis first: its rays are neighbours in the kernel's inner loop).  The rays
are the cylinder's own rays, so the projection equals the per-pixel surface
projector's (``ctbench.compat.surfaces``, the oracle) to round-off, the
backprojection is its exact adjoint, and both are differentiable (in the
volume and the trajectory tensors) through the flat projector's autograd.

**FDK.**  :func:`ctbench.solvers.fdk` on a :class:`CylindricalProjector`
centred on the source filters the rows along the arc with the equiangular ramp
(Kak & Slaney), pre-weights every ray by the cosine of its angle to the central
ray, and backprojects with the kernels' cylinder mode (``cone == 2`` in
``kernels/fdk.cuh``): column ``R/du atan2(a, w)``, row ``R b/rho``, distance
weight ``(R/rho)^2`` with ``rho`` the voxel's in-plane distance to the source.
Parker (short scan) and Wang (displaced detector) weights use each column's
fan angle, measured from the vectors.
"""

from __future__ import annotations

import torch

from ..engine.base import Rays
from ..engine.fdk_kernels import CYLINDER
from ..geometry import Trajectory
from ..projector import Projector

__all__ = ["CylindricalProjector", "cylinder_pixels", "source_centred_frames"]

# attributes of the flat projector that describe shapes, grid and frames
_SHARED = ("trajectory", "beam", "is_2d", "grid", "global_volume_shape", "volume_shape", "local_volume_shape",
           "projection_shape", "detector_shape", "detector_spacing", "voxel_spacing", "n_views", "rank",
           "world_size", "view_slice", "volume_slice", "partition", "partition_grid", "view_world_size",
           "space_world_size", "process_group", "view_rank", "space_rank", "view_group", "space_group",
           "backend_name", "options")


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t / t.norm(dim=-1, keepdim=True)


def _away_normal(src, ctr, u, v, cone: bool) -> torch.Tensor:
    """Unit detector normal pointing away from the source (along the rays)."""
    n = _unit(torch.linalg.cross(u, v, dim=-1))
    if not cone:
        side = torch.sign((n * src).sum(-1, keepdim=True))
    else:
        side = torch.sign((n * (ctr - src)).sum(-1, keepdim=True))
    return n * torch.where(side == 0, torch.ones_like(side), side)


def source_centred_frames(src, ctr, u, v):
    """(u_hat, v_hat) of a cylinder about the line through the source along v that passes through the detector
    centre: v_hat along v, u_hat the arc's tangent at the centre, on the side of u (module docstring)."""
    vh = _unit(v)
    radial = (ctr - src) - ((ctr - src) * vh).sum(-1, keepdim=True) * vh
    tangent = _unit(torch.linalg.cross(vh, radial, dim=-1))
    side = torch.sign((tangent * u).sum(-1, keepdim=True))
    return tangent * torch.where(side == 0, torch.ones_like(side), side), vh


def cylinder_pixels(trajectory: Trajectory, detector_shape, detector_spacing, radius=None) -> torch.Tensor:
    """World positions ``(n_views, U, V, 3)`` of the pixel centres of a cylindrical detector (module docstring);
    differentiable in the trajectory tensors."""
    src, ctr, u, v = trajectory.tensors()
    if radius is None:
        u, v = source_centred_frames(src, ctr, u, v)
    U, V = detector_shape
    du, dv = detector_spacing
    uh, vh = _unit(u), _unit(v)
    n = _away_normal(src, ctr, u, v, trajectory.beam == "cone")
    R = _radius(src, ctr, n, radius)[:, None]
    arc = (torch.arange(U, dtype=src.dtype, device=src.device) - (U - 1) / 2) * du
    phi = arc[None, :] / R
    col = ctr[:, None, :] + (R * torch.sin(phi))[..., None] * uh[:, None, :] \
        + (R * (torch.cos(phi) - 1))[..., None] * n[:, None, :]
    rows = (torch.arange(V, dtype=src.dtype, device=src.device) - (V - 1) / 2) * dv
    return col[:, :, None, :] + rows[None, None, :, None] * vh[:, None, None, :]


def _radius(src, ctr, n, radius):
    if radius is None:
        return ((ctr - src) * n).sum(-1).abs()
    return torch.full(src.shape[:1], float(radius), dtype=src.dtype, device=src.device)


class CylindricalProjector:
    """A Joseph projector (and its exact adjoint) for a cylindrical detector (module docstring).

    Same arguments as :class:`~ctbench.Projector` plus ``radius`` (mm): None centres the cylinder on the
    source (radius = each view's source-to-detector distance: what FDK reconstructs), a number fixes it.
    ``detector_spacing`` is ``(du, dv)`` with ``du`` the pitch along the arc.  ``project``, ``backproject``
    (differentiable, each other's exact adjoint, with ``trajectory=`` overrides), ``inner_volume``,
    ``inner_projection`` and the shape attributes work as on the flat projector; the block-store and
    distributed options do not (they raise).  Cone and fan (2D) beams.
    """

    curved_detector = "cylinder"

    def __init__(self, trajectory, volume_shape, detector_shape, *, radius=None, detector_spacing=1.0,
                 voxel_spacing=1.0, backend: str = "auto", **options):
        unsupported = sorted(k for k in options if k not in ("memory_budget", "view_chunk_size"))
        if unsupported:
            raise TypeError(f"CylindricalProjector does not take {unsupported}; it supports backend, memory_budget "
                            "and view_chunk_size")
        self.flat = Projector(trajectory, volume_shape, detector_shape, detector_spacing=detector_spacing,
                              voxel_spacing=voxel_spacing, backend=backend, **options)
        if self.flat.beam != "cone":
            raise ValueError("CylindricalProjector needs a cone or fan beam (a curved detector of a parallel beam "
                             "is a flat detector's resampling)")
        if radius is not None:
            r = float(radius)
            if not (r > 0 and r == r and r != float("inf")):
                raise ValueError(f"radius must be a positive distance in mm or None, got {radius!r}")
            half_arc = (self.flat.detector_shape[0] - 1) / 2 * self.flat.detector_spacing[0]
            if half_arc / r >= 3.14159:
                raise ValueError(f"radius {r:g} mm is too small for a detector arc of {2 * half_arc:g} mm (more than "
                                 "a half turn each side)")
            radius = r
        self.radius = radius
        self._volume_shape_arg = tuple(volume_shape)
        self._options = dict(options, backend=backend)
        self._voxel_spacing_arg = voxel_spacing
        self._cached = None
        self._columns(self.flat.trajectory)  # checks the column views' geometry now

    @property
    def centred_on_source(self) -> bool:
        """Whether the cylinder's axis runs through the source in every view (what FDK reconstructs)."""
        if self.radius is None:
            return True
        src, ctr, u, v = (t.detach().double() for t in self.flat.trajectory.tensors())
        n = _away_normal(src, ctr, u, v, True)
        depth = ((ctr - src) * n).sum(-1).abs()
        return bool(((depth - self.radius).abs() <= 1e-6 * depth).all())

    def __getattr__(self, name):
        if name in _SHARED:
            return getattr(self.__dict__["flat"], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    # ------------------------------------------------------------------ the column views
    def _column_trajectory(self, trajectory: Trajectory) -> Trajectory:
        """One view per (view, column): the column's centre on the cylinder, u along the column (v), v across it."""
        src, ctr, u, v = trajectory.tensors()
        if self.radius is None:
            u, v = source_centred_frames(src, ctr, u, v)
        U, V = self.flat.detector_shape
        du, dv = self.flat.detector_spacing
        n_views = trajectory.n_views
        pix = cylinder_pixels(trajectory, (U, 1), (du, dv), self.radius)[:, :, 0, :]  # the columns' centres
        uh = _unit(u)
        n = _away_normal(src, ctr, u, v, True)
        R = _radius(src, ctr, n, self.radius)[:, None]
        phi = ((torch.arange(U, dtype=src.dtype, device=src.device) - (U - 1) / 2) * du)[None, :] / R
        tangent = torch.cos(phi)[..., None] * uh[:, None, :] - torch.sin(phi)[..., None] * n[:, None, :]
        along = _unit(v)[:, None, :].expand(n_views, U, 3)

        def per_column(t):
            return t[:, None, :].expand(n_views, U, 3).reshape(n_views * U, 3)

        # (along, -tangent): its normal points along the rays, as the generators' frames do
        return Trajectory(per_column(src), pix.reshape(-1, 3), along.reshape(-1, 3), (-tangent).reshape(-1, 3),
                          beam="cone", ndim=trajectory.ndim, meta={"kind": "cylinder columns"})

    def _columns(self, trajectory: Trajectory) -> Projector:
        """The flat projector of the column views (cached while the trajectory needs no gradient)."""
        frozen = not trajectory.requires_grad
        if frozen and self._cached is not None and self._cached[0] is trajectory:
            return self._cached[1]
        V = self.flat.detector_shape[1]
        det = 1 if self.flat.is_2d else (V, 1)
        spacing = self.flat.detector_spacing[0] if self.flat.is_2d else (self.flat.detector_spacing[1],
                                                                          self.flat.detector_spacing[0])
        inner = Projector(self._column_trajectory(trajectory), self._volume_shape_arg, det, detector_spacing=spacing,
                          voxel_spacing=self._voxel_spacing_arg, **self._options)
        if frozen:
            self._cached = (trajectory, inner)
        return inner

    def _inner(self, trajectory) -> Projector:
        if trajectory is None:
            self.flat._check_current_geometry()
            return self._columns(self.flat.trajectory)
        return self._columns(self.flat._check_override(trajectory))

    # ------------------------------------------------------------------ the operator
    def project(self, volume: torch.Tensor, trajectory=None) -> torch.Tensor:
        """Line integrals to the cylinder's pixels: ``(*batch, *volume_shape) -> (*batch, n_views, U, V)``
        (``(*batch, n_views, U)`` for fan 2D)."""
        volume = self.flat._check_input(volume, "volume", self.flat.volume_shape)
        y = self._inner(trajectory).project(volume)
        batch = volume.shape[:volume.ndim - len(self.flat.volume_shape)]
        return y.reshape(*batch, *self.flat.projection_shape)

    def backproject(self, sinogram: torch.Tensor, trajectory=None) -> torch.Tensor:
        """The exact adjoint of :meth:`project`."""
        sinogram = self.flat._check_input(sinogram, "sinogram", self.flat.projection_shape)
        inner = self._inner(trajectory)
        batch = sinogram.shape[:sinogram.ndim - len(self.flat.projection_shape)]
        return inner.backproject(sinogram.reshape(*batch, *inner.projection_shape))

    __call__ = project

    def inner_volume(self, a, b):
        return (a * b).sum()

    def inner_projection(self, a, b):
        return (a * b).sum()

    # ------------------------------------------------------------------ what FDK reads
    def _rays(self, trajectory, dtype, device) -> Rays:
        """The views' frames for the weighted backprojection: ``cone == CYLINDER``, u the arc pitch."""
        if trajectory is None:
            self.flat._check_current_geometry()
        tr = self.flat.trajectory if trajectory is None else self.flat._check_override(trajectory)
        du, dv = self.flat.detector_spacing
        src, ctr, u, v = (t.to(device=device, dtype=dtype) for t in tr.tensors())
        if self.radius is None:
            u, v = source_centred_frames(src, ctr, u, v)
        return Rays(src, ctr, _unit(u) * du, _unit(v) * dv, CYLINDER, self.flat.detector_shape)

    def __repr__(self):
        r = "source-centred" if self.radius is None else f"radius={self.radius:g} mm"
        return f"CylindricalProjector({self.flat!r}, {r})"
