"""The memory budget of a streamed recon and the chunk sizes that follow from it.

A budget caps the peak memory (resident set) of the whole ``ctbench recon``
process.  Part of it is already taken when planning starts (Python, torch,
the kernels: the measured *baseline*); the rest is shared out stage by
stage, and each stage's windows are the largest that fit:

- reading and correcting: ``view_chunk`` views at a time (the raw frames, the
  one read ahead, the float copies the corrections make, the work store's
  write staging);
- ring filters (whole sinogram rows): ``row_band`` detector rows of every view;
- filtered backprojection: a z-slab of ``slab`` planes (its accumulator, the
  pyramid levels and the output's write staging) and ``view_batch`` views of
  the detector rows that slab's rays cross (the block read, the one read
  ahead, and ramp filtering's buffers, :func:`ctbench.engine.plan.fdk_filter_factor`);
- iterative solvers: the whole sinogram and the solver's vectors in memory, or
  (CGLS) the disk-backed solver's own plan.

The cost models count bytes per element of each buffer, calibrated against
measured peaks (tests/test_streamed_recon.py measures a subprocess against its
budget).  A job whose smallest windows do not fit is refused before any work,
with the smallest budget that would do (:class:`BudgetError`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..engine.plan import PlanError, fdk_filter_factor, format_bytes, parse_bytes

DEFAULT_FRACTION = 0.8          # of the memory available at start, when no budget is given
RUNTIME_MARGIN = 160 << 20      # threads, allocator slack, zarr's event loop, kernel buffers: measured
# The baseline planned with, at least: a fresh ``ctbench recon`` process measures about 300 MiB, a little more or
# less from run to run; planning with a fixed figure above that gives the same windows, hence the same volume
# bit for bit, every time the same command runs (a resumed run and an uninterrupted one agree).  A process
# that already holds more (a napari session) plans with what it holds.
PLANNING_BASELINE = 384 << 20
READ_BYTES_PER_RAW = 2.0        # a raw chunk and the one read ahead
CORRECT_BYTES_PER_PIXEL = 20.0  # float copies while correcting (flat/dark, non-finite fill, zinger median)
STORE_WRITE_COPIES = 2.0        # zarr's encoded chunk plus its crc32c copy
RING_COPIES = 8.0               # ring filters: read band, sort order (int64), ranked, smoothed, output
FDK_BLOCK_COPIES = 2.0          # the band block being filtered and the one read ahead
SLAB_COPIES = 2.3               # accumulator, pyramid levels (1/8 + 1/64 ...), the output's write staging


class BudgetError(PlanError):
    """The job cannot run within the memory budget; the message names the smallest budget that would do."""


def parse_budget(value, name: str = "memory") -> int | None:
    """Bytes from ``"4GB"``, ``"512 MiB"`` or a number; None stays None."""
    return parse_bytes(value, name)


def default_budget() -> int:
    """:data:`DEFAULT_FRACTION` of the memory available now."""
    from ..engine.plan import available_host_memory
    return int(available_host_memory() * DEFAULT_FRACTION)


def _release_free_heap() -> None:
    """Hand freed heap pages back to the system (glibc's malloc_trim), so the baseline is what is in use."""
    import ctypes
    import sys
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def planning_baseline() -> int:
    """The baseline a plan assumes: the process's resident memory now, at least :data:`PLANNING_BASELINE`."""
    return max(PLANNING_BASELINE, baseline_bytes())


def baseline_bytes() -> int:
    """The process's resident memory now (its fixed cost: interpreter, torch, libraries, what it holds)."""
    _release_free_heap()
    try:
        import psutil
        return int(psutil.Process().memory_info().rss)
    except ImportError:          # psutil is a dependency; /proc is the fallback on Linux
        try:
            with open("/proc/self/statm") as f:
                import os
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return 400 << 20


@dataclass(frozen=True)
class ScanShape:
    """What the planner needs to know of a job (all counts after subsets, crops and binning)."""

    n_views: int
    raw_frame: tuple[int, int]      # rows, cols as read
    raw_itemsize: int
    frame: tuple[int, int]          # rows, cols after crop and binning
    volume: tuple[int, int, int]    # (D, H, W)
    ring_pass: bool = False
    oversample: int = 1
    padding: float = 2.0
    phase_pad: tuple[int, int] = (0, 0)   # Paganin's padded frame (rows, cols), (0, 0) without phase retrieval


@dataclass
class PipelinePlan:
    """Chunk sizes of every stage and their estimated peaks (bytes); JSON-able (kept in the run folder)."""

    budget: int
    baseline: int
    view_chunk: int
    store_chunks: tuple[int, int, int]
    row_band: int
    slab: int
    view_batch: int
    peaks: dict = field(default_factory=dict)
    solver_from_disk: bool = False      # the iterative solver's vectors do not fit: disk-backed CGLS

    def to_json(self) -> dict:
        d = asdict(self)
        d["store_chunks"] = list(self.store_chunks)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "PipelinePlan":
        d = dict(d)
        d["store_chunks"] = tuple(int(c) for c in d["store_chunks"])
        return cls(**d)

    def summary(self) -> str:
        return (f"memory budget {format_bytes(self.budget)} (baseline {format_bytes(self.baseline)}): "
                f"{self.view_chunk} views per read, slabs of {self.slab} planes, {self.view_batch} views per "
                f"backprojection batch; peak estimate {format_bytes(max(self.peaks.values(), default=0))}")


def store_chunks(s: ScanShape) -> tuple[int, int, int]:
    """Work-store chunks (views, rows, cols): a few MB, whole rows of the detector, 8 rows deep."""
    rows, cols = s.frame
    rb = min(rows, 8)
    vc = max(1, min(s.n_views, 64, (4 << 20) // max(1, rb * cols * 4)))
    return vc, rb, cols


def view_pass_bytes(s: ScanShape, k: int) -> int:
    r0, c0 = s.raw_frame
    rows, cols = s.frame
    vc, rb, _ = store_chunks(s)
    raw = k * r0 * c0 * s.raw_itemsize * READ_BYTES_PER_RAW
    work = k * r0 * c0 * CORRECT_BYTES_PER_PIXEL
    fields = 3 * r0 * c0 * 8                      # averaged flat and dark (float64) and the gain
    phase = s.phase_pad[0] * s.phase_pad[1] * 16 * 3
    write = max(k, vc) * rows * cols * 4 * (1 + STORE_WRITE_COPIES)
    return int(raw + work + fields + phase + write)


def ring_pass_bytes(s: ScanShape, rb: int) -> int:
    _, cols = s.frame
    return int(s.n_views * rb * cols * 4 * RING_COPIES) if s.ring_pass else 0


def slab_bytes(s: ScanShape, nz: int) -> int:
    _, H, W = s.volume
    return int(nz * H * W * 4 * SLAB_COPIES)


def block_bytes(s: ScanShape, nb: int, nv: int) -> int:
    _, cols = s.frame
    um = (cols - 1) * s.oversample + 1
    factor = fdk_filter_factor(cols, 4, s.padding, s.oversample) + FDK_BLOCK_COPIES
    return int(nb * max(cols, um) * nv * 4 * factor)


def plan_pipeline(s: ScanShape, budget: int, baseline: int, *, band_rows, alignment: int = 16,
                  iterative_bytes: int = 0) -> PipelinePlan:
    """The chunk sizes of a job under ``budget`` bytes (``baseline`` already taken).

    ``band_rows(z0, z1)`` gives the number of detector rows the rays through planes ``[z0, z1)`` cross (the
    planner's geometry); slabs are multiples of ``alignment`` planes.  ``iterative_bytes``: the in-memory
    solver's peak (0 for FDK).  Raises :class:`BudgetError` with the smallest budget that would do.
    """
    avail = budget - baseline - RUNTIME_MARGIN
    D = s.volume[0]
    rows, _ = s.frame

    # the smallest windows: one view, one ring row band, the thinnest slab and one view of its band
    z_min = min(D, alignment)
    nv_min = max(1, min(rows, band_rows(0, z_min), band_rows(max(0, D // 2 - z_min // 2), min(D, D // 2 + z_min))))
    smallest = {"read": view_pass_bytes(s, 1), "rings": ring_pass_bytes(s, 1),
                "backprojection": slab_bytes(s, z_min) + block_bytes(s, 1, nv_min), "solver": iterative_bytes}
    need = max(smallest.values())
    if need > avail:
        raise BudgetError(f"the job does not fit a memory budget of {format_bytes(budget)}: its smallest "
                          f"windows need {format_bytes(need)} beside the {format_bytes(baseline + RUNTIME_MARGIN)} "
                          f"the process itself takes ({', '.join(f'{k} {format_bytes(v)}' for k, v in smallest.items() if v)}); "
                          f"give at least {format_bytes(math.ceil((need + baseline + RUNTIME_MARGIN) * 1.05))} "
                          "(--memory, resources.memory), bin the detector, or crop the volume")

    k = _largest(lambda k: view_pass_bytes(s, k) <= avail, 1, min(s.n_views, 256))
    vc, rb_store, _ = store_chunks(s)
    # Windows never straddle a store chunk: whole chunks per write, or windows that tile one chunk, so that the
    # ranks of a job (ctbench.pipeline.ranks), each taking whole chunks, never write the same chunk.
    k = _whole_chunks(k, vc)
    rb = 0
    if s.ring_pass:
        rb = _whole_chunks(_largest(lambda r: ring_pass_bytes(s, r) <= avail, 1, rows), rb_store)
    nz = _largest(lambda n: _fdk_fits(s, n * alignment, 1, band_rows, avail) and n * alignment <= _ceil(D, alignment),
                  1, max(1, _ceil(D, alignment) // alignment))
    slab = min(D, nz * alignment)
    # a slab uses at most half of what is left: the rest goes to bigger view batches (fewer, longer kernel calls)
    while slab > alignment and slab_bytes(s, slab) > avail / 2 and _fdk_fits(s, slab - alignment, 8, band_rows, avail):
        slab -= alignment
    nv = _band_max(s, slab, band_rows)
    nb = _largest(lambda b: slab_bytes(s, slab) + block_bytes(s, b, nv) <= avail, 1, s.n_views)
    peaks = {"read": view_pass_bytes(s, k), "rings": ring_pass_bytes(s, rb),
             "backprojection": slab_bytes(s, slab) + block_bytes(s, nb, nv), "solver": iterative_bytes}
    peaks = {key: v + baseline + RUNTIME_MARGIN for key, v in peaks.items() if v}
    return PipelinePlan(int(budget), int(baseline), int(k), (int(vc), int(rb_store), int(s.frame[1])), int(rb),
                        int(slab), int(nb), peaks)


def _whole_chunks(n: int, chunk: int) -> int:
    """``n`` rounded down to whole chunks, or (below one chunk) to the largest divisor of the chunk."""
    if n >= chunk:
        return n - n % chunk
    return max(d for d in range(1, n + 1) if chunk % d == 0)


def _ceil(a: int, b: int) -> int:
    return -(-a // b) * b


def _band_max(s: ScanShape, slab: int, band_rows) -> int:
    D = s.volume[0]
    return max(band_rows(z0, min(D, z0 + slab)) for z0 in range(0, D, slab))


def _fdk_fits(s, slab, nb, band_rows, avail) -> bool:
    return slab_bytes(s, slab) + block_bytes(s, nb, _band_max(s, slab, band_rows)) <= avail


def _largest(ok, lo: int, hi: int) -> int:
    """The largest n in [lo, hi] with ok(n) (ok monotone, ok(lo) assumed); lo if none."""
    if hi <= lo or ok(hi):
        return max(lo, hi) if ok(max(lo, hi)) else lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
