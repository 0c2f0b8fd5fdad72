"""diffct 2.5's :class:`Projector` (``diffct.operators``) over ctbench's projector.

The class is ctbench's :class:`ctbench.projector.Projector` plus diffct's keywords, with diffct's
meanings (docs/FROM_DIFFCT.md, "Projector keywords"):

- ``backend``: ``"torch"`` (diffct's portable backend) runs ctbench's backend for the data's
  device (``"auto"``: compiled CPU kernels for CPU tensors, CUDA kernels for CUDA tensors);
  ``"numba"`` (diffct's native CUDA backend) is ctbench's ``"cuda"`` and, as in diffct, needs
  NVIDIA CUDA and ``precision="fast"``.  ctbench's own names (``"cpu"``, ``"cuda"``,
  ``"reference"``) work too.  ``backend`` then holds diffct's label (``"torch"`` or
  ``"numba"``), ``backend_name`` ctbench's.
- ``precision``: ``"fast"`` and ``"float32"`` compute and return float32, ``"float64"``
  float64, whatever the input dtype (gradients flow back through the cast); ``None`` (the
  default) keeps ctbench's rule, the input's dtype.  ``dtype`` is the resulting dtype (None for
  the input's).
- ``schedule``: ``"auto"``, ``"spatial"``, ``"views"`` or ``"window"`` is validated and kept:
  it orders diffct's GPU streaming; ctbench's planner orders its windows itself and the
  operator is the same (docs/FROM_DIFFCT.md).
- ``detector_chunk_shape``: diffct's ``(tu,)`` for 2D scans is ``(tu, 1)``.
- ``volume_chunk_shape``: diffct's shapes in tensor order, ``(h, w)`` for 2D volumes and
  ``(d, h, w)`` for 3D ones, are mapped onto ctbench's z-slab windows (:func:`slab_planes`).
- ``detector_surface``: curved detectors (:mod:`ctbench.compat.surfaces`).
- ``native_volume_layout``: accepted (a layout hint for diffct's native CUDA path; ctbench's
  volumes are always contiguous ``(D, H, W)``).
- ``projector(x)`` is ``projector.project(x)``; ``project_into``/``backproject_into`` also take
  dense tensors (written in place) and return ctbench's plan (diffct returns the output).
"""

from __future__ import annotations

import operator as _operator

import torch

from ..projector import Projector as _CoreProjector
from .backend_choice import auto_label, nvidia_cuda, warn_auto_fallback
from .cells import (CellStrategy, cell_backproject_into, cell_project_into, check_cell_geometry,
                    check_diffct_geometry)
from ._cell_ranks import CellDistributedStrategy, ranks_into
from .distribution import agree_surface_request, check_ownership, default_grid, owned_slices
from .geometry import TrajectoryTuple
from .surfaces import SurfaceProjector

__all__ = ["Projector", "BACKEND_ALIASES", "PRECISIONS", "SCHEDULES", "slab_planes"]

# diffct's backend names -> ctbench's (docs/FROM_DIFFCT.md)
BACKEND_ALIASES = {"torch": "auto", "numba": "cuda"}
PRECISIONS = {"fast": torch.float32, "float32": torch.float32, "float64": torch.float64}
SCHEDULES = ("auto", "spatial", "views", "window")
_UNSET = object()  # precision not given: diffct's "fast" on the diffct face, the input's dtype at top level


def _positive(value, name):
    if isinstance(value, bool):
        raise TypeError(f"{name} must contain positive integers, got {value!r}")
    try:
        v = _operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must contain positive integers, got {value!r}") from None
    if v < 1:
        raise ValueError(f"{name} must contain positive integers, got {value!r}")
    return v


def slab_planes(volume_chunk_shape, volume_shape):
    """ctbench's slab depth for diffct's ``volume_chunk_shape`` (None: no explicit bound).

    ctbench windows a volume into z-slabs only (one mechanism for threads, GPU tiles, disk and
    the space partition).  A diffct block ``(d, h, w)`` holds ``d*h*w`` voxels; the deepest slab
    holding no more voxels, ``floor(d*h*w / (H*W))`` planes (at least 1, at most D), keeps the
    memory bound the block set (a block smaller than one plane gets one plane: the smallest
    window ctbench has).  A plane count ``nz`` is ctbench's own spelling.  2D volumes are one
    plane: their ``(h, w)`` is validated and the whole plane is one window."""
    if volume_chunk_shape is None:
        return None
    is_2d = len(volume_shape) == 2
    if isinstance(volume_chunk_shape, int) and not isinstance(volume_chunk_shape, bool):
        return None if is_2d else _positive(volume_chunk_shape, "volume_chunk_shape")
    if not isinstance(volume_chunk_shape, (tuple, list, torch.Size)):
        raise TypeError(f"volume_chunk_shape must be a tuple of positive integers, got "
                        f"{type(volume_chunk_shape).__name__}")
    shape = tuple(_positive(v, "volume_chunk_shape") for v in volume_chunk_shape)
    if len(shape) != len(volume_shape):
        raise ValueError(f"volume_chunk_shape must have {len(volume_shape)} entries (tensor order), got "
                         f"{volume_chunk_shape!r}")
    if is_2d:
        return None
    D, H, W = volume_shape
    d, h, w = (min(a, b) for a, b in zip(shape, (D, H, W)))
    return max(1, min(D, (d * h * w) // (H * W)))


def _backend(backend, precision, options=None):
    if not isinstance(backend, str):
        raise ValueError(f"backend must be 'auto', 'numba', or 'torch' (or ctbench's 'cpu', 'cuda', 'reference'), "
                         f"got {backend!r}")
    if backend == "numba":
        if precision not in (None, "fast"):
            raise ValueError("numba requires precision='fast' and views/space partition")
        if not nvidia_cuda():
            raise RuntimeError("numba requires NVIDIA CUDA")
    core = BACKEND_ALIASES.get(backend, backend)
    if backend == "auto" or backend in BACKEND_ALIASES:
        native = backend == "auto" and auto_label(precision, options or {}) == "numba"  # diffct's rule
        label = "numba" if backend == "numba" or native else "torch"
    else:
        label = backend
    return core, label


def _core_options(volume_shape, backend, precision, schedule, volume_chunk_shape, native_volume_layout, options):
    if precision is not None and (not isinstance(precision, str) or precision not in PRECISIONS):
        raise ValueError("precision must be 'fast', 'float32', or 'float64'")
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError("schedule must be 'auto', 'spatial', 'views', or 'window'")
    if not isinstance(native_volume_layout, bool):
        raise TypeError(f"native_volume_layout must be True or False, got {native_volume_layout!r}")
    core_backend, label = _backend(backend, precision, options)
    vs = volume_shape if isinstance(volume_shape, (tuple, list, torch.Size)) else (volume_shape,)
    nz = slab_planes(volume_chunk_shape, tuple(vs))
    if nz is not None:
        options["volume_chunk_shape"] = nz
    nb = options.get("view_chunk_size")
    if nb is not None and not isinstance(nb, bool) and not isinstance(nb, int):
        try:  # diffct takes any integer type (NumPy's too)
            options["view_chunk_size"] = _operator.index(nb)
        except TypeError:
            pass  # the core check names the argument
    dcs = options.get("detector_chunk_shape")
    if isinstance(dcs, (tuple, list)):  # NumPy integers are integers to diffct
        dcs = tuple(v if isinstance(v, bool) or not hasattr(type(v), "__index__") else _operator.index(v) for v in dcs)
        if len(vs) == 2 and len(dcs) == 2 and dcs[1] != 1:
            raise ValueError(f"detector_chunk_shape of a 2D scan is (tu,) (one detector row), got {dcs!r}")
        options["detector_chunk_shape"] = (dcs[0], 1) if len(vs) == 2 and len(dcs) == 1 else dcs
    return core_backend, label, options


class Projector(_CoreProjector):
    """ctbench's Projector with diffct 2.5's keywords (module docstring); with
    ``detector_surface=`` it builds a :class:`~ctbench.compat.surfaces.SurfaceProjector`."""

    _AUTO_IS_DIFFCT = True  # backend="auto" means diffct's choice (its cell model off NVIDIA CUDA)
    _QUIET_AUTO = False  # True on the inner projectors of a SurfaceProjector (its own construction warns)

    def __new__(cls, trajectory, volume_shape, detector_shape, *, detector_surface=None,
                backend="auto", precision=_UNSET, schedule="auto", volume_chunk_shape=None,
                native_volume_layout=False, devices=None, distributed=False, process_group=None,
                partition="views", partition_grid=None, **kwargs):
        precision = cls._precision(precision)
        if detector_surface is not None:  # (the top-level subclass too: compat/keywords.py)
            if cls._AUTO_IS_DIFFCT:
                check_ownership(distributed, process_group, partition, partition_grid)
                if distributed:  # mismatched ranks fail together, before the refusal below
                    agree_surface_request(trajectory, volume_shape, detector_shape, detector_surface, backend,
                                          precision, schedule, process_group, partition, partition_grid, kwargs)
            kwargs.update(_ownership(cls._AUTO_IS_DIFFCT, devices, distributed, process_group, partition,
                                     partition_grid))
            core_backend, label, options = _core_options(volume_shape, backend, precision, schedule,
                                                         volume_chunk_shape, native_volume_layout, kwargs)
            sp = SurfaceProjector(_promoted(trajectory), volume_shape, detector_shape, detector_surface=detector_surface,
                                  backend=core_backend, precision=precision, **options,
                                  projector=cls, projector_options=dict(backend=backend, precision=precision,
                                                                        schedule=schedule))  # same model per pixel
            sp.__dict__.update(backend=label, precision=precision, schedule=schedule,
                               dtype=PRECISIONS.get(precision), native_volume_layout=native_volume_layout)
            if cls._AUTO_IS_DIFFCT and backend == "auto" and label == "torch":
                warn_auto_fallback(precision, options)
            return sp
        return object.__new__(cls)

    def __init__(self, trajectory, volume_shape, detector_shape, *, backend="auto", precision=_UNSET,
                 schedule="auto", volume_chunk_shape=None, native_volume_layout=False, detector_surface=None,
                 devices=None, distributed=False, process_group=None, partition="views", partition_grid=None,
                 **options):
        precision = self._precision(precision)
        if self._AUTO_IS_DIFFCT:
            check_ownership(distributed, process_group, partition, partition_grid)
        options.update(_ownership(self._AUTO_IS_DIFFCT, devices, distributed, process_group, partition,
                                  partition_grid))
        core_backend, label, options = _core_options(volume_shape, backend, precision, schedule,
                                                     volume_chunk_shape, native_volume_layout, options)
        # diffct's portable backend named explicitly: diffct's cell model (compat/cells.py) on one process
        # (and "auto", diffct's default, which is its portable backend off NVIDIA CUDA; ctbench's
        # top-level Projector keeps ctbench's engine for "auto": compat/keywords.py)
        self._cell_model = self._uses_cells(backend, label, options)
        self._float32_work = precision != "float64"
        if self._AUTO_IS_DIFFCT:
            _finite_first(trajectory, options.get("beam"))
        trajectory = _promoted(trajectory)
        # diffct's frames: a tuple with a part that requires grad stays live (re-read and re-checked at every
        # call, in-place edits included); one without is snapshotted now (later edits do not reach it)
        self._live_frames = None
        if self._cell_model and _is_parts(trajectory):
            if any(t.requires_grad for t in trajectory):
                self._live_frames = trajectory
            else:
                trajectory = _like(trajectory, [t.detach().clone() for t in trajectory])
        super().__init__(trajectory, volume_shape, detector_shape, backend=core_backend, **options)
        self.backend = label
        self.precision = precision
        self.dtype = PRECISIONS.get(precision)
        self.schedule = schedule
        self.native_volume_layout = native_volume_layout
        self.volume_chunk_shape = volume_chunk_shape
        self.model = "cells" if self._cell_model else "joseph"
        self.last_execution_stats = None  # diffct's report: the cell model's calls set it (compat/cell_stats.py)
        if self._AUTO_IS_DIFFCT and not self._QUIET_AUTO and backend == "auto" and label == "torch":
            warn_auto_fallback(precision, options)
        if self._cell_model:  # the same ranks and collectives with diffct's local operator
            self._strategy = (CellDistributedStrategy(self, self._strategy.layout) if distributed
                              else CellStrategy(self))
        if self._AUTO_IS_DIFFCT and not distributed:  # diffct names the partition of one process too
            self.partition = partition
        self._built = True

    # diffct's process_group is read-only once the projector is built (the strategy sets it while building)
    @property
    def process_group(self):
        return self.__dict__.get("_process_group")

    @process_group.setter
    def process_group(self, value):
        if self.__dict__.get("_built"):
            raise AttributeError("process_group is read-only: it is fixed when the projector is built")
        self.__dict__["_process_group"] = value

    # diffct's ownership attributes on the diffct face: volume_slice holds a slice per axis of the
    # caller's volume and a 2D volume's global shape is (H, W); ctbench's engine reads the slab's
    # planes (volume_slice.start/.stop) and its grid (self.grid.shape), which keep their meaning
    @property
    def _splits_2d_rows(self):  # diffct splits a 2D volume by rows; its cell model can (compat/_cell_ranks.py)
        return self._cell_model

    def _slab_shape(self):
        rows = self.__dict__.get("_rows")
        if rows is None:
            return super()._slab_shape()
        D, _, W = self.grid.shape
        return (D, rows.stop - rows.start, W)

    @property
    def volume_shape(self):
        rows = self.__dict__.get("_rows")
        if rows is None:
            return super().volume_shape
        return (rows.stop - rows.start, self.grid.shape[2])

    @property
    def volume_slice(self):
        planes = self.__dict__["_planes"]
        if not self._AUTO_IS_DIFFCT:
            return planes
        slices = owned_slices(planes, self.grid.shape, self.is_2d)
        rows = self.__dict__.get("_rows")
        return slices if rows is None else type(slices)((rows, *slices[1:]), planes)

    @volume_slice.setter
    def volume_slice(self, planes):
        self.__dict__["_planes"] = getattr(planes, "planes", planes)

    @property
    def global_volume_shape(self):
        shape = self.__dict__["_grid_volume_shape"]
        return shape[1:] if self._AUTO_IS_DIFFCT and self.is_2d else shape

    @global_volume_shape.setter
    def global_volume_shape(self, shape):
        self.__dict__["_grid_volume_shape"] = tuple(shape)

    @classmethod
    def _uses_cells(cls, backend, label, options) -> bool:
        names = ("torch", "auto") if cls._AUTO_IS_DIFFCT else ("torch",)
        # (distributed ranks run it too: compat/_cell_ranks.py; devices= is ctbench's multi-device engine)
        return backend in names and label == "torch" and not options.get("devices")

    @classmethod
    def _precision(cls, precision):
        # diffct's default is "fast" and it has no None; ctbench's top level defaults to the input's dtype
        if precision is _UNSET:
            return "fast" if cls._AUTO_IS_DIFFCT else None
        if precision is None and cls._AUTO_IS_DIFFCT:
            raise ValueError("precision must be 'fast', 'float32', or 'float64'")
        return precision

    def _check_trajectory(self, trajectory):
        if getattr(self, "_cell_model", False):  # the cell model takes any finite segment (compat/cells.py)
            check_cell_geometry(trajectory, self.beam)
            check_diffct_geometry(trajectory, self.beam, self.voxel_spacing, self._float32_work)
            return trajectory
        return super()._check_trajectory(trajectory)

    def _check_ray_geometry(self, trajectory):
        # the checks of one-pixel views of a curved detector (compat/surfaces.py): the flat-detector
        # axis rules of diffct's face do not apply to them
        if self._cell_model:
            check_cell_geometry(trajectory, self.beam)
            return trajectory
        return _CoreProjector._check_trajectory(self, trajectory)

    def _rays(self, trajectory, dtype, device):
        if trajectory is None and self._live_frames is not None:
            trajectory = self._live_frames  # live frames: rebuilt and checked as an override at every call
        return super()._rays(trajectory, dtype, device)

    def _check_override(self, trajectory):
        return super()._check_override(_promoted(trajectory))

    def _cast(self, x):
        # diffct's precision: the result dtype is the precision's, the input's cast is differentiable
        if self.dtype is not None and isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != self.dtype:
            return x.to(self.dtype)
        return x

    # diffct's per-call frames: trajectory= is keyword-only (ctbench's top level keeps it positional too)
    def project(self, volume, *, trajectory=None):
        return _CoreProjector.project(self, self._cast(volume), trajectory)

    def backproject(self, sinogram, *, trajectory=None):
        return _CoreProjector.backproject(self, self._cast(sinogram), trajectory)

    def __call__(self, volume, *, trajectory=None):
        return self.project(volume, trajectory=trajectory)

    # diffct's *_into also take dense tensors (written in place); ctbench's engine returns its plan,
    # diffct's cell model the output (as diffct does)
    def project_into(self, volume_store, sinogram_store, *, trajectory=None, device=None):
        if self._cell_model and self.options.get("distributed"):
            return ranks_into(self, "project", _store(volume_store, "source"), _store(sinogram_store, "output"),
                              trajectory)
        if self._cell_model:  # diffct's model streams itself
            cell_project_into(self, _store(volume_store, "source"), _store(sinogram_store, "output"), trajectory)
            return sinogram_store
        _no_override(trajectory)
        return _CoreProjector.project_into(self, _store(volume_store, "source"), _store(sinogram_store, "output"),
                                           device=device)

    def backproject_into(self, sinogram_store, volume_store, *, trajectory=None, device=None):
        if self._cell_model and self.options.get("distributed"):
            return ranks_into(self, "backproject", _store(sinogram_store, "source"), _store(volume_store, "output"),
                              trajectory)
        if self._cell_model:
            cell_backproject_into(self, _store(sinogram_store, "source"), _store(volume_store, "output"), trajectory)
            return volume_store
        _no_override(trajectory)
        return _CoreProjector.backproject_into(self, _store(sinogram_store, "source"), _store(volume_store, "output"),
                                               device=device)


def _ownership(diffct_face, devices, distributed, process_group, partition, partition_grid) -> dict:
    """The ownership keywords for ctbench's core Projector: a distributed run gets them all; one
    process on the diffct face keeps diffct's partition name for itself (nothing is split), and
    ctbench's top level passes what was given on (its core refuses a partition without ranks)."""
    out = {} if devices is None else {"devices": devices}
    if distributed:
        # (diffct picks a default hybrid grid; ctbench's top level asks for partition_grid)
        out.update(distributed=True, process_group=process_group, partition=partition,
                   partition_grid=default_grid(partition, partition_grid, process_group) if diffct_face
                   else partition_grid)
    elif not diffct_face:
        if distributed is not False:
            out["distributed"] = distributed
        out.update({k: v for k, v in (("process_group", process_group), ("partition_grid", partition_grid))
                    if v is not None})
        if partition != "views":
            out["partition"] = partition
    return out


def _no_override(trajectory):
    if trajectory is not None:
        raise ValueError("trajectory= in project_into/backproject_into needs diffct's model (backend='torch' or "
                         "'auto' on ctbench.compat.Projector); ctbench's engine streams the projector's own frames")


def _finite_first(trajectory, beam):
    """diffct's order of trajectory errors: a non-finite part wins over a shape error of a later part."""
    if not isinstance(trajectory, (tuple, list)):
        return
    dims = 3 if beam in (None, "cone", "parallel3d") else 2
    for t in trajectory:
        if not (isinstance(t, torch.Tensor) and t.ndim == 2 and t.shape[1] == dims and t.is_floating_point()):
            return
        if not bool(torch.isfinite(t.detach()).all()):
            raise ValueError("trajectory tensors must contain only finite values")


def _like(trajectory, parts):
    """``parts`` in the container ``trajectory`` came in (a TrajectoryTuple keeps its beam)."""
    beam = getattr(trajectory, "diffct_beam", None)
    if beam is not None:
        return TrajectoryTuple(parts, beam)
    return list(parts) if isinstance(trajectory, list) else tuple(parts)


def _is_parts(trajectory) -> bool:
    return isinstance(trajectory, (tuple, list)) and bool(trajectory) and all(
        isinstance(t, torch.Tensor) for t in trajectory)


def _promoted(trajectory):
    """diffct accepts trajectory parts of mixed float dtypes and float16: one dtype for all parts
    (float64 if any part is, else float32), as diffct computes in its work dtype anyway."""
    if _is_parts(trajectory):
        dtypes = {t.dtype for t in trajectory}
        if all(t.is_floating_point() for t in trajectory) and (len(dtypes) > 1 or dtypes - {torch.float32, torch.float64}):
            dtype = torch.float64 if torch.float64 in dtypes else torch.float32
            return _like(trajectory, [t.to(dtype) for t in trajectory])
    return trajectory


def _store(value, name):
    if not isinstance(value, torch.Tensor):
        if name == "output" and getattr(value, "writable", True) is False:  # before any read of the input
            raise PermissionError(f"output {value!r} is read-only (writable=False); *_into writes into it")
        if not hasattr(value, "chunks") and hasattr(value, "read") and hasattr(value, "write"):
            from .storage import ForeignStore  # a store of diffct's protocol (no chunks)

            return ForeignStore(value)
        return value
    if not value.is_contiguous():
        raise ValueError(f"{name} must be a contiguous tensor or a block store")
    if value.requires_grad and (name == "output" or torch.is_grad_enabled()):  # a source is fine under no_grad
        raise ValueError(f"{name} must not require grad: *_into writes blocks outside autograd (detach it)")
    from ..storage import TensorStore

    return TensorStore(value)

