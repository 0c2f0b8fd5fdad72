"""LSMR: least squares by Golub-Kahan bidiagonalisation, minimising ``||A^T r||`` (Fong & Saunders 2011).

Over the same Krylov spaces as LSQR and CGLS, LSMR picks the iterate whose
normal-equations residual ``||A^T (b - A x_k)||`` is smallest (MINRES on
``A^T A x = A^T b``), where LSQR picks the smallest ``||b - A x_k||``.  Both
norms then decrease monotonically (``||b - A x_k||`` a little more slowly
than LSQR's), and ``||A^T r||`` falls smoothly, which makes a tolerance on it
a dependable stopping rule.  The residual norms come from recurrences, without
extra projections: one projection and one backprojection per iteration.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_run, check_sinogram, initial_volume
from .state import IterationState, ReconResult, iterate, run_to_end

__all__ = ["lsmr", "lsmr_iterations"]


def _rotation(a: float, b: float) -> tuple[float, float, float]:
    """(c, s, r) with ``[c s; -s c] [a; b] = [r; 0]``, r >= 0."""
    r = math.hypot(a, b)
    if r == 0.0:
        return 1.0, 0.0, 0.0
    return a / r, b / r, r


def lsmr_iterations(projector, sinogram: torch.Tensor, n_iter: int = 20, *, x0=None, tol=None, callback=None,
                    cancel=None):
    """Generator of LSMR iterations; yields an :class:`IterationState` after each one.

    ``tol``: stop once ``||A^T r|| / ||A^T r_0||`` falls to ``tol`` (the norm LSMR
    minimises).  ``extra`` holds ``relative_residual``, ``gradient_norm``
    (``||A^T (b - A x)||``) and ``relative_gradient``.  Arguments are checked when called.
    """
    return _prepare(projector, sinogram, n_iter, x0, tol, callback, cancel)[1]


def _prepare(projector, sinogram, n_iter, x0, tol, callback, cancel):
    b = check_sinogram(projector, sinogram)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    x = initial_volume(projector, b, x0)
    return x, _lsmr_gen(projector, b, x, n_iter, tol, callback, cancel)


def _lsmr_gen(P, b, x, n_iter, tol, callback, cancel):
    def norm_p(t):
        return math.sqrt(float(P.inner_projection(t, t)))

    def norm_v(t):
        return math.sqrt(float(P.inner_volume(t, t)))

    with torch.no_grad():
        b_norm = norm_p(b) or 1.0
        u = b - P.project(x)
        beta = norm_p(u)
        u = u / beta if beta > 0 else u
        v = P.backproject(u) if beta > 0 else torch.zeros_like(x)
        alpha = norm_v(v)
        v = v / alpha if alpha > 0 else v
        g0 = alpha * beta or 1.0
        # Bidiagonalisation, the two rotations of the MINRES recurrence for x, and those estimating ||r||.
        st = {"x": x, "u": u, "v": v, "h": v.clone(), "hbar": torch.zeros_like(x), "alpha": alpha,
              "alphabar": alpha, "zeta": 0.0, "zetabar": alpha * beta, "rho": 1.0, "rhobar": 1.0, "cbar": 1.0,
              "sbar": 0.0, "betadd": beta, "betad": 0.0, "rhodold": 1.0, "tautildeold": 0.0, "thetatilde": 0.0,
              "res": beta, "done": alpha * beta == 0}

        def step():
            if st["done"]:
                g = abs(st["zetabar"])
                return st["res"], st["x"], {"relative_residual": st["res"] / b_norm, "gradient_norm": g,
                                            "relative_gradient": g / g0}
            alpha = st["alpha"]
            u = P.project(st["v"]) - alpha * st["u"]
            beta = norm_p(u)
            if beta > 0:
                u = u / beta
            v = P.backproject(u) - beta * st["v"]
            alpha = norm_v(v)
            if alpha > 0:
                v = v / alpha
            # rotation eliminating beta from the lower bidiagonal
            rho_old = st["rho"]
            c, s, rho = _rotation(st["alphabar"], beta)
            theta_new = s * alpha
            alphabar = c * alpha
            # rotation of the upper bidiagonal (MINRES on the normal equations)
            rhobar_old, zeta_old = st["rhobar"], st["zeta"]
            thetabar = st["sbar"] * rho
            cbar, sbar, rhobar = _rotation(st["cbar"] * rho, theta_new)
            zeta = cbar * st["zetabar"]
            zetabar = -sbar * st["zetabar"]
            hbar = st["h"] - (thetabar * rho / (rho_old * rhobar_old)) * st["hbar"]
            x_new = st["x"] + (zeta / (rho * rhobar)) * hbar
            h = v - (theta_new / rho) * st["h"]
            # ||r_k|| by the recurrence of Fong & Saunders (section 3.2)
            betahat = c * st["betadd"]
            betadd = -s * st["betadd"]
            thetatilde_old = st["thetatilde"]
            ctilde, stilde, rhotilde_old = _rotation(st["rhodold"], thetabar)
            thetatilde = stilde * rhobar
            rhodold = ctilde * rhobar
            betad = -stilde * st["betad"] + ctilde * betahat
            tautildeold = (zeta_old - thetatilde_old * st["tautildeold"]) / rhotilde_old if rhotilde_old else 0.0
            taud = (zeta - thetatilde * tautildeold) / rhodold if rhodold else 0.0
            res = math.sqrt((betad - taud) ** 2 + betadd ** 2)
            st.update(x=x_new, u=u, v=v, h=h, hbar=hbar, alpha=alpha, alphabar=alphabar, zeta=zeta, zetabar=zetabar,
                      rho=rho, rhobar=rhobar, cbar=cbar, sbar=sbar, betadd=betadd, betad=betad, rhodold=rhodold,
                      tautildeold=tautildeold, thetatilde=thetatilde, res=res, done=beta == 0 or alpha == 0)
            g = abs(zetabar)
            return res, x_new, {"relative_residual": res / b_norm, "gradient_norm": g, "relative_gradient": g / g0}

        def converged(state: IterationState) -> bool:
            return st["done"] or (tol is not None and state.extra["relative_gradient"] <= tol)

        return (yield from iterate(step, n_iter, converged=converged, callback=callback, cancel=cancel))


def lsmr(projector, sinogram: torch.Tensor, n_iter: int = 20, *, x0=None, tol=None, callback=None,
         cancel=None) -> ReconResult:
    """Run LSMR for up to ``n_iter`` iterations; see :func:`lsmr_iterations`."""
    x_start, gen = _prepare(projector, sinogram, n_iter, x0, tol, callback, cancel)
    return run_to_end(gen, x_start)
