"""CGLS: conjugate gradients on the normal equations ``A^T A x = A^T b``.

Minimises ``||A x - b||`` over ``x0 + span{A^T r0, (A^T A) A^T r0, ...}``;
the residual norm ``||b - A x_k||`` decreases monotonically.  One projection
and one backprojection per iteration.  Every inner product goes through the
projector (``inner_volume`` / ``inner_projection``), so the same code runs
under distributed partitions.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_run, check_sinogram, initial_volume
from .state import IterationState, ReconResult, iterate, run_to_end

__all__ = ["cgls", "cgls_iterations"]


def cgls_iterations(projector, sinogram: torch.Tensor, n_iter: int = 20, *, x0=None, tol=None, callback=None,
                    cancel=None):
    """Generator of CGLS iterations; yields an :class:`IterationState` after each one.

    ``tol``: stop once ``||A x - b|| / ||b||`` falls to ``tol``.  ``extra``
    holds ``relative_residual`` and ``gradient_norm`` (``||A^T (b - A x)||``).
    The iteration also stops (as converged) when the gradient vanishes
    exactly.  Arguments are checked when this function is called.
    """
    return _prepare(projector, sinogram, n_iter, x0, tol, callback, cancel)[1]


def _prepare(projector, sinogram, n_iter, x0, tol, callback, cancel):
    b = check_sinogram(projector, sinogram)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    x = initial_volume(projector, b, x0)
    return x, _cgls_gen(projector, b, x, n_iter, tol, callback, cancel)


def _cgls_gen(P, b, x, n_iter, tol, callback, cancel):
    with torch.no_grad():
        b_norm = math.sqrt(float(P.inner_projection(b, b))) or 1.0
        r = b - P.project(x)
        s = P.backproject(r)
        st = {"x": x, "r": r, "s": s, "p": s.clone(), "gamma": float(P.inner_volume(s, s)), "done": False}

        def step():
            if st["gamma"] == 0.0:  # exact solution reached: nothing left to do
                st["done"] = True
                res = math.sqrt(float(P.inner_projection(st["r"], st["r"])))
                return res, st["x"], {"relative_residual": res / b_norm, "gradient_norm": 0.0}
            q = P.project(st["p"])
            qq = float(P.inner_projection(q, q))
            alpha = st["gamma"] / qq if qq > 0 else 0.0
            x_new = st["x"] + alpha * st["p"]
            r_new = st["r"] - alpha * q
            s_new = P.backproject(r_new)
            gamma_new = float(P.inner_volume(s_new, s_new))
            beta = gamma_new / st["gamma"]
            st.update(x=x_new, r=r_new, s=s_new, p=s_new + beta * st["p"], gamma=gamma_new)
            res = math.sqrt(float(P.inner_projection(r_new, r_new)))
            return res, x_new, {"relative_residual": res / b_norm, "gradient_norm": math.sqrt(gamma_new)}

        def converged(state: IterationState) -> bool:
            return st["done"] or st["gamma"] == 0.0 or (tol is not None and state.extra["relative_residual"] <= tol)

        return (yield from iterate(step, n_iter, converged=converged, callback=callback, cancel=cancel))


def cgls(projector, sinogram: torch.Tensor, n_iter: int = 20, *, x0=None, tol=None, callback=None,
         cancel=None) -> ReconResult:
    """Run CGLS for up to ``n_iter`` iterations; see :func:`cgls_iterations`.

    Returns a :class:`ReconResult` (volume in the data's line-integral unit per mm).
    """
    x_start, gen = _prepare(projector, sinogram, n_iter, x0, tol, callback, cancel)
    return run_to_end(gen, x_start)
