"""The run-time paths of the CPU Joseph projector: measured once per library and CPU, cached, forceable.

The Joseph library (``kernels/joseph_cpu.cpp``) compiles several inner loops per operation and
lists the ones this build has: forward ``avx512-gather``, ``avx512-loads``, ``avx2-gather``,
``avx2-loads`` (SIMD lanes fetching each plane's stencil pairs with gathers or with scalar loads;
the AVX-512 and AVX2 ones only where the build targets them), ``avx512-gather-fused`` and
``avx2-gather-fused`` (the ray set-up and the edge planes in the lanes too) and ``beams`` (scalar
rays in lockstep), each also as ``NAME-bands`` (the detector rows in bands, all views per band, so
that a band's part of the volume stays in cache across the views; the same rays, bitwise the same
output), ``avx512-gather-fused-tiles`` and ``avx2-gather-fused-tiles`` (the fused bands, and where a band's
planes exceed the L2 its views taken in runs traced plane tile by plane tile) and their ``-fused-pad-tiles`` forms
(rays through zero-bordered copies of small slabs: the build's default); back ``pairs``, ``rows``
(float32 pair updates, in one 128-bit add or row by row), their ``-zNm`` forms (each thread's z-chunk
walked in sub-chunks of about N MiB of output), the seamless ``-sNm`` forms (each sample scattered
whole by the sub-chunk holding its stencil's lower z row), their ``-fK`` forms (sub-chunks of at
least max(H, W) / K planes), the banded ``-bR`` forms (no sub-chunks; each thread's detector rows in
bands of R, every view per band; ``dup-padded-b8``: accumulators in z-row pair slots), their ``-rs-bR``
forms (two or more threads split the detector rows' bands instead of z-chunks, and view tiles where a band's
planes exceed the L2; ``dup-padded-rs-b8`` is the default of AVX-512 and AVX2 builds, ``pairs-padded-rs-b8`` of the others) and ``blocked`` (four scalar updates per sample).
All compute the same samples; they differ only in speed (and in float32 rounding).

At the first kernel call of a process the fastest path of each operation is taken from the
choice cached beside the library (``path_choice.read_choice``) or, failing that, measured on a
small scan (a 16x128x128 volume, 48 views, 128x16 detector, one thread: about 1.5 s on a quiet core) and
cached.
``CTBENCH_CPU_PATH="forward=NAME,back=NAME"`` forces a path (an unknown name is an error listing
the known ones); it is read at every call, so tests and benchmarks can switch paths in-process.
"""

from __future__ import annotations

import math
import re
import statistics
import threading
import time

import torch

from ...geometry.generators import circular_trajectory_3d
from . import path_cache, path_choice
from .library import F64 as _D
from .library import I64 as _L
from .library import INT as _I
from .library import PTR as _P

FAMILY = "joseph"
OPS = {"forward": 0, "back": 1}  # operation -> op index of joseph_set_path
FORWARD_ARGS = [_P, _L, _I, _I, _I, _I, _I, _I, _D, _D, _D, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I,
                _P, _I, _I]
BACKWARD_ARGS = [_P, _I, _I, _I, _I, _I, _I, _D, _D, _D, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I,
                 _P, _L, _I]
# (N, NZ, views): a (NZ, N, N) volume, N x NZ detector.  W1's rows and planes (N = 128: 512-byte rows,
# 64 KiB planes, whose cache-set and 4K-aliasing effects decide between the back paths) in a thin slab,
# and enough views for the back paths' per-view costs to rank as on a real scan: with 8 views the
# "blocked" paths won by 5 % and then ran W1's back 1.55x slower than the padded ones (1.01 vs 0.65 s).
MEASURE_SHAPE = (128, 16, 48)
MEASURE_REPEATS = 3      # timed calls per path after a warm-up call, interleaved across paths

REMATCH_ROUNDS = 2        # rounds of the default against its challenger, in units of ``repeats``


def rematch_time(default_s: float, challenger_s: float, ratios: list[float]) -> float:
    """The challenger's time for the ranking after its rematch with the default: the larger of its least
    time and the default's least time times the median of their paired ratios (challenger / default, one per
    round).  Least times alone let one lucky call decide: on a loaded 2-core Zen 4 one measurement in six
    ranked ``pairs-padded-b4`` 8% ahead of the default, which the six measurements' median put 3% behind, and
    each such choice stays cached for the library's life (docs/INTERNALS.md, "The measurement").  A
    ratio of two calls a few milliseconds apart sees the same spell of load."""
    if not ratios:
        return challenger_s
    return max(challenger_s, default_s * statistics.median(ratios))


_LOCK = threading.Lock()
_STATE: dict[int, dict] = {}  # id(lib) -> {"lib", "known", "measured", "source", "current"}


def known_paths(lib) -> dict[str, list[str]]:
    """The forward and back path names the loaded library offers ({} for a library built before the paths
    existed, as a benchmark's baseline build may be)."""
    if not hasattr(lib, f"{FAMILY}_path_count"):
        return {}
    return path_choice.library_paths(lib, FAMILY, OPS)


def _measure_scan(n: int, nz: int, views: int):
    """Geometry (float32 tensors) and a smooth (nz, n, n) volume of a small circular cone scan (magnification
    2, an n x nz detector covering the slab), in the kernels' layout."""
    traj = circular_trajectory_3d(views, 2.5 * n, 5.0 * n, start_angle=0.1, dtype=torch.float64)
    pitch = 2.0
    geom = [t.to(torch.float32).contiguous() for t in
            (traj.source, traj.detector_center, traj.detector_u * pitch, traj.detector_v * pitch)]
    zz, yx = torch.linspace(-1, 1, nz), torch.linspace(-1, 1, n)
    vol = (1.5 - zz[:, None, None] ** 2 - yx[None, :, None] ** 2 - yx[None, None, :] ** 2).clamp(min=0)
    return geom, vol.to(torch.float32).contiguous()


_BACK_BANDS = re.compile(r"-b\d+$")   # the banded back paths (-bR)


def _back_twin_left_out(name: str, names: list[str]) -> bool:
    """Whether the banded back path ``name`` is left out of the ranking beside its ``-rs`` twin (``X-bR`` beside
    ``X-rs-bR``): the twins differ only in how two or more threads split the work (z-chunks or detector rows) and in
    the view tiles beyond the L2; the measurement runs one thread on an in-cache slab, where they are the same code.
    The row split ran W1 7% faster at 2 threads, the tiles N = 320 8-10% at 1 (docs/INTERNALS.md, "Back: who owns
    which voxels", "Back: view tiles").  The z-chunk twin stays forceable."""
    m = _BACK_BANDS.search(name)
    return bool(m) and "-rs-" not in name and name[: m.start()] + "-rs" + name[m.start():] in names


def _left_out_of_ranking(name: str, names: list[str]) -> bool:
    """Whether ``name`` (``X-fused-bands`` or ``X-fused-tiles``) is left out of the ranking beside its
    ``X-fused-pad-tiles`` twin (each build's default): on the measurement's slab the twin runs their loop (the
    tiles start beyond the L2, the padded copies at one ray per voxel and the slab has 0.375), so ranking them
    together would let noise choose between the same code.  Both stay forceable."""
    for tail in ("-fused-bands", "-fused-tiles"):
        if name.endswith(tail) and name[: -len(tail)] + "-fused-pad-tiles" in names:
            return True
    return False




def candidates(op: str, names: list[str]) -> list[str]:
    """The paths of ``op`` that the measurement ranks.  Forward: only the ``-bands`` and ``-tiles`` paths where
    the library has them.  A view-by-view path traces the same rays as its ``-bands`` twin in another order, which pays
    only once the volume leaves the cache; the measurement's slab stays in cache, so timing both would let
    noise pick a path that ran 2x slower at N = 256 (520 against 1028 M samples/s, 1 thread).  Back: only
    the banded ``-bR`` paths where the library has them, for the same reason (W1 0.76 against 0.60 CPU-s,
    N = 256 7.5 against 5.2, 1 thread, for the best view-by-view path), and of twins differing only in their
    thread split the ``-rs`` one (:func:`_back_twin_left_out`).  The others stay forceable by
    ``CTBENCH_CPU_PATH``; so do the ``-fused-bands`` and ``-fused-tiles`` paths where a ``-fused-pad-tiles``
    twin exists (:func:`_left_out_of_ranking`)."""
    if op == "forward":
        banded = [n for n in names if n.endswith(("-bands", "-tiles")) and not _left_out_of_ranking(n, names)]
        return banded or list(names)
    if op == "back":
        banded = [n for n in names if _BACK_BANDS.search(n) and not _back_twin_left_out(n, names)]
        return banded or list(names)
    return list(names)


def _measure_calls(lib) -> dict:
    """The forward and back calls of the measurement's scan, on freshly allocated arrays (the back scatters
    the forward's sinogram: all-zero pixels would be skipped)."""
    n, nz, views = MEASURE_SHAPE
    geom, vol = _measure_scan(n, nz, views)
    sino = torch.zeros((views, n, nz), dtype=torch.float32)
    back = torch.zeros_like(vol)
    g = [t.data_ptr() for t in geom]
    fwd = getattr(lib, "joseph_forward_f32")
    fwd.argtypes, fwd.restype = FORWARD_ARGS, None
    bwd = getattr(lib, "joseph_backward_f32")
    bwd.argtypes, bwd.restype = BACKWARD_ARGS, None

    def forward():
        fwd(vol.data_ptr(), vol.numel(), 1, nz, n, n, 0, nz, 1.0, 1.0, 1.0, *g, 1, views, n, nz, 0, n, 0, nz,
            sino.data_ptr(), 0, 1)

    def backward():
        back.zero_()
        bwd(sino.data_ptr(), 1, nz, n, n, 0, nz, 1.0, 1.0, 1.0, *g, 1, views, n, nz, 0, n, 0, nz, back.data_ptr(),
            vol.numel(), 1)

    # the tensors live as long as the calls (the library holds raw pointers only)
    forward.keep = backward.keep = (geom, vol, sino, back)
    forward()
    return {"forward": forward, "back": backward}


def measure(lib, repeats: int = MEASURE_REPEATS) -> dict[str, dict[str, float]]:
    """CPU seconds (least of ``repeats`` interleaved calls, one thread) of every candidate path of each
    operation (:func:`candidates`).  The default and the fastest other path then meet again for
    ``REMATCH_ROUNDS * repeats`` rounds; the challenger's figure is then :func:`rematch_time`'s."""
    known = known_paths(lib)
    calls = _measure_calls(lib)
    timings: dict[str, dict[str, float]] = {}

    def rounds(op, names, best, n_rounds, warm_up):
        """Time ``names`` in turn for ``n_rounds`` rounds (after ``warm_up`` untimed ones); keeps each path's
        least time in ``best`` and returns every timed round's times."""
        per_round = []
        for r in range(n_rounds + warm_up):
            times = {}
            for name in names:
                path_choice.set_library_path(lib, FAMILY, OPS[op], known[op].index(name))
                # CPU seconds of this thread, which runs the one-thread call: another process's load
                # preempts it (which wall time would count) without adding to its CPU time
                t = time.thread_time()
                calls[op]()
                times[name] = time.thread_time() - t
            if r >= warm_up:  # the first round warms every path up
                per_round.append(times)
                for name, dt in times.items():
                    best[name] = min(best[name], dt)
        return per_round

    try:
        for op, names in known.items():
            names = candidates(op, names)
            best = {name: math.inf for name in names}
            rounds(op, names, best, repeats, 1)
            # A path that beat the default gets a rematch with it: a load's noise only ever adds time,
            # so more calls of the two bring both nearer their own least (a choice made under a load of
            # about 4 once took a forward path that ran real scans 2x slower than the default)
            challenger = min(names, key=best.__getitem__)
            if challenger != names[0]:
                # on arrays of their own, so that the two also meet on another placement in memory: one
                # path led whole measurements, by the paired median too, and placement is one guess why
                # (this alone did not stop it; the margin did)
                calls = _measure_calls(lib)
                paired = rounds(op, [names[0], challenger], best, REMATCH_ROUNDS * repeats, 1)
                best[challenger] = rematch_time(best[names[0]], best[challenger],
                                                [r[challenger] / r[names[0]] for r in paired])
            timings[op] = best
    finally:
        for i in OPS.values():
            path_choice.set_library_path(lib, FAMILY, i, -1)
    return timings


def _acceptable(known: dict[str, list[str]]):
    def accept(choice: dict[str, str]) -> bool:
        # a cached choice among paths the measurement no longer ranks (made before only the -bands
        # forward paths were ranked) is measured again
        return all(name in candidates(op, known.get(op, [name])) for op, name in choice.items())
    return accept


def measured_choice(lib, lib_info: dict | None = None) -> tuple[dict[str, str], str]:
    """``(choice, where from)``: the cached choice of this library and CPU, or a fresh measurement (then
    cached; :mod:`ctbench.engine.path_cache`).  ``lib_info`` (``source``, ``sha256``, ``dir`` for a
    JIT build) says where the library came from; by default what the loader recorded on it."""
    info = getattr(lib, "_ctbench_origin", {}) if lib_info is None else lib_info
    n, nz, views = MEASURE_SHAPE
    known = known_paths(lib)
    accept = _acceptable(known)

    return path_cache.cached_or_measured(
        info, FAMILY, known, lambda: measure(lib),
        f"circular cone, {nz}x{n}x{n} volume, {views} views, {n}x{nz} detector, float32, 1 thread", accept)


def _state(lib) -> dict:
    with _LOCK:
        st = _STATE.get(id(lib))
        if st is None or st["lib"] is not lib:
            known = known_paths(lib)
            choice, source = measured_choice(lib) if known else ({}, "no run-time paths in this library")
            st = {"lib": lib, "known": known, "measured": choice, "source": source, "current": {}}
            _STATE[id(lib)] = st
        return st


def active_paths(lib) -> dict[str, str]:
    """The path each operation runs now: ``CTBENCH_CPU_PATH``'s, else the measured one."""
    st = _state(lib)
    forced = path_choice.check_forced(path_choice.forced_paths(), st["known"])
    return {op: forced.get(op, st["measured"][op]) for op in st["known"]}


def apply(lib) -> dict[str, str]:
    """Select the active paths in ``lib`` (before a kernel call); returns them."""
    active = active_paths(lib)
    st = _STATE[id(lib)]
    with _LOCK:
        for op, name in active.items():
            if st["current"].get(op) != name:
                path_choice.set_library_path(lib, FAMILY, OPS[op], st["known"][op].index(name))
                st["current"][op] = name
    return active


def describe(lib, *, measure: bool = True) -> dict:
    """The paths offered, measured and active, and where the measured choice came from (for ``ctbench info``
    and the benchmarks).  ``measure=False`` times nothing: a library whose choice is neither cached nor
    made in this process reports ``measured: None`` (and the active paths as far as ``CTBENCH_CPU_PATH``
    names them)."""
    with _LOCK:
        st = _STATE.get(id(lib))
        ready = st is not None and st["lib"] is lib
    if not measure and not ready:
        known = known_paths(lib)
        choice = path_cache.cached_choice(getattr(lib, "_ctbench_origin", {}), FAMILY, known,
                                              _acceptable(known)) if known else None
        if choice is None:
            forced = path_choice.check_forced(path_choice.forced_paths(), known)
            return {"known": known, "measured": None, "active": forced or None,
                    "source": "not measured yet: timed at the first projector call (or ctbench info "
                              "--measure-paths)"}
    st = _state(lib)
    return {"known": st["known"], "measured": dict(st["measured"]), "source": st["source"],
            "active": active_paths(lib)}
