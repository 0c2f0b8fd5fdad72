"""SIRT: the simultaneous iterative reconstruction technique.

    x <- clip(x + C A^T R (b - A x))      R = 1 / (A 1),  C = 1 / (A^T 1)

``R`` and ``C`` are the inverse row and column sums of the projector (zero
where a sum vanishes: rays that miss the volume, voxels no ray sees).  Each
iteration is a gradient step on ``||A x - b||_R^2`` in the metric ``C^-1``
whose step never exceeds the stable one, so the *weighted* residual
``||A x - b||_R`` decreases monotonically (also with ``bounds``, a box
projection).  One projection and one backprojection per iteration.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_bounds, check_run, check_sinogram, initial_volume
from .state import IterationState, ReconResult, iterate, run_to_end

__all__ = ["sirt", "sirt_iterations", "safe_reciprocal", "path_eps"]


def safe_reciprocal(t: torch.Tensor, eps: float) -> torch.Tensor:
    """1/t where |t| exceeds the absolute threshold ``eps``, 0 elsewhere.

    The threshold is absolute (not relative to a local maximum) so that every
    rank of a distributed run makes the same choice for the same ray or voxel.
    """
    keep = t.abs() > eps
    return torch.where(keep, 1.0 / torch.where(keep, t, torch.ones_like(t)), torch.zeros_like(t))


def path_eps(projector) -> float:
    """A length far below any real ray path or voxel weight: 1e-6 of the smallest voxel pitch (mm)."""
    return 1e-6 * min(projector.voxel_spacing)


def _clip(x: torch.Tensor, bounds) -> torch.Tensor:
    if bounds is None:
        return x
    lo, hi = bounds
    return x.clamp(min=lo, max=hi)


def sirt_iterations(projector, sinogram: torch.Tensor, n_iter: int = 100, *, x0=None, bounds=None, tol=None,
                    callback=None, cancel=None):
    """Generator of SIRT iterations; yields an :class:`IterationState` after each one.

    ``tol``: stop once ``||A x - b|| / ||b||`` falls to ``tol``.  ``bounds``:
    ``(lower, upper)`` with None for an open side, applied after every
    update (``(0, None)`` for non-negativity).  ``extra`` holds
    ``relative_residual`` and ``weighted_residual`` (``||A x - b||_R``, the
    monotone one).  Arguments are checked when this function is called.
    """
    return _prepare(projector, sinogram, n_iter, x0, bounds, tol, callback, cancel)[1]


def _prepare(projector, sinogram, n_iter, x0, bounds, tol, callback, cancel):
    """Checked arguments -> (starting volume, generator)."""
    b = check_sinogram(projector, sinogram)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    bounds = check_bounds(bounds)
    x = _clip(initial_volume(projector, b, x0), bounds)
    return x, _sirt_gen(projector, b, x, n_iter, bounds, tol, callback, cancel)


def _sirt_gen(P, b, x, n_iter, bounds, tol, callback, cancel):
    with torch.no_grad():
        R = safe_reciprocal(P.project(torch.ones_like(x)), path_eps(P))
        C = safe_reciprocal(P.backproject(torch.ones_like(b)), path_eps(P))
        b_norm = math.sqrt(float(P.inner_projection(b, b))) or 1.0
        r = b - P.project(x)
        state = {"x": x, "r": r}

        def step():
            x_new = _clip(state["x"] + C * P.backproject(R * state["r"]), bounds)
            r_new = b - P.project(x_new)
            state["x"], state["r"] = x_new, r_new
            res = math.sqrt(float(P.inner_projection(r_new, r_new)))
            wres = math.sqrt(float(P.inner_projection(r_new, R * r_new)))
            return res, x_new, {"relative_residual": res / b_norm, "weighted_residual": wres}

        def converged(s: IterationState) -> bool:
            return tol is not None and s.extra["relative_residual"] <= tol

        return (yield from iterate(step, n_iter, converged=converged, callback=callback, cancel=cancel))


def sirt(projector, sinogram: torch.Tensor, n_iter: int = 100, *, x0=None, bounds=None, tol=None, callback=None,
         cancel=None) -> ReconResult:
    """Run SIRT for up to ``n_iter`` iterations; see :func:`sirt_iterations`.

    Returns a :class:`ReconResult` (volume in the data's line-integral unit per mm).
    """
    x_start, gen = _prepare(projector, sinogram, n_iter, x0, bounds, tol, callback, cancel)
    return run_to_end(gen, x_start)
