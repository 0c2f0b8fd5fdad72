"""MLEM and OS-EM for transmission data: maximum likelihood of the photon counts, x >= 0.

The model is the transmission one: counts ``y_i ~ Poisson(I0_i exp(-(A x)_i))``
with the flat field ``I0``.  The solvers maximise its log-likelihood, i.e.
minimise :class:`~ctbench.solvers.functionals.PoissonTransmission`

    L(x) = sum_i [ I0_i exp(-l_i) + y_i l_i ] + const,    l = A x,    x >= 0,

by separable paraboloidal surrogates (Erdogan & Fessler 1999): at ``x^n`` each
ray's term is majorised by the parabola of "optimal" curvature
``c_i = 2 I0_i (1 - exp(-l_i) (1 + l_i)) / l_i^2`` (tangent at ``l_i^n``, above
the term on ``l >= 0``), and De Pierro's convexity argument splits the
parabolas over voxels, giving the closed-form update

    x_j <- max(0, x_j - [A^T (y - I0 exp(-A x))]_j / [A^T (c * A 1)]_j).

Each update minimises a surrogate that lies above ``L`` and touches it at
``x^n``, so ``L`` never increases: the likelihood is non-decreasing at every
iteration (on a non-negative projector, starting from any ``x0 >= 0``, zeros
included).  This is the EM family's answer for transmission data (the
transmission EM of Lange & Carson needs a 1D root-find per voxel; this
surrogate gives the same monotonicity in closed form).  Why not emission MLEM
(``x <- x A^T(b / A x) / A^T 1``) on the line integrals ``b``?  It models ``b``
as Poisson counts, which it is not: it ignores the flat field, weights rays
the wrong way round (it trusts long, photon-starved rays most) and needs
``b >= 0``.

OS-EM applies the same update with one subset of views at a time (subset
sums in numerator and denominator; subsets as in
:mod:`ctbench.solvers.ordered_subsets`): faster early on, no longer monotone,
and with noisy data it settles in a limit cycle near the maximum-likelihood
image.  One *iteration* is one pass over the subsets (about one projection and
one backprojection of all views).  The ML image of noisy data is itself noisy:
stop early, or use :func:`ctbench.solvers.pwls` with a penalty.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_run, initial_volume
from .functionals import PoissonTransmission, check_counts, optimal_curvature
from .ordered_subsets import _subsets
from .sirt import path_eps, safe_reciprocal
from .state import IterationState, ReconResult, iterate, run_to_end

__all__ = ["mlem", "mlem_iterations", "osem", "osem_iterations"]


def mlem_iterations(projector, counts: torch.Tensor, flat, n_iter: int = 20, *, x0=None, tol=None, callback=None,
                    cancel=None):
    """Generator of transmission-MLEM iterations (module docstring); yields an :class:`IterationState` after each.

    ``counts``: measured photons per pixel (the sinogram's shape, >= 0; zeros
    allowed); ``flat``: unattenuated counts ``I0`` (a positive number or a
    tensor broadcastable to the counts).  ``tol``: stop once the relative change
    ``||x_k - x_{k-1}|| / ||x_k||`` falls to ``tol``.  ``extra`` holds
    ``objective`` (the negative log-likelihood above that of a perfect fit,
    >= 0), ``log_likelihood`` (its negative), ``relative_residual`` (against the
    line integrals ``-log(max(y, 1) / I0)``) and ``relative_change``.
    """
    return _prepare(projector, counts, flat, n_iter, 1, x0, tol, callback, cancel)[1]


def osem_iterations(projector, counts: torch.Tensor, flat, n_iter: int = 10, *, n_subsets: int | None = None,
                    x0=None, tol=None, callback=None, cancel=None):
    """Generator of OS-EM passes: :func:`mlem_iterations` one subset of views at a time.

    ``n_subsets`` as in :func:`ctbench.solvers.os_sirt_iterations` (None or 0:
    automatic).  ``objective`` and ``residual`` are those of the pass (each
    subset measured just before its own update, no extra projection); with one
    subset this is exactly MLEM.
    """
    return _prepare(projector, counts, flat, n_iter, n_subsets, x0, tol, callback, cancel)[1]


def _prepare(projector, counts, flat, n_iter, n_subsets, x0, tol, callback, cancel):
    y = check_counts(counts, projector)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    model = PoissonTransmission(projector, y, flat)
    parts = _subsets(projector, n_subsets)
    x = initial_volume(projector, y, x0).clamp(min=0.0)
    return x, _em_gen(projector, parts, model, x, n_iter, tol, callback, cancel)


def _em_gen(P, parts, model, x, n_iter, tol, callback, cancel):
    with torch.no_grad():
        eps = path_eps(P)
        y, flat, b = model.counts, model.flat, model.data
        b_norm = math.sqrt(float(P.inner_projection(b, b))) or 1.0
        rows = P.project(torch.ones_like(x))
        pieces = []
        for Ps, idx in parts:
            sl = (lambda t: t) if idx is None else (lambda t, i=idx: t[i])
            pieces.append((Ps, sl(y), sl(flat), sl(b), sl(rows)))
        single = len(parts) == 1
        st = {"x": x, "l": P.project(x) if single else None}

        def step():
            x_old = st["x"]
            xn = x_old.clone()
            nll, rr = 0.0, 0.0
            for Ps, ys, fs, bs, rs in pieces:
                l = st["l"] if single else Ps.project(xn)
                e = fs * torch.exp(-l)
                if not single:
                    nll += _nll(Ps, ys, fs, e, l)
                    rr += float(Ps.inner_projection(l - bs, l - bs))
                numer = Ps.backproject(ys - e)
                denom = Ps.backproject(optimal_curvature(l, fs) * rs)
                xn = (xn - numer * safe_reciprocal(denom, eps * eps)).clamp_(min=0.0)
            if single:   # the projection of the new iterate: this iteration's numbers and the next update's l
                l = P.project(xn)
                st["l"] = l
                nll = model.value_at(l)
                rr = float(P.inner_projection(l - b, l - b))
            st["x"] = xn
            dx = xn - x_old
            change = math.sqrt(float(P.inner_volume(dx, dx)) / max(float(P.inner_volume(xn, xn)), 1e-300))
            res = math.sqrt(rr)
            return res, xn, {"objective": nll, "log_likelihood": -nll, "relative_residual": res / b_norm,
                             "relative_change": change, "n_subsets": len(parts)}

        def converged(s: IterationState) -> bool:
            return tol is not None and s.extra["relative_change"] <= tol

        return (yield from iterate(step, n_iter, converged=converged, callback=callback, cancel=cancel))


def _nll(Ps, y, flat, e, l) -> float:
    """One subset's share of PoissonTransmission's value (the saturated form, >= 0)."""
    sat = torch.where(y > 0, y - y * torch.log(torch.where(y > 0, y, flat) / flat), torch.zeros_like(y))
    t = e + y * l - sat
    return float(Ps.inner_projection(t, torch.ones_like(t)))


def mlem(projector, counts: torch.Tensor, flat, n_iter: int = 20, *, x0=None, tol=None, callback=None,
         cancel=None) -> ReconResult:
    """Run transmission MLEM for up to ``n_iter`` iterations; see :func:`mlem_iterations`."""
    x_start, gen = _prepare(projector, counts, flat, n_iter, 1, x0, tol, callback, cancel)
    return run_to_end(gen, x_start)


def osem(projector, counts: torch.Tensor, flat, n_iter: int = 10, *, n_subsets: int | None = None, x0=None,
         tol=None, callback=None, cancel=None) -> ReconResult:
    """Run OS-EM for up to ``n_iter`` passes; see :func:`osem_iterations`."""
    x_start, gen = _prepare(projector, counts, flat, n_iter, n_subsets, x0, tol, callback, cancel)
    return run_to_end(gen, x_start)
