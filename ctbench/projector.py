"""Projector: the public, differentiable Joseph operator.

``Projector(trajectory, volume_shape, detector_shape)`` maps volumes
``(*batch, D, H, W)`` to sinograms ``(*batch, n_views, U, V)`` (2D scans:
``(*batch, H, W)`` to ``(*batch, n_views, U)``) and back.  Both directions
are torch autograd functions, each other's adjoint in backward, with
gradients for the trajectory tensors as well.
"""

from __future__ import annotations

import math
import operator
from typing import Sequence

import torch

from .engine import BACKENDS, Rays, VolumeGrid, get_backend
from .engine.executor import make_executor
from .engine.plan import check_chunk_options
from .engine.ops import backproject_op, project_op
from .geometry import Trajectory, as_trajectory, resolve_trajectory
from .geometry.trajectory import check_finite, check_geometry

_DTYPES = (torch.float32, torch.float64)


# The kernels take sizes as 32-bit ints (ctypes and CUDA would wrap larger ones silently).
_MAX_DIM = 2**31 - 1
# Spacings must survive float32 (the kernels' precision for float32 data) as normal numbers.
_MIN_SPACING, _MAX_SPACING = float(torch.finfo(torch.float32).tiny), float(torch.finfo(torch.float32).max)


def _integer(v, name: str, value) -> int:
    """``v`` as an int: ints, integer tensors/numpy scalars and integral floats (16.0); never 16.7 or True."""
    if isinstance(v, bool):
        raise ValueError(f"{name} must contain integers, got {value!r}")
    try:
        return operator.index(v)
    except TypeError:
        pass
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a tuple of positive integers, got {value!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise ValueError(f"{name} must contain integers, got {value!r} ({v!r} is not whole)")
    return int(f)


def _positive_ints(value, name: str, n: int | None = None) -> tuple[int, ...]:
    seq = value if isinstance(value, (tuple, list, torch.Size)) else (value,)
    t = tuple(_integer(v, name, value) for v in seq)
    if n is not None and len(t) != n:
        raise ValueError(f"{name} must have {n} entries, got {value!r}")
    if any(v <= 0 for v in t):
        raise ValueError(f"{name} must contain positive integers (zero-length axes are invalid), got {value!r}")
    if any(v > _MAX_DIM for v in t):
        raise ValueError(f"{name} entries must be below 2**31 (the kernels index with 32-bit sizes), got {value!r}")
    return t


def _spacing(value, name: str, n: int) -> tuple[float, ...]:
    if isinstance(value, bool) or (isinstance(value, (tuple, list)) and any(isinstance(v, bool) for v in value)):
        raise ValueError(f"{name} must be lengths in mm, got {value!r} (a boolean is not a length)")
    if isinstance(value, (int, float)):
        vals = (float(value),) * n
    else:
        vals = tuple(float(v) for v in value)
        if len(vals) != n:
            raise ValueError(f"{name} must be a scalar or {n} values, got {value!r}")
    if any(not math.isfinite(v) or v <= 0 for v in vals):
        raise ValueError(f"{name} must be positive and finite (mm), got {value!r}")
    if any(not _MIN_SPACING <= v <= _MAX_SPACING for v in vals):
        raise ValueError(f"{name} must lie in [{_MIN_SPACING:.3g}, {_MAX_SPACING:.3g}] mm so that float32 "
                         f"kernels see it unchanged (not 0 or inf), got {value!r}")
    return vals


def _check_detector_size(detector_shape) -> None:
    """One projection is indexed with 32-bit offsets by the FDK kernels."""
    U, V = detector_shape
    if U * V > _MAX_DIM:
        raise ValueError(f"detector_shape {tuple(detector_shape)} has {U * V} pixels; at most 2**31 - 1 are supported")


class Projector:
    """Joseph forward projector and its exact adjoint for any trajectory.

    Parameters
    ----------
    trajectory : Trajectory
        Per-view geometry; its tensors may require grad.
    volume_shape : (D, H, W), or (H, W) for 2D scans
    detector_shape : (U, V), or U for 2D scans
    beam : "cone" or "parallel"; defaults to the trajectory's beam.
    detector_spacing : pixel pitch (du, dv) in mm, or a scalar.
    voxel_spacing : (dz, dy, dx) in mm, or a scalar ((dy, dx) in 2D).
    backend : "auto" (cuda for CUDA tensors, cpu otherwise), "cpu", "cuda" or "reference".
    """

    def __init__(self, trajectory: Trajectory, volume_shape: Sequence[int], detector_shape, *,
                 beam: str | None = None, detector_spacing=1.0, voxel_spacing=1.0, backend: str = "auto",
                 **options):
        if options.pop("detector_surface", None) is not None:  # curved detectors: a projector built on this one
            raise TypeError(f"detector_surface= is not supported by {type(self).__name__}; use ctbench.Projector "
                            "(ctbench.compat.Projector), which builds a curved-detector projector")
        trajectory, beam = resolve_trajectory(trajectory, beam)  # diffct tuples and beam names (issue 17)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        unknown = set(options) - _EXTENSION_OPTIONS
        if unknown:
            raise TypeError(f"Projector got unexpected keyword arguments {sorted(unknown)}")
        self.beam = beam or trajectory.beam
        if self.beam not in ("cone", "parallel"):
            raise ValueError(f"beam must be 'cone' or 'parallel', got {self.beam!r}")

        vs = volume_shape if isinstance(volume_shape, (tuple, list, torch.Size)) else (volume_shape,)
        self.is_2d = len(vs) == 2
        if len(vs) not in (2, 3):
            raise ValueError(f"volume_shape must be (D, H, W) or, for 2D scans, (H, W); got {volume_shape!r}")
        if trajectory.ndim == 2 and not self.is_2d:
            raise ValueError(f"a 2D trajectory needs a 2D volume_shape (H, W), got {volume_shape!r}")
        vs = _positive_ints(vs, "volume_shape")
        self.global_volume_shape = (1, *vs) if self.is_2d else vs

        if self.is_2d:
            ds = detector_shape if isinstance(detector_shape, (tuple, list)) else (detector_shape,)
            if len(ds) == 2 and int(ds[1]) != 1:
                raise ValueError(f"2D scans have one detector row: detector_shape must be U or (U, 1), got {detector_shape!r}")
            self.detector_shape = (_positive_ints(ds[:1], "detector_shape")[0], 1)
            dy, dx = _spacing(voxel_spacing, "voxel_spacing", 2)
            self.voxel_spacing = (dy, dy, dx)  # the single plane's depth never enters: rays stay in z=0
            dsp = detector_spacing if isinstance(detector_spacing, (int, float)) else tuple(detector_spacing)[0]
            self.detector_spacing = _spacing(dsp, "detector_spacing", 1) * 2
        else:
            self.detector_shape = _positive_ints(detector_shape, "detector_shape", 2)
            self.voxel_spacing = _spacing(voxel_spacing, "voxel_spacing", 3)
            self.detector_spacing = _spacing(detector_spacing, "detector_spacing", 2)

        _check_detector_size(self.detector_shape)
        self.grid = VolumeGrid((1, *vs) if self.is_2d else vs, self.voxel_spacing)
        self.backend_name = backend
        self.trajectory = self._check_trajectory(trajectory)
        # Window sizes are checked up front, not at the first call that plans windows.
        check_chunk_options(self.grid.shape, self.detector_shape, options.get("volume_chunk_shape"),
                            options.get("view_chunk_size"), options.get("detector_chunk_shape"))
        self.options = options
        # Defaults of a single process; a strategy may narrow them (distributed ranks).
        self.rank, self.world_size = 0, 1
        self.view_slice = slice(0, self.n_views)
        self.volume_slice = slice(0, self.grid.shape[0])
        self.partition = None
        self.partition_grid, self.view_world_size, self.space_world_size = (1, 1), 1, 1
        self.process_group = None
        # One process is grid position (0, 0) of a (1, 1) grid; groups of one are None (docs/DISTRIBUTED.md).
        self.view_rank, self.space_rank = 0, 0
        self.view_group, self.space_group = None, None
        self._strategy = make_strategy(self, options)

    # ------------------------------------------------------------ attributes
    @property
    def n_views(self) -> int:
        return self.trajectory.n_views

    @property
    def volume_shape(self) -> tuple[int, ...]:
        """Shape that project() takes and backproject() returns on this process."""
        D, H, W = self.grid.shape  # (global_volume_shape is diffct's (H, W) for 2D on the diffct face)
        nz = self.volume_slice.stop - self.volume_slice.start
        return (H, W) if self.is_2d else (nz, H, W)

    def _slab_shape(self) -> tuple[int, int, int]:
        """This process's part of the grid as the engine sees it: (planes, H, W)."""
        D, H, W = self.grid.shape
        return (self.volume_slice.stop - self.volume_slice.start, H, W)

    @property
    def local_volume_shape(self) -> tuple[int, ...]:
        return self.volume_shape

    @property
    def projection_shape(self) -> tuple[int, ...]:
        """Shape that project() returns and backproject() takes on this process."""
        n = self.view_slice.stop - self.view_slice.start
        return (n, self.detector_shape[0]) if self.is_2d else (n, *self.detector_shape)

    # ------------------------------------------------------------- checking
    def _check_frames(self, trajectory: Trajectory) -> Trajectory:
        """The frame checks alone (:func:`check_frames`)."""
        return check_frames(trajectory, self.beam)

    def _check_trajectory(self, trajectory: Trajectory) -> Trajectory:
        self._check_frames(trajectory)
        if self.beam != "parallel":
            half = torch.tensor(self._box_half(), dtype=torch.float64)
            src = trajectory.source.detach().to(torch.float64).cpu()
            inside = (src.abs() < half).all(dim=1)
            if self.is_2d:
                inside = (src[:, :2].abs() < half[:2]).all(dim=1)
            if inside.any():
                raise ValueError(f"the source lies inside the volume in views {inside.nonzero()[:, 0].tolist()[:10]}; "
                                 "move the source outside (larger sid) or use a smaller volume")
        check_geometry(trajectory, self.beam, self._box_half(), min(self.grid.spacing))
        return trajectory

    def _box_half(self) -> tuple[float, float, float]:
        """Half extent (x, y, z) in mm of the global voxel grid (centred on the origin)."""
        (D, H, W), (dz, dy, dx) = self.grid.shape, self.grid.spacing
        return (W * dx / 2, H * dy / 2, D * dz / 2)

    def _check_current_geometry(self) -> None:
        """Call-time check of the held trajectory: its tensors are held by reference and may have
        been edited in place (a learnable parameter gone NaN) since construction.  CPU tensors are
        checked at every call (tens of microseconds); CUDA tensors when their version counter moved,
        so that unchanged geometry costs no device synchronisation."""
        ts = self.trajectory.tensors()
        if ts[0].device.type == "cpu":
            check_finite(ts)
            return
        key = tuple((t.data_ptr(), t._version) for t in ts)
        if key != getattr(self, "_checked_geometry_key", None):
            check_finite(ts)
            self._checked_geometry_key = key

    def _rays(self, trajectory: Trajectory | None, dtype, device) -> Rays:
        if trajectory is None:
            self._check_current_geometry()
        tr = self.trajectory if trajectory is None else self._check_override(trajectory)
        du, dv = self.detector_spacing
        src, ctr, u, v = (t.to(device=device, dtype=dtype) for t in tr.tensors())
        return Rays(src, ctr, u * du, v * dv, self.beam == "cone", self.detector_shape)

    def _check_override(self, trajectory: Trajectory) -> Trajectory:
        trajectory = as_trajectory(trajectory, like=self.trajectory)  # diffct tuples too (issue 17)
        if trajectory.n_views != self.trajectory.n_views:
            raise ValueError(f"trajectory override has {trajectory.n_views} views; this projector has "
                             f"{self.trajectory.n_views}")
        return self._check_trajectory(trajectory)

    @property
    def engine_backend(self) -> str:
        """The backend that runs ("cpu", "cuda", "reference", ...): the one of the last call, and before any
        call the one ``backend`` picks for the first of ``devices=`` (the CPU without it)."""
        ran = self.__dict__.get("_last_backend")
        if ran is not None:
            return ran
        if self.backend_name != "auto":
            return self.backend_name
        devices = self.options.get("devices")
        first = (devices[0] if isinstance(devices, (list, tuple)) and devices else devices) or "cpu"
        if isinstance(first, int) and not isinstance(first, bool):
            first = torch.device("cuda", first)
        try:
            kind = torch.device(first).type
        except (TypeError, RuntimeError):   # the strategy has refused such devices= already
            kind = "cpu"
        return "cuda" if kind == "cuda" else "cpu"

    def _executor(self, device: torch.device):
        """The executor that runs this projector's windows on ``device``."""
        backend = get_backend(self.backend_name, device)
        self._last_backend = backend.name
        if backend.name == "cuda" and device.type == "cpu" and torch.cuda.is_available():
            # CPU-backed arrays with a GPU backend: stream windows to the current GPU.
            return make_executor(backend, self.grid, self.detector_shape, self.options,
                                 compute_device=torch.device("cuda", torch.cuda.current_device()))
        if not backend.supports(device):
            raise ValueError(f"backend {backend.name!r} cannot run on {device}; pass tensors on "
                             f"{'a CUDA device' if backend.name == 'cuda' else 'the CPU'} or choose backend='auto'")
        return make_executor(backend, self.grid, self.detector_shape, self.options)

    def _check_input(self, x: torch.Tensor, name: str, core: tuple[int, ...]) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
        if tuple(x.shape[x.ndim - len(core):]) != core or x.ndim < len(core):
            raise ValueError(f"{name} must have shape (*batch, {', '.join(map(str, core))}), got {tuple(x.shape)}")
        return x

    # ------------------------------------------------------------ operators
    def project(self, volume: torch.Tensor, trajectory: Trajectory | None = None) -> torch.Tensor:
        """Line integrals of ``volume`` (*batch, *volume_shape) -> (*batch, *projection_shape)."""
        volume = self._check_input(volume, "volume", self.volume_shape)
        batch = volume.shape[:volume.ndim - len(self.volume_shape)]
        vol4 = volume.reshape(math.prod(batch), *self._slab_shape())  # -1 is ambiguous for empty slabs
        rays = self._rays(trajectory, volume.dtype, volume.device)
        sino = self._strategy.project(vol4, rays)
        return sino.reshape(*batch, *self.projection_shape)

    def backproject(self, sinogram: torch.Tensor, trajectory: Trajectory | None = None) -> torch.Tensor:
        """The exact adjoint of :meth:`project`: (*batch, *projection_shape) -> (*batch, *volume_shape)."""
        sinogram = self._check_input(sinogram, "sinogram", self.projection_shape)
        batch = sinogram.shape[:sinogram.ndim - len(self.projection_shape)]
        sino4 = sinogram.reshape(math.prod(batch), self.projection_shape[0], *self.detector_shape)  # zero-view shards
        rays = self._rays(trajectory, sinogram.dtype, sinogram.device)
        vol = self._strategy.backproject(sino4, rays)
        return vol.reshape(*batch, *self.volume_shape)

    # Inner products that solvers use, so that they stay correct under every
    # partition (a distributed strategy reduces across ranks: owned volume
    # parts are summed, replicated rays counted once).
    def inner_volume(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """<a, b> over the global volume, for tensors of this process's volume_shape."""
        return self._strategy.inner_volume(a, b)

    def inner_projection(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """<a, b> over all global rays, for tensors of this process's projection_shape."""
        return self._strategy.inner_projection(a, b)

    __call__ = project

    def __repr__(self) -> str:
        return (f"Projector({self.trajectory!r}, volume_shape={self.volume_shape}, "
                f"detector_shape={self.detector_shape}, beam={self.beam!r}, backend={self.backend_name!r})")

    # ---------------------------------------------- planning and block stores
    # (issue 6: ctbench/engine/plan.py and ctbench/storage/streaming.py)
    def plan(self, kind: str = "project", dtype: torch.dtype = torch.float32, device="cpu", *, batch: int = 1,
             volume_store=None, sinogram_store=None, memory_budget=None):
        """The windows and estimated peak bytes of a call (see docs/LARGE_VOLUMES.md).

        ``kind`` is "project" or "backproject" ("fdk" for the FDK backprojection); ``dtype`` and
        ``device`` describe the input tensors.  With ``volume_store`` and ``sinogram_store`` it is
        the plan of :meth:`project_into` / :meth:`backproject_into` / ``fdk_into`` on those stores.
        ``kind="cgls"`` is the capacity of disk-backed CGLS on this process (x, s, p, the rays,
        geometry and pipeline, in memory and on disk; ``memory_budget`` overrides the option).
        """
        if kind == "cgls":
            from .engine.plan import plan_cgls_for
            return plan_cgls_for(self, dtype, memory_budget=memory_budget,
                                 data_chunks=None if sinogram_store is None else sinogram_store.chunks,
                                 data_dtype=None if sinogram_store is None else sinogram_store.dtype)
        if volume_store is not None or sinogram_store is not None:
            from .storage.streaming import plan_into
            return plan_into(self, kind, volume_store, sinogram_store)
        from .engine.plan import plan_for
        return plan_for(self, kind, dtype, device, batch)

    def project_into(self, volume_store, sinogram_store, *, device=None):
        """Project a volume block store into a sinogram block store, window by window; returns the plan."""
        from .storage.streaming import project_into
        return project_into(self, volume_store, sinogram_store, device=device)

    def backproject_into(self, sinogram_store, volume_store, *, device=None):
        """Backproject a sinogram block store into a volume block store, slab by slab; returns the plan."""
        from .storage.streaming import backproject_into
        return backproject_into(self, sinogram_store, volume_store, device=device)
    # ------------------------------------------ end of planning and block stores


class SingleDeviceStrategy:
    """One process, one device: the whole call runs on the input's device."""

    def __init__(self, projector: "Projector"):
        self.p = projector

    def project(self, vol4: torch.Tensor, rays: Rays) -> torch.Tensor:
        p = self.p
        ex = p._executor(vol4.device)
        return project_op(vol4, *rays.tensors(), ex, p.volume_slice.start, rays.cone, p.detector_shape)

    def backproject(self, sino4: torch.Tensor, rays: Rays) -> torch.Tensor:
        p = self.p
        ex = p._executor(sino4.device)
        return backproject_op(sino4, *rays.tensors(), ex, p.volume_slice.start, p.volume_slice.stop, rays.cone,
                              p.detector_shape)

    def inner_volume(self, a, b):
        return (a * b).sum()

    def inner_projection(self, a, b):
        return (a * b).sum()


def make_strategy(projector: "Projector", options: dict):
    """Pick how calls are spread: one device, several devices, or torchrun ranks."""
    if options.get("distributed"):
        from .distributed.strategy import make_distributed_strategy
        return make_distributed_strategy(projector, options)
    stray = [k for k in ("process_group", "partition", "partition_grid") if options.get(k) is not None]
    if stray:
        raise ValueError(f"{', '.join(stray)} only apply with distributed=True "
                         "(one process per device under torchrun)")
    devices = options.get("devices")
    if devices is not None:
        from .engine.devices import MultiDeviceStrategy
        return MultiDeviceStrategy(projector, devices)
    return SingleDeviceStrategy(projector)


# Keyword options of the layers above one device: several devices, planning
# of windows under a memory budget, and torchrun ranks.
_EXTENSION_OPTIONS: set[str] = {
    "devices", "memory_budget", "volume_chunk_shape", "view_chunk_size", "detector_chunk_shape",
    "distributed", "process_group", "partition", "partition_grid",
}


def check_frames(trajectory: Trajectory, beam: str) -> Trajectory:
    """The frame checks alone: a Trajectory, finite, with views, non-zero axes and ray directions."""
    if not isinstance(trajectory, Trajectory):
        raise TypeError(f"trajectory must be a ctbench Trajectory, got {type(trajectory).__name__}")
    trajectory.validate_finite()
    if trajectory.n_views == 0:
        raise ValueError("trajectory has no views")
    for name in ("detector_u", "detector_v"):
        norms = getattr(trajectory, name).detach().norm(dim=1)
        if (norms == 0).any():
            raise ValueError(f"trajectory {name} has zero-length vectors in views "
                             f"{(norms == 0).nonzero()[:, 0].tolist()[:10]}")
    if beam == "parallel" and (trajectory.source.detach().norm(dim=1) == 0).any():
        raise ValueError("parallel-beam ray directions (trajectory.source) must be non-zero")
    return trajectory
