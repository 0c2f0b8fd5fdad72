"""LSQR: least squares by Golub-Kahan bidiagonalisation (Paige & Saunders 1982).

Minimises ``||A x - b||`` over the same Krylov spaces as CGLS,
``x0 + span{A^T r0, (A^T A) A^T r0, ...}``, so in exact arithmetic its iterates
equal CGLS's; in floating point it is the more stable of the two (it never forms
``A^T A`` implicitly through recurrences on the normal-equations residual),
which shows on ill-conditioned problems run for many iterations.  The residual
norm ``||b - A x_k||`` decreases monotonically; the solver tracks it by the
recurrence (``phibar``), without an extra projection.  One projection and one
backprojection per iteration; inner products go through the projector.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_run, check_sinogram, initial_volume
from .state import IterationState, ReconResult, iterate, run_to_end

__all__ = ["lsqr", "lsqr_iterations"]


def lsqr_iterations(projector, sinogram: torch.Tensor, n_iter: int = 20, *, x0=None, tol=None, callback=None,
                    cancel=None):
    """Generator of LSQR iterations; yields an :class:`IterationState` after each one.

    ``tol``: stop once ``||A x - b|| / ||b||`` falls to ``tol``.  ``extra`` holds
    ``relative_residual`` and ``gradient_norm`` (``||A^T (b - A x)||``, from the
    recurrence).  The iteration stops (as converged) when the bidiagonalisation
    breaks down (an exact solution).  Arguments are checked when called.
    """
    return _prepare(projector, sinogram, n_iter, x0, tol, callback, cancel)[1]


def _prepare(projector, sinogram, n_iter, x0, tol, callback, cancel):
    b = check_sinogram(projector, sinogram)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    x = initial_volume(projector, b, x0)
    return x, _lsqr_gen(projector, b, x, n_iter, tol, callback, cancel)


def _norm_p(P, t):
    return math.sqrt(float(P.inner_projection(t, t)))


def _norm_v(P, t):
    return math.sqrt(float(P.inner_volume(t, t)))


def _lsqr_gen(P, b, x, n_iter, tol, callback, cancel):
    with torch.no_grad():
        b_norm = _norm_p(P, b) or 1.0
        u = b - P.project(x)
        beta = _norm_p(P, u)
        u = u / beta if beta > 0 else u
        v = P.backproject(u) if beta > 0 else torch.zeros_like(x)
        alpha = _norm_v(P, v)
        v = v / alpha if alpha > 0 else v
        st = {"x": x, "u": u, "v": v, "w": v.clone(), "alpha": alpha, "phibar": beta, "rhobar": alpha,
              "done": beta == 0 or alpha == 0}

        def step():
            if st["done"]:
                return st["phibar"], st["x"], {"relative_residual": st["phibar"] / b_norm, "gradient_norm": 0.0}
            alpha = st["alpha"]
            u = P.project(st["v"]) - alpha * st["u"]
            beta = _norm_p(P, u)
            if beta > 0:
                u = u / beta
            v = P.backproject(u) - beta * st["v"]
            alpha_new = _norm_v(P, v)
            if alpha_new > 0:
                v = v / alpha_new
            rho = math.hypot(st["rhobar"], beta)
            c, s = st["rhobar"] / rho, beta / rho
            theta = s * alpha_new
            rhobar = -c * alpha_new
            phi = c * st["phibar"]
            phibar = s * st["phibar"]
            x_new = st["x"] + (phi / rho) * st["w"]
            w = v - (theta / rho) * st["w"]
            st.update(x=x_new, u=u, v=v, w=w, alpha=alpha_new, phibar=phibar, rhobar=rhobar,
                      done=beta == 0 or alpha_new == 0)
            # ||A^T r_k|| = phibar * alpha_{k+1} * |c|  (Paige & Saunders, section 5.1)
            return phibar, x_new, {"relative_residual": phibar / b_norm, "gradient_norm": phibar * alpha_new * abs(c)}

        def converged(state: IterationState) -> bool:
            return st["done"] or (tol is not None and state.extra["relative_residual"] <= tol)

        return (yield from iterate(step, n_iter, converged=converged, callback=callback, cancel=cancel))


def lsqr(projector, sinogram: torch.Tensor, n_iter: int = 20, *, x0=None, tol=None, callback=None,
         cancel=None) -> ReconResult:
    """Run LSQR for up to ``n_iter`` iterations; see :func:`lsqr_iterations`.

    Returns a :class:`ReconResult` (volume in the data's line-integral unit per mm).
    """
    x_start, gen = _prepare(projector, sinogram, n_iter, x0, tol, callback, cancel)
    return run_to_end(gen, x_start)
