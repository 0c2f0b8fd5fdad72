"""Curved (non-planar) detectors: diffct 2.5's ``detector_surface=`` and :class:`ParameterizedSurface`.

A detector surface moves every pixel of a view off the flat detector.  It is sampled on the
centred physical pixel coordinates ``u`` (U, V) and ``v`` (U, V) (2D scans: ``(U,)`` each, ``v``
zeros), float64 on the CPU, and returns local offsets ``(t, w, h)`` per pixel, shared by all
views ``(*pixels, 3)`` or per view ``(n_views, *pixels, 3)``: the pixel sits at

    det_center + t * det_u + w * det_v + h * (det_u x det_v)

(2D: the normal is ``(u_y, -u_x)`` and ``w`` must be zero).  The flat detector is
``(u, v, 0)``.  ``detector_surface`` is either a callable ``surface(u, v)`` (its captured tensors
get gradients) or a :class:`ParameterizedSurface` ``(sampler, parameters)`` called as
``sampler(u, v, view_indices, *parameters)``.

:class:`SurfaceProjector` (what ``Projector(..., detector_surface=...)`` builds) runs ctbench's
engine unchanged: at each call every pixel becomes its own one-pixel view (same source, detector
centre at the pixel, the view's axes), so the Joseph projection, its exact adjoint and the
geometry gradients, through the pixel positions to the trajectory tensors and to the surface
parameters, are the flat projector's.  The result is reshaped to ``(n_views, U, V)``.  The
per-pixel trajectory holds 12 numbers per pixel and view: fine for test-sized and moderate
scans; for very large detectors split the views.
"""

from __future__ import annotations

import functools
import math

import torch

from ..geometry import Trajectory
from ..storage import check_store
from .cell_stats import surface_stats

__all__ = ["ParameterizedSurface", "SurfaceProjector"]


class ParameterizedSurface:
    """A detector surface with explicit learnable tensors: ``sampler(u, v, view_indices, *parameters)``
    returns ``(*pixels, 3)`` or ``(len(view_indices), *pixels, 3)`` local offsets (module docstring)."""

    def __init__(self, sampler, parameters=()):
        if not callable(sampler):
            raise TypeError(f"ParameterizedSurface sampler must be callable, got {type(sampler).__name__}")
        self.sampler = sampler
        self.parameters = tuple(parameters)
        for i, p in enumerate(self.parameters):
            if not isinstance(p, torch.Tensor) or not p.is_floating_point():
                raise TypeError(f"ParameterizedSurface parameters[{i}] must be a floating-point tensor, got "
                                f"{type(p).__name__}")
            if not torch.isfinite(p.detach()).all():
                raise ValueError(f"ParameterizedSurface parameters[{i}] must be finite")

    def __call__(self, u, v, view_indices):
        return self.sampler(u, v, view_indices, *self.parameters)

    def __repr__(self):
        return f"ParameterizedSurface({getattr(self.sampler, '__name__', self.sampler)!r}, " \
               f"{len(self.parameters)} parameters)"


def _pixel_grids(detector_shape, spacing, is_2d):
    U, V = detector_shape
    du, dv = spacing
    iu = (torch.arange(U, dtype=torch.float64) - (U - 1) / 2) * du
    if is_2d:
        return iu, torch.zeros_like(iu)
    iv = (torch.arange(V, dtype=torch.float64) - (V - 1) / 2) * dv
    return torch.meshgrid(iu, iv, indexing="ij")


def sample_offsets(surface, detector_shape, spacing, is_2d: bool, n_views: int) -> torch.Tensor:
    """The surface's offsets as ``(n_views or 1, *pixels, 3)``, checked (errors name ``detector_surface``)."""
    u, v = _pixel_grids(detector_shape, spacing, is_2d)
    if isinstance(surface, ParameterizedSurface):
        for i, p in enumerate(surface.parameters):
            if not torch.isfinite(p.detach()).all():
                raise ValueError(f"detector_surface parameters[{i}] must be finite")
        off = surface(u, v, torch.arange(n_views, dtype=torch.int64))
    else:
        off = surface(u, v)
    if not isinstance(off, torch.Tensor) or not off.is_floating_point():
        raise TypeError(f"detector_surface must return a floating-point tensor of local (t, w, h) offsets, got "
                        f"{type(off).__name__}" + (f" of {off.dtype}" if isinstance(off, torch.Tensor) else ""))
    pixels = tuple(u.shape)
    if tuple(off.shape) == (*pixels, 3):
        off = off.unsqueeze(0)
    elif tuple(off.shape) != (n_views, *pixels, 3):
        raise ValueError(f"detector_surface must return offsets of shape {(*pixels, 3)} (shared by all views) or "
                         f"{(n_views, *pixels, 3)} (per view), got {tuple(off.shape)}")
    if not torch.isfinite(off.detach()).all():
        bad = (~torch.isfinite(off.detach())).reshape(off.shape[0], -1).any(1).nonzero()[:, 0].tolist()
        raise ValueError(f"detector_surface returned non-finite offsets (in {'views' if off.shape[0] > 1 else 'the shared map'} "
                         f"{bad[:10]})")
    if is_2d and bool((off.detach()[..., 1] != 0).any()):
        raise ValueError("detector_surface offsets of a 2D scan must have a zero middle (w) coordinate")
    return off


def frame_count(beam) -> int:
    """How many frame tensors diffct's beam has: source (or ray), centre, u, and v in 3D."""
    if beam in ("cone", "parallel3d"):
        return 4
    if beam in ("fan", "parallel"):
        return 3
    raise ValueError(f"beam must be 'cone', 'parallel3d', 'fan' or 'parallel', got {beam!r}")


def compose_points(center, axis_u, axis_v, offsets, pixel_dims: int):
    """World positions of surface pixels: ``center + t u + w v + h n`` with ``n = u x v`` (3D),
    or ``center + t u + h (u_y, -u_x)`` (2D: ``axis_v`` None).  Frames are ``(n, r)``, offsets
    ``(*pixels, 3)`` or ``(n, *pixels, 3)`` with ``pixel_dims`` pixel axes; the result is
    ``(n, *pixels, r)`` in the promoted dtype."""
    shape = (center.shape[0], *([1] * pixel_dims), center.shape[-1])
    center, axis_u = center.reshape(shape), axis_u.reshape(shape)
    t, w, h = offsets.unbind(-1)
    points = center + t[..., None] * axis_u
    if axis_v is None:
        normal = torch.stack((axis_u[..., 1], -axis_u[..., 0]), -1)
        return points + h[..., None] * normal
    axis_v = axis_v.reshape(shape)
    nd = torch.promote_types(axis_u.dtype, axis_v.dtype)
    normal = torch.linalg.cross(axis_u.to(nd), axis_v.to(nd), dim=-1)
    return points + w[..., None] * axis_v + h[..., None] * normal


def check_pixels(source, points, beam: str, spacing_xyz, what: str, first: int = 0, coincide: bool = True) -> None:
    """diffct's call-time rules for surface pixels (``points`` ``(n, P, 3)``, ``source`` ``(n, 3)``):
    finite in the arithmetic's dtype; for diverging beams no pixel on its source, and the nearer of
    source and pixel within 1e6 voxels of the centre, both within 1e15 (what floating-point ray set-up
    resolves).  ``what`` names the dtype in the message; ``first`` is the index of the first view;
    ``coincide=False`` skips the coincidence rule (for reference frames, whose centre may be the source)."""
    if not bool(torch.isfinite(points).all()) or not bool(torch.isfinite(source).all()):
        bad = (~torch.isfinite(points)).reshape(points.shape[0], -1).any(1) | ~torch.isfinite(source).all(1)
        raise ValueError(f"detector_surface pixel positions are not finite in {what} (overflow) in views "
                         f"{(bad.nonzero()[:, 0] + first).tolist()[:10]}")
    if beam == "parallel":
        return
    same = (points == source[:, None, :]).all(-1)
    if coincide and bool(same.any()):
        raise ValueError(f"source and detector surface pixels must differ: a detector_surface pixel coincides "
                         f"with the source (in {what}) in views "
                         f"{(same.any(1).nonzero()[:, 0] + first).tolist()[:10]}; a ray needs two distinct end points")
    pitch = torch.as_tensor(spacing_xyz, dtype=torch.float64)
    ds = (source.to(torch.float64) / pitch).norm(dim=-1)[:, None]
    dp = (points.to(torch.float64) / pitch).norm(dim=-1)
    far = torch.maximum(ds, dp) > 1e15
    if bool(far.any()):
        raise ValueError(f"a source or detector_surface pixel lies more than 1e15 voxels from the volume centre in "
                         f"views {(far.any(1).nonzero()[:, 0] + first).tolist()[:10]}")
    far = torch.minimum(ds, dp) > 1e6
    if bool(far.any()):
        raise ValueError(f"a source and one of its detector_surface pixels both lie more than 1e6 voxels from the "
                         f"volume centre in views {(far.any(1).nonzero()[:, 0] + first).tolist()[:10]}")


def pixel_trajectory(trajectory: Trajectory, offsets: torch.Tensor, dtype, device, spacing_xyz=None,
                     view_chunk_size=None) -> Trajectory:
    """One one-pixel view per (view, pixel): the view's source (or ray direction) and axes, the
    detector centre at the pixel's position on the surface.  As diffct, the world points are
    composed only in ``dtype`` (the arithmetic the projection runs in), in the scan's own rank
    (2-vectors for 2D scans) and ``view_chunk_size`` views at a time, so that no intermediate
    holds more than one batch of pixels; with ``spacing_xyz`` (the voxel pitch, x first) each batch
    is checked (:func:`check_pixels`) as it is composed."""
    n = trajectory.n_views
    rank = 2 if trajectory.ndim == 2 else 3
    if spacing_xyz is not None:
        # the range rules also on the raw frames, in float64 (rounding to float32 may pull a far source
        # or detector centre onto the bound); frames only: the world points are composed once, below
        with torch.no_grad():
            raw = [t.detach().to(device="cpu", dtype=torch.float64)[:, :rank] for t in trajectory.tensors()[:2]]
            check_pixels(raw[0], raw[1][:, None, :], trajectory.beam, tuple(spacing_xyz)[:rank], "float64",
                         coincide=False)
    src, ctr, u, v = (t.to(device=device, dtype=dtype) for t in trajectory.tensors())
    off = offsets.to(device=device, dtype=dtype)
    step = n if view_chunk_size is None else max(1, int(view_chunk_size))
    parts = []
    for a in range(0, n, step):
        b = min(a + step, n)
        o = off if off.shape[0] == 1 else off[a:b]
        if rank == 2:
            p = compose_points(ctr[a:b, :2], u[a:b, :2], None, o, off.ndim - 2)
        else:
            p = compose_points(ctr[a:b], u[a:b], v[a:b], o, off.ndim - 2)
        if spacing_xyz is not None:
            check_pixels(src[a:b, :rank].detach(), p.detach().reshape(b - a, -1, rank), trajectory.beam,
                         tuple(spacing_xyz)[:rank], str(dtype), first=a)
        if rank == 2:  # ctbench's 2D scans live in the plane z = 0
            p = torch.cat([p, torch.zeros_like(p[..., :1])], -1)
        parts.append(p.expand(b - a, *p.shape[1:]))
    points = parts[0] if len(parts) == 1 else torch.cat(parts)
    per_view = math.prod(points.shape[1:-1])
    points = points.reshape(n * per_view, 3)

    def repeat(t):
        return t.repeat_interleave(per_view, dim=0)

    return Trajectory(repeat(src), points, repeat(u), repeat(v), beam=trajectory.beam, ndim=trajectory.ndim,
                      meta={"kind": "detector_surface"})


class SurfaceProjector:
    """A :class:`~ctbench.Projector` whose detector pixels lie on ``detector_surface`` (module docstring).

    Same arguments as the Projector; ``project``, ``backproject`` (both differentiable, each
    other's exact adjoint, with ``trajectory=`` overrides), ``inner_volume``,
    ``inner_projection`` and the shape attributes work; the block-store, planning and
    distributed options of the flat projector do not (they raise)."""

    _UNSUPPORTED = {"devices"}
    # torchrun ranks: the flat projector and every per-pixel projector share the partition; the
    # pixels of a rank's views are the per-pixel projector's views (_per_pixel)
    _RANKS = ("distributed", "process_group", "partition", "partition_grid")

    def __init__(self, trajectory, volume_shape, detector_shape, *, detector_surface, beam=None, detector_spacing=1.0,
                 voxel_spacing=1.0, backend="auto", precision=None, projector=None, projector_options=None,
                 **options):
        if not callable(detector_surface):
            raise TypeError(f"detector_surface must be callable or a ParameterizedSurface, got "
                            f"{type(detector_surface).__name__}")
        used = sorted(k for k in self._UNSUPPORTED if options.get(k) not in (None, False))
        if used:
            raise NotImplementedError(f"detector_surface= does not combine with {used} in ctbench; run one process "
                                      "per device (distributed=True) or without a curved detector")
        if projector is None:
            from ..projector import Projector as projector

            projector_options = {"backend": backend}
        elif not (isinstance(projector, type) and hasattr(projector, "_check_trajectory")):
            raise TypeError(f"projector must be a Projector class, got {projector!r}")
        self.detector_surface = detector_surface
        # diffct's frames (a tuple) are converted again at every call, so that in-place edits of the
        # caller's tensors count and each call has its own graph back to them
        self._frames = None if isinstance(trajectory, Trajectory) else trajectory
        # the flat projector holds the frames, shapes and grid; the per-pixel projector built at each
        # call is made the same way (same class and keywords), so it runs the same ray model
        # a class may name the checks its ray model needs of one-pixel views (``_check_ray_geometry``):
        # its flat-detector rules (unit, orthogonal, facing axes) are about frames, which check_pixels covers
        check = getattr(projector, "_check_ray_geometry", None)
        # (inner projectors: quiet about backend="auto", the surface projector's construction said it once)
        pixels = projector if check is None else type(f"SurfacePixels{projector.__name__}", (projector,),
                                                       {"_check_trajectory": check, "_QUIET_AUTO": True})
        self._make = functools.partial(pixels, **(projector_options or {}))
        # the flat frames are only a reference for the pixels: their own detector plane may be edge-on
        # or cut the volume (the surface moves every pixel), so they are checked as frames only; the
        # rays themselves are checked by check_pixels and by the per-pixel projector
        frames = type(f"SurfaceFrames{projector.__name__}", (projector,), {"_check_trajectory": projector._check_frames,
                                                                            "_QUIET_AUTO": True})
        self.flat = functools.partial(frames, **(projector_options or {}))(
            trajectory, volume_shape, detector_shape, beam=beam, detector_spacing=detector_spacing,
            voxel_spacing=voxel_spacing, **options)
        self._voxel_spacing_arg = voxel_spacing
        self._options = options
        # sample and check once now, so that a bad surface fails at construction, naming the argument;
        # in float64 and in the arithmetic diffct's precision runs (float32 unless "float64")
        off = sample_offsets(detector_surface, self.flat.detector_shape, self.flat.detector_spacing, self.flat.is_2d,
                             self.flat.n_views)
        work = torch.float64 if precision == "float64" else torch.float32
        pix = pixel_trajectory(self.flat.trajectory, off.detach(), work, "cpu", spacing_xyz=self._spacing_xyz(),
                               view_chunk_size=self._options.get("view_chunk_size"))
        self._per_pixel(pix)  # the per-pixel projector's own geometry rules, once now
        self.last_execution_stats = None  # diffct's report of the last call (compat/cell_stats.py)

    def surface_offsets(self) -> torch.Tensor:
        """The surface's current local offsets ``(n_views or 1, *pixels, 3)``, sampled now and detached (what
        a checkpoint fingerprints: the effective pixels, whatever changed the sampler or its tensors)."""
        flat = self.flat
        with torch.no_grad():
            return sample_offsets(self.detector_surface, flat.detector_shape, flat.detector_spacing, flat.is_2d,
                                  flat.n_views).detach()

    def _spacing_xyz(self):
        dz, dy, dx = self.flat.grid.spacing
        return dx, dy, dz

    # attributes of the flat projector that describe shapes and the grid
    _SHARED = ("trajectory", "beam", "is_2d", "grid", "global_volume_shape", "volume_shape", "local_volume_shape",
               "projection_shape", "detector_shape", "detector_spacing", "voxel_spacing", "n_views", "rank",
               "world_size", "view_slice", "volume_slice", "partition", "partition_grid", "view_world_size",
               "space_world_size", "process_group", "view_rank", "space_rank", "view_group", "space_group",
               "backend_name", "options")

    @property
    def volume_slice(self):
        """The owned part of the volume's first axis, as diffct's: a 2D scan's first axis is ``H`` (ctbench's
        core projector counts z-planes, one for a 2D volume)."""
        flat = self.__dict__["flat"]
        return slice(0, flat.volume_shape[0]) if flat.is_2d else flat.volume_slice

    def __getattr__(self, name):
        if name in SurfaceProjector._SHARED:
            return getattr(self.__dict__["flat"], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (a projector with a detector_surface "
                             "supports project, backproject and the inner products)")

    def _inner(self, trajectory, dtype, device):
        flat = self.flat
        if trajectory is None and self._frames is None:
            flat._check_current_geometry()  # the held tensors may have been edited in place
            tr = flat.trajectory
        else:
            tr = flat._check_override(self._frames if trajectory is None else trajectory)
        # sampled at every call: the surface's parameters may have changed since the last one
        off = sample_offsets(self.detector_surface, flat.detector_shape, flat.detector_spacing, flat.is_2d,
                             tr.n_views)
        return self._per_pixel(pixel_trajectory(tr, off, dtype, device, spacing_xyz=self._spacing_xyz(),
                                                view_chunk_size=self._options.get("view_chunk_size")))

    def _per_pixel(self, pix):
        flat = self.flat
        # of the flat projector's options only the memory bound and the ranks apply to one-pixel views
        ranks = {k: v for k, v in self._options.items() if k in self._RANKS and v is not None}
        distributed = bool(ranks.get("distributed"))
        inner = self._make(pix, flat.global_volume_shape if distributed else flat.volume_shape,
                           1 if flat.is_2d else (1, 1), beam=flat.beam, voxel_spacing=self._voxel_spacing_arg,
                           **{k: v for k, v in self._options.items() if k == "memory_budget"}, **ranks)
        if distributed:  # this rank's one-pixel views are the pixels of its flat views (same order)
            per = flat.detector_shape[0] * flat.detector_shape[1]
            inner.view_slice = slice(flat.view_slice.start * per, flat.view_slice.stop * per)
        return inner

    def _cast(self, x):
        # diffct's precision= (set by compat.operators.Projector): compute and return in its dtype
        dt = self.__dict__.get("dtype")
        if dt is not None and isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dt:
            return x.to(dt)
        return x

    def project(self, volume: torch.Tensor, trajectory=None) -> torch.Tensor:
        """Line integrals to the surface's pixels: ``(*batch, *volume_shape) -> (*batch, *projection_shape)``."""
        volume = self.flat._check_input(self._cast(volume), "volume", self.flat.volume_shape)
        self.last_execution_stats = None
        inner = self._inner(trajectory, volume.dtype, volume.device)
        y = inner.project(volume)
        self.last_execution_stats = surface_stats(self, getattr(inner, "last_execution_stats", None))
        batch = volume.shape[:volume.ndim - len(self.flat.volume_shape)]
        return y.reshape(*batch, *self.flat.projection_shape)

    def backproject(self, sinogram: torch.Tensor, trajectory=None) -> torch.Tensor:
        """The exact adjoint of :meth:`project`."""
        sinogram = self.flat._check_input(self._cast(sinogram), "sinogram", self.flat.projection_shape)
        self.last_execution_stats = None
        inner = self._inner(trajectory, sinogram.dtype, sinogram.device)
        batch = sinogram.shape[:sinogram.ndim - len(self.flat.projection_shape)]
        x = inner.backproject(sinogram.reshape(*batch, *inner.projection_shape))
        self.last_execution_stats = surface_stats(self, getattr(inner, "last_execution_stats", None))
        return x

    def _into(self, run, source, output, shapes, names, trajectory):
        src_shape, out_shape = shapes
        if isinstance(source, torch.Tensor):
            value = source
        else:
            value = check_store(source, names[0], src_shape).read()
        if not isinstance(output, torch.Tensor):
            check_store(output, names[1], out_shape)
        elif tuple(output.shape) != tuple(out_shape):
            raise ValueError(f"{names[1]} has shape {tuple(output.shape)}; this projector needs {tuple(out_shape)}")
        elif output.requires_grad:
            raise ValueError(f"{names[1]} must not require grad: *_into writes outside autograd (detach it)")
        with torch.no_grad():
            # the whole result is computed (and every check passed) before the output is touched
            result = run(value, trajectory)
            if isinstance(output, torch.Tensor):
                output.copy_(result)
            else:
                output.write(None, result.to(output.dtype))
        return output

    def project_into(self, volume_store, sinogram_store, *, device=None, trajectory=None):
        """diffct's ``project_into``: the projection of a dense volume (or block store) written into
        ``sinogram_store`` (tensor or block store); returns it.  Nothing is written if a check fails."""
        return self._into(self.project, _on(volume_store, device), sinogram_store,
                          (self.flat.volume_shape, self.flat.projection_shape), ("volume_store", "sinogram_store"),
                          trajectory)

    def backproject_into(self, sinogram_store, volume_store, *, device=None, trajectory=None):
        """diffct's ``backproject_into`` (see :meth:`project_into`)."""
        return self._into(self.backproject, _on(sinogram_store, device), volume_store,
                          (self.flat.projection_shape, self.flat.volume_shape), ("sinogram_store", "volume_store"),
                          trajectory)

    __call__ = project

    def inner_volume(self, a, b):
        return (a * b).sum()

    def inner_projection(self, a, b):
        return (a * b).sum()

    def __repr__(self):
        return f"SurfaceProjector({self.flat!r}, detector_surface={self.detector_surface!r})"



def _on(value, device):
    if device is None or not isinstance(value, torch.Tensor):
        return value
    return value.to(device)
