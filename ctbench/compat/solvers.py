"""diffct 2.5's solvers (``diffct.solvers``) on ctbench's engine: :class:`SolverResult`, :func:`cgls`,
:func:`sirt`, :func:`tv_reconstruction` (Adam on half the mean squared error plus weighted mean TV,
as diffct), :func:`cgls_into`, :func:`total_variation`.  ``checkpoint_directory=``/``resume=``
write and read diffct's checkpoints (:mod:`ctbench.compat._checkpoint`), except ``cgls_into`` on a
ctbench Projector, which runs ctbench's disk-backed CGLS (:mod:`ctbench.compat._disk`).
Calls that use ctbench's keywords (``n_iter``, ``tol``, ...) pass on to :mod:`ctbench.solvers`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import solvers as _s

from . import _checkpoint as _ck
from ._agreement import agree
from ._common import _is_projector, _read_all, _write_blocks

__all__ = ["SolverResult", "cgls", "sirt", "tv_reconstruction", "cgls_into", "total_variation"]

# ------------------------------------------------------------------ solvers


@dataclass
class SolverResult:
    """diffct's solver result: the final ``volume``, ``iterations`` run, ``residual_history``
    (``||A x - b||`` before the first and after every iteration), ``converged`` and ``reason``."""

    volume: torch.Tensor
    iterations: int
    residual_history: list
    converged: bool
    reason: str


_CTBENCH_SOLVER_KEYWORDS = {"n_iter", "tol", "bounds", "lam", "nonneg", "cancel"}
_LIMIT = 1 << 20  # elements per block of a checkpoint's copies and fingerprints (diffct's default)


def _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume,
                   callback=None):
    if not _is_operator(operator):
        raise TypeError(f"operator must be a ctbench Projector or a linear operator with project, backproject, "
                        f"volume_shape and projection_shape, got {type(operator).__name__}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"iterations must be a nonnegative integer, got {iterations!r}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) or float(v) < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable (callback(iteration, residual, volume)) or None, "
                        f"got {type(callback).__name__}")
    if not isinstance(measurements, torch.Tensor) or not measurements.is_floating_point():
        raise TypeError("measurements must be a real floating-point tensor")
    if tuple(measurements.shape) != tuple(operator.projection_shape) or not torch.isfinite(measurements).all():
        raise ValueError(f"measurements must be finite and of projection_shape {tuple(operator.projection_shape)}, "
                         f"got {tuple(measurements.shape)}")
    if x0 is not None and (not isinstance(x0, torch.Tensor) or not x0.is_floating_point()
                           or tuple(x0.shape) != tuple(operator.volume_shape) or not torch.isfinite(x0).all()):
        raise ValueError(f"x0 must be a finite floating-point tensor of volume_shape {tuple(operator.volume_shape)}")
    for name, value in (("checkpoint_directory", checkpoint_directory), ("resume", resume)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a directory path or None, got {type(value).__name__}")


def _check_setting(name, value, positive=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)) \
            or float(value) < 0 or (positive and float(value) == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _compute_dtype(operator, measurements):
    dtype = getattr(operator, "dtype", None)  # diffct's precision= (a compat Projector's dtype)
    return dtype if isinstance(dtype, torch.dtype) else measurements.dtype


class _Checkpoints:
    """diffct's checkpoint directories for an in-memory solver (:mod:`ctbench.compat._checkpoint`):
    the resume is validated, and the target directory checked, before anything is computed."""

    def __init__(self, operator, measurements, algorithm, settings, iterations, checkpoint_directory, resume,
                 shapes, scalars=()):
        self.directory, self.rank = checkpoint_directory, int(getattr(operator, "rank", 0) or 0)
        self.active = checkpoint_directory is not None or resume is not None
        self.saved, self.states = None, None
        if not self.active:
            return
        dtype = _compute_dtype(operator, measurements)
        self.metadata = _ck.signature(operator, measurements.detach(), algorithm, settings, _LIMIT, dtype)
        if resume is not None:
            self.saved, stores = _ck.load(resume, self.metadata, iterations, shapes, _LIMIT, scalars=scalars,
                                          rank=self.rank)
            self.states = {k: v.read(None).to(device=measurements.device, dtype=v.dtype) for k, v in stores.items()}
        _ck.refuse_overwrite(checkpoint_directory, self.saved["iteration"] if self.saved else 0, self.rank)

    def save(self, iteration, states, history, norm, **scalars):
        if self.directory is not None:
            _ck.save(self.directory, iteration, states, self.metadata, history, norm, _LIMIT, rank=self.rank,
                     **scalars)


def _admitted(operator, admit, token):
    """Run the local checks ``admit()`` (returning its result), then agree with the other ranks on
    the outcome and the branches taken (:mod:`ctbench.compat._agreement`) before any collective."""
    result, error = None, None
    try:
        result = admit()
    except (ValueError, TypeError, OSError, NotImplementedError) as caught:
        error = caught
    ck = result[0] if isinstance(result, tuple) else result
    saved = getattr(ck, "saved", None)
    agree(operator, error, (*token, None if saved is None else (saved["iteration"], saved["residual_history"])))
    return result


def _no_checkpoints(solver, checkpoint_directory, resume):
    if checkpoint_directory is not None or resume is not None:
        raise NotImplementedError(f"checkpoint_directory/resume are not supported by {solver} in ctbench")


def _is_operator(obj) -> bool:
    # diffct's solvers take any linear operator with project/backproject and the two shapes (a
    # ctbench Projector, or e.g. a matrix wrapped so); inner products default to plain sums
    return all(hasattr(obj, n) for n in ("project", "backproject", "volume_shape", "projection_shape"))


def _dot_rays(operator, a, b) -> float:
    # float64 sums (diffct's): CGLS's step lengths are sensitive to float32 rounding of the norms
    inner = getattr(operator, "inner_projection", None)
    return float(inner(a.double(), b.double()) if inner is not None else (a.double() * b.double()).sum())


def _dot_volume(operator, a, b) -> float:
    inner = getattr(operator, "inner_volume", None)
    return float(inner(a.double(), b.double()) if inner is not None else (a.double() * b.double()).sum())


def _norm(operator, y) -> float:
    return math.sqrt(max(_dot_rays(operator, y, y), 0.0))


def _status(residual, threshold, stopped):
    if stopped:
        return False, "callback stopped"
    if residual <= threshold:
        return True, "residual tolerance reached"
    return False, "iteration limit reached"


def _stop(callback, k, residual, x) -> bool:
    # diffct: a callback stops the solver by returning False (None continues)
    return callback is not None and callback(k, residual, x) is False


def _start(operator, b, x0):
    return (torch.zeros(operator.volume_shape, dtype=b.dtype, device=b.device) if x0 is None
            else x0.detach().to(b).clone())


@torch.no_grad()
def cgls(operator, measurements, iterations=30, *, x0=None, rtol=1e-6, atol=0., callback=None,
         checkpoint_directory=None, resume=None, **ctbench_kwargs):
    """CGLS on ``A x = b`` (diffct's signature): stops after ``iterations`` (a total, resumed
    iterations included) or once ``||A x - b|| <= atol + rtol ||b||``; ``callback(k, residual, x)``
    returning False stops it.  ``checkpoint_directory=d`` publishes diffct's checkpoint
    ``d/step-NNNNNN/rank-NNNNN`` after every iteration; ``resume=`` continues from one (that
    folder, or ``d`` itself for its newest step): :mod:`ctbench.compat._checkpoint`.

    With ctbench's keywords (``n_iter``, ``tol``, ``cancel``) this is :func:`ctbench.solvers.cgls`.
    """
    if ctbench_kwargs:
        return _ctbench_solver(_s.cgls, "cgls", operator, measurements, iterations, x0, callback, ctbench_kwargs)
    def admit():
        _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume, callback)
        vol, rays = tuple(operator.volume_shape), tuple(operator.projection_shape)
        return _Checkpoints(operator, measurements, "cgls", {}, iterations, checkpoint_directory, resume,
                            dict(x=vol, s=vol, p=vol, r=rays, q=rays), scalars=("gamma",))

    ck = _admitted(operator, admit, ("cgls", iterations, rtol, atol, x0 is None, resume is None,
                                     checkpoint_directory is None))
    b = measurements.detach().to(_compute_dtype(operator, measurements))
    norm_b = _norm(operator, b)
    threshold = atol + rtol * norm_b
    if ck.saved is not None:
        st, k, history, gamma = ck.states, ck.saved["iteration"], list(ck.saved["residual_history"]), ck.saved["gamma"]
    else:
        x = _start(operator, b, x0)
        r = b.clone() if x0 is None else b - operator.project(x)
        history = [norm_b if x0 is None else _norm(operator, r)]
        s = operator.backproject(r) if iterations and history[0] > threshold else torch.zeros_like(x)
        st, k, gamma = dict(x=x, s=s, p=s.clone(), r=r, q=torch.zeros_like(b)), 0, _dot_volume(operator, s, s)
    stopped, breakdown = False, False
    while k < iterations and history[-1] > threshold:
        if gamma == 0:
            breakdown = True
            break
        st["q"] = operator.project(st["p"])
        denom = _dot_rays(operator, st["q"], st["q"])
        if denom == 0:
            breakdown = True
            break
        alpha = gamma / denom
        st["x"].add_(st["p"], alpha=alpha)
        st["r"].sub_(st["q"], alpha=alpha)
        st["s"] = operator.backproject(st["r"])
        gamma_next = _dot_volume(operator, st["s"], st["s"])
        st["p"] = st["s"] + (gamma_next / gamma) * st["p"]
        gamma = gamma_next
        k += 1
        history.append(_norm(operator, st["r"]))
        ck.save(k, st, history, norm_b, gamma=gamma)
        stopped = _stop(callback, k, history[-1], st["x"])
        if stopped:
            break
    converged, reason = _status(history[-1], threshold, stopped)
    if breakdown and not converged:
        reason = "normal equation breakdown"
    return SolverResult(st["x"], k, history, converged, reason)


def _reciprocal(sums):
    return torch.where(sums > 0, 1 / sums.clamp_min(torch.finfo(sums.dtype).tiny), torch.zeros_like(sums))


@torch.no_grad()
def sirt(operator, measurements, iterations=100, *, x0=None, rtol=1e-6, atol=0., callback=None,
         checkpoint_directory=None, resume=None, relaxation=1., nonnegative=True, **ctbench_kwargs):
    """SIRT ``x += relaxation * C A^T R (b - A x)`` with ``R``, ``C`` the inverse row and column
    sums (zero where a sum is zero), clamped at 0 when ``nonnegative`` (diffct's signature;
    checkpoints as :func:`cgls`).

    With ctbench's keywords (``n_iter``, ``bounds``, ``tol``) this is :func:`ctbench.solvers.sirt`.
    """
    if ctbench_kwargs:
        return _ctbench_solver(_s.sirt, "sirt", operator, measurements, iterations, x0, callback, ctbench_kwargs)
    def admit():
        _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume, callback)
        omega = _check_setting("relaxation", relaxation, positive=True)
        if not isinstance(nonnegative, bool):
            raise TypeError(f"nonnegative must be a bool, got {nonnegative!r}")
        vol, rays = tuple(operator.volume_shape), tuple(operator.projection_shape)
        return _Checkpoints(operator, measurements, "sirt", dict(relaxation=omega, nonnegative=nonnegative),
                            iterations, checkpoint_directory, resume, dict(x=vol, row=rays, column=vol)), omega

    ck, relaxation = _admitted(operator, admit, ("sirt", iterations, rtol, atol, relaxation, nonnegative,
                                                 x0 is None, resume is None, checkpoint_directory is None))
    b = measurements.detach().to(_compute_dtype(operator, measurements))
    norm_b = _norm(operator, b)
    threshold = atol + rtol * norm_b
    if ck.saved is not None:
        st, k, history = ck.states, ck.saved["iteration"], list(ck.saved["residual_history"])
        residual = b - operator.project(st["x"]) if k < iterations and history[-1] > threshold else None
    else:
        st, k = dict(x=_start(operator, b, x0)), 0
        residual = b if x0 is None else b - operator.project(st["x"])
        history = [norm_b if x0 is None else _norm(operator, residual)]
        if iterations and history[0] > threshold:
            st["row"] = _reciprocal(operator.project(torch.ones_like(st["x"])))
            st["column"] = _reciprocal(operator.backproject(torch.ones_like(b)))
    stopped, stale = False, False
    while k < iterations and history[-1] > threshold:
        if stale:  # a callback may have changed the iterate in place (diffct re-projects)
            residual = b - operator.project(st["x"])
        st["x"].add_(st["column"] * operator.backproject(st["row"] * residual), alpha=relaxation)
        if nonnegative:
            st["x"].clamp_(min=0)
        k += 1
        residual = b - operator.project(st["x"])
        history.append(_norm(operator, residual))
        ck.save(k, st, history, norm_b)
        stopped = _stop(callback, k, history[-1], st["x"])
        if stopped:
            break
        stale = callback is not None
    converged, reason = _status(history[-1], threshold, stopped)
    return SolverResult(st["x"], k, history, converged, reason)


def _tv_spacing(operator, ndim):
    vs = getattr(operator, "voxel_spacing", 1.0)
    sp = (float(vs),) * ndim if isinstance(vs, (int, float)) else tuple(float(v) for v in vs)
    return sp[-ndim:]


def total_variation(volume, *, operator=None, voxel_spacing=1., eps=1e-6, reduction="mean"):
    """Isotropic total variation with physical forward differences (diffct's definition):
    ``sum sqrt(|grad x|^2 + eps)`` over every voxel, the differences zero past the last voxel of
    each axis, divided by the voxel count for ``reduction="mean"``.  Differentiable.

    With ``operator`` (a distributed ctbench Projector) the sum and count are global; ctbench's
    smoothed TV of the Chambolle-Pock solver is :func:`ctbench.solvers.total_variation`.
    """
    if not isinstance(volume, torch.Tensor) or not volume.is_floating_point() or volume.ndim < 1:
        raise TypeError("volume must be a real floating-point tensor")
    if not math.isfinite(float(eps)) or float(eps) <= 0:
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    spacing = ((float(voxel_spacing),) * volume.ndim if isinstance(voxel_spacing, (int, float))
               else tuple(float(v) for v in voxel_spacing))
    if len(spacing) != volume.ndim or any(not math.isfinite(v) or v <= 0 for v in spacing):
        raise ValueError(f"voxel_spacing must be positive, one per volume axis ({volume.ndim}), got {voxel_spacing!r}")
    squared = torch.zeros_like(volume)
    for axis, pitch in enumerate(spacing):
        d = torch.diff(volume, dim=axis) / pitch
        pad = [0, 0] * volume.ndim
        pad[2 * (volume.ndim - 1 - axis) + 1] = 1  # zero difference past the last voxel
        squared = squared + torch.nn.functional.pad(d, pad).square()
    total = torch.sqrt(squared + eps).sum()
    count = volume.numel()
    if operator is not None and getattr(operator, "world_size", 1) > 1:
        raise NotImplementedError("total_variation over a distributed operator is not supported in the diffct "
                                  "spelling; use ctbench.solvers.total_variation(volume, projector=...)")
    return total if reduction == "sum" else total / max(count, 1)


@torch.no_grad()
def tv_reconstruction(operator, measurements, iterations=100, weight=1., lr=.1, *, x0=None, rtol=1e-6, atol=0.,
                      callback=None, checkpoint_directory=None, resume=None, **ctbench_kwargs):
    """diffct's TV reconstruction: Adam (learning rate ``lr``) on ``0.5 * mean((A x - b)^2)
    + weight * total_variation(x)`` with the volume clamped at 0 after each step (checkpoints as
    :func:`cgls`: the volume and Adam's moments and step count).

    With ctbench's keywords (``n_iter``, ``lam``, ``nonneg``, ``tol``) this is ctbench's
    Chambolle-Pock :func:`ctbench.solvers.tv_reconstruction`, which minimises the exact TV problem.
    """
    if ctbench_kwargs:
        return _ctbench_solver(_s.tv_reconstruction, "tv_reconstruction", operator, measurements, iterations, x0,
                               callback, ctbench_kwargs)
    def admit():
        _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume, callback)
        settings = dict(weight=_check_setting("weight", weight), lr=_check_setting("lr", lr, positive=True))
        if getattr(operator, "partition", None) in ("space", "hybrid"):
            raise NotImplementedError("the diffct-style tv_reconstruction runs on one process or a views partition; "
                                      "use ctbench.solvers.tv_reconstruction for space partitions")
        vol = tuple(operator.volume_shape)
        return _Checkpoints(operator, measurements, "tv_reconstruction", settings, iterations, checkpoint_directory,
                            resume, dict(x=vol, exp_avg=vol, exp_avg_sq=vol, step=(1,))), settings

    ck, settings = _admitted(operator, admit, ("tv_reconstruction", iterations, rtol, atol, weight, lr, x0 is None,
                                               resume is None, checkpoint_directory is None))
    weight, lr = settings["weight"], settings["lr"]
    b = measurements.detach().to(_compute_dtype(operator, measurements))
    norm_b = _norm(operator, b)
    threshold = atol + rtol * norm_b
    x = (ck.states["x"].clone() if ck.saved is not None else _start(operator, b, x0)).requires_grad_()
    opt = torch.optim.Adam([x], lr=lr)
    if ck.saved is not None:
        opt.state[x] = dict(step=ck.states["step"].to("cpu").reshape(()).clone(),
                            exp_avg=ck.states["exp_avg"].to(x).clone(), exp_avg_sq=ck.states["exp_avg_sq"].to(x).clone())
        k, history = ck.saved["iteration"], list(ck.saved["residual_history"])
        residual = operator.project(x.detach()) - b if k < iterations and history[-1] > threshold else None
    else:
        k = 0
        residual = -b if x0 is None else operator.project(x.detach()) - b
        history = [norm_b if x0 is None else _norm(operator, residual)]
    rays = _dot_rays(operator, torch.ones_like(b), torch.ones_like(b))  # the global ray count
    spacing = _tv_spacing(operator, x.ndim)
    stopped, stale = False, False
    while k < iterations and history[-1] > threshold:
        if stale:  # a callback may have changed the iterate in place
            residual = operator.project(x.detach()) - b
        grad = operator.backproject(residual) / max(rays, 1)
        if weight:
            with torch.enable_grad():
                tv = total_variation(x, voxel_spacing=spacing)  # diffct passes operator.voxel_spacing
                (g_tv,) = torch.autograd.grad(tv, x)
            grad = grad + weight * g_tv
        opt.zero_grad()
        x.grad = grad.to(x)
        opt.step()
        x.clamp_(min=0)
        k += 1
        residual = operator.project(x.detach()) - b
        history.append(_norm(operator, residual))
        if ck.directory is not None:
            state = opt.state[x]
            ck.save(k, dict(x=x.detach(), exp_avg=state["exp_avg"], exp_avg_sq=state["exp_avg_sq"],
                            step=torch.as_tensor(state["step"], dtype=x.dtype).reshape(1)), history, norm_b)
        stopped = _stop(callback, k, history[-1], x.detach())
        if stopped:
            break
        stale = callback is not None
    converged, reason = _status(history[-1], threshold, stopped)
    return SolverResult(x.detach(), k, history, converged, reason)


def _ctbench_solver(fn, name, operator, measurements, iterations, x0, callback, kwargs):
    unknown = set(kwargs) - _CTBENCH_SOLVER_KEYWORDS
    if unknown:
        raise TypeError(f"{name}() got unexpected keyword arguments {sorted(unknown)}")
    if "n_iter" not in kwargs and iterations is not None:
        kwargs["n_iter"] = iterations
    return fn(operator, measurements, x0=x0, callback=callback, **kwargs)


def cgls_into(operator, measurements, output, iterations, *, workspace, block_elements=1048576, rtol=1e-6,
              atol=0., callback=None, checkpoint_directory=None, resume=None):
    """diffct's ``cgls_into``: CGLS of ``measurements`` (a tensor or a block store) written into
    ``output`` (a block store or a tensor, returned as given as ``result.volume``), with the CGLS
    vectors on disk in ``workspace`` (a new directory, diffct's rule).

    - a linear operator with ``project_into``/``backproject_into`` (not a ctbench Projector): diffct's
      block CGLS (:mod:`ctbench.compat._block_cgls`): every read, write and norm holds at most
      ``block_elements`` values, ``callback(k, residual, output)`` sees the current iterate in
      ``output``, checkpoints are diffct's;
    - a ctbench Projector: ctbench's disk-backed CGLS (:mod:`ctbench.compat._disk`, its own
      checkpoint format in ``checkpoint_directory``); the callback receives the work x store,
      ``block_elements`` bounds the initial norm's blocks and a tensor output's copies, the disk
      solver sizes its own windows (its memory budget).  2D projectors run in memory unless
      checkpointing."""
    from ._disk import disk_cgls_request, plan_directories

    if isinstance(block_elements, bool) or not isinstance(block_elements, int) or block_elements < 1:
        raise ValueError(f"block_elements must be a positive integer, got {block_elements!r}")
    if not _is_operator(operator):
        raise TypeError(f"operator must be a ctbench Projector or a linear operator with project, backproject, "
                        f"volume_shape and projection_shape, got {type(operator).__name__}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"iterations must be a nonnegative integer, got {iterations!r}")
    rtol, atol = _check_setting("rtol", rtol), _check_setting("atol", atol)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    for name, value in (("checkpoint_directory", checkpoint_directory), ("resume", resume), ("workspace", workspace)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a directory path, got {type(value).__name__}")
    if not hasattr(output, "write") and not isinstance(output, torch.Tensor):
        raise TypeError(f"output must be a block store or a tensor, got {type(output).__name__}")
    # (a distributed ctbench Projector too: diffct's block CGLS over its rank-local stores, with global norms;
    # ctbench's disk CGLS runs distributed through ctbench.solvers.disk_cgls)
    if not _is_projector(operator) or getattr(operator, "options", {}).get("distributed"):
        from ._block_cgls import block_cgls

        k, history, converged, reason = block_cgls(
            operator, measurements, output, iterations, workspace=workspace, block_elements=block_elements,
            rtol=rtol, atol=atol, callback=callback, checkpoint_directory=checkpoint_directory, resume=resume)
        return SolverResult(output, k, history, converged, reason)
    from ._block_cgls import check_output

    ws = Path(workspace)
    if ws.exists():
        raise ValueError(f"workspace must be a new directory; {ws} exists")
    check_output(output, operator.volume_shape)
    if getattr(operator, "is_2d", False) and checkpoint_directory is None and resume is None:
        b = _read_all(measurements, "measurements", getattr(operator, "options", {}).get("view_chunk_size"))
        result = cgls(operator, b, iterations, rtol=rtol, atol=atol, callback=callback)
        ws.mkdir(parents=True)
        _write_blocks(output, result.volume, block_elements)
        return SolverResult(output, result.iterations, result.residual_history, result.converged, result.reason)
    # resuming without checkpoint_directory: the resumed state is copied into the new workspace
    work, every, again = plan_directories(ws, checkpoint_directory if checkpoint_directory is not None
                                          else (ws if resume is not None else None), resume)
    if checkpoint_directory is None:
        every = 0
    if isinstance(output, torch.Tensor):
        from ..storage import TensorStore as _Plain

        target = _Plain(output.detach()) if output.is_contiguous() else None
    else:
        target = output
    volume, k, history, converged, reason = disk_cgls_request(
        operator, measurements, iterations, work_dir=work, checkpoint_every=every, resume=again, rtol=rtol,
        atol=atol, callback=callback, volume_store=target, callback_x="store")
    ws.mkdir(parents=True, exist_ok=True)
    if target is None:  # a non-contiguous output tensor: copy in blocks
        _write_blocks(output, volume.read(None) if hasattr(volume, "read") else volume, block_elements)
    elif hasattr(output, "flush"):
        output.flush()
    return SolverResult(output, k, history, converged, reason)
