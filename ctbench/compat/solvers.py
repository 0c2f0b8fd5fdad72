"""diffct 2.5's solvers (``diffct.solvers``) on ctbench's engine: :class:`SolverResult`, :func:`cgls`,
:func:`sirt`, :func:`tv_reconstruction` (Adam on half the mean squared error plus weighted mean TV,
as diffct), :func:`cgls_into`, :func:`total_variation`.  ``cgls`` and ``cgls_into`` with
``checkpoint_directory=``/``resume=`` run ctbench's disk-backed CGLS (:mod:`ctbench.compat._disk`).
Calls that use ctbench's keywords (``n_iter``, ``tol``, ...) pass on to :mod:`ctbench.solvers`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import solvers as _s

from ._common import _read_all, _write_blocks

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


def _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume):
    if not _is_operator(operator):
        raise TypeError(f"operator must be a ctbench Projector or a linear operator with project, backproject, "
                        f"volume_shape and projection_shape, got {type(operator).__name__}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"iterations must be a nonnegative integer, got {iterations!r}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not math.isfinite(float(v)) or float(v) < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if not isinstance(measurements, torch.Tensor) or not measurements.is_floating_point():
        raise TypeError("measurements must be a real floating-point tensor")
    if tuple(measurements.shape) != tuple(operator.projection_shape) or not torch.isfinite(measurements).all():
        raise ValueError(f"measurements must be finite and of projection_shape {tuple(operator.projection_shape)}, "
                         f"got {tuple(measurements.shape)}")
    if x0 is not None and (not isinstance(x0, torch.Tensor) or tuple(x0.shape) != tuple(operator.volume_shape)
                           or not torch.isfinite(x0).all()):
        raise ValueError(f"x0 must be a finite tensor of volume_shape {tuple(operator.volume_shape)}")
    for name, value in (("checkpoint_directory", checkpoint_directory), ("resume", resume)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a directory path or None, got {type(value).__name__}")


def _no_checkpoints(solver, checkpoint_directory, resume):
    if checkpoint_directory is not None or resume is not None:
        raise NotImplementedError(f"checkpoint_directory/resume are not supported by {solver} in ctbench; cgls and "
                                  "cgls_into support them (through ctbench's disk-backed CGLS, 3D volumes)")


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


@torch.no_grad()
def cgls(operator, measurements, iterations=30, *, x0=None, rtol=1e-6, atol=0., callback=None,
         checkpoint_directory=None, resume=None, **ctbench_kwargs):
    """CGLS on ``A x = b`` (diffct's signature): stops after ``iterations`` or once
    ``||A x - b|| <= atol + rtol ||b||``; ``callback(k, residual, x)`` returning False stops it.
    With ``checkpoint_directory=`` (checkpoint every iteration there) or ``resume=`` (continue
    from a checkpoint directory) it runs ctbench's disk-backed CGLS (:mod:`ctbench.compat._disk`).

    With ctbench's keywords (``n_iter``, ``tol``, ``cancel``) this is :func:`ctbench.solvers.cgls`.
    """
    if ctbench_kwargs:
        return _ctbench_solver(_s.cgls, "cgls", operator, measurements, iterations, x0, callback, ctbench_kwargs)
    _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume)
    if checkpoint_directory is not None or resume is not None:
        from ._disk import disk_cgls_request, plan_directories

        work, every, again = plan_directories(None, checkpoint_directory, resume)
        return SolverResult(*disk_cgls_request(operator, measurements, iterations, work_dir=work,
                                               checkpoint_every=every, resume=again, x0=x0, rtol=rtol, atol=atol,
                                               callback=callback))
    b = measurements.detach()
    x = torch.zeros(operator.volume_shape, dtype=b.dtype, device=b.device) if x0 is None else x0.detach().to(b).clone()
    r = b.clone() if x0 is None else b - operator.project(x)
    norm_b = _norm(operator, b)
    history = [norm_b if x0 is None else _norm(operator, r)]
    threshold = atol + rtol * norm_b
    s = operator.backproject(r) if iterations and history[0] > threshold else torch.zeros_like(x)
    p = s.clone()
    gamma = _dot_volume(operator, s, s)
    k, stopped, breakdown = 0, False, False
    while k < iterations and history[-1] > threshold:
        if gamma == 0:
            breakdown = True
            break
        q = operator.project(p)
        denom = _dot_rays(operator, q, q)
        if denom == 0:
            breakdown = True
            break
        alpha = gamma / denom
        x.add_(p, alpha=alpha)
        r.sub_(q, alpha=alpha)
        s = operator.backproject(r)
        gamma_next = _dot_volume(operator, s, s)
        p = s + (gamma_next / gamma) * p
        gamma = gamma_next
        k += 1
        history.append(_norm(operator, r))
        stopped = _stop(callback, k, history[-1], x)
        if stopped:
            break
    converged, reason = _status(history[-1], threshold, stopped)
    if breakdown and not converged:
        reason = "normal equation breakdown"
    return SolverResult(x, k, history, converged, reason)


@torch.no_grad()
def sirt(operator, measurements, iterations=100, *, x0=None, rtol=1e-6, atol=0., callback=None,
         checkpoint_directory=None, resume=None, relaxation=1., nonnegative=True, **ctbench_kwargs):
    """SIRT ``x += relaxation * C A^T R (b - A x)`` with ``R``, ``C`` the inverse row and column
    sums (zero where a sum is zero), clamped at 0 when ``nonnegative`` (diffct's signature).

    With ctbench's keywords (``n_iter``, ``bounds``, ``tol``) this is :func:`ctbench.solvers.sirt`.
    """
    if ctbench_kwargs:
        return _ctbench_solver(_s.sirt, "sirt", operator, measurements, iterations, x0, callback, ctbench_kwargs)
    _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume)
    _no_checkpoints("sirt", checkpoint_directory, resume)
    if not math.isfinite(float(relaxation)) or float(relaxation) <= 0:
        raise ValueError(f"relaxation must be a finite number > 0, got {relaxation!r}")
    if not isinstance(nonnegative, bool):
        raise TypeError(f"nonnegative must be a bool, got {nonnegative!r}")
    b = measurements.detach()
    x = torch.zeros(operator.volume_shape, dtype=b.dtype, device=b.device) if x0 is None else x0.detach().to(b).clone()
    residual = b if x0 is None else b - operator.project(x)
    norm_b = _norm(operator, b)
    history = [norm_b if x0 is None else _norm(operator, residual)]
    threshold = atol + rtol * norm_b
    k, stopped = 0, False
    if iterations and history[0] > threshold:
        row = operator.project(torch.ones_like(x))
        col = operator.backproject(torch.ones_like(b))
        row = torch.where(row > 0, 1 / row.clamp_min(torch.finfo(row.dtype).tiny), torch.zeros_like(row))
        col = torch.where(col > 0, 1 / col.clamp_min(torch.finfo(col.dtype).tiny), torch.zeros_like(col))
    while k < iterations and history[-1] > threshold:
        x.add_(col * operator.backproject(row * residual), alpha=float(relaxation))
        if nonnegative:
            x.clamp_(min=0)
        k += 1
        residual = b - operator.project(x)
        history.append(_norm(operator, residual))
        stopped = _stop(callback, k, history[-1], x)
        if stopped:
            break
    converged, reason = _status(history[-1], threshold, stopped)
    return SolverResult(x, k, history, converged, reason)


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
    + weight * total_variation(x)`` with the volume clamped at 0 after each step.

    With ctbench's keywords (``n_iter``, ``lam``, ``nonneg``, ``tol``) this is ctbench's
    Chambolle-Pock :func:`ctbench.solvers.tv_reconstruction`, which minimises the exact TV problem.
    """
    if ctbench_kwargs:
        return _ctbench_solver(_s.tv_reconstruction, "tv_reconstruction", operator, measurements, iterations, x0,
                               callback, ctbench_kwargs)
    _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume)
    _no_checkpoints("tv_reconstruction", checkpoint_directory, resume)
    for name, v, pos in (("weight", weight, False), ("lr", lr, True)):
        if not math.isfinite(float(v)) or (pos and float(v) <= 0):
            raise ValueError(f"{name} must be a finite number{' > 0' if pos else ''}, got {v!r}")
    b = measurements.detach()
    x = (torch.zeros(operator.volume_shape, dtype=b.dtype, device=b.device) if x0 is None
         else x0.detach().to(b).clone()).requires_grad_()
    opt = torch.optim.Adam([x], lr=float(lr))
    residual = -b if x0 is None else operator.project(x.detach()) - b
    norm_b = _norm(operator, b)
    history = [norm_b if x0 is None else _norm(operator, residual)]
    threshold = atol + rtol * norm_b
    if getattr(operator, "partition", None) in ("space", "hybrid"):
        raise NotImplementedError("the diffct-style tv_reconstruction runs on one process or a views partition; "
                                  "use ctbench.solvers.tv_reconstruction for space partitions")
    rays = _dot_rays(operator, torch.ones_like(b), torch.ones_like(b))  # the global ray count
    spacing = _tv_spacing(operator, x.ndim)
    k, stopped = 0, False
    while k < iterations and history[-1] > threshold:
        grad = operator.backproject(residual) / max(rays, 1)
        if weight:
            with torch.enable_grad():
                tv = total_variation(x, voxel_spacing=spacing)  # diffct passes operator.voxel_spacing
                (g_tv,) = torch.autograd.grad(tv, x)
            grad = grad + float(weight) * g_tv
        opt.zero_grad()
        x.grad = grad.to(x)
        opt.step()
        x.clamp_(min=0)
        k += 1
        residual = operator.project(x.detach()) - b
        history.append(_norm(operator, residual))
        stopped = _stop(callback, k, history[-1], x.detach())
        if stopped:
            break
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
    ``output`` (a block store or a tensor, returned as given), with the CGLS vectors on disk:
    ctbench's disk-backed CGLS works in ``workspace`` (a new directory, diffct's rule), or in
    ``checkpoint_directory`` when checkpointing (see :mod:`ctbench.compat._disk`).
    ``callback(k, residual, x)`` gets the work x store.  ``block_elements`` bounds the blocks of the
    initial norm and the tensor output's copies; the disk solver sizes its own windows (its memory
    budget).  2D operators run in memory (disk CGLS is for 3D volumes) unless checkpointing."""
    from ._disk import disk_cgls_request, plan_directories

    if isinstance(block_elements, bool) or not isinstance(block_elements, int) or block_elements < 1:
        raise ValueError(f"block_elements must be a positive integer, got {block_elements!r}")
    if not _is_operator(operator):
        raise TypeError(f"operator must be a ctbench Projector or a linear operator with project, backproject, "
                        f"volume_shape and projection_shape, got {type(operator).__name__}")
    ws = Path(workspace)
    if ws.exists():
        raise ValueError(f"workspace must be a new directory; {ws} exists")
    out_shape = tuple(output.shape)
    if out_shape != tuple(operator.volume_shape):
        raise ValueError(f"output has shape {out_shape}; this projector's volume_shape is {tuple(operator.volume_shape)}")
    if not hasattr(output, "write") and not isinstance(output, torch.Tensor):
        raise TypeError(f"output must be a block store or a tensor, got {type(output).__name__}")
    is_2d = getattr(operator, "is_2d", len(tuple(operator.volume_shape)) == 2)
    if is_2d and checkpoint_directory is None and resume is None:
        b = _read_all(measurements, "measurements", getattr(operator, "options", {}).get("view_chunk_size"))
        result = cgls(operator, b, iterations, rtol=rtol, atol=atol, callback=callback)
        ws.mkdir(parents=True)
        _write_blocks(output, result.volume, block_elements)
        return SolverResult(output, result.iterations, result.residual_history, result.converged, result.reason)
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not math.isfinite(float(value)) or float(value) < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"iterations must be a nonnegative integer, got {iterations!r}")
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


