"""TGV: second-order total generalised variation (Bredies, Kunisch & Pock 2010) by the primal-dual method.

    minimise over x, w:  1/2 ||A x - b||^2 + alpha1 ||D x - w||_{2,1} + alpha0 ||E w||_{F,1}    (x >= 0 if nonneg)

``D`` is the forward-difference gradient of :mod:`ctbench.engine.finite_differences`
(the TV's), ``w`` a vector field (one component per spatial axis), ``E`` the
symmetrised gradient ``E w = (J w + (J w)^T) / 2`` with ``(J w)_ab = D_b w_a``;
``||.||_{2,1}`` sums each voxel's Euclidean norm, ``||.||_{F,1}`` each voxel's
Frobenius norm (off-diagonal entries counted twice).  Where TV favours
piecewise-constant images (and turns ramps into staircases), TGV favours
piecewise-*affine* ones: ``w`` takes up smooth gradients at the cost
``alpha0``, and only jumps cost ``alpha1``.  The usual choice is
``alpha0 = 2 alpha1`` (per voxel step); ``alpha0 -> infinity`` forces ``E w = 0``.

Solved by Chambolle-Pock (theta = 1) on ``K (x, w) = (A x, D x - w, E w)`` with
the diagonal steps of Pock & Chambolle (2011), as :func:`ctbench.solvers.tv_iterations`:
dual steps ``1/(A 1)`` per ray, 1/3 on ``D x - w``, 1/2 on ``E w``; primal steps
``1/(A^T 1 + 2 ndim)`` per voxel for ``x`` and ``1/(1 + 2 ndim)`` for ``w`` (the
inverse absolute row and column sums of ``K``), convergent without estimating
``||A||``.  The objective is not monotone iteration by iteration.  One
projection and one backprojection per iteration.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_flag, check_run, check_sinogram, initial_volume
from ..engine.finite_differences import divergence, gradient
from .functionals import _positive
from .sirt import path_eps, safe_reciprocal
from .state import IterationState, ReconResult, iterate, run_to_end

__all__ = ["tgv", "tgv_iterations", "symmetrised_gradient", "symmetrised_gradient_adjoint"]


def symmetrised_gradient(w: torch.Tensor) -> torch.Tensor:
    """``E w``: shape ``(ndim, ndim, *volume)`` from a field ``w`` of shape ``(ndim, *volume)``; symmetric."""
    ndim = w.shape[0]
    J = torch.stack([gradient(w[a], ndim) for a in range(ndim)])     # J[a, b] = D_b w_a
    return 0.5 * (J + J.transpose(0, 1))


def symmetrised_gradient_adjoint(r: torch.Tensor) -> torch.Tensor:
    """``E^T r`` for a tensor field ``r`` of shape ``(ndim, ndim, *volume)`` (symmetrised first)."""
    s = 0.5 * (r + r.transpose(0, 1))
    return torch.stack([-divergence(s[a]) for a in range(s.shape[0])])


def _ball(q: torch.Tensor, radius: float, n_lead: int) -> torch.Tensor:
    """Project every voxel's vector (``n_lead`` leading axes) onto the ball of ``radius``."""
    norm = q.square().sum(dim=tuple(range(n_lead))).sqrt()
    if radius <= 0:
        return torch.zeros_like(q)
    return q / torch.clamp(norm / radius, min=1.0)


def _values(P, x, w, Ax, b, alpha1, alpha0, ndim):
    r = Ax - b
    rr = float(P.inner_projection(r, r))
    t1 = float((gradient(x, ndim) - w).square().sum(0).sqrt().sum())
    t0 = float(symmetrised_gradient(w).square().sum((0, 1)).sqrt().sum())
    return rr, 0.5 * rr + alpha1 * t1 + alpha0 * t0


def tgv_iterations(projector, sinogram: torch.Tensor, n_iter: int = 200, *, alpha1: float = 1e-3,
                   alpha0: float | None = None, nonneg: bool = True, x0=None, tol=None, callback=None, cancel=None):
    """Generator of primal-dual TGV iterations (module docstring); yields an :class:`IterationState` after each.

    ``alpha1`` weighs jumps (as ``lam`` in :func:`ctbench.solvers.tv_iterations`),
    ``alpha0`` (default ``2 alpha1``) the change of slope.  ``tol``: stop once
    ``||x_k - x_{k-1}|| / ||x_k||`` falls to ``tol``.  ``extra`` holds
    ``objective``, ``relative_residual`` and ``relative_change``; the auxiliary
    field ``w`` is not returned.  Not for distributed projectors.
    """
    return _prepare(projector, sinogram, n_iter, alpha1, alpha0, nonneg, x0, tol, callback, cancel)[1]


def _prepare(projector, sinogram, n_iter, alpha1, alpha0, nonneg, x0, tol, callback, cancel):
    b = check_sinogram(projector, sinogram)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    alpha1 = _positive(alpha1, "alpha1", allow_zero=True)
    alpha0 = 2.0 * alpha1 if alpha0 is None else _positive(alpha0, "alpha0", allow_zero=True)
    nonneg = check_flag(nonneg, "nonneg")
    if getattr(projector, "partition", None) in ("space", "hybrid") or getattr(projector, "world_size", 1) > 1:
        raise ValueError("tgv does not support distributed projectors (its differences act on the whole volume)")
    x = initial_volume(projector, b, x0)
    if nonneg:
        x = x.clamp(min=0)
    return x, _tgv_gen(projector, b, x, n_iter, alpha1, alpha0, nonneg, tol, callback, cancel)


def _tgv_gen(P, b, x, n_iter, alpha1, alpha0, nonneg, tol, callback, cancel):
    with torch.no_grad():
        ndim = len(P.volume_shape)
        # Diagonal steps of Pock & Chambolle (2011): 1 / (absolute row or column sums of K).
        sigma = safe_reciprocal(P.project(torch.ones_like(x)), path_eps(P))     # data rows: 1 / (A 1)
        sigma_q, sigma_r = 1.0 / 3.0, 0.5                                      # |D| + |I| rows; E rows
        tau_x = 1.0 / (P.backproject(torch.ones_like(b)) + 2.0 * ndim)         # A^T 1 + |D| columns
        tau_w = 1.0 / (1.0 + 2.0 * ndim)                                       # |I| + |E| columns
        b_norm = math.sqrt(float(P.inner_projection(b, b))) or 1.0
        Ax = P.project(x)
        w = torch.zeros((ndim, *x.shape), dtype=x.dtype, device=x.device)
        st = {"x": x, "w": w, "xbar": x, "wbar": w, "Ax": Ax, "Axbar": Ax, "p": torch.zeros_like(b),
              "q": torch.zeros_like(w), "r": torch.zeros((ndim, ndim, *x.shape), dtype=x.dtype, device=x.device)}

        def one():
            p = (st["p"] + sigma * (st["Axbar"] - b)) / (1.0 + sigma)
            q = _ball(st["q"] + sigma_q * (gradient(st["xbar"], ndim) - st["wbar"]), alpha1, 1)
            r = _ball(st["r"] + sigma_r * symmetrised_gradient(st["wbar"]), alpha0, 2)
            x_old, w_old = st["x"], st["w"]
            x_new = x_old - tau_x * (P.backproject(p) - divergence(q))
            if nonneg:
                x_new = x_new.clamp(min=0)
            w_new = w_old - tau_w * (-q + symmetrised_gradient_adjoint(r))
            Ax_new = P.project(x_new)
            st.update(p=p, q=q, r=r, x=x_new, w=w_new, xbar=2 * x_new - x_old, wbar=2 * w_new - w_old,
                      Axbar=2 * Ax_new - st["Ax"], Ax=Ax_new)
            rr, obj = _values(P, x_new, w_new, Ax_new, b, alpha1, alpha0, ndim)
            dx = x_new - x_old
            change = math.sqrt(float(P.inner_volume(dx, dx)) / max(float(P.inner_volume(x_new, x_new)), 1e-300))
            res = math.sqrt(rr)
            return res, x_new, {"objective": obj, "relative_residual": res / b_norm, "relative_change": change}

        def converged(s: IterationState) -> bool:
            return tol is not None and s.extra["relative_change"] <= tol

        return (yield from iterate(one, n_iter, converged=converged, callback=callback, cancel=cancel))


def tgv(projector, sinogram: torch.Tensor, n_iter: int = 200, *, alpha1: float = 1e-3, alpha0: float | None = None,
        nonneg: bool = True, x0=None, tol=None, callback=None, cancel=None) -> ReconResult:
    """Run TGV for up to ``n_iter`` iterations; see :func:`tgv_iterations`."""
    x_start, gen = _prepare(projector, sinogram, n_iter, alpha1, alpha0, nonneg, x0, tol, callback, cancel)
    return run_to_end(gen, x_start)
