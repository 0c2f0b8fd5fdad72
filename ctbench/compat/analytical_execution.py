"""diffct 2.5's ``diffct.analytical_execution``: one analytic reconstruction (FBP/FDK) as an object.

``AnalyticalExecution(source, trajectory, volume_shape, angles, beam=..., **options)`` checks a
request, and then ``tensor_result()`` (differentiable) or ``into(output)`` (a block store, numerical)
runs diffct's recipe view batch by view batch:

1. pre-weight the views: ``projection_weights`` if given, else the detector-normal cosine
   ``d_k / |pixel - source|`` of fan and cone rays (``d_k`` the source-detector distance along the
   normal), times Parker's weights with ``short_scan=True``;
2. filter along ``u``: the ramp of :func:`ctbench.compat.analytical.ramp_filter_1d` (``window``,
   ``pad_factor``), or a learned real frequency response ``filter_response`` of
   ``pad_factor * U // 2 + 1`` bins applied to the centred zero-padded rows;
3. multiply by the angular quadrature ``angular_weights`` (default:
   :func:`~ctbench.compat.analytical.angular_integration_weights` of the angles);
4. gather with ctbench's voxel-driven weighted backprojection (``sid/(2 pi sdd)`` and the squared
   magnification for fan and cone, ``1/(2 pi)`` for parallel beams; ``ctbench.compat.weighted``).

The batches (``view_chunk_size`` views; default 32) are summed in view order in both modes, and a
voxel's value does not depend on the slab it is computed in, so ``into`` writes exactly what
``tensor_result`` returns.  ``into`` reads at most ``view_chunk_size`` views at a time and writes
z-slabs of the depth ``volume_chunk_shape`` allows (:func:`ctbench.compat.operators.slab_planes`).
Gradients reach the source and the three learned options (never the geometry, as in diffct).

The request (the acquisition's dtypes and a digest of its values, shapes, options) goes to the
:class:`~ctbench.compat.distribution.Partition`'s ``preflight`` with any validation error, where
ranks would agree before any data is read; in one process ``preflight`` raises that error.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import numbers

import torch
import torch.nn.functional as F

from ..engine.fdk_kernels import weighted_backproject
from ..engine.fdk_autograd import WeightedBackproject
from ..geometry import as_trajectory
from ._common import _filter_name
from .analytical import angular_integration_weights, parker_weights, ramp_filter_1d
from .distribution import Partition
from .operators import _positive, slab_planes
from ..projector import Projector
from ..storage import TensorStore as _MemoryStore
from ..storage.completion import same_location
from .weighted import _check_geometry, _cone_scale, _normals

__all__ = ["AnalyticalExecution", "reconstruct", "reconstruct_into"]

_ERRORS = (ValueError, TypeError, RuntimeError, OSError, NotImplementedError)
_NAMES = {2: ("src_pos", "det_center", "det_u_vec"), 3: ("src_pos", "det_center", "det_u_vec", "det_v_vec")}


def _learned(value, shape, name, *, exact):
    """A learned option: finite real values of ``shape`` (or broadcasting to it unless ``exact``)."""
    if value is None:
        return None
    value = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if value.is_complex() or not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"{name} must contain finite real floating-point values, got dtype {value.dtype}")
    if not torch.isfinite(value.detach()).all():
        raise ValueError(f"{name} must contain finite real floating-point values")
    try:
        ok = tuple(value.shape) == shape if exact else torch.broadcast_shapes(value.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} must {'have' if exact else 'broadcast to'} shape {shape}, got {tuple(value.shape)}")
    return value


def _overlap(a, b) -> bool:
    """Whether two tensors share storage (what ctbench's stores compare as their location)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    return same_location(_MemoryStore(a.detach()), _MemoryStore(b.detach()))


def _digest(t: torch.Tensor):
    """(shape, dtype, sha256 of the raw bytes): equal values in different dtypes differ."""
    raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return tuple(t.shape), str(t.dtype), hashlib.sha256(raw.numpy().tobytes()).hexdigest()


class AnalyticalExecution:
    """One diffct analytic reconstruction request (see the module); ``beam`` is keyword-only."""

    def __init__(self, source, trajectory, volume_shape, angles, *, beam, detector_spacing=1.0, voxel_spacing=1.0,
                 window="ram-lak", pad_factor=2, projection_weights=None, angular_weights=None,
                 filter_response=None, short_scan=False, isocenter=None, backend="auto", precision="fast",
                 devices=None, view_chunk_size=None, volume_chunk_shape=None, distributed=False,
                 process_group=None, partition="views", partition_grid=None):
        if not isinstance(distributed, bool):
            raise TypeError(f"distributed must be a bool, got {type(distributed).__name__}")
        if distributed or process_group is not None or partition_grid is not None:
            raise NotImplementedError("distributed analytic reconstruction is not part of ctbench's diffct face; "
                                      "see docs/FROM_DIFFCT.md")
        if devices is not None:
            raise NotImplementedError("devices= is not supported by ctbench's diffct analytic reconstruction")
        error, request, n_views = None, None, 0
        try:
            n_views = self._check(source, trajectory, volume_shape, angles, beam, detector_spacing, voxel_spacing,
                                  window, pad_factor, projection_weights, angular_weights, filter_response,
                                  short_scan, isocenter, backend, precision, view_chunk_size, volume_chunk_shape)
            learned = (self.projection_weights, self.angular_weights, self.filter_response)
            request = (self.beam, str(self.dtype), self.volume_shape, self.detector_shape, self.view_chunk_size,
                       self.slab, None if self.filter_response is not None else self.window, self.pad_factor,
                       self.short_scan,
                       tuple(None if w is None else (tuple(w.shape), str(w.dtype), w.requires_grad) for w in learned),
                       tuple(_digest(t) for t in (*self.geometry, self.angles)),
                       None if isocenter is None else tuple(torch.as_tensor(isocenter).reshape(-1).tolist()))
        except _ERRORS as caught:
            error = caught
        # a request that failed its checks still meets the other ranks (empty shares) to raise together
        self.partition = Partition(tuple(volume_shape) if error is None else (0,),
                                   n_views if error is None else 0, partition=partition)
        self.partition.preflight(error, request)

    # ------------------------------------------------------------------ checks
    def _check(self, source, trajectory, volume_shape, angles, beam, detector_spacing, voxel_spacing, window,
               pad_factor, projection_weights, angular_weights, filter_response, short_scan, isocenter, backend,
               precision, view_chunk_size, volume_chunk_shape) -> int:
        if beam not in ("parallel", "fan", "cone"):
            raise ValueError(f"beam must be 'parallel', 'fan', or 'cone', got {beam!r}")
        if backend not in ("auto", "torch", "numba"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'numba', got {backend!r}")
        if precision not in ("fast", "float32", "float64"):
            raise ValueError(f"precision must be 'fast', 'float32' or 'float64', got {precision!r}")
        self.beam, self.rank = beam, 3 if beam == "cone" else 2
        self.dtype = torch.float64 if precision == "float64" else torch.float32
        if isinstance(source, torch.Tensor):
            if not source.is_floating_point():
                raise ValueError("sinogram must have a real floating-point dtype")
        elif not (hasattr(source, "read") and hasattr(source, "shape")):
            raise TypeError(f"source must be a tensor or a block store, got {type(source).__name__}")
        shape = tuple(source.shape)
        if len(shape) != self.rank or min(shape[1:]) < 2:
            raise ValueError(f"sinogram must have {self.rank} dimensions with at least two bins on each detector "
                             f"axis, got shape {shape}")
        self.source, self.detector_shape = source, shape[1:]
        traj = as_trajectory(trajectory, beam=beam)
        n = traj.n_views
        if shape[0] != n:
            raise ValueError(f"sinogram has {shape[0]} views, the trajectory {n}")
        parts = tuple(trajectory) if isinstance(trajectory, (tuple, list)) else traj.tensors()
        for name, g in zip(_NAMES[self.rank], parts):  # the caller's tensors (diffct's 2-vectors for 2D)
            if isinstance(g, torch.Tensor) and g.requires_grad:
                raise ValueError(f"{name}: analytic reconstruction does not support geometry gradients")
        _check_geometry(traj.tensors(), _NAMES[self.rank], n, 3)
        self.geometry = tuple(torch.as_tensor(g) for g in parts)
        if not isinstance(angles, torch.Tensor):
            angles = torch.as_tensor(angles)
        if angles.requires_grad:
            raise ValueError("angles must not require grad (the acquisition angles are fixed)")
        if not angles.is_floating_point() or tuple(angles.shape) != (n,) or not torch.isfinite(angles).all():
            raise ValueError(f"angles must be a finite real vector with one unwrapped radian angle per view ({n})")
        self.angles = angles.detach()
        if not isinstance(volume_shape, (tuple, list, torch.Size)) or len(volume_shape) != self.rank:
            raise ValueError(f"volume_shape must have {self.rank} entries, got {volume_shape!r}")
        self.volume_shape = tuple(_positive(v, "volume_shape") for v in volume_shape)
        if isinstance(pad_factor, bool) or not isinstance(pad_factor, numbers.Integral) or pad_factor < 2:
            raise ValueError(f"pad_factor must be an integer >= 2 for analytical reconstruction, got {pad_factor!r}")
        self.pad_factor = int(pad_factor)
        self.window = _filter_name(window)
        self.view_chunk_size = min(32, n) if view_chunk_size is None else _positive(view_chunk_size,
                                                                                   "view_chunk_size")
        self.slab = slab_planes(volume_chunk_shape, self.volume_shape)
        # the write blocks of into (diffct's spatial tiles); the gather itself runs in z-slabs
        if isinstance(volume_chunk_shape, (tuple, list, torch.Size)):
            self.tile = tuple(int(c) for c in volume_chunk_shape)
        else:  # None, or ctbench's plane count
            self.tile = None if self.slab is None else (self.slab, *self.volume_shape[1:])
        if not isinstance(short_scan, bool):
            raise TypeError(f"short_scan must be a bool, got {type(short_scan).__name__}")
        if short_scan and beam == "parallel":
            raise ValueError("Parker short-scan weights apply to fan or cone beams, not parallel")
        self.short_scan = short_scan
        self.projection_weights = _learned(projection_weights, (n, *self.detector_shape), "projection_weights",
                                           exact=False)
        self.angular_weights = _learned(angular_weights, (n,), "angular_weights", exact=True)
        self.filter_response = _learned(filter_response, (self.pad_factor * self.detector_shape[0] // 2 + 1,),
                                        "filter_response", exact=True)
        if self.angular_weights is None:
            self.angular_weights = angular_integration_weights(self.angles.double() - self.angles[0].double())
        det = self.detector_shape if self.rank == 3 else self.detector_shape[0]
        self.projector = Projector(traj.to(device="cpu", dtype=self.dtype).detach(), self.volume_shape, det,
                                   detector_spacing=detector_spacing, voxel_spacing=voxel_spacing)
        self.du = float(self.projector.detector_spacing[0])
        if beam == "parallel":
            self.scale = torch.full((n,), 1 / (2 * math.pi), dtype=torch.float64)
        else:
            self.scale = _cone_scale(self.projector, isocenter, self.rank)
        self.parker = self._parker(n) if short_scan else None
        return n

    def _parker(self, n):
        s, c = (t.detach().to(device="cpu", dtype=torch.float64) for t in self.projector.trajectory.tensors()[:2])
        sdd = float(((c - s) * _normals(self.projector)).sum(1).mean())
        w = parker_weights(self.angles.double() - self.angles[0].double(), self.detector_shape[0], self.du, sdd)
        return w[..., None] if self.rank == 3 else w

    # ------------------------------------------------------------------ the recipe
    def _batches(self):
        n = self.projector.projection_shape[0]
        return [(a, min(a + self.view_chunk_size, n)) for a in range(0, n, self.view_chunk_size)]

    def _views(self, a, b):
        if isinstance(self.source, torch.Tensor):
            return self.source[a:b].to(self.dtype)
        rest = tuple(slice(0, m) for m in self.detector_shape)
        return self.source.read((slice(a, b),) + rest).to(self.dtype)

    def _cosine(self, a, b):
        """``d_k / |pixel - source|`` of views [a, b) (fan and cone rays)."""
        tr = self.projector.trajectory
        s, c, u = (t[a:b].detach().to(torch.float64) for t in tr.tensors()[:3])
        d = ((c - s) * _normals(self.projector)[a:b]).sum(1)
        du = self.projector.detector_spacing[0]
        iu = (torch.arange(self.detector_shape[0], dtype=torch.float64) - (self.detector_shape[0] - 1) / 2) * du
        rel = (c - s)[:, None, :] + iu[None, :, None] * u[:, None, :]
        if self.rank == 3:
            v = tr.tensors()[3][a:b].detach().to(torch.float64)
            dv = self.projector.detector_spacing[1]
            iv = (torch.arange(self.detector_shape[1], dtype=torch.float64) - (self.detector_shape[1] - 1) / 2) * dv
            rel = rel[:, :, None, :] + iv[None, None, :, None] * v[:, None, None, :]
            return (d[:, None, None] / rel.norm(dim=-1)).to(self.dtype)
        return (d[:, None] / rel.norm(dim=-1)).to(self.dtype)

    def _filter(self, x):
        if self.filter_response is None:
            return ramp_filter_1d(x, dim=1, sample_spacing=self.du, pad_factor=self.pad_factor, window=self.window)
        n = x.shape[1]
        m = self.pad_factor * n
        left = (m - n) // 2
        pad = (0, 0, left, m - n - left) if x.ndim == 3 else (left, m - n - left)
        response = self.filter_response.to(self.dtype).reshape((1, -1) + (1,) * (x.ndim - 2))
        y = torch.fft.irfft(torch.fft.rfft(F.pad(x, pad), dim=1) * response, n=m, dim=1)
        return y.narrow(1, left, n)

    def _filtered(self, a, b):
        """Views [a, b) pre-weighted, filtered and multiplied by their angular weights, (b-a, U, V)."""
        data = self._views(a, b)
        if self.projection_weights is not None:
            w = self.projection_weights.broadcast_to((self.projector.projection_shape[0], *self.detector_shape))
            data = data * w[a:b].to(self.dtype)
        elif self.beam != "parallel":
            data = data * self._cosine(a, b)
        if self.parker is not None:
            data = data * self.parker[a:b].to(self.dtype)
        q = self._filter(data) * self.angular_weights[a:b].to(self.dtype).reshape((-1,) + (1,) * (self.rank - 1))
        return q.unsqueeze(-1) if self.rank == 2 else q

    def _tiles(self, z0, z1):
        """Output windows of slab [z0, z1) (2D: the plane), each within ``volume_chunk_shape``."""
        shape = (z1 - z0, *self.volume_shape[1:]) if self.rank == 3 else self.volume_shape
        block = [min(c, m) for c, m in zip(self.tile, shape)] if self.tile else list(shape)
        base = (z0, 0, 0) if self.rank == 3 else (0, 0)
        starts = [range(0, m, c) for m, c in zip(shape, block)]
        for corner in itertools.product(*starts):
            yield tuple(slice(o + a, o + min(a + c, m)) for o, a, c, m in zip(base, corner, block, shape))

    def _rays(self, a, b):
        return self.projector._rays(None, self.dtype, torch.device("cpu")).views(a, b)

    def tensor_result(self) -> torch.Tensor:
        """The reconstruction as a tensor (float32, or float64 with ``precision="float64"``), differentiable
        with respect to the source and the learned options."""
        out = None
        for a, b in self._batches():
            part = WeightedBackproject.apply(self._filtered(a, b), self.scale[a:b].to(self.dtype), self._rays(a, b),
                                             self.projector.grid)
            out = part if out is None else out + part
        return out[0] if self.rank == 2 else out

    def into(self, output):
        """Write the reconstruction into ``output`` (a tensor or block store of ``volume_shape``) slab by slab;
        returns ``output``.  Numerical: learned options that require grad are refused."""
        if not isinstance(output, torch.Tensor) and not hasattr(output, "write"):
            raise TypeError(f"output must be a tensor or a block store, got {type(output).__name__}")
        if tuple(output.shape) != self.volume_shape:
            raise ValueError(f"output has shape {tuple(output.shape)}, expected volume_shape {self.volume_shape}")
        for name in ("projection_weights", "angular_weights", "filter_response"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                raise ValueError(f"into methods are numerical; detach {name}")
        # every refusal comes before the first read or write
        if isinstance(self.source, torch.Tensor) and self.source.requires_grad:
            raise ValueError("into methods are numerical; detach the source (fbp/fdk are differentiable)")
        if isinstance(output, torch.Tensor):
            if output.requires_grad:
                raise ValueError("output must not require grad: into writes outside autograd (detach it)")
            if not output.is_floating_point():
                raise TypeError(f"output must be a floating-point tensor, got {output.dtype}")
        elif getattr(output, "writable", True) is False:
            raise PermissionError(f"output {type(output).__name__} is read-only (writable=False)")
        if output is self.source or same_location(output, self.source) or _overlap(output, self.source):
            raise ValueError("output must not be (or share memory with) the source")
        D = self.volume_shape[0] if self.rank == 3 else 1
        step = self.slab or D
        grid = self.projector.grid
        with torch.no_grad():
            for z0 in range(0, D, step):
                z1 = min(z0 + step, D)
                acc = None
                for a, b in self._batches():
                    part = weighted_backproject(self._filtered(a, b), self._rays(a, b), grid,
                                                self.scale[a:b].to(self.dtype), z0=z0, z1=z1)
                    acc = part if acc is None else acc + part
                value = acc[0] if self.rank == 2 else acc
                for window in self._tiles(z0, z1):
                    local = window if self.rank == 2 else (slice(window[0].start - z0, window[0].stop - z0),
                                                           *window[1:])
                    if isinstance(output, torch.Tensor):
                        output[window].copy_(value[local])
                    else:
                        output.write(window, value[local].to(output.dtype))
            if hasattr(output, "flush"):
                output.flush()
        return output


def reconstruct(source, trajectory, volume_shape, angles, **kwargs):
    """``AnalyticalExecution(...).tensor_result()`` for a tensor source."""
    if not isinstance(source, torch.Tensor):
        raise TypeError("fbp/fdk input must be a tensor; use fbp_into/fdk_into for stores")
    return AnalyticalExecution(source, trajectory, volume_shape, angles, **kwargs).tensor_result()


def reconstruct_into(source, output, trajectory, volume_shape, angles, **kwargs):
    """``AnalyticalExecution(...).into(output)``."""
    return AnalyticalExecution(source, trajectory, volume_shape, angles, **kwargs).into(output)
