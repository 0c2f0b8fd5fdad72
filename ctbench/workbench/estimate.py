"""What a reconstruction will cost before it runs: memory from the planner, time from a measured call.

Memory is the data the run holds (the sinogram and the result), the solver's
working arrays (counted from the solver's source, see ``STATE``) and the
largest window a projector call allocates (``Projector.plan``, the planner of
docs/LARGE_VOLUMES.md).  Time is measured, not guessed: one forward and one
backprojection of a few evenly spaced views on this machine, scaled to all
views and to the projector calls the algorithm makes (``CALLS``).  The
measurement is cached per problem shape and backend, so changing only the
iterations or parameters re-estimates without measuring again.
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

_cache: dict = {}
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

    @property
    def peak_bytes(self) -> int:
        return self.data_bytes + self.state_bytes + self.kernel_bytes

    def summary(self) -> str:
        iters = f"{self.n_iter} iteration(s), " if self.n_iter > 1 or self.algorithm != "fbp" else ""
        return (f"about {format_bytes(self.peak_bytes)} of memory and {_duration(self.seconds)} "
                f"({iters}one projection pair {_duration(self.pair_seconds)}, measured on "
                f"{self.measured_views} views)")


def _duration(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.0f} min"


def memory_of(geometry: ScanGeometry, algorithm: str, *, backend: str = "auto",
              dtype: torch.dtype = torch.float32) -> tuple[int, int, int]:
    """(data, solver state, largest projector window) in bytes for ``algorithm`` on ``geometry``."""
    if algorithm not in STATE:
        raise ValueError(f"algorithm must be one of {list(STATE)}, got {algorithm!r}")
    item = torch.empty((), dtype=dtype).element_size()
    vol = item * _prod(geometry.volume_shape)
    sino = item * _prod(geometry.sinogram_shape)
    n_vol, n_sino = STATE[algorithm]
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
    n = geometry.n_views
    idx = torch.linspace(0, n - 1, k).round().long().unique()
    sub = ScanGeometry(geometry.trajectory[idx], geometry.detector_shape, geometry.detector_spacing,
                       geometry.volume_shape, geometry.voxel_spacing)
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
    setup, per_iter = CALLS[algo]
    if algo in ("os_sirt", "os_tv"):
        # A pass is one call per subset: the views once, the fixed cost of a call once per subset.
        pass_seconds = subsets_of(request, geometry.n_views) * fixed + per_view * geometry.n_views
        seconds = setup * pass_seconds + n_iter * pass_seconds
    else:
        seconds = (setup + per_iter * n_iter) * pair
    return RunEstimate(algo, n_iter, data, state, kernel, seconds, pair, measured)


def subsets_of(request: ReconRequest, n_views: int) -> int:
    """The subsets an ordered-subset request runs with (0: the solvers' automatic choice)."""
    from ..solvers.ordered_subsets import auto_subsets

    S = int(request.params.get("n_subsets", 0) or 0)
    return min(S, n_views) if S > 0 else auto_subsets(n_views)
