"""Named reconstruction workflows as generators of progress events (no GUI code).

The napari widgets, the command line and the job worker all run a
reconstruction the same way: describe it as a :class:`ReconRequest`
(algorithm name + parameters + preview mode), then consume the events of
:func:`reconstruct`::

    for event in reconstruct(geometry, sinogram, ReconRequest("sirt", {"n_iter": 20})):
        if isinstance(event, Progress): ...      # iteration, residual, maybe a preview volume
        elif isinstance(event, Finished): ...    # the volume, residual history, why it stopped

Iterative methods consume the solver generators of :mod:`ctbench.solvers`
(``sirt_iterations`` etc.), so a run can be previewed live and cancelled
between two iterations.  :data:`ALGORITHMS` describes every algorithm's
parameters (type, range, default, help) so that forms can be generated
from it and bad values rejected with a message that names the parameter.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .design import ScanGeometry
from .preview import MODES, Problem, full_problem, preview_problem


# --------------------------------------------------------------- parameters
@dataclass(frozen=True)
class ParamSpec:
    """One algorithm parameter: how to show it and which values are valid."""

    name: str
    label: str
    kind: str                      # "int", "float", "bool" or "choice"
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    help: str = ""
    log_scale: bool = False        # a hint for forms: spans decades (regularisation weights)

    def coerce(self, value: Any) -> Any:
        """The value converted to this parameter's type; ValueError names the parameter."""
        what = f"{self.label} ({self.name})"
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise ValueError(f"{what} must be true or false, got {value!r}")
        if self.kind == "choice":
            if value not in self.choices:
                raise ValueError(f"{what} must be one of {list(self.choices)}, got {value!r}")
            return value
        try:
            num = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not math.isfinite(num):
            raise ValueError(f"{what} must be a finite number, got {value!r}")
        if self.kind == "int":
            if num != int(num):
                raise ValueError(f"{what} must be a whole number, got {value!r}")
            num = int(num)
        if self.minimum is not None and num < self.minimum:
            raise ValueError(f"{what} must be at least {self.minimum:g}, got {value!r}")
        if self.maximum is not None and num > self.maximum:
            raise ValueError(f"{what} must be at most {self.maximum:g}, got {value!r}")
        return num


@dataclass(frozen=True)
class Algorithm:
    """A reconstruction method the workbench offers."""

    name: str
    label: str
    iterative: bool
    params: tuple[ParamSpec, ...]
    description: str = ""

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def validate(self, params: dict | None) -> dict:
        """Defaults filled in, values coerced; ValueError for unknown names or bad values."""
        params = dict(params or {})
        known = {p.name for p in self.params}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"{self.label} has no parameters {unknown}; it takes {sorted(known)}")
        return {p.name: p.coerce(params.get(p.name, p.default)) for p in self.params}


FILTERS = ("ram-lak", "shepp-logan", "cosine", "hamming", "hann")

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("fbp", "FBP / FDK", False, (
        ParamSpec("filter", "Filter", "choice", "ram-lak", choices=FILTERS,
                  help="ramp filter window; smoother windows trade resolution for noise"),
    ), "filtered backprojection: FBP for parallel and fan beams, FDK for cone beams "
       "(helical FDK for helical scans)"),
    Algorithm("sirt", "SIRT", True, (
        ParamSpec("n_iter", "Iterations", "int", 50, 1, 100000),
        ParamSpec("nonneg", "Non-negative", "bool", True, help="clip negative attenuation after each step"),
    ), "simultaneous iterative reconstruction: robust, slow to converge"),
    Algorithm("cgls", "CGLS", True, (
        ParamSpec("n_iter", "Iterations", "int", 20, 1, 100000),
    ), "conjugate gradients on the least-squares problem: fast, noise grows with iterations"),
    Algorithm("tv", "TV", True, (
        ParamSpec("n_iter", "Iterations", "int", 100, 1, 100000),
        ParamSpec("lam", "TV weight λ", "float", 0.01, 0.0, 1e6, help="total-variation regularisation weight",
                  log_scale=True),
        ParamSpec("nonneg", "Non-negative", "bool", True),
    ), "least squares with total-variation regularisation: piecewise-constant images from few views"),
    Algorithm("os_sirt", "OS-SIRT", True, (
        ParamSpec("n_iter", "Passes", "int", 5, 1, 100000, help="passes over all subsets; one pass costs "
                  "about one SIRT iteration"),
        ParamSpec("n_subsets", "Subsets", "int", 0, 0, 10000, help="view subsets per pass; 0: automatic "
                  "(about one per 8 views, at most 16)"),
        ParamSpec("nonneg", "Non-negative", "bool", True, help="clip negative attenuation after each step"),
    ), "ordered-subset SIRT (OS-SART): SIRT's image in a fraction of its time"),
    Algorithm("os_tv", "OS-TV", True, (
        ParamSpec("n_iter", "Passes", "int", 10, 1, 100000),
        ParamSpec("n_subsets", "Subsets", "int", 0, 0, 10000, help="view subsets per pass; 0: automatic"),
        ParamSpec("lam", "TV weight λ", "float", 1e-4, 0.0, 1e6, help="total-variation weight against the "
                  "path-length-weighted data term", log_scale=True),
        ParamSpec("nonneg", "Non-negative", "bool", True),
    ), "ordered-subset SIRT with a total-variation step after each pass: fast piecewise-constant images"),
    Algorithm("fista_tv", "FISTA-TV", True, (
        ParamSpec("n_iter", "Iterations", "int", 50, 1, 100000),
        ParamSpec("lam", "TV weight λ", "float", 0.01, 0.0, 1e6, help="total-variation weight against "
                  "1/2 ||A x - b||^2 (the same objective as TV)", log_scale=True),
        ParamSpec("nonneg", "Non-negative", "bool", True),
        ParamSpec("prox_iter", "TV steps", "int", 10, 1, 1000, help="inner steps of each TV proximal map "
                  "(warm-started); more: a more exact step, slower iterations"),
    ), "accelerated proximal gradient on least squares + TV: the TV objective, monotone"),
    Algorithm("tgv", "TGV", True, (
        ParamSpec("n_iter", "Iterations", "int", 200, 1, 100000),
        ParamSpec("alpha1", "Jump weight α1", "float", 0.01, 0.0, 1e6, help="weight of jumps (as TV's λ)",
                  log_scale=True),
        ParamSpec("alpha0_ratio", "Slope weight α0/α1", "float", 2.0, 0.0, 1e6, help="weight of changes of slope "
                  "relative to α1; 2 is the usual choice, large values approach TV"),
        ParamSpec("nonneg", "Non-negative", "bool", True),
    ), "total generalised variation: piecewise-smooth images without TV's staircases"),
    Algorithm("lsqr", "LSQR", True, (
        ParamSpec("n_iter", "Iterations", "int", 20, 1, 100000),
    ), "least squares by bidiagonalisation: CGLS's iterates, more stable over many iterations"),
    Algorithm("lsmr", "LSMR", True, (
        ParamSpec("n_iter", "Iterations", "int", 20, 1, 100000),
    ), "least squares minimising the normal-equations residual: smooth convergence, a dependable stopping point"),
    Algorithm("sart", "SART", True, (
        ParamSpec("n_iter", "Sweeps", "int", 2, 1, 100000, help="sweeps over all views, one view per update"),
        ParamSpec("relax", "Relaxation", "float", 1.0, 0.01, 1.99, help="scales every update; below 1 damps "
                  "the noise of the last views visited"),
        ParamSpec("nonneg", "Non-negative", "bool", True, help="clip negative attenuation after each update"),
    ), "SART: one view per update; a good image in one or two sweeps"),
    Algorithm("mlem", "MLEM", True, (
        ParamSpec("n_iter", "Iterations", "int", 30, 1, 100000),
        ParamSpec("i0", "Photons per pixel I0", "float", 1e4, 1.0, 1e12, help="unattenuated counts per detector "
                  "pixel; the counts are rebuilt as I0·exp(-p) from the line integrals p, so I0 sets the noise "
                  "model, not the image", log_scale=True),
    ), "maximum likelihood of the photon counts (transmission), non-negative, monotone; stop early on noisy data"),
    Algorithm("osem", "OS-EM", True, (
        ParamSpec("n_iter", "Passes", "int", 10, 1, 100000, help="passes over all subsets"),
        ParamSpec("n_subsets", "Subsets", "int", 0, 0, 10000, help="view subsets per pass; 0: automatic"),
        ParamSpec("i0", "Photons per pixel I0", "float", 1e4, 1.0, 1e12, help="unattenuated counts per detector "
                  "pixel (sets the noise model)", log_scale=True),
    ), "ordered-subset MLEM: the likelihood's image in a few passes"),
    Algorithm("pwls", "PWLS", True, (
        ParamSpec("n_iter", "Iterations", "int", 50, 1, 100000),
        ParamSpec("i0", "Photons per pixel I0", "float", 1e4, 1.0, 1e12, help="unattenuated counts per detector "
                  "pixel; rays are weighted by their counts I0·exp(-p) (inverse variance of the log data)",
                  log_scale=True),
        ParamSpec("penalty", "Penalty", "choice", "huber", choices=("huber", "tv", "none"),
                  help="huber: smooths differences below δ, keeps edges; tv: piecewise constant; none: weighted "
                  "least squares"),
        ParamSpec("lam", "Penalty weight λ", "float", 0.01, 0.0, 1e6, help="weight of the penalty against the "
                  "weighted data term", log_scale=True),
        ParamSpec("delta", "Huber δ", "float", 1e-3, 1e-9, 1e6, help="attenuation step (per mm) between "
                  "neighbouring voxels below which a difference counts as noise", log_scale=True),
        ParamSpec("nonneg", "Non-negative", "bool", True),
    ), "penalised weighted least squares: rays weighted by their photon counts, with an edge-keeping penalty"),
)}


# Other names of an algorithm: "fdk" is the filtered backprojection's usual name for cone beams (one method
# serves every beam: FDK for circular cone beams, FBP for fan and parallel beams, helical FDK for helices).
ALIASES = {"fdk": "fbp"}


@dataclass(frozen=True)
class ReconRequest:
    """What to reconstruct: an algorithm, its parameters and the preview mode.

    ``mode`` is "full" or one of :data:`ctbench.preview.MODES` ("auto",
    "slice", "binned") for a quick preview.  Requests are plain JSON
    (:meth:`to_dict`), so a job bridge can carry them.
    """

    algorithm: str
    params: dict = field(default_factory=dict)
    mode: str = "full"

    def validated(self) -> "ReconRequest":
        name = ALIASES.get(self.algorithm, self.algorithm)
        if name not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {list(ALGORITHMS) + list(ALIASES)}, got {self.algorithm!r}")
        if self.mode != "full" and self.mode not in MODES:
            raise ValueError(f"mode must be 'full' or one of {MODES}, got {self.mode!r}")
        return ReconRequest(name, ALGORITHMS[name].validate(self.params), self.mode)

    @property
    def spec(self) -> Algorithm:
        return ALGORITHMS[self.algorithm]

    def title(self) -> str:
        """Algorithm and parameters in a few words, for layer names: ``SIRT n_iter=20 nonneg``."""
        a = ALGORITHMS.get(self.algorithm)
        parts = [a.label.split(" ")[0] if a else self.algorithm]
        for k, v in self.params.items():
            if isinstance(v, bool):
                if v:
                    parts.append(k)
            elif isinstance(v, float):
                parts.append(f"{k}={v:g}")
            else:
                parts.append(f"{k}={v}")
        if self.mode != "full":
            parts.append(f"[preview {self.mode}]")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "params": dict(self.params), "mode": self.mode}

    @classmethod
    def from_dict(cls, d: dict) -> "ReconRequest":
        return cls(d["algorithm"], dict(d.get("params", {})), d.get("mode", "full"))


# ------------------------------------------------------------------- events
@dataclass
class Started:
    """The run has its problem and starts iterating."""

    request: ReconRequest
    n_iter: int
    volume_shape: tuple[int, ...]
    voxel_spacing: tuple[float, ...]
    origin: tuple[float, ...]
    note: str = ""
    clock: float = 0.0             # time.perf_counter() when the run started; Progress.elapsed counts from it


@dataclass
class Progress:
    """After an iteration; ``preview`` is a copy of the estimate every ``preview_every`` iterations."""

    iteration: int
    n_iter: int
    residual: float | None
    elapsed: float
    preview: torch.Tensor | None = None
    views: tuple[int, int] | None = None   # FBP/FDK: (views backprojected, all views) after each batch of views


@dataclass
class SubsetProgress:
    """Inside a pass of an ordered-subset method (OS-SIRT, OS-TV): ``subset`` of ``n_subsets`` updates of pass
    ``iteration`` (1-based) of ``n_iter`` are done.  Delivered through ``reconstruct(on_subset=...)``."""

    iteration: int
    n_iter: int
    subset: int
    n_subsets: int
    elapsed: float

    @property
    def done_fraction(self) -> float:
        """The share of all subset updates of the run that are done."""
        total = max(self.n_iter * self.n_subsets, 1)
        return ((self.iteration - 1) * self.n_subsets + self.subset) / total


@dataclass
class Finished:
    """The result. ``stopped`` says why, as the solvers do: "completed", "tol" or "cancelled"."""

    volume: torch.Tensor
    residuals: list[float]
    n_iter: int
    stopped: str
    elapsed: float
    request: ReconRequest
    voxel_spacing: tuple[float, ...]
    origin: tuple[float, ...]
    note: str = ""

    def metadata(self) -> dict:
        """JSON-able record of how this volume was made (for layer metadata and datasets)."""
        return {"algorithm": self.request.algorithm, "params": dict(self.request.params), "mode": self.request.mode,
                "n_iter": self.n_iter, "stopped": self.stopped, "elapsed_s": round(self.elapsed, 4),
                "residuals": [float(r) for r in self.residuals], "voxel_spacing": list(self.voxel_spacing),
                "origin": list(self.origin), "note": self.note}


Event = Started | Progress | Finished
FBP_VIEW_BATCH = 16     # views per FBP/FDK batch: one Progress event each


def _cancelled(cancel) -> bool:
    if cancel is None:
        return False
    if isinstance(cancel, threading.Event):
        return cancel.is_set()
    return bool(cancel())


def _direct(problem: Problem, params: dict) -> torch.Tensor:
    from .. import solvers

    g = problem.geometry
    kind = g.kind
    if g.beam == "cone" and not g.is_2d:
        fn = solvers.helical_fdk if kind == "spiral" and hasattr(solvers, "helical_fdk") else solvers.fdk
    else:
        fn = solvers.fbp
    return fn(problem.projector, problem.sinogram, filter=params["filter"])


def _iterations(problem: Problem, request: ReconRequest, x0, cancel, on_subset=None):
    from .. import solvers

    p = request.params
    P, y = problem.projector, problem.sinogram
    if request.algorithm == "sirt":
        return solvers.sirt_iterations(P, y, p["n_iter"], x0=x0, bounds=(0.0, None) if p["nonneg"] else None,
                                       cancel=cancel)
    if request.algorithm == "cgls":
        return solvers.cgls_iterations(P, y, p["n_iter"], x0=x0, cancel=cancel)
    if request.algorithm == "tv":
        return solvers.tv_iterations(P, y, p["n_iter"], lam=p["lam"], nonneg=p["nonneg"], x0=x0, cancel=cancel)
    if request.algorithm in ("os_sirt", "os_tv"):
        subsets = min(p["n_subsets"], P.n_views)  # a preview may have fewer views than the scan
        if request.algorithm == "os_sirt":
            return solvers.os_sirt_iterations(P, y, p["n_iter"], n_subsets=subsets, x0=x0, cancel=cancel,
                                              bounds=(0.0, None) if p["nonneg"] else None, on_subset=on_subset)
        return solvers.os_tv_iterations(P, y, p["n_iter"], n_subsets=subsets, lam=p["lam"], nonneg=p["nonneg"],
                                        x0=x0, cancel=cancel, on_subset=on_subset)
    nonneg = (0.0, None) if p.get("nonneg") else None
    if request.algorithm == "fista_tv":
        return solvers.fista_tv_iterations(P, y, p["n_iter"], lam=p["lam"], nonneg=p["nonneg"],
                                           prox_iter=p["prox_iter"], x0=x0, cancel=cancel)
    if request.algorithm == "lsqr":
        return solvers.lsqr_iterations(P, y, p["n_iter"], x0=x0, cancel=cancel)
    if request.algorithm == "tgv":
        return solvers.tgv_iterations(P, y, p["n_iter"], alpha1=p["alpha1"], alpha0=p["alpha0_ratio"] * p["alpha1"],
                                      nonneg=p["nonneg"], x0=x0, cancel=cancel)
    if request.algorithm == "lsmr":
        return solvers.lsmr_iterations(P, y, p["n_iter"], x0=x0, cancel=cancel)
    if request.algorithm == "sart":
        return solvers.sart_iterations(P, y, p["n_iter"], relax=p["relax"], bounds=nonneg, x0=x0, cancel=cancel,
                                       on_subset=on_subset)
    if request.algorithm in ("mlem", "osem", "pwls"):
        counts = p["i0"] * torch.exp(-y)      # the counts the line integrals stand for
        if request.algorithm == "mlem":
            return solvers.mlem_iterations(P, counts, p["i0"], p["n_iter"], x0=x0, cancel=cancel)
        if request.algorithm == "osem":
            return solvers.osem_iterations(P, counts, p["i0"], p["n_iter"], x0=x0, cancel=cancel,
                                           n_subsets=min(p["n_subsets"], P.n_views))
        return solvers.pwls_iterations(P, counts.clamp(min=torch.finfo(y.dtype).tiny), p["i0"], p["n_iter"],
                                       penalty=p["penalty"], lam=p["lam"], delta=p["delta"], nonneg=p["nonneg"],
                                       x0=x0, cancel=cancel)
    raise ValueError(f"{request.algorithm!r} is not an iterative algorithm")


def problem_for(geometry: ScanGeometry, sinogram: torch.Tensor, request: ReconRequest, *,
                backend: str = "auto") -> Problem:
    """The problem a request solves: the full one, or a reduced preview problem."""
    if request.mode == "full":
        return full_problem(geometry, sinogram, backend)
    return preview_problem(geometry, sinogram, request.algorithm, request.mode, backend=backend)


def check_inputs(geometry: ScanGeometry, sinogram: torch.Tensor) -> torch.Tensor:
    """The sinogram as a float tensor matching the geometry; ValueError otherwise."""
    if not isinstance(geometry, ScanGeometry):
        raise TypeError(f"geometry must be a ctbench ScanGeometry, got {type(geometry).__name__}")
    if not isinstance(sinogram, torch.Tensor):
        sinogram = torch.as_tensor(sinogram)
    if not sinogram.is_floating_point():
        sinogram = sinogram.to(torch.float32)
    if tuple(sinogram.shape) != geometry.sinogram_shape:
        raise ValueError(f"sinogram has shape {tuple(sinogram.shape)} but the geometry expects "
                         f"{geometry.sinogram_shape} (n_views, *detector_shape)")
    if not torch.isfinite(sinogram).all():
        raise ValueError("sinogram contains NaN or infinite values")
    return sinogram


def reconstruct(geometry: ScanGeometry, sinogram: torch.Tensor, request: ReconRequest, *,
                preview_every: int = 5, cancel: threading.Event | Callable[[], bool] | None = None,
                backend: str = "auto", x0: torch.Tensor | None = None,
                on_subset: Callable[[SubsetProgress], None] | None = None) -> Iterator[Event]:
    """Run ``request`` on the scan, yielding :class:`Started`, :class:`Progress` and one :class:`Finished`.

    ``preview_every`` (iterations) sets how often a :class:`Progress` event
    carries a copy of the estimate (0: never).  ``cancel`` (a
    ``threading.Event`` or a callable) is checked after every iteration;
    when set, the run finishes at once with ``stopped="cancelled"`` and the
    current estimate.  Closing the generator also stops the solver.
    ``on_subset`` (ordered-subset methods) receives a :class:`SubsetProgress`
    after every subset update, from inside the pass (the thread the run runs in).
    """
    request = request.validated()
    if on_subset is not None and not callable(on_subset):
        raise TypeError(f"on_subset must be a callable or None, got {type(on_subset).__name__}")
    if isinstance(preview_every, bool) or not isinstance(preview_every, int) or preview_every < 0:
        raise ValueError(f"preview_every must be a non-negative integer, got {preview_every!r}")
    sinogram = check_inputs(geometry, sinogram)
    t0 = time.perf_counter()
    problem = problem_for(geometry, sinogram, request, backend=backend)
    spec = request.spec
    n_iter = int(request.params.get("n_iter", 1)) if spec.iterative else 1
    yield Started(request, n_iter, tuple(problem.volume_shape), tuple(problem.voxel_spacing),
                  tuple(problem.origin), problem.note, t0)

    def shaped(v: torch.Tensor) -> torch.Tensor:
        return v.detach().reshape(problem.volume_shape)

    if not spec.iterative:
        from .batched_fbp import filtered_backprojection_in_batches, splittable

        if splittable(problem.projector, problem.geometry.kind):
            # One batch of views at a time: real progress (views done / all views), same result.
            gen = filtered_backprojection_in_batches(problem.projector, problem.sinogram,
                                                     filter=request.params["filter"], batch=FBP_VIEW_BATCH)
            while True:
                try:
                    done = next(gen)
                except StopIteration as stop:
                    vol = stop.value
                    break
                yield Progress(0, 1, None, time.perf_counter() - t0, None, views=done)
        else:
            vol = _direct(problem, request.params)
        elapsed = time.perf_counter() - t0
        yield Progress(1, 1, None, elapsed, None)
        yield Finished(shaped(vol), [], 1, "completed", elapsed, request, problem.voxel_spacing, problem.origin,
                       problem.note)
        return

    residuals: list[float] = []
    volume = None
    stopped = "completed"
    current = {"pass": 1}

    def hook(k: int, n_subsets: int) -> None:
        on_subset(SubsetProgress(current["pass"], n_iter, k, n_subsets, time.perf_counter() - t0))
    gen = _iterations(problem, request, x0, cancel, hook if on_subset is not None else None)
    try:
        while True:
            try:
                state = next(gen)
            except StopIteration as stop:
                # The solver ended by itself: its return value says why ("tol", "cancelled", ...).
                stopped = stop.value if isinstance(stop.value, str) else "completed"
                break
            volume = state.volume
            it = int(state.iteration)
            current["pass"] = it + 1
            res = None if state.residual is None else float(state.residual)
            if res is not None:
                residuals.append(res)
            last = it >= n_iter
            preview = None
            if preview_every and (it % preview_every == 0 or last):
                preview = shaped(volume).clone()
            yield Progress(it, n_iter, res, time.perf_counter() - t0, preview)
            if last:
                break
            if _cancelled(cancel):
                stopped = "cancelled"
                break
    finally:
        gen.close()
    if volume is None:
        volume = torch.zeros(problem.volume_shape, dtype=sinogram.dtype) if x0 is None else x0
    yield Finished(shaped(volume).clone(), residuals, len(residuals), stopped,
                   time.perf_counter() - t0, request, problem.voxel_spacing, problem.origin, problem.note)


def run(geometry: ScanGeometry, sinogram: torch.Tensor, request: ReconRequest, **kwargs) -> Finished:
    """Run :func:`reconstruct` to the end and return its :class:`Finished` event."""
    result = None
    for event in reconstruct(geometry, sinogram, request, **kwargs):
        if isinstance(event, Finished):
            result = event
    assert result is not None
    return result


# --------------------------------------------------------------- simulation
def simulate(geometry: ScanGeometry, volume: torch.Tensor, *, i0: float | None = None, seed: int | None = None,
             backend: str = "auto") -> torch.Tensor:
    """Line integrals of ``volume`` for the scan, optionally with Poisson noise.

    With ``i0`` (unattenuated photons per pixel) the counts
    ``N ~ Poisson(i0 * exp(-p))`` become ``-log(max(N, 1) / i0)``: a pixel
    that counts no photon reads as one photon, so the result stays finite.
    ``seed`` makes the noise reproducible.
    """
    if not isinstance(volume, torch.Tensor):
        volume = torch.as_tensor(volume)
    if not volume.is_floating_point():
        volume = volume.to(torch.float32)
    if tuple(volume.shape) != tuple(geometry.volume_shape):
        raise ValueError(f"volume has shape {tuple(volume.shape)} but the geometry's grid is "
                         f"{geometry.volume_shape}")
    if volume.dtype not in (torch.float32, torch.float64):
        volume = volume.to(torch.float32)
    sino = geometry.projector(backend).project(volume.contiguous())
    return sino if i0 is None else poisson_noise(sino, i0, seed)


def simulate_in_batches(geometry: ScanGeometry, volume: torch.Tensor, *, batch: int = 16, i0: float | None = None,
                        seed: int | None = None, backend: str = "auto", cancel=None):
    """:func:`simulate`, one batch of ``batch`` views at a time: yields ``(views done, n_views)``, returns the
    sinogram (equal to :func:`simulate`'s, noise included), or None if ``cancel`` was set."""
    import dataclasses

    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive number of views, got {batch!r}")
    n = geometry.n_views
    parts = []
    for start in range(0, n, batch):
        if _cancelled(cancel):
            return None
        part = dataclasses.replace(geometry, trajectory=geometry.trajectory[start:start + batch])
        parts.append(simulate(part, volume, backend=backend))
        yield min(start + batch, n), n
    sino = torch.cat(parts, dim=0)
    return sino if i0 is None else poisson_noise(sino, i0, seed)


def poisson_noise(sino: torch.Tensor, i0: float, seed: int | None = None) -> torch.Tensor:
    """Line integrals -> Poisson counts at ``i0`` photons per pixel -> line integrals (see :func:`simulate`)."""
    i0 = float(i0)
    if not math.isfinite(i0) or i0 <= 0:
        raise ValueError(f"i0 (photons per pixel) must be a positive number, got {i0!r}")
    gen = torch.Generator(device=sino.device)
    if seed is not None:
        gen.manual_seed(int(seed))
    else:
        gen.seed()
    counts = torch.poisson((i0 * torch.exp(-sino.to(torch.float64))), generator=gen)
    return (-torch.log(counts.clamp(min=1.0) / i0)).to(sino.dtype)
