"""Planning of windows under a memory budget (the slab principle of docs/ARCHITECTURE.md).

A projector call touches a volume slab ``[z0, z1)``, a batch of views and a
detector tile.  Because the projection of a volume is exactly the sum of the
projections of its slabs, and the backprojection into a slab is that slab of
the whole backprojection, a call can run as a sequence of windows whose
buffers are bounded, with results equal to the untiled call up to float
round-off.

:func:`make_plan` estimates the bytes each window holds and shrinks the
windows (halving the larger of the slab and the sinogram block) until they
fit ``memory_budget``.  Explicit ``volume_chunk_shape``, ``view_chunk_size``
and ``detector_chunk_shape`` are kept as given; the planner only shrinks
what the caller left open.  The result, a :class:`Plan`, lists the windows
in execution order and the estimated peak bytes; executors run exactly it.

Three modes, by where the data lives:

- ``"inplace"``: the tensors are on the compute device; windows are views of
  them and only the accumulators of non-contiguous windows are extra.
  Without an explicit budget the call is one window.
- ``"streamed"``: CPU-backed tensors, a CUDA compute device; slabs (project)
  or sinogram blocks (backproject) are copied through two pinned host and
  two device buffers so copies overlap the kernels.  The budget defaults to
  the device's free memory.
- ``"store"``: block stores on disk or in memory; one slab and one view batch
  are resident at a time, plus the store's chunk staging.  The budget
  defaults to a quarter of the available host memory.
"""

from __future__ import annotations

import dataclasses

import math
import os
import re
from dataclasses import dataclass, field

import torch

from .base import Tile

KINDS = ("project", "backproject", "fdk")
MODES = ("inplace", "streamed", "store")

# Share of free device memory that an automatic CUDA plan may use.
DEVICE_MEMORY_FRACTION = 0.8
# Share of available host memory that a store plan may use without a budget.
HOST_MEMORY_FRACTION = 0.25


class PlanError(ValueError):
    """The requested windows cannot fit the memory budget."""


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
          "t": 1000 ** 4, "tb": 1000 ** 4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(value, name: str = "memory_budget") -> int | None:
    """Bytes from an int/float or a string such as ``"64 MiB"`` or ``"2GB"``; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number of bytes or a string like '64 MiB', got {value!r}")
    if isinstance(value, (int, float)):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{name} must be a number of bytes or a string like '64 MiB', got {value!r}")
        n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    else:
        raise ValueError(f"{name} must be a number of bytes or a string like '64 MiB', got {value!r}")
    if (isinstance(n, float) and not math.isfinite(n)) or not 0 < n < 2 ** 63:   # 10**400 bytes: no machine
        raise ValueError(f"{name} must be a positive number of bytes below 2**63, got {value!r:.60}")
    return int(n)


def format_bytes(n: int | float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class Window:
    """One window: global planes ``[z0, z1)``, views ``[view0, view1)`` and a detector tile."""

    z0: int
    z1: int
    view0: int
    view1: int
    tile: Tile


@dataclass(frozen=True)
class Plan:
    """The windows of one call and what they cost.

    ``windows`` are in execution order: for ``project`` view batch, then tile,
    then slab (slab contributions are summed into a view-batch block); for
    ``backproject`` and ``fdk`` slab, then view batch, then tile (view
    contributions are summed into a slab).  ``buffers`` names the bytes that
    a window holds (allocated buffers, the largest window), ``working_set_bytes``
    is what a window touches (compared with ``budget``) and ``peak_bytes`` the
    estimated peak growth of memory on ``device`` during the call, including
    an output the call allocates in memory.
    """

    kind: str
    mode: str
    device: torch.device
    dtype: torch.dtype
    batch: int
    z_range: tuple[int, int]
    n_views: int
    detector_shape: tuple[int, int]
    slab_depth: int
    view_batch: int
    tile_shape: tuple[int, int]
    working_set_bytes: int
    peak_bytes: int
    budget: int | None
    buffers: dict = field(default_factory=dict)
    host_bytes: int = 0

    # ---------------------------------------------------------- the windows
    def slabs(self) -> list[tuple[int, int]]:
        z0, z1 = self.z_range
        return [(a, min(a + self.slab_depth, z1)) for a in range(z0, z1, self.slab_depth)] or [(z0, z1)]

    def view_batches(self) -> list[tuple[int, int]]:
        n = self.n_views
        return [(a, min(a + self.view_batch, n)) for a in range(0, n, self.view_batch)] or [(0, 0)]

    def tiles(self) -> list[Tile]:
        U, V = self.detector_shape
        tu, tv = self.tile_shape
        return [Tile(u, min(u + tu, U), v, min(v + tv, V)) for u in range(0, U, tu) for v in range(0, V, tv)]

    @property
    def windows(self) -> tuple[Window, ...]:
        slabs, batches, tiles = self.slabs(), self.view_batches(), self.tiles()
        if self.kind == "project":
            return tuple(Window(z0, z1, a, b, t) for a, b in batches for t in tiles for z0, z1 in slabs)
        return tuple(Window(z0, z1, a, b, t) for z0, z1 in slabs for a, b in batches for t in tiles)

    @property
    def n_windows(self) -> int:
        return len(self.slabs()) * len(self.view_batches()) * len(self.tiles())

    @property
    def single(self) -> bool:
        """True when the call runs as one window covering everything."""
        return self.n_windows == 1

    def __repr__(self) -> str:
        return (f"Plan({self.kind}, {self.mode} on {self.device}, {self.n_windows} windows: "
                f"slabs of {self.slab_depth} planes, {self.view_batch} views, tiles {self.tile_shape}; "
                f"working set {format_bytes(self.working_set_bytes)}, peak {format_bytes(self.peak_bytes)}, "
                f"budget {format_bytes(self.budget) if self.budget else 'none'})")


# ------------------------------------------------------------------ overrides
def check_chunk_options(grid_shape, detector_shape, volume_chunk_shape=None, view_chunk_size=None,
                        detector_chunk_shape=None):
    """Validate explicit window sizes; returns (slab depth | None, view batch | None, tile | None)."""
    D, H, W = grid_shape
    nz = None
    if volume_chunk_shape is not None:
        vcs = volume_chunk_shape
        if isinstance(vcs, int) and not isinstance(vcs, bool):
            vcs = (vcs,)
        try:
            vcs = tuple(vcs)
        except TypeError:
            vcs = None
        ok = vcs is not None and len(vcs) in (1, 3) and isinstance(vcs[0], int) and vcs[0] > 0
        if ok and len(vcs) == 3:
            ok = all(v in (None, -1, full) for v, full in zip(vcs[1:], (H, W)))
        if not ok:
            raise ValueError("volume_chunk_shape must be a positive plane count nz or (nz, H, W) with the full "
                             f"plane (volume windows are z-slabs; here H, W = {H}, {W}), got {volume_chunk_shape!r}")
        nz = vcs[0]
    nb = None
    if view_chunk_size is not None:
        if not isinstance(view_chunk_size, int) or isinstance(view_chunk_size, bool) or view_chunk_size <= 0:
            raise ValueError(f"view_chunk_size must be a positive integer, got {view_chunk_size!r}")
        nb = view_chunk_size
    tile = None
    if detector_chunk_shape is not None:
        dcs = detector_chunk_shape
        if isinstance(dcs, int) and not isinstance(dcs, bool):
            dcs = (dcs, detector_shape[1])
        try:
            dcs = tuple(dcs)
        except TypeError:
            dcs = ()
        if len(dcs) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in dcs):
            raise ValueError(f"detector_chunk_shape must be (tu, tv) positive pixel counts, got "
                             f"{detector_chunk_shape!r}")
        tile = (min(dcs[0], detector_shape[0]), min(dcs[1], detector_shape[1]))
    return nz, nb, tile


def _balanced(total: int, size: int, align: int = 1) -> int:
    """Shrink ``size`` so that ``ceil(total/size)`` windows come out even (aligned to ``align``)."""
    if total <= 0:
        return max(1, size)
    size = max(1, min(size, total))
    n = -(-total // size)
    even = -(-total // n)
    if align > 1:
        even = -(-even // align) * align
    return max(1, min(size, even))


# ------------------------------------------------------------- buffer model
@dataclass
class _Shape:
    kind: str
    mode: str
    B: int
    Nz: int
    n: int
    H: int
    W: int
    U: int
    V: int
    isz: int
    staging: object = None  # store mode: (nz, nb) -> (read, write) staging bytes of the stores
    filter_factor: float = 0.0  # fdk: peak bytes of filtering a block, per byte of the block
    filtered_ratio: float = 1.0  # fdk: bytes of a filtered block (oversampled rows) per byte of the block
    cpu_kernel: bool = False  # the compute runs in the CPU kernels (their own scratch counts too)


def _kernel_scratch(s: _Shape, nz: int, nb: int, tu: int, tv: int) -> int:
    """Bytes the CPU forward kernel allocates for itself: an x/y-swapped copy of the
    slab, made when a window has at least a quarter as many rays as slab voxels
    (the same rule as kernels/joseph_cpu.cpp)."""
    if not (s.cpu_kernel and s.kind == "project" and s.H > 1 and s.W > 1):
        return 0
    return s.B * nz * s.H * s.W * s.isz if nb * tu * tv >= (nz * s.H * s.W) // 4 else 0


def _buffers(s: _Shape, nz: int, nb: int, tu: int, tv: int) -> tuple[dict, int, int, int]:
    """Bytes of one window: (allocated buffers, working set, peak on the compute device, host bytes)."""
    slab = s.B * nz * s.H * s.W * s.isz
    block = s.B * nb * tu * tv * s.isz
    full_tile = (tu, tv) == (s.U, s.V)
    whole_volume = nz == s.Nz
    whole_views = nb == s.n
    single = whole_volume and whole_views and full_tile
    out_bytes = (s.B * s.n * s.U * s.V if s.kind == "project" else s.B * s.Nz * s.H * s.W) * s.isz
    buf: dict[str, int] = {}
    host = 0
    if s.mode == "inplace":
        working = slab + block
        if not single:
            # Views of the caller's tensors; only non-contiguous windows get copies.
            if s.kind == "project":
                if not whole_volume and s.B > 1:
                    buf["slab_copy"] = slab
                if not (full_tile and (s.B == 1 or whole_views)):
                    buf["block_accumulator"] = block
            else:
                if not whole_volume and s.B > 1:
                    buf["slab_accumulator"] = slab
                if not (full_tile and (s.B == 1 or whole_views)):
                    buf["block_copy"] = block
        buf["output"] = out_bytes
        scratch = _kernel_scratch(s, nz, nb, tu, tv)
        if scratch:
            buf["kernel_scratch"] = scratch
        peak = sum(buf.values())
    elif s.mode == "streamed":
        if s.kind == "project":
            n_slab = 1 if whole_volume else 2
            buf = {"device_slabs": n_slab * slab, "device_block": block}
            host = 2 * slab if not whole_volume else 0
        else:
            n_block = 1 if (whole_views and full_tile) else 2
            buf = {"device_blocks": n_block * block, "device_slab": slab}
            host = 2 * block if n_block == 2 else 0
        if host:
            buf["host_pinned"] = host
        working = peak = sum(v for k, v in buf.items() if k != "host_pinned")
    else:  # store: one slab and one view batch resident, plus chunk staging
        # Reading the input store and writing the output store never overlap:
        # project reads slabs into a live block, then writes the block;
        # backproject reads blocks into a live slab, then writes the slab.
        read_stage, write_stage = (int(v) for v in s.staging(nz, nb)) if s.staging else (0, 0)
        buf = {"slab": slab, "block": block, "read_staging": read_stage, "write_staging": write_stage}
        if s.kind == "project":
            scratch = _kernel_scratch(s, nz, nb, tu, tv)
            if scratch:
                buf["kernel_scratch"] = scratch
            working = block + max(slab + max(read_stage, scratch), write_stage)
        elif s.kind == "backproject":
            working = slab + max(block + read_stage, write_stage)
        else:
            # FDK filters each view batch once (raw block, pre-weights and FFT
            # buffers, then the filtered block), then backprojects the filtered
            # block into one slab at a time.
            buf["filter_transient"] = filtering = int(s.filter_factor * block)
            buf["filtered_block"] = filtered = int(s.filtered_ratio * block)
            working = max(block + filtering + read_stage, slab + filtered + max(read_stage, write_stage))
        peak = working
    return buf, working, peak, host


# ------------------------------------------------------------------- budgets
def free_device_memory(device: torch.device) -> int:
    """Bytes a CUDA plan may use: free memory plus torch's cached blocks, times DEVICE_MEMORY_FRACTION."""
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int((free + max(0, cached)) * DEVICE_MEMORY_FRACTION)


def available_host_memory() -> int:
    """MemAvailable from /proc/meminfo (Linux), else physical pages; bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def fdk_filter_factor(U: int, isz: int, padding: float = 2.0, oversample: int = 1) -> float:
    """Peak bytes of ramp-filtering a block, per byte of the block (measured on the CPU backend).

    The filtered block (``oversample`` times the block), float64 pre-weights
    (8/itemsize), the pre-weighted copy (one block), and spectra of rows
    zero-padded to a power of two (r = padded/U blocks each): the spectrum and
    its product with the ramp, or, when oversampling, the product, the
    zero-padded spectrum and its inverse (m x r each).  Calibrated against the
    measured peak (within 5 % for U = 96..256, oversample 1 and 2).
    """
    want = max(int(math.ceil(padding * U)), 2 * U - 1 if padding >= 2 else U, 2)
    r = (1 << (want - 1).bit_length()) / U
    spectra = 2.0 * r if oversample == 1 else r * (1 + 2 * oversample)
    return oversample + 8.0 / isz + 1.0 + spectra


# ------------------------------------------------------------------ planner
def make_plan(kind: str, grid_shape, detector_shape, n_views: int, *, z_range=None, batch: int = 1,
              dtype: torch.dtype = torch.float32, device="cpu", mode: str = "inplace", memory_budget=None,
              volume_chunk_shape=None, view_chunk_size=None, detector_chunk_shape=None,
              store_staging=None, store_align=(1, 1), fdk_padding=None,
              fdk_oversample=None, free_memory=None) -> Plan:
    """Choose the windows of one call.

    Parameters
    ----------
    kind : "project", "backproject" or "fdk" (fdk_into between stores: filtering, then the FDK kernel).
    grid_shape : global volume shape (D, H, W); detector_shape : (U, V).
    n_views : views of the call; z_range : global planes [z0, z1) of the call's slab (default all).
    batch : leading batch size B of the tensors.
    device : the compute device; mode : "inplace", "streamed" or "store" (module docstring).
    memory_budget : bytes (or "64 MiB") that a window may hold; None picks the mode's default.
    volume_chunk_shape, view_chunk_size, detector_chunk_shape : explicit window sizes, kept as given.
    store_staging : mode "store": a function (slab depth, view batch) -> (bytes the input store
        stages while reading its window, bytes the output store stages while writing its window).
    fdk_padding, fdk_oversample : kind "fdk": the ramp filter's padding and oversampling factors
        (its FFT buffers and the filtered block grow with them).
    store_align : mode "store": (z, view) chunk sizes of the volume and sinogram stores; windows are
        aligned to them where the budget allows, so that writes cover whole chunks.
    free_memory : mode "inplace" on a CUDA device without a budget: the bytes the call may use there
        (default :func:`free_device_memory`).  When the call's working set exceeds it, it becomes the
        budget and the call runs as windows (CUDA tensors whose working set does not fit).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if kind == "fdk" and mode != "store":
        raise ValueError("kind='fdk' plans fdk_into between block stores: pass volume_store and sinogram_store "
                         "(in-memory FDK is ctbench.solvers.fdk)")
    device = torch.device(device)
    D, H, W = (int(v) for v in grid_shape)
    U, V = (int(v) for v in detector_shape)
    z0, z1 = (0, D) if z_range is None else (int(z_range[0]), int(z_range[1]))
    Nz = max(0, z1 - z0)
    n = int(n_views)
    B = max(1, int(batch))
    isz = itemsize(dtype)
    fixed_nz, fixed_nb, fixed_tile = check_chunk_options((D, H, W), (U, V), volume_chunk_shape, view_chunk_size,
                                                         detector_chunk_shape)
    explicit_budget = parse_bytes(memory_budget)
    budget = explicit_budget
    if budget is None:
        if mode == "streamed" and device.type == "cuda":
            budget = free_device_memory(device)
        elif mode == "store":
            budget = int(available_host_memory() * HOST_MEMORY_FRACTION)

    fdk_padding = 2.0 if fdk_padding is None else float(fdk_padding)
    m = int(fdk_oversample or 1)
    shape = _Shape(kind, mode, B, Nz, n, H, W, U, V, isz, store_staging if mode == "store" else None,
                   fdk_filter_factor(U, isz, fdk_padding, m) if kind == "fdk" else 0.0,
                   ((U - 1) * m + 1) / U if kind == "fdk" else 1.0,
                   cpu_kernel=torch.device(device).type == "cpu" and mode != "streamed")

    nz = fixed_nz or max(1, Nz)
    nb = fixed_nb or max(1, n)
    tu, tv = fixed_tile or (U, V)
    nz, nb = min(nz, max(1, Nz)), min(nb, max(1, n))
    if mode == "store":
        tu, tv = U, V  # store windows write whole views

    def cost():
        return _buffers(shape, nz, nb, tu, tv)

    if budget is None and mode == "inplace" and device.type == "cuda" and fixed_nz is None and fixed_nb is None \
            and fixed_tile is None:
        free = int(free_memory) if free_memory is not None else free_device_memory(device)
        if cost()[1] > free:
            budget = free
    if budget is not None:
        while cost()[1] > budget:
            slab_b = B * nz * H * W
            block_b = B * nb * tu * tv * (1 + shape.filter_factor)
            can_z = fixed_nz is None and nz > 1
            can_v = fixed_nb is None and nb > 1
            can_t = fixed_tile is None and mode != "store" and (tu > 1 or tv > 1)
            if can_z and (slab_b >= block_b or not (can_v or can_t)):
                nz = -(-nz // 2)
            elif can_v:
                nb = -(-nb // 2)
            elif can_t:
                if tu > 1:
                    tu = -(-tu // 2)
                else:
                    tv = -(-tv // 2)
            else:
                need = cost()[1]
                what = ("the given volume_chunk_shape/view_chunk_size/detector_chunk_shape"
                        if (fixed_nz or fixed_nb or fixed_tile) else
                        "the smallest window (one plane, one view" + (")" if mode == "store" else ", one pixel)"))
                raise PlanError(
                    f"memory_budget={format_bytes(budget)} is too small for a single window: {what} needs "
                    f"{format_bytes(need)} ({need} bytes) for a {kind} on {device} ({mode}); raise memory_budget "
                    "or use smaller chunk shapes")
    # Even windows, aligned to store chunks where the budget allows.
    z_align, v_align = (int(a) for a in store_align) if mode == "store" else (1, 1)
    if fixed_nz is None and nz < Nz:
        if z_align > 1 and nz >= z_align and z0 % z_align == 0:
            nz = nz // z_align * z_align
        nz = _balanced(Nz, nz, z_align if (z_align > 1 and nz % z_align == 0) else 1)
    if fixed_nb is None and nb < n:
        if v_align > 1 and nb >= v_align:
            nb = nb // v_align * v_align
        nb = _balanced(n, nb, v_align if (v_align > 1 and nb % v_align == 0) else 1)
    if fixed_tile is None and (tu, tv) != (U, V):
        tu, tv = _balanced(U, tu), _balanced(V, tv)
    buf, working, peak, host = cost()
    return Plan(kind=kind, mode=mode, device=device, dtype=dtype, batch=B, z_range=(z0, z1), n_views=n,
                detector_shape=(U, V), slab_depth=max(1, nz), view_batch=max(1, nb), tile_shape=(tu, tv),
                working_set_bytes=int(working), peak_bytes=int(peak), budget=budget,
                buffers=buf, host_bytes=int(host))


def plan_for(projector, kind: str = "project", dtype: torch.dtype = torch.float32, device="cpu",
             batch: int = 1) -> Plan:
    """The plan of ``projector.project`` (or backproject) on tensors of ``dtype`` on ``device``.

    With ``devices=[...]`` it is the plan of the first (largest) view shard on the first device.
    """
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    device = torch.device(device)
    strategy = projector._strategy
    if hasattr(strategy, "plan"):
        return strategy.plan(kind, batch, dtype, device)
    ex = projector._executor(device)
    return ex.plan(kind, batch, projector.volume_slice.start, projector.volume_slice.stop,
                   projector.projection_shape[0], dtype, device)


# ------------------------------------------------------- solver capacity model
# The disk-backed CGLS of ctbench.solvers.disk_cgls keeps x, s, p (volume
# sized) and r, q (ray sized) in chunked block stores and runs five kinds of
# window passes.  This model is the bytes each pass holds at once; the solver
# runs exactly these windows.
WORK_CHUNK_BYTES = 1 << 20  # target size of a work-store chunk (zarr stages a few of them per window)
READ_CHUNKS_IN_FLIGHT = 1  # whole-chunk reads into a window: about one chunk buffer besides it (measured)


def store_concurrency() -> int:
    """Chunks a zarr store decodes or encodes at once (its ``async.concurrency``; 10 without zarr)."""
    try:
        import zarr
        return max(1, int(zarr.config.get("async.concurrency") or 10))
    except ImportError:  # pragma: no cover - zarr is a runtime dependency
        return 10


@dataclass(frozen=True)
class SolverPlan:
    """Capacity and windows of a disk-backed solver on one rank (``kind`` "cgls").

    ``slab_depth``/``view_batch`` are the window sizes (planes of this rank's slab, views of this rank's
    shard); ``volume_chunks``/``ray_chunks`` are the chunk shapes of the work stores; ``memory`` names
    the bytes each pass holds at once (plus geometry and pipeline state) and ``peak_bytes`` is their
    maximum plus geometry and pipeline; ``disk`` names the bytes of the work stores and checkpoints on
    this rank; ``state_bytes`` is what the same solve would hold in memory (x, s, p, the data b and
    r, q, the geometry): the figure the disk solver is an alternative to.
    """

    kind: str
    dtype: torch.dtype
    rank: int
    world_size: int
    partition: str | None
    z_range: tuple[int, int]
    view_range: tuple[int, int]
    grid_shape: tuple[int, int, int]
    detector_shape: tuple[int, int]
    slab_depth: int
    view_batch: int
    volume_chunks: tuple[int, ...]
    ray_chunks: tuple[int, ...]
    budget: int
    memory: dict
    peak_bytes: int
    disk: dict
    disk_bytes: int
    in_memory: dict
    state_bytes: int

    def slabs(self) -> list[tuple[int, int]]:
        """Global planes [s0, s1) of this rank's slab windows."""
        z0, z1 = self.z_range
        return [(a, min(a + self.slab_depth, z1)) for a in range(z0, z1, self.slab_depth)]

    def view_batches(self) -> list[tuple[int, int]]:
        """Local views [a, b) of this rank's shard (add ``view_range[0]`` for global views)."""
        n = self.view_range[1] - self.view_range[0]
        return [(a, min(a + self.view_batch, n)) for a in range(0, n, self.view_batch)]

    def summary(self) -> str:
        m = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.memory.items())
        d = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.disk.items())
        return (f"disk {self.kind.upper()} on rank {self.rank} of {self.world_size}: planes {self.z_range}, views "
                f"{self.view_range}, {self.dtype}; windows of {self.slab_depth} planes x {self.view_batch} views\n"
                f"  memory: peak {format_bytes(self.peak_bytes)} of budget {format_bytes(self.budget)} ({m})\n"
                f"  disk:   {format_bytes(self.disk_bytes)} ({d})\n"
                f"  the same solve in memory would hold {format_bytes(self.state_bytes)}")

    __repr__ = summary


def _chunk_planes(plane_bytes: int, limit: int) -> int:
    return max(1, min(limit, WORK_CHUNK_BYTES // max(1, plane_bytes)))


def make_cgls_plan(grid_shape, detector_shape, *, z_range, view_range, dtype=torch.float32, memory_budget=None,
                   data_chunks=None, data_itemsize=None, rank: int = 0, world_size: int = 1,
                   partition: str | None = None, view_world_size: int = 1, space_world_size: int = 1,
                   cpu_kernel: bool = True, concurrency: int | None = None, keep_checkpoints: int = 2,
                   with_x0: bool = True) -> SolverPlan:
    """The windows and capacity of disk CGLS on one rank.

    ``z_range`` (global planes) and ``view_range`` (global views) are what this rank owns;
    ``data_chunks`` is the chunk shape of the sinogram store (default: the work stores' ray chunks);
    ``concurrency`` the chunks a store stages at once.  The passes and what each holds at once:

    - data: one block of b (norm and fingerprint) and its read staging;
    - project (q = A p, and r = b - A x0): a block accumulator, one slab, the slab's read staging or
      the CPU kernel's slab copy, then the block's write staging (plus b's block for r0, and a copy
      of the block for the all-reduce over the space group);
    - residual (r -= alpha q): two blocks and their staging;
    - backproject (s = A^T r): a slab accumulator, one block and its staging, then the slab's write
      staging (plus a copy of the slab for the all-reduce over the view group);
    - update (x += alpha p; p = s + beta p) and checkpoints: two slabs and their staging.

    Volume windows get half the budget and ray windows the other half (a projection holds one of
    each; the update holds two slabs, the residual update two blocks), then both shrink until every
    pass fits.  Raises :class:`PlanError` when one plane and one view do not fit.
    """
    D, H, W = (int(v) for v in grid_shape)
    U, V = (int(v) for v in detector_shape)
    z0, z1 = (int(v) for v in z_range)
    v0, v1 = (int(v) for v in view_range)
    Nz, n = z1 - z0, v1 - v0
    if Nz <= 0 or n <= 0:
        raise PlanError(f"disk CGLS needs at least one plane and one view on every rank; rank {rank} has "
                        f"{Nz} planes and {n} views (use fewer ranks)")
    isz = itemsize(dtype)
    dsz = int(data_itemsize or isz)
    conc = int(concurrency or store_concurrency())
    budget = parse_bytes(memory_budget)
    if budget is None:
        budget = int(available_host_memory() * HOST_MEMORY_FRACTION)
    plane, view = H * W * isz, U * V * isz
    cz, cv = _chunk_planes(plane, Nz), _chunk_planes(view, n)
    dch = tuple(int(c) for c in (data_chunks or (cv, U, V)))
    data_chunk_bytes = dsz * math.prod(dch)

    # The solver reads and writes one chunk row per store call: zarr then holds one encoded chunk
    # while writing, and about two chunk buffers while reading, besides the window itself.
    def vol_read(nz):
        return min(READ_CHUNKS_IN_FLIGHT, -(-nz // cz)) * cz * plane

    def vol_write(nz):
        return cz * plane

    def ray_read(nb):
        return min(READ_CHUNKS_IN_FLIGHT, -(-nb // cv)) * cv * view

    def ray_write(nb):
        return cv * view

    def data_read(nb):  # the sinogram store is read a window at a time (zarr's own staging)
        touched = -(-nb // dch[0]) * -(-U // dch[1]) * -(-V // dch[2])
        return min(conc, READ_CHUNKS_IN_FLIGHT, touched) * data_chunk_bytes + (nb * U * V * isz if dsz != isz else 0)

    def passes(nz, nb):
        slab, block = nz * plane, nb * view
        scratch = slab if (cpu_kernel and H > 1 and W > 1 and nb * U * V >= (nz * H * W) // 4) else 0
        ar_block = block if space_world_size > 1 else 0  # the all-reduce works on a copy
        ar_slab = slab if view_world_size > 1 else 0
        project = block + max(slab + max(vol_read(nz), scratch), ray_write(nb) + ar_block)
        if with_x0:  # r0 = b - A x0: the data block joins the accumulator
            first = block + max(slab + max(vol_read(nz), scratch), ar_block, block + max(data_read(nb), ray_write(nb)))
        else:  # r0 = b
            first = block + max(data_read(nb), ray_write(nb))
        return {
            "data": block + data_read(nb),
            "project": project,
            "initial_residual": first,
            "residual": max(2 * block + ray_read(nb), block + ray_write(nb)),
            "backproject": slab + max(block + ray_read(nb), vol_write(nz) + ar_slab),
            "update": 2 * slab + max(vol_read(nz), vol_write(nz)),
        }

    nz, nb = Nz, n
    while 2 * nz * plane + vol_write(nz) > budget // 2 and nz > 1:
        nz = -(-nz // 2)
    while 2 * nb * view + ray_write(nb) > budget // 2 and nb > 1:
        nb = -(-nb // 2)
    while max(passes(nz, nb).values()) > budget:
        if nz > 1 and (nz * plane >= nb * view or nb == 1):
            nz = -(-nz // 2)
        elif nb > 1:
            nb = -(-nb // 2)
        else:
            need = max(passes(1, 1).values())
            raise PlanError(f"memory_budget={format_bytes(budget)} is too small for disk CGLS: one plane and one "
                            f"view need {format_bytes(need)} ({need} bytes); raise memory_budget")
    # Windows aligned to the work stores' chunks, so that every write replaces whole chunks.
    # (a window covering the whole axis needs no alignment: its last chunk ends the store).
    cz, cv = min(cz, nz), min(cv, nb)
    nz = nz if nz == Nz else nz // cz * cz
    nb = nb if nb == n else nb // cv * cv
    mem = passes(nz, nb)
    geometry = 4 * 3 * (v1 - v0) * isz + 4 * 3 * (v1 - v0) * 8  # rays in dtype + the float64 trajectory
    pipeline = 2 * conc * 1024  # zarr's per-chunk bookkeeping
    memory = {**mem, "geometry": geometry, "pipeline": pipeline}
    peak = max(mem.values()) + geometry + pipeline
    vol_b, ray_b = Nz * plane, n * view
    disk = {"x, s, p": 3 * vol_b, "r, q": 2 * ray_b, "checkpoints": keep_checkpoints * (2 * vol_b + ray_b)}
    in_memory = {"x, s, p": 3 * vol_b, "b, r, q": 3 * ray_b, "geometry": geometry}
    return SolverPlan(kind="cgls", dtype=dtype, rank=rank, world_size=world_size, partition=partition,
                      z_range=(z0, z1), view_range=(v0, v1), grid_shape=(D, H, W), detector_shape=(U, V),
                      slab_depth=nz, view_batch=nb, volume_chunks=(cz, H, W), ray_chunks=(cv, U, V), budget=budget,
                      memory=memory, peak_bytes=int(peak), disk=disk, disk_bytes=int(sum(disk.values())),
                      in_memory=in_memory, state_bytes=int(sum(in_memory.values())))


def plan_cgls_for(projector, dtype: torch.dtype = torch.float32, *, memory_budget=None, data_chunks=None,
                  data_dtype=None, with_x0: bool = True) -> SolverPlan:
    """The :class:`SolverPlan` of disk CGLS for ``projector`` on this process (its slab and views)."""
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    budget = memory_budget if memory_budget is not None else projector.options.get("memory_budget")
    vs, ws = projector.volume_slice, projector.view_slice
    backend = getattr(projector, "backend_name", "auto")
    plan = make_cgls_plan(projector.grid.shape, projector.detector_shape, z_range=(vs.start, vs.stop),
                          view_range=(ws.start, ws.stop), dtype=dtype, memory_budget=budget,
                          data_chunks=data_chunks, data_itemsize=itemsize(data_dtype) if data_dtype else None,
                          rank=projector.rank, world_size=projector.world_size, partition=projector.partition,
                          view_world_size=projector.view_world_size, space_world_size=projector.space_world_size,
                          cpu_kernel=backend in ("auto", "cpu"), with_x0=with_x0)
    # an explicit view_chunk_size is the user's memory bound: no batch of views may exceed it
    nb = projector.options.get("view_chunk_size")
    if nb is not None and plan.view_batch > nb:
        plan = dataclasses.replace(plan, view_batch=int(nb))
    return plan
