"""Self-calibration: the geometry that makes a reconstruction reproject onto the measured data.

Alternates two steps, coarse to fine (binned detector and volume first):

- reconstruct: a few CGLS iterations, warm-started, with the current geometry;
- correct the geometry: one Levenberg-Marquardt step on
  ``0.5 ||A(g(p)) x - y||^2 / ||y||^2 + 0.5 lambda ||D s||^2`` with the volume
  held.  The gradient comes from the projector's geometry gradients (autograd
  through :class:`~ctbench.calibration.model.GeometryModel`); the Gauss-Newton
  curvature from central finite differences of the projection, one projection
  pair per global parameter and one pair per shift component for all views at
  once (a view's shift only changes that view).  ``axis_tilt``, which the
  volume would take back from a volume-held step, steps on the reduced
  problem instead (the volume follows the geometry: :mod:`ctbench.calibration.varpro`).

Per-view shifts ``s`` live in the complement of their gauge (a fixed object
translation, and the mean shift when the detector offset is free), and a
first-difference prior (``smoothness``) ties neighbouring views.  After the
first reconstruction, every free global parameter is tested for
identifiability against the object (can a changed volume explain its data
signature?) and the other parameters; one that fails is held at its start and
reported as "not identifiable" (see :mod:`ctbench.calibration.analysis`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..projector import Projector
from ..solvers import cgls
from ..solvers._checks import check_callable, check_cancel, check_sinogram
from ..solvers.state import is_cancelled
from .acceptance import BETTER, LEVEL, MU0, WORSE, judge, predicted_decrease, rounding_scale
from .analysis import Analysis, analyse
from .levels import Level, make_level, resample_volume
from .model import complement_basis
from .normal import difference_operator, normal_matrix
from .parameters import (GLOBAL, NEEDS_KNOWN_OBJECT, PER_VIEW, SPECS, STAGE, WHY_WEAK, check_bounds, check_free,
                         check_start)
from .result import CalibrationResult, ParameterEstimate
from .varpro import followed_volume, reduced_step_columns, varpro_indices

__all__ = ["CalibrationState", "calibrate", "calibrate_iterations"]

F64 = torch.float64


@dataclass(frozen=True)
class CalibrationState:
    """One outer iteration: the level, the loss after the geometry step, the current estimate."""

    iteration: int
    level: int
    binning: int
    loss: float                       # relative data misfit ||A x - y||^2 / ||y||^2 (volume held)
    parameters: dict                  # global values in their units
    shifts: dict                      # per-view values (lists, px)
    volume: torch.Tensor              # current reconstruction at this level's grid
    extra: dict = field(default_factory=dict)


def _check_levels(levels, n_outer):
    try:
        levels = tuple(int(f) for f in levels)
        n_outer = tuple(int(k) for k in ([n_outer] * len(levels) if isinstance(n_outer, int) else n_outer))
    except (TypeError, ValueError):
        raise ValueError(f"levels and n_outer must be integers or sequences of integers, got {levels!r}, "
                         f"{n_outer!r}") from None
    if not levels or any(f < 1 for f in levels):
        raise ValueError(f"levels must be binning factors >= 1, coarse first, e.g. (2, 1); got {levels}")
    if len(n_outer) != len(levels) or any(k < 1 for k in n_outer):
        raise ValueError(f"n_outer must give at least 1 outer iteration for each of the {len(levels)} levels, "
                         f"got {n_outer}")
    return levels, n_outer


def _check_structure(y: torch.Tensor) -> None:
    spread = float(y.std()) if y.numel() > 1 else 0.0
    scale = float(y.abs().max())
    if scale == 0.0 or spread <= 1e-6 * scale:
        raise ValueError("sinogram: the scan has no structure (constant or empty projections); "
                         "no geometry can be calibrated from it")


def _check_known_object(obj, projector: Projector):
    if obj is None:
        return None
    if not isinstance(obj, torch.Tensor):
        try:
            obj = torch.as_tensor(obj)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"known_object must be a volume tensor, got {type(obj).__name__}") from None
    shape = tuple(projector.global_volume_shape)
    if tuple(obj.shape) != shape:
        raise ValueError(f"known_object has shape {tuple(obj.shape)}; the projector's volume is {shape}")
    if not obj.is_floating_point():
        obj = obj.to(torch.float32)
    if not bool(torch.isfinite(obj).all()):
        raise ValueError("known_object has non-finite values")
    if float(obj.abs().max()) == 0:
        raise ValueError("known_object is empty (all zero): a known object needs structure")
    return obj.detach().cpu()


def calibrate_iterations(projector: Projector, sinogram: torch.Tensor, free=("offset_u", "roll", "shift"), *,
                         bounds=None, start=None, levels=(2, 1), n_outer=(8, 3), n_inner: int = 3,
                         n_init: int = 10, volume_factor: int = 2, smoothness: float = 0.05, min_identifiability: float = 0.03,
                         known_object=None, callback=None, cancel=None):
    """Generator of self-calibration steps; yields a :class:`CalibrationState` per outer iteration.

    Its return value (``StopIteration.value``; :func:`calibrate` collects it) is
    the :class:`~ctbench.calibration.result.CalibrationResult`.  Arguments are
    checked when this function is called.  See :func:`calibrate` for them.
    """
    if not isinstance(projector, Projector):
        raise TypeError(f"projector must be a ctbench Projector, got {type(projector).__name__}")
    if projector.is_2d:
        raise ValueError("calibration supports 3D scans (a detector with rows and columns); this projector is 2D")
    if projector.world_size != 1:
        raise ValueError("calibration runs in one process; build the projector without a distributed partition")
    y = check_sinogram(projector, sinogram)
    _check_structure(y)
    free = check_free(free, beam=projector.beam, n_views=projector.n_views)
    bounds = check_bounds(bounds, free)
    start = check_start(start, free, bounds, projector.n_views)
    levels, n_outer = _check_levels(levels, n_outer)
    for f in levels:
        U, V = projector.detector_shape
        if U // f < 4 or V // f < 4:
            raise ValueError(f"levels: binning {f} leaves a {U // f}x{V // f} detector; use smaller factors")
    for name, val in (("n_inner", n_inner), ("n_init", n_init), ("volume_factor", volume_factor)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    for name, val in (("smoothness", smoothness), ("min_identifiability", min_identifiability)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val) or val < 0:
            raise ValueError(f"{name} must be a non-negative number, got {val!r}")
    callback = check_callable(callback, "callback")
    cancel = check_cancel(cancel)
    known = _check_known_object(known_object, projector)
    return _run(projector, y, free, bounds, start, levels, n_outer, n_inner, n_init, volume_factor, float(smoothness),
                float(min_identifiability), callback, cancel, known)


def calibrate(projector: Projector, sinogram: torch.Tensor, free=("offset_u", "roll", "shift"), **options
              ) -> CalibrationResult:
    """Calibrate a scan's geometry from its own data; returns a :class:`CalibrationResult`.

    Parameters
    ----------
    projector : the nominal scan (trajectory, volume grid, detector); any 3D beam, one process.
    sinogram : the measured line integrals ``(n_views, U, V)``.
    free : parameters to estimate: global ``offset_u``, ``offset_v`` (px), ``roll``, ``pitch``,
        ``yaw``, ``axis_tilt`` (deg), ``sdd`` (mm, cone beam) and per-view ``shift_u``,
        ``shift_v`` (px; ``"shift"`` for both).  See docs/CALIBRATION.md.
    bounds : ``{name: (low, high)}``; defaults are in :data:`ctbench.calibration.parameters.SPECS`.
    start : ``{name: value}`` (per-view: a list per view); 0 (the nominal geometry) by default.
    levels : binning factors, coarse first; ``n_outer``: outer iterations per level.
    n_inner : CGLS iterations per outer iteration (warm-started); ``n_init``: for the first volume.
    volume_factor : the calibration's volume grid is this many times coarser than the (binned) detector.
    smoothness : weight of the first-difference prior on per-view shifts, relative to their data curvature.
    min_identifiability : a global parameter whose data signature is explained to within this
        fraction by a changed volume and the other parameters is held and reported "not identifiable".
    known_object : the object on the projector's volume grid when it is known (a calibration phantom, a
        reference scan): no reconstruction, and the absolute scale (``sdd``, ``pitch``) becomes identifiable.
    callback : called with each :class:`CalibrationState`; returning True stops.
    cancel : a threading.Event or a callable; checked between outer iterations.
    """
    gen = calibrate_iterations(projector, sinogram, free, **options)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


# ------------------------------------------------------------------ the loop
class _Estimate:
    """Current values: global (dict of floats) and the per-view shift vector ``s = [shift_u; shift_v]``."""

    def __init__(self, free, start, n):
        self.glob_names = tuple(k for k in free if k in GLOBAL)
        self.shift_names = tuple(k for k in free if k in PER_VIEW)
        self.n = n
        self.g = {k: float(start.get(k, 0.0)) for k in self.glob_names}
        self.s = torch.cat([torch.as_tensor(start.get(k, [0.0] * n), dtype=F64) for k in self.shift_names]) \
            if self.shift_names else torch.zeros(0, dtype=F64)
        self.held: set[str] = set()
        self.pending: set[str] = set()    # not yet released by the coarse-to-fine stages

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(k for k in self.glob_names if k not in self.held and k not in self.pending)

    def shifts(self, s=None) -> dict:
        s = self.s if s is None else s
        return {k: s[i * self.n:(i + 1) * self.n] for i, k in enumerate(self.shift_names)}

    def trajectory(self, model, g=None, s=None, dtype=None):
        g = self.g if g is None else g
        sh = self.shifts(s)
        return model.apply(g, sh.get("shift_u"), sh.get("shift_v"), dtype=dtype)


def _loss(P: Projector, traj, x, y, y_norm2):
    """(loss, its rounding scale): the relative misfit summed in float64 from the projector's (float32)
    values, and how far their rounding can move it (:func:`~ctbench.calibration.acceptance.rounding_scale`)."""
    with torch.no_grad():
        p = P.project(x, trajectory=traj)
        r = p - y
        return float(r.to(F64).square().sum()) / y_norm2, rounding_scale(p, r, y_norm2)


def _jacobian(level: Level, est: _Estimate, P: Projector, x, dtype):
    """Central differences: a column (a sinogram) per active global parameter and per shift component."""
    cols_g, cols_s = [], []
    with torch.no_grad():
        for k in est.active:
            h = SPECS[k].step
            gp, gm = dict(est.g), dict(est.g)
            gp[k] += h
            gm[k] -= h
            d = P.project(x, trajectory=est.trajectory(level.model, g=gp, dtype=dtype)) - \
                P.project(x, trajectory=est.trajectory(level.model, g=gm, dtype=dtype))
            cols_g.append(d / (2 * h))
        n = est.n
        for i, k in enumerate(est.shift_names):
            h = SPECS[k].step
            e = torch.zeros_like(est.s)
            e[i * n:(i + 1) * n] = h
            d = P.project(x, trajectory=est.trajectory(level.model, s=est.s + e, dtype=dtype)) - \
                P.project(x, trajectory=est.trajectory(level.model, s=est.s - e, dtype=dtype))
            cols_s.append(d / (2 * h))
    return cols_g, cols_s


def _gradient(level: Level, est: _Estimate, P: Projector, x, y, dtype):
    """d(0.5 ||A x - y||^2)/d(parameters) through the projector's geometry gradients."""
    g = {k: torch.tensor(v, dtype=F64, requires_grad=k in est.active) for k, v in est.g.items()}
    s = est.s.clone().requires_grad_(est.s.numel() > 0)
    traj = est.trajectory(level.model, g=g, s=s, dtype=dtype)
    r = P.project(x.detach(), trajectory=traj) - y
    loss = 0.5 * r.to(F64).square().sum()
    wrt = [g[k] for k in est.active] + ([s] if s.numel() else [])
    grads = torch.autograd.grad(loss, wrt, allow_unused=True) if wrt else []
    grads = [torch.zeros((), dtype=F64) if gr is None else gr for gr in grads]
    gg = torch.stack([gr.reshape(()) for gr in grads[:len(est.active)]]) if est.active else torch.zeros(0, dtype=F64)
    gs = grads[len(est.active)] if s.numel() else torch.zeros(0, dtype=F64)
    return gg.to(F64), gs.to(F64)


def _clip(est: _Estimate, g: dict, s: torch.Tensor, bounds, B):
    g = {k: min(max(v, bounds[k][0]), bounds[k][1]) for k, v in g.items()}
    if s.numel():
        n = est.n
        parts = []
        for i, k in enumerate(est.shift_names):
            lo, hi = bounds[k]
            parts.append(s[i * n:(i + 1) * n].clamp(lo, hi))
        s = torch.cat(parts)
        s = B @ (B.T @ s)   # back into the identifiable subspace
    return g, s


def _extrapolate(est: _Estimate, step: torch.Tensor, last: torch.Tensor | None, bounds, B) -> bool:
    """Aitken jump along a slowly converging direction.

    The volume absorbs part of every geometry error, so alternating steps
    shrink geometrically (by a ratio rho) along the same direction; the rest of
    the way is then ``step * rho / (1 - rho)``.  Jumps only when two steps agree
    in direction; capped at three more steps' worth.  The next reconstruction
    and Gauss-Newton step correct any overshoot.
    """
    if last is None or last.numel() != step.numel() or step.numel() == 0:
        return False
    n_step, n_last = float(step.norm()), float(last.norm())
    if n_step == 0 or n_last == 0:
        return False
    cos = float(step @ last) / (n_step * n_last)
    rho = n_step / n_last
    if cos < 0.9 or not 0.3 < rho < 0.97:
        return False
    jump = step * min(rho / (1 - rho), 3.0)
    kg = len(est.active)
    g = {**est.g, **{k: est.g[k] + float(jump[i]) for i, k in enumerate(est.active)}}
    s = est.s + jump[kg:] if est.s.numel() else est.s
    est.g, est.s = _clip(est, g, s, bounds, B)
    return True


def _object_on(level: Level, obj: torch.Tensor, dtype) -> torch.Tensor:
    """A known object on a level's (binned) grid: the mean over each bin, which keeps attenuation per mm."""
    if tuple(obj.shape) == tuple(level.volume_shape):
        return obj.to(dtype)
    return F.adaptive_avg_pool3d(obj.to(dtype)[None, None], tuple(level.volume_shape))[0, 0]


def _hold_note(k: str, ident: float, scale_like: bool = False) -> str:
    why = WHY_WEAK.get(k)
    if scale_like:
        return (f"{k}: not identifiable from an unknown object ({why}; the rest, {100 * ident:.1f}% of its effect "
                "on the data, is smaller than what the coarse calibration volume gets wrong); held at its start "
                "value: give known_object to calibrate it")
    return (f"{k}: not identifiable from this scan (only {100 * ident:.1f}% of its effect on the data is not "
            "explained by a changed object or the other parameters" + (f": {why}" if why else "") +
            "); held at its start value")


def _run(projector, y, free, bounds, start, levels, n_outer, n_inner, n_init, vf, smoothness, min_ident,
         callback, cancel, known=None):
    dtype = y.dtype
    est = _Estimate(free, start, projector.n_views)
    y_full_norm2 = float(y.to(F64).square().sum())
    history: list[dict] = []
    notes: list[str] = []
    B = None
    x = None
    it = 0
    stopped = "completed"
    analysis: Analysis | None = None
    held_ident: dict[str, float] = {}
    tested: set[str] = set()
    mu = MU0
    if known is not None:
        vf = 1                      # nothing to absorb: the object is given on the projector's grid
    stages = sorted({STAGE.get(k, 0) for k in est.glob_names} | {0})
    est.pending = {k for k in est.glob_names if STAGE.get(k, 0) > 0}
    schedule = [(0, st) for st in stages] + [(li, stages[-1]) for li in range(1, len(levels))]
    cur = None
    for li, stage in schedule:
        f, n_it = levels[li], n_outer[li]
        if li != cur:
            level = make_level(projector, y, f, vf)
            yl = level.sinogram
            y_norm2 = float(yl.to(F64).square().sum())
            if B is None:
                N = level.model.gauge_vectors(est.shift_names, est.glob_names) if est.shift_names else None
                B = complement_basis(N) if N is not None else torch.zeros(0, 0, dtype=F64)
                if est.s.numel():
                    est.s = B @ (B.T @ est.s)
            Dm = difference_operator(est.n, len(est.shift_names))
            P = level.projector(est.trajectory(level.model, dtype=dtype))
            if known is not None:
                x = _object_on(level, known, dtype)
            else:
                x0 = None if x is None else resample_volume(x, P.volume_shape).to(dtype)
                x = cgls(P, yl, n_init if x is None else n_inner, x0=x0).volume
            fresh = True
            cur = li
        est.pending -= {k for k in est.pending if STAGE[k] <= stage}
        last_step = None
        mu = MU0    # a new problem (parameters joined, or a finer level): the last one's damping says nothing here
        for k_outer in range(n_it):
            if is_cancelled(cancel):
                stopped = "cancelled"
                break
            if not fresh:
                P = level.projector(est.trajectory(level.model, dtype=dtype))
                if known is None:
                    x = cgls(P, yl, n_inner, x0=x).volume
            fresh = False
            cols_g, cols_s = _jacobian(level, est, P, x, dtype)
            if any(k not in tested for k in est.active):
                an = analyse(P, x, yl, est, cols_g, cols_s, B, smoothness, Dm, known_object=known is not None)
                weak = [k for k in est.active if k not in tested and
                        (an.identifiability[k] < min_ident or (known is None and k in NEEDS_KNOWN_OBJECT))]
                tested |= set(est.active)
                for k in weak:
                    est.held.add(k)
                    held_ident[k] = an.identifiability[k]
                    notes.append(_hold_note(k, an.identifiability[k], known is None and k in NEEDS_KNOWN_OBJECT))
                keep = [i for i, k in enumerate(an.names) if k not in weak]
                cols_g = [cols_g[i] for i in keep]
            if not est.active and not est.s.numel():
                msg = "no free parameter is identifiable from this scan: the geometry is left nominal"
                if not est.pending and msg not in notes:
                    notes.append(msg)
                break
            gg, gs = _gradient(level, est, P, x, yl, dtype)
            # weak parameters step on the reduced problem (the volume follows the geometry): varpro.py
            vp = varpro_indices(est.active, known is not None)
            if vp:
                with torch.no_grad():
                    cols_g, g_red = reduced_step_columns(P, x, P.project(x) - yl, cols_g, vp)
                for i, gv in zip(vp, g_red):
                    gg[i] = gv
            H = normal_matrix(cols_g, cols_s, est.n)
            kg = len(est.active)
            # reduce the shifts to their identifiable subspace: z = [global, q], s = B q
            T = torch.block_diag(torch.eye(kg, dtype=F64), B) if est.s.numel() else torch.eye(kg, dtype=F64)
            Hz = T.T @ H @ T
            grad = torch.cat([gg, gs]) if est.s.numel() else gg
            gz = T.T @ grad
            lam = 0.0
            if est.s.numel():
                hs = torch.diagonal(H)[kg:]
                lam = smoothness * float(hs.mean()) if float(hs.mean()) > 0 else 0.0
                R = Dm.T @ Dm
                Hz[kg:, kg:] += lam * (B.T @ R @ B)
                gz[kg:] += lam * (B.T @ (R @ est.s))
            reg = (lambda s: 0.5 * lam * float((Dm @ s).square().sum()) / y_norm2) if est.s.numel() \
                else (lambda s: 0.0)
            cur_data, cur_round = _loss(P, None, x, yl, y_norm2)
            current = cur_data + reg(est.s)
            if vp:   # judged after the volume has followed: the current geometry gets the same iterations
                cur_f, cur_round = _loss(P, None, followed_volume(P, yl, x, n_inner), yl, y_norm2)
                current = cur_f + reg(est.s)
            accepted = False
            step_g = step_s = 0.0
            diag = torch.diagonal(Hz).clamp_min(1e-30)
            for _ in range(5):
                A = Hz + mu * torch.diag(diag)
                try:
                    delta = -torch.linalg.solve(A, gz)
                except RuntimeError:
                    mu *= 10
                    continue
                g_new = dict(est.g)
                for i, k in enumerate(est.active):
                    g_new[k] = est.g[k] + float(delta[i])
                s_new = est.s + B @ delta[kg:] if est.s.numel() else est.s
                g_new, s_new = _clip(est, g_new, s_new, bounds, B)
                t_new = est.trajectory(level.model, g=g_new, s=s_new, dtype=dtype)
                if vp:
                    P_new = level.projector(t_new)
                    x_new = followed_volume(P_new, yl, x, n_inner)
                    trial, trial_round = _loss(P_new, None, x_new, yl, y_norm2)
                else:
                    x_new = x
                    trial, trial_round = _loss(P, t_new, x, yl, y_norm2)
                trial += reg(s_new)
                # the step actually taken (after the bounds), in z = [global, q]; the model's gain in loss units
                # (the data term is |r|^2 / |y|^2, twice the model's 0.5 |r|^2; the prior's share is counted twice
                # too, which only makes a step look more promising than it is: judged "worse" sooner)
                dz = torch.tensor([g_new[k] - est.g[k] for k in est.active], dtype=F64)
                if est.s.numel():
                    dz = torch.cat([dz, B.T @ (s_new - est.s)])
                pred = 2.0 * predicted_decrease(gz, Hz, dz) / y_norm2
                verdict = judge(current, trial, pred, cur_round + trial_round)
                if verdict != WORSE:
                    step_g = max([abs(g_new[k] - est.g[k]) for k in est.active] or [0.0])
                    step_s = float((s_new - est.s).square().mean().sqrt()) if est.s.numel() else 0.0
                    step = torch.tensor([g_new[k] - est.g[k] for k in est.active] + (s_new - est.s).tolist(),
                                        dtype=F64)
                    est.g, est.s = g_new, s_new
                    x = x_new
                    # no jump from a level step: its direction is the model's, not one the loss confirmed
                    extrapolated = verdict == BETTER and _extrapolate(est, step, last_step, bounds, B)
                    last_step = None if extrapolated or verdict != BETTER else step
                    current = trial
                    if verdict == BETTER:
                        mu = max(mu / 3, 1e-7)
                    accepted = True
                    break
                mu *= 5
            it += 1
            rec = {"iteration": it, "level": li, "binning": f, "stage": stage, "loss": current,
                   "data_loss": cur_data, "accepted": accepted, "damping": mu,
                   "level_step": accepted and verdict == LEVEL}
            history.append(rec)
            state = CalibrationState(it, li, f, current, dict(est.g),
                                     {k: v.tolist() for k, v in est.shifts().items()}, x, dict(rec))
            stop_requested = callback is not None and callback(state) is True
            yield state
            if stop_requested:
                stopped = "callback"
                break
            if accepted and step_g < 1e-4 and step_s < 1e-4:
                break   # converged at this level and stage
        if stopped != "completed":
            break
    # Final uncertainty and identifiability at the coarsest level with the final geometry (cheap, and a
    # binned pixel carries the same information as the pixels it averages).
    if stopped == "completed":
        level = make_level(projector, y, levels[0], vf)
        P = level.projector(est.trajectory(level.model, dtype=dtype))
        if known is not None:
            xa = _object_on(level, known, dtype)
        else:
            xa = cgls(P, level.sinogram, n_inner, x0=resample_volume(x, P.volume_shape).to(dtype)).volume
        cols_g, cols_s = _jacobian(level, est, P, xa, dtype)
        analysis = analyse(P, xa, level.sinogram, est, cols_g, cols_s, B, smoothness,
                           difference_operator(est.n, len(est.shift_names)), known_object=known is not None,
                           discretisation=len(levels) > 1)
        # An estimate whose uncertainty exceeds what the parameter is for, and which the data do not tell from
        # the start (within 2 sd), says nothing: report it as such and leave the geometry at the start for it,
        # instead of a confident-looking wrong value.  One far from the start keeps its value and its honest sd.
        for k in est.active:
            sd = analysis.sigma.get(k)
            if sd is None or (sd > SPECS[k].resolution and abs(est.g[k] - float(start.get(k, 0.0))) < 2 * sd):
                est.held.add(k)
                held_ident[k] = analysis.identifiability.get(k, 0.0)
                notes.append(f"{k}: not determined by this scan (its estimate {est.g[k]:.4g} has a 1-sd uncertainty "
                             f"of {'?' if sd is None else f'{sd:.3g}'} {SPECS[k].unit}, above the "
                             f"{SPECS[k].resolution:g} {SPECS[k].unit} that would make it useful, and it is within 2 sd of its start"
                             + (f": {WHY_WEAK[k]}" if k in WHY_WEAK else "") + "); held at its start value")
                est.g[k] = float(start.get(k, 0.0))
    else:
        notes.append(f"stopped early ({stopped}): no final uncertainty analysis")
    model = make_level(projector, y, 1).model
    trajectory = est.trajectory(model, dtype=projector.trajectory.dtype)
    final_loss, _ = _loss(projector, trajectory.to(dtype=dtype), x if tuple(x.shape) == tuple(projector.volume_shape)
                       else resample_volume(x, projector.volume_shape).to(dtype), y, y_full_norm2)
    table = []
    for k in free:
        spec = SPECS[k]
        st = start.get(k, 0.0)
        if k in PER_VIEW:
            vals = est.shifts()[k]
            table.append(ParameterEstimate(k, spec.unit, float(vals.square().mean().sqrt()), 0.0, bounds[k],
                                           None if analysis is None else analysis.shift_rms_sigma.get(k),
                                           None, "estimated", spec.meaning, per_view=True))
            continue
        if k in est.held or k in est.pending:
            status = "not identifiable" if k in est.held else "not reached"
            table.append(ParameterEstimate(k, spec.unit, None, st, bounds[k], None, held_ident.get(k), status,
                                           spec.meaning))
            continue
        ident = None if analysis is None else analysis.identifiability.get(k)
        sigma = None if analysis is None else analysis.sigma.get(k)
        status = "estimated"
        lo, hi = bounds[k]
        if any(abs(est.g[k] - b) < 1e-9 for b in (lo, hi)):
            status = "at bound"
            notes.append(f"{k}: the estimate sits at its bound {est.g[k]:g}; widen the bounds")
        table.append(ParameterEstimate(k, spec.unit, est.g[k], st, bounds[k], sigma, ident, status, spec.meaning))
    correlations = {} if analysis is None else {f"{a}/{b}": c for (a, b), c in analysis.correlation.items()}
    for pair, c in correlations.items():
        if abs(c) > 0.9:
            notes.append(f"{pair.replace('/', ' and ')} are strongly correlated (r = {c:+.2f}): the data fix a "
                         "combination of them better than either; their uncertainties include it")
    if projector.beam == "cone" and known is None:
        notes.append("absolute scale (the object's size against the magnification) is not identifiable from an "
                     "unknown object: the source-object distance and the detector pitch are taken as given"
                     + ("; sdd is estimated from the cone-angle effects alone" if "sdd" in est.active else ""))
    if est.shift_names:
        gauge = ["a fixed translation of the object (it only moves the reconstruction)"]
        if "shift_u" in est.shift_names and "offset_u" in est.glob_names:
            gauge.append("the mean shift_u (it trades with offset_u)")
        if "shift_v" in est.shift_names and "offset_v" in est.glob_names:
            gauge.append("the mean shift_v (it trades with offset_v)")
        notes.append("per-view shifts are not identifiable along " + ", ".join(gauge) +
                     "; they are constrained to zero there. A translation along the beam is not modelled "
                     "(invisible in parallel beam, a faint magnification change in cone beam)")
    return CalibrationResult(trajectory=trajectory, parameters=table,
                             shifts={k: v.tolist() for k, v in est.shifts().items()},
                             shift_sigma=None if analysis is None else analysis.shift_sigma,
                             loss_history=[h["loss"] for h in history], history=history, volume=x,
                             volume_binning=levels[-1] if stopped == "completed" else f, stopped=stopped,
                             notes=notes, final_loss=final_loss, levels=list(levels), correlations=correlations)
