"""What a reconstruction will cost before it runs: memory from the planner, time from a measured call.

Memory is the data the run holds (the sinogram and the result), the solver's
working arrays (counted from the solver's source, see ``STATE``) and the
largest window a projector call allocates (``Projector.plan``, the planner of
docs/LARGE_VOLUMES.md).  Time is measured, not guessed: one forward and one
backprojection of a few evenly spaced views on this machine, scaled to all
views and to the projector calls the algorithm makes (``CALLS``).  The
measurement is cached per problem shape and backend, so changing only the
iterations or parameters re-estimates without measuring again.

FBP/FDK is timed as itself (its filter and its own backprojection kernel, which
the first call also compiles or loads), on a few views, scaled to all views.
Once a run of an algorithm has finished on a problem shape (``record_run``),
its measured time per iteration and set-up replace the model for that
algorithm and shape: the next estimate is what this machine did.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from ..engine.plan import format_bytes
from .design import ScanGeometry
from .workflow import ReconRequest

# Volume- and sinogram-sized float arrays each solver holds at its peak, besides the data b and the result x
# and the planner's projector window.  Measured, not read off the source: the peak resident growth of a
# 2-iteration run (``workflow.run``) on a volume-heavy (160^3, 30 views of 64^2) and a sinogram-heavy (96^3,
# 120 views of 192^2) problem, solved for volumes and sinograms; the arrays the solvers name (SIRT's C, R,
# r, A x, ...; CGLS's r, p, s, q; TV's gradient field) plus torch's temporaries.  OS-TV is taken as TV.
# tests/test_estimate_memory.py checks a third shape against a measured run within a factor of 2.
STATE = {"fbp": (0, 3), "sirt": (7, 8), "cgls": (2, 2), "tv": (22, 10), "os_sirt": (11, 8), "os_tv": (22, 10), "fista_tv": (48, 12), "lsqr": (2, 1), "lsmr": (4, 1), "sart": (11, 8), "mlem": (8, 13), "osem": (10, 14), "pwls": (20, 14), "tgv": (88, 10)}
# (set-up, per iteration) in units of one forward plus one backprojection of all views.
CALLS = {"fbp": (0.0, 0.5), "sirt": (1.0, 1.0), "cgls": (0.5, 1.0), "tv": (0.5, 1.0), "os_sirt": (1.0, 1.0),
         "os_tv": (1.0, 1.0), "fista_tv": (30.5, 1.0), "lsqr": (0.5, 1.0), "lsmr": (0.5, 1.0), "sart": (1.0, 1.0), "mlem": (1.0, 1.5), "osem": (1.0, 1.5), "pwls": (16.0, 1.0), "tgv": (0.5, 1.0)}
MEASURED_VIEWS = 4          # views in the timed call: enough to amortise the call overhead, cheap on any scan
LIKE = "sirt"               # the model of an algorithm these tables do not list (a new solver): one SIRT-like pass

_cache: dict = {}
_fbp_cache: dict = {}
_runs: dict = {}            # (problem key, algorithm) -> (set-up seconds, seconds per iteration) of a finished run
_lock = threading.Lock()


@dataclass(frozen=True)
class RunEstimate:
    """Memory (bytes) and time (seconds) of a run, and how they were found."""

    algorithm: str
    n_iter: int
    data_bytes: int          # the sinogram and the result volume
    state_bytes: int         # the solver's working arrays
    kernel_bytes: int        # the largest projector window (the planner's peak)
    seconds: float
    pair_seconds: float      # one forward + one backprojection of all views, from the measurement
    measured_views: int
    title: str = ""          # the request in a few words ("CGLS n_iter=200"): what the estimate is of
    basis: str = ""          # how the time was found, in words

    @property
    def peak_bytes(self) -> int:
        return self.data_bytes + self.state_bytes + self.kernel_bytes

    def summary(self) -> str:
        what = f"{self.title}: " if self.title else ""
        basis = self.basis or (f"one projection pair {_duration(self.pair_seconds)}, measured on "
                               f"{self.measured_views} views")
        iters = f"{self.n_iter} iteration(s), " if self.n_iter > 1 or self.algorithm != "fbp" else ""
        return f"{what}about {format_bytes(self.peak_bytes)} of memory and {_duration(self.seconds)} ({iters}{basis})"


def _duration(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.0f} min"


def memory_of(geometry: ScanGeometry, algorithm: str, *, backend: str = "auto",
              dtype: torch.dtype = torch.float32) -> tuple[int, int, int]:
    """(data, solver state, largest projector window) in bytes for ``algorithm`` on ``geometry``."""
    from .workflow import ALGORITHMS

    if algorithm not in STATE and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
    item = torch.empty((), dtype=dtype).element_size()
    vol = item * _prod(geometry.volume_shape)
    sino = item * _prod(geometry.sinogram_shape)
    n_vol, n_sino = STATE.get(algorithm, STATE[LIKE])
    P = geometry.projector(backend)
    # FBP/FDK backprojects (the in-memory FDK runs the backprojection windows); the others also project.
    kinds = ("backproject",) if algorithm == "fbp" else ("project", "backproject")
    kernel = max(int(P.plan(kind, dtype).peak_bytes) for kind in kinds)
    return vol + sino, n_vol * vol + n_sino * sino, kernel


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _key(geometry: ScanGeometry, backend: str) -> tuple:
    return (tuple(geometry.volume_shape), tuple(geometry.voxel_spacing), tuple(geometry.detector_shape),
            geometry.n_views, geometry.beam, backend)


def call_costs(geometry: ScanGeometry, *, backend: str = "auto") -> tuple[float, float, int]:
    """(fixed seconds per forward+backprojection call, seconds per view, views measured), measured and cached.

    Two timed calls, on ``MEASURED_VIEWS`` and on four times as many evenly spaced views, separate the
    fixed cost of a call (threads, windows) from the cost per view: ``t = fixed + per_view * views``.
    A scan with few views is measured whole (all of it counted per view).
    """
    key = _key(geometry, backend)
    with _lock:
        if key in _cache:
            return _cache[key]
    n = geometry.n_views
    small, large = min(n, MEASURED_VIEWS), min(n, 4 * MEASURED_VIEWS)
    if large == n:
        out = (0.0, _timed_pair(geometry, n, backend) / n, n)
    else:
        t_small = _timed_pair(geometry, small, backend)
        t_large = _timed_pair(geometry, large, backend)
        per_view = max(t_large - t_small, 0.0) / (large - small)
        out = (max(t_small - per_view * small, 0.0), per_view, large)
    with _lock:
        _cache[key] = out
    return out


def pair_seconds(geometry: ScanGeometry, *, backend: str = "auto") -> tuple[float, int]:
    """Seconds of one forward plus one backprojection of all views, and the views measured (cached)."""
    fixed, per_view, measured = call_costs(geometry, backend=backend)
    return fixed + per_view * geometry.n_views, measured


def _timed_pair(geometry: ScanGeometry, k: int, backend: str) -> float:
    sub = _subset(geometry, k)
    P = sub.projector(backend)
    x = torch.zeros(tuple(sub.volume_shape), dtype=torch.float32)
    P.backproject(P.project(x))               # first call: kernel load and caches, not counted
    t0 = time.perf_counter()
    P.backproject(P.project(x))
    return time.perf_counter() - t0


def estimate_run(geometry: ScanGeometry, request: ReconRequest, *, backend: str = "auto") -> RunEstimate:
    """Memory and time of ``request`` (a full run) on ``geometry``; measures on first use (seconds at most)."""
    if not isinstance(geometry, ScanGeometry):
        raise TypeError(f"geometry must be a ctbench ScanGeometry, got {type(geometry).__name__}")
    request = request.validated()
    algo = request.algorithm
    data, state, kernel = memory_of(geometry, algo, backend=backend)
    fixed, per_view, measured = call_costs(geometry, backend=backend)
    pair = fixed + per_view * geometry.n_views
    n_iter = int(request.params.get("n_iter", 1)) if request.spec.iterative else 1
    title = request.title()
    run = _runs.get((_key(geometry, backend), algo))
    if run is not None:
        setup_s, per_iter_s = run
        return RunEstimate(algo, n_iter, data, state, kernel, setup_s + per_iter_s * n_iter, pair, measured, title,
                           f"from the last {request.spec.label.split(' ')[0]} run on this scan here: "
                           + (f"{_duration(per_iter_s)} per iteration" if request.spec.iterative
                              else f"{_duration(setup_s + per_iter_s)}"))
    if not request.spec.iterative:
        f_fixed, f_per_view, f_views = fbp_costs(geometry, request, backend=backend)
        seconds = f_fixed + f_per_view * geometry.n_views
        return RunEstimate(algo, 1, data, state, kernel, seconds, pair, measured, title,
                           f"timed as itself on {f_views} views")
    setup, per_iter = CALLS.get(algo, CALLS[LIKE])
    if algo in ("os_sirt", "os_tv"):
        # A pass is one call per subset: the views once, the fixed cost of a call once per subset.
        pass_seconds = subsets_of(request, geometry.n_views) * fixed + per_view * geometry.n_views
        seconds = setup * pass_seconds + n_iter * pass_seconds
    else:
        seconds = (setup + per_iter * n_iter) * pair
    return RunEstimate(algo, n_iter, data, state, kernel, seconds, pair, measured, title)


def _subset(geometry: ScanGeometry, k: int) -> ScanGeometry:
    n = geometry.n_views
    idx = torch.linspace(0, n - 1, k).round().long().unique()
    return ScanGeometry(geometry.trajectory[idx], geometry.detector_shape, geometry.detector_spacing,
                        geometry.volume_shape, geometry.voxel_spacing)


def fbp_costs(geometry: ScanGeometry, request: ReconRequest, *, backend: str = "auto") -> tuple[float, float, int]:
    """(fixed seconds, seconds per view, views timed) of the one-pass method of ``request`` (FBP/FDK), timed as
    itself: its filter, weights and backprojection kernel, on ``MEASURED_VIEWS`` and four times as many views
    (the first call, not counted, compiles or loads the kernel, as a first run would).  Cached per shape."""
    from .workflow import run

    request = request.validated()
    key = (_key(geometry, backend), request.algorithm, tuple(sorted(request.params.items())))
    with _lock:
        if key in _fbp_cache:
            return _fbp_cache[key]
    full = ReconRequest(request.algorithm, dict(request.params), "full")
    n = geometry.n_views

    def timed(k: int) -> float:
        sub = _subset(geometry, k)
        y = torch.zeros(sub.sinogram_shape, dtype=torch.float32)
        run(sub, y, full)                       # kernel load or compile, caches: not counted
        t0 = time.perf_counter()
        run(sub, y, full)
        return time.perf_counter() - t0

    small, large = min(n, MEASURED_VIEWS), min(n, 4 * MEASURED_VIEWS)
    if large == n:
        out = (0.0, timed(n) / n, n)
    else:
        t_small, t_large = timed(small), timed(large)
        per_view = max(t_large - t_small, 0.0) / (large - small)
        out = (max(t_small - per_view * small, 0.0), per_view, large)
    with _lock:
        _fbp_cache[key] = out
    return out


def record_run(geometry: ScanGeometry, algorithm: str, progress, total_seconds: float, *,
               backend: str = "auto") -> None:
    """Keep what a finished run took, for the next estimate of ``algorithm`` on this problem shape.

    ``progress`` is the run's ``(iteration, elapsed seconds)`` pairs (empty for a one-pass method); the time
    per iteration is taken between the first and the last iteration (the first also pays the set-up)."""
    pts = [(int(i), float(t)) for i, t in progress if i >= 1]
    if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
        per = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
        setup = max(pts[0][1] - per * pts[0][0], 0.0)
    elif pts:
        per, setup = pts[-1][1] / pts[-1][0], 0.0
    else:
        per, setup = 0.0, float(total_seconds)
    if per < 0 or setup < 0 or not (per == per and setup == setup):
        return
    with _lock:
        _runs[(_key(geometry, backend), algorithm)] = (setup, per)


def subsets_of(request: ReconRequest, n_views: int) -> int:
    """The subsets an ordered-subset request runs with (0: the solvers' automatic choice)."""
    from ..solvers.ordered_subsets import auto_subsets

    S = int(request.params.get("n_subsets", 0) or 0)
    return min(S, n_views) if S > 0 else auto_subsets(n_views)
