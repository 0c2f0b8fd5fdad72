"""diffct 2.5's top-level spellings, on ctbench's engine (docs/FROM_DIFFCT.md).

A diffct script runs with ``from diffct import ...`` replaced by ``from ctbench import ...``:

- solvers with diffct's signatures and :class:`SolverResult`: :func:`cgls`, :func:`sirt`,
  :func:`tv_reconstruction` (Adam on half the mean squared error plus weighted mean TV, as
  diffct), :func:`cgls_into`, :func:`total_variation`; ``cgls_into`` and ``cgls`` with
  ``checkpoint_directory=``/``resume=`` run ctbench's disk-backed CGLS (:mod:`ctbench.compat_disk`);
- the functional analytic reconstructions ``fdk(sinogram, trajectory, volume_shape, angles, ...)``,
  ``fbp(...)``, ``helical_fdk(...)``, ``fdk_into(source, output, trajectory, ...)``, ``fbp_into``.
  Called with a :class:`~ctbench.Projector` first they are ctbench's own
  (:mod:`ctbench.solvers`), so both spellings work;
- block stores :class:`TensorStore` and :class:`NpyStore` (diffct's ``read(slices)`` /
  ``write(slices, value, accumulate=)`` / ``flush()``, and ctbench's block-store protocol);
- weights and filters: :func:`detector_coordinates_1d`, :func:`angular_integration_weights`,
  :func:`fan_cosine_weights`, :func:`cone_cosine_weights`, :func:`parker_weights`,
  :func:`ramp_filter_1d`.

ctbench's own solvers keep their names under :mod:`ctbench.solvers` (``n_iter``, ``tol``,
:class:`~ctbench.solvers.ReconResult`, Chambolle-Pock TV); the top-level ``cgls``, ``sirt`` and
``tv_reconstruction`` pass calls that use ctbench's keywords on to them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import solvers as _s
from .geometry import as_trajectory
from .storage import TensorStore as _TensorStore
from .storage import normalize_window

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


def _is_projector(obj) -> bool:
    return hasattr(obj, "project") and hasattr(obj, "backproject") and hasattr(obj, "grid")


def _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume):
    if not _is_projector(operator):
        raise TypeError(f"operator must be a ctbench Projector, got {type(operator).__name__}")
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


def _dot_rays(operator, a, b) -> float:
    # float64 sums (diffct's): CGLS's step lengths are sensitive to float32 rounding of the norms
    return float(operator.inner_projection(a.double(), b.double()))


def _dot_volume(operator, a, b) -> float:
    return float(operator.inner_volume(a.double(), b.double()))


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
    from a checkpoint directory) it runs ctbench's disk-backed CGLS (:mod:`ctbench.compat_disk`).

    With ctbench's keywords (``n_iter``, ``tol``, ``cancel``) this is :func:`ctbench.solvers.cgls`.
    """
    if ctbench_kwargs:
        return _ctbench_solver(_s.cgls, "cgls", operator, measurements, iterations, x0, callback, ctbench_kwargs)
    _check_request(operator, measurements, iterations, x0, rtol, atol, checkpoint_directory, resume)
    if checkpoint_directory is not None or resume is not None:
        from .compat_disk import disk_cgls_request, plan_directories

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
    sp = tuple(float(v) for v in operator.voxel_spacing)
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
    ``checkpoint_directory`` when checkpointing (see :mod:`ctbench.compat_disk`).
    ``callback(k, residual, x)`` gets the work x store.  ``block_elements`` bounds the blocks of the
    initial norm and the tensor output's copies; the disk solver sizes its own windows (its memory
    budget).  2D operators run in memory (disk CGLS is for 3D volumes) unless checkpointing."""
    from .compat_disk import disk_cgls_request, plan_directories

    if isinstance(block_elements, bool) or not isinstance(block_elements, int) or block_elements < 1:
        raise ValueError(f"block_elements must be a positive integer, got {block_elements!r}")
    if not _is_projector(operator):
        raise TypeError(f"operator must be a ctbench Projector, got {type(operator).__name__}")
    ws = Path(workspace)
    if ws.exists():
        raise ValueError(f"workspace must be a new directory; {ws} exists")
    out_shape = tuple(output.shape)
    if out_shape != tuple(operator.volume_shape):
        raise ValueError(f"output has shape {out_shape}; this projector's volume_shape is {tuple(operator.volume_shape)}")
    if not hasattr(output, "write") and not isinstance(output, torch.Tensor):
        raise TypeError(f"output must be a block store or a tensor, got {type(output).__name__}")
    if operator.is_2d and checkpoint_directory is None and resume is None:
        b = _read_all(measurements, "measurements")
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
        from .storage import TensorStore as _Plain

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


def _read_all(source, name):
    if isinstance(source, torch.Tensor):
        return source.detach()
    if hasattr(source, "read") and hasattr(source, "shape"):
        return source.read(tuple(slice(0, n) for n in source.shape))
    raise TypeError(f"{name} must be a tensor or a block store, got {type(source).__name__}")


def _write_blocks(output, value, block_elements):
    if isinstance(output, torch.Tensor):
        with torch.no_grad():
            output.copy_(value)
        return
    per_plane = max(math.prod(value.shape[1:]), 1)
    step = max(1, block_elements // per_plane)
    for z in range(0, value.shape[0], step):
        window = (slice(z, min(z + step, value.shape[0])),) + tuple(slice(0, n) for n in value.shape[1:])
        output.write(window, value[window].to(output.dtype))
    if hasattr(output, "flush"):
        output.flush()


# --------------------------------------------------------- analytic (diffct)

_WINDOWS = {None: "ram-lak", "ram-lak": "ram-lak", "ramlak": "ram-lak", "none": "ram-lak", "hann": "hann",
            "hanning": "hann", "hamming": "hamming", "cosine": "cosine", "shepp-logan": "shepp-logan"}


def _filter_name(window):
    key = window.lower().replace("_", "-") if isinstance(window, str) else window
    if key not in _WINDOWS:
        raise ValueError(f"window must be one of {sorted(k for k in _WINDOWS if k)} or None, got {window!r}")
    return _WINDOWS[key]


def _unsupported(**options):
    for name, value in options.items():
        if value not in (None, False):
            raise NotImplementedError(f"{name}= is not supported by ctbench's diffct spelling; "
                                      "see docs/FROM_DIFFCT.md for the ctbench equivalent")


def _functional_projector(sinogram, trajectory, volume_shape, angles, beam, detector_spacing, voxel_spacing,
                          backend, precision):
    from .projector import Projector

    if backend not in ("auto", "torch", "numba"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'numba', got {backend!r}")
    if precision not in ("fast", "float32", "float64"):
        raise ValueError(f"precision must be 'fast', 'float32' or 'float64', got {precision!r}")
    if not isinstance(sinogram, torch.Tensor) or not sinogram.is_floating_point():
        raise TypeError("sinogram must be a real floating-point tensor")
    traj = as_trajectory(trajectory, beam=beam)
    n = traj.n_views
    if angles is not None:
        a = torch.as_tensor(angles)
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"angles must be a 1D tensor of the {n} view angles, got shape {tuple(a.shape)}")
    dtype = torch.float64 if precision == "float64" else torch.float32
    sino = sinogram.detach().to(dtype)
    traj = traj.to(device=sino.device, dtype=dtype).detach()
    det = tuple(sino.shape[1:]) if traj.ndim == 3 else sino.shape[1]
    P = Projector(traj, tuple(volume_shape), det, detector_spacing=detector_spacing, voxel_spacing=voxel_spacing)
    return P, sino


def _analytic(kind, sinogram, trajectory, volume_shape, angles, beam, detector_spacing, voxel_spacing, window,
              pad_factor, short_scan, isocenter, backend, precision, unsupported):
    _unsupported(**unsupported)
    if isocenter is not None and any(float(c) != 0.0 for c in torch.as_tensor(isocenter).reshape(-1).tolist()):
        raise NotImplementedError("isocenter= is not supported; move the scan with transform_trajectory so that "
                                  "the rotation axis passes through the origin")
    P, sino = _functional_projector(sinogram, trajectory, volume_shape, angles, beam, detector_spacing,
                                    voxel_spacing, backend, precision)
    pad = float(pad_factor) if pad_factor and pad_factor >= 1 else 1.0
    fn = {"fdk": _s.fdk, "fbp": _s.fbp}[kind]
    return fn(P, sino, filter=_filter_name(window), padding=pad, short_scan="auto" if short_scan else False)


def fbp(*args, **kwargs):
    """``fbp(projector, sinogram, ...)`` (ctbench, :func:`ctbench.solvers.fbp`) or diffct's
    ``fbp(sinogram, trajectory, volume_shape, angles, *, beam="parallel", detector_spacing=1.0,
    voxel_spacing=1.0, window="ram-lak", pad_factor=2, short_scan=False, ...)``."""
    if args and _is_projector(args[0]):
        return _s.fbp(*args, **kwargs)
    return _diffct_fbp(*args, **kwargs)


def _diffct_fbp(sinogram, trajectory, volume_shape, angles, *, beam="parallel", detector_spacing=1.0,
                voxel_spacing=1.0, window="ram-lak", pad_factor=2, projection_weights=None, angular_weights=None,
                filter_response=None, short_scan=False, isocenter=None, backend="auto", precision="fast",
                devices=None, view_chunk_size=None, volume_chunk_shape=None, distributed=False,
                process_group=None, partition="views", partition_grid=None):
    if beam not in ("parallel", "fan"):
        raise ValueError("fbp beam must be 'parallel' or 'fan'; use fdk for cone data")
    return _analytic("fbp", sinogram, trajectory, volume_shape, angles, beam, detector_spacing, voxel_spacing,
                     window, pad_factor, short_scan, isocenter, backend, precision,
                     dict(projection_weights=projection_weights, angular_weights=angular_weights,
                          filter_response=filter_response, distributed=distributed, process_group=process_group,
                          partition_grid=partition_grid))


def fdk(*args, **kwargs):
    """``fdk(projector, sinogram, ...)`` (ctbench, :func:`ctbench.solvers.fdk`) or diffct's
    ``fdk(sinogram, trajectory, volume_shape, angles, *, detector_spacing=1.0, voxel_spacing=1.0,
    window="ram-lak", pad_factor=2, short_scan=False, ...)``."""
    if args and _is_projector(args[0]):
        return _s.fdk(*args, **kwargs)
    return _diffct_fdk(*args, **kwargs)


def _diffct_fdk(sinogram, trajectory, volume_shape, angles, *, detector_spacing=1.0, voxel_spacing=1.0,
                window="ram-lak", pad_factor=2, projection_weights=None, angular_weights=None, filter_response=None,
                short_scan=False, isocenter=None, backend="auto", precision="fast", devices=None,
                view_chunk_size=None, volume_chunk_shape=None, distributed=False, process_group=None,
                partition="views", partition_grid=None):
    return _analytic("fdk", sinogram, trajectory, volume_shape, angles, "cone", detector_spacing, voxel_spacing,
                     window, pad_factor, short_scan, isocenter, backend, precision,
                     dict(projection_weights=projection_weights, angular_weights=angular_weights,
                          filter_response=filter_response, distributed=distributed, process_group=process_group,
                          partition_grid=partition_grid))


def helical_fdk(*args, **kwargs):
    """``helical_fdk(projector, sinogram, ...)`` (ctbench) or diffct's
    ``helical_fdk(sinogram, trajectory, volume_shape, angles, *, isocenter, detector_spacing=1.0,
    voxel_spacing=1.0, window="ram-lak", pad_factor=2, ...)`` (``isocenter`` must be the origin)."""
    if args and _is_projector(args[0]):
        return _s.helical_fdk(*args, **kwargs)
    return _diffct_helical(*args, **kwargs)


def _diffct_helical(sinogram, trajectory, volume_shape, angles, *, isocenter, detector_spacing=1.0,
                    voxel_spacing=1.0, window="ram-lak", pad_factor=2, projection_weights=None, view_weights=None,
                    filter_response=None):
    _unsupported(projection_weights=projection_weights, view_weights=view_weights, filter_response=filter_response)
    if any(float(c) != 0.0 for c in torch.as_tensor(isocenter).reshape(-1).tolist()):
        raise NotImplementedError("isocenter must be the origin; move the scan with transform_trajectory")
    P, sino = _functional_projector(sinogram, trajectory, volume_shape, angles, "cone", detector_spacing,
                                    voxel_spacing, "auto", "fast")
    pad = float(pad_factor) if pad_factor and pad_factor >= 1 else 1.0
    return _s.helical_fdk(P, sino, filter=_filter_name(window), padding=pad)


def fdk_into(*args, **kwargs):
    """``fdk_into(projector, sinogram_store, volume_store, ...)`` (ctbench, streamed,
    :func:`ctbench.solvers.fdk_into`) or diffct's ``fdk_into(source, output, trajectory,
    volume_shape, angles, **fdk_options)`` (returns ``output``)."""
    if args and _is_projector(args[0]):
        return _s.fdk_into(*args, **kwargs)
    return _diffct_into(_diffct_fdk, *args, **kwargs)


def fbp_into(*args, **kwargs):
    """diffct's ``fbp_into(source, output, trajectory, volume_shape, angles, beam="parallel", **options)``
    (returns ``output``); with a Projector first, ctbench's streamed :func:`ctbench.solvers.fdk_into`."""
    if args and _is_projector(args[0]):
        return _s.fdk_into(*args, **kwargs)
    return _diffct_into(_diffct_fbp, *args, **kwargs)


def _diffct_into(fn, source, output, trajectory, volume_shape, angles, **kwargs):
    sino = _read_all(source, "source")
    if tuple(output.shape) != tuple(volume_shape):
        raise ValueError(f"output has shape {tuple(output.shape)}, expected volume_shape {tuple(volume_shape)}")
    vol = fn(sino, trajectory, volume_shape, angles, **kwargs)
    _write_blocks(output, vol, 1 << 22)
    return output


# ------------------------------------------------------------------ stores


def _window(slices, shape):
    # diffct passes a slice or a tuple (or list) of slices; ctbench also None for the whole store
    return normalize_window(tuple(slices) if isinstance(slices, list) else slices, tuple(shape), "block indices")


def _value(value, shape):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"block values must be tensors, got {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"block value has shape {tuple(value.shape)}; the window needs {tuple(shape)}")
    return value.detach()


class TensorStore(_TensorStore):
    """ctbench's in-memory block store, with diffct's extras: ``write(..., accumulate=True)``,
    ``flush()``, ``writable`` and ``device``."""

    writable = True

    def __init__(self, tensor, chunks=None):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise TypeError("TensorStore requires a floating-point tensor")
        super().__init__(tensor, chunks)

    @property
    def device(self):
        return self.tensor.device

    def read(self, window=None):
        return self.tensor[_window(window, self.shape)].detach().clone()

    def write(self, window, value, *, accumulate=False):
        with torch.no_grad():
            block = self.tensor[_window(window, self.shape)]
            value = _value(value, block.shape).to(device=block.device, dtype=block.dtype)
            block.add_(value) if accumulate else block.copy_(value)

    def flush(self):
        pass


_NP = {torch.float32: np.float32, torch.float64: np.float64}


class NpyStore:
    """A float32/float64 ``.npy`` file mapped into memory, as diffct's ``NpyStore``: ``read(slices)``,
    ``write(slices, value, accumulate=False)``, ``flush()``; ``NpyStore.create(path, shape, dtype=)``
    makes a new file (written aside and renamed, so a crash leaves no half-made file).  It is also a
    ctbench block store (``chunks``), usable with ``project_into`` and ``fdk_into``."""

    def __init__(self, path, *, mode="r+"):
        if mode not in ("r", "r+"):
            raise ValueError(f"NpyStore mode must be 'r' or 'r+', got {mode!r}")
        self.path = Path(path).resolve()
        if not self.path.exists():
            raise FileNotFoundError(f"NpyStore: no such file {self.path}")
        arr = np.load(self.path, mmap_mode=mode, allow_pickle=False)
        if not isinstance(arr, np.memmap) or arr.dtype not in (np.float32, np.float64):
            raise TypeError(f"NpyStore needs a float32 or float64 .npy file; {self.path} holds {arr.dtype}")
        self._array = arr

    @classmethod
    def create(cls, path, shape, *, dtype=torch.float32):
        if dtype not in _NP:
            raise TypeError(f"NpyStore dtype must be torch.float32 or torch.float64, got {dtype}")
        shape = tuple(shape)
        if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
            raise ValueError(f"NpyStore shape must hold nonnegative integers, got {shape!r}")
        path = Path(path).resolve()
        if path.exists():
            raise FileExistsError(f"NpyStore.create: {path} exists")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=_NP[dtype], shape=shape)
        arr.flush()
        del arr
        os.replace(tmp, path)
        return cls(path)

    @property
    def shape(self):
        return tuple(self._array.shape)

    @property
    def dtype(self):
        return torch.float32 if self._array.dtype == np.float32 else torch.float64

    @property
    def chunks(self):
        return self.shape  # one memory-mapped block: any window reads directly

    def staging_bytes(self, window_shape, write=False):
        return 0

    @property
    def device(self):
        return torch.device("cpu")

    @property
    def writable(self):
        return bool(self._array.flags.writeable)

    def read(self, window=None):
        return torch.from_numpy(np.array(self._array[_window(window, self.shape)]))

    def write(self, window, value, *, accumulate=False):
        if not self.writable:
            raise PermissionError(f"NpyStore {self.path} is read-only (mode='r')")
        block = self._array[_window(window, self.shape)]
        v = _value(value, block.shape).to(device="cpu", dtype=self.dtype).numpy()
        if accumulate:
            block += v
        else:
            block[...] = v

    def flush(self):
        self._array.flush()

    def __repr__(self):
        return f"NpyStore({str(self.path)!r}, shape={self.shape}, dtype={self.dtype})"


# ------------------------------------------------------- weights and filters


def detector_coordinates_1d(num_detectors, detector_spacing, detector_offset=0.0, device=None, dtype=torch.float32):
    """Centres of ``num_detectors`` cells: ``(k - (n - 1)/2) * spacing + offset`` (ctbench's and diffct's)."""
    k = torch.arange(int(num_detectors), device=device, dtype=dtype)
    return (k - 0.5 * (int(num_detectors) - 1)) * detector_spacing + detector_offset


def _scan_period(span: float, step: float):
    """pi or 2 pi when the sorted angles close that circle within about one step (diffct's rule)."""
    tol = max(1e-4, 0.05 * step)
    for period in (math.pi, 2 * math.pi):
        if -tol <= period - span <= 1.5 * step + tol:
            return period
    return None


def angular_integration_weights(angles, redundant_full_scan=True):
    """Per-view arc weights: half the gaps to the neighbours (periodic when the scan closes a
    half or full circle, open trapezoid otherwise), halved on a full turn when
    ``redundant_full_scan`` (each ray measured twice).  Input order is kept."""
    a = angles if angles.dtype in (torch.float32, torch.float64) else angles.float()
    n = a.shape[0]
    if n == 0:
        return torch.zeros_like(a)
    if n == 1:
        return torch.full_like(a, math.pi if redundant_full_scan else 1.0)
    s, order = torch.sort(a)
    gaps = s[1:] - s[:-1]
    step = float(gaps.median().abs())
    span = float(s[-1] - s[0])
    period = _scan_period(span, step)
    end = max(period - span, 0.0) if period is not None else 0.0
    w = torch.empty_like(s)
    w[0] = 0.5 * (gaps[0] + end)
    w[-1] = 0.5 * (gaps[-1] + end)
    if n > 2:
        w[1:-1] = 0.5 * (gaps[:-1] + gaps[1:])
    if redundant_full_scan and period == 2 * math.pi:
        w = 0.5 * w
    out = torch.empty_like(w)
    out[order] = w
    return out


def fan_cosine_weights(num_detectors, detector_spacing, sdd, detector_offset=0.0, device=None, dtype=torch.float32):
    """``sdd / sqrt(sdd^2 + u^2)`` per detector cell (fan-beam pre-weights)."""
    u = detector_coordinates_1d(num_detectors, detector_spacing, detector_offset, device, dtype)
    return sdd / torch.sqrt(sdd * sdd + u * u)


def cone_cosine_weights(det_u, det_v, du, dv, sdd, detector_offset_u=0.0, detector_offset_v=0.0, device=None,
                        dtype=torch.float32):
    """``sdd / sqrt(sdd^2 + u^2 + v^2)`` as a (det_u, det_v) tensor (cone-beam pre-weights)."""
    u = detector_coordinates_1d(det_u, du, detector_offset_u, device, dtype)[:, None]
    v = detector_coordinates_1d(det_v, dv, detector_offset_v, device, dtype)[None, :]
    return sdd / torch.sqrt(sdd * sdd + u * u + v * v)


def parker_weights(angles, num_detectors, detector_spacing, sdd, detector_offset=0.0):
    """Parker's short-scan weights (n_views, num_detectors) for a circular fan scan with
    increasing ``angles`` in this frame (ones for a full turn), with the overscan
    ``delta = max(largest fan angle, (span - pi)/2)``.  ctbench's FDK computes its own from the
    trajectory (:func:`ctbench.solvers.weights.parker_weights`), for either rotation sense."""
    a = angles if angles.dtype in (torch.float32, torch.float64) else angles.float()
    n = a.shape[0]
    u = detector_coordinates_1d(num_detectors, detector_spacing, detector_offset, a.device, a.dtype)
    gamma = torch.atan(u / sdd)[None, :]
    s = torch.sort(a).values
    span = float(s[-1] - s[0])
    step = float((s[1:] - s[:-1]).median().abs()) if n > 1 else 2 * math.pi
    if _scan_period(span, step) == 2 * math.pi:
        return torch.ones((n, int(num_detectors)), device=a.device, dtype=a.dtype)
    delta = max(float(gamma.abs().max()), 0.5 * (span - math.pi))
    beta = (a - a.min())[:, None]
    q = math.pi / 4
    w = torch.ones_like(beta.expand(n, int(num_detectors)))
    w = torch.where(beta < 2 * (delta - gamma), torch.sin(q * beta / (delta - gamma + 1e-12)) ** 2, w)
    w = torch.where(beta > math.pi - 2 * gamma,
                    torch.sin(q * (math.pi + 2 * delta - beta) / (delta + gamma + 1e-12)) ** 2, w)
    return torch.where((beta < 0) | (beta > math.pi + 2 * delta), torch.zeros_like(w), w)


def ramp_filter_1d(sinogram_tensor, dim=-1, sample_spacing=1.0, pad_factor=1, window=None, use_rfft=True):
    """The band-limited ramp filter along ``dim`` with diffct's scaling (an angular-frequency ramp,
    ``2 pi`` times ctbench's :func:`ctbench.solvers.ramp_filter`): the spatial kernel of Kak &
    Slaney (ch. 3, eq. 61), ``h[0] = pi/2``, ``h[k] = -2/(pi k^2)`` for odd ``k``, 0 for even,
    applied by FFT after centred zero-padding to ``pad_factor`` times the length, divided by
    ``sample_spacing``; ``window`` apodises it ("hann", "hamming", "cosine", "shepp-logan")."""
    x = sinogram_tensor
    d = dim % x.ndim
    n = x.shape[d]
    m = max(int(pad_factor or 1), 1) * n
    left = (m - n) // 2
    if m > n:
        pad = [0, 0] * x.ndim
        pad[2 * (x.ndim - 1 - d)] = left
        pad[2 * (x.ndim - 1 - d) + 1] = m - n - left
        x = torch.nn.functional.pad(x, pad)
    lag = torch.arange(m, device=x.device)
    lag = torch.minimum(lag, m - lag)
    h = torch.zeros(m, device=x.device, dtype=x.dtype)
    h[0] = math.pi / 2
    odd = lag % 2 == 1
    h[odd] = -2.0 / (math.pi * lag[odd].to(x.dtype) ** 2)
    f = torch.fft.rfftfreq(m, device=x.device, dtype=x.dtype)
    name = _filter_name(window)
    nf = (2 * f).clamp(max=1.0)
    win = {"ram-lak": torch.ones_like(nf), "hann": 0.5 * (1 + torch.cos(math.pi * nf)),
           "hamming": 0.54 + 0.46 * torch.cos(math.pi * nf), "cosine": torch.cos(0.5 * math.pi * nf),
           "shepp-logan": torch.where(nf > 1e-8, torch.sin(0.5 * math.pi * nf) / (0.5 * math.pi * nf).clamp_min(1e-8),
                                      torch.ones_like(nf))}[name]
    resp = torch.fft.rfft(h).real * win / float(sample_spacing)
    shape = [1] * x.ndim
    shape[d] = resp.shape[0]
    y = torch.fft.irfft(torch.fft.rfft(x, dim=d) * resp.reshape(shape), n=m, dim=d)
    return y.narrow(d, left, n).contiguous() if m > n else y


__all__ = [
    "SolverResult", "cgls", "cgls_into", "sirt", "tv_reconstruction", "total_variation",
    "fdk", "fbp", "helical_fdk", "fdk_into", "fbp_into", "TensorStore", "NpyStore",
    "detector_coordinates_1d", "angular_integration_weights", "fan_cosine_weights", "cone_cosine_weights",
    "parker_weights", "ramp_filter_1d",
]
