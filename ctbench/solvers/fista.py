"""FISTA: accelerated proximal gradient for ``min_x f(x) + g(x)`` with composable functionals.

``f`` is a sum of smooth functionals (:mod:`ctbench.solvers.functionals`: data
terms, Huber, smoothed TV), ``g`` one proximable functional (TV with an
optional box, a box).  With step ``s <= 1 / L`` (``L`` a Lipschitz constant of
``grad f``), FISTA (Beck & Teboulle 2009)

    z_k = prox_{s g}(y_k - s grad f(y_k))
    t_{k+1} = (1 + sqrt(1 + 4 t_k^2)) / 2
    y_{k+1} = x_k + (t_k - 1) / t_{k+1} (x_k - x_{k-1})

reaches ``F(x_k) - F* <= 2 ||x_0 - x*||^2 / (s (k + 1)^2)`` when the prox is
exact.  The monotone variant (MFISTA, the default) keeps ``x_k = z_k`` only if
it does not raise the objective, else ``x_k = x_{k-1}``, with the momentum
``y_{k+1} = x_k + t_k / t_{k+1} (z_k - x_k) + (t_k - 1) / t_{k+1} (x_k - x_{k-1})``:
then ``F(x_k)`` never increases (also with an inexact, few-iteration TV prox).

Data terms keep their projections: ``A y`` is a combination of ``A z`` and
``A x``, so an iteration costs one projection and one backprojection.

:func:`fista_tv` is the named TV solver: ``1/2 ||A x - b||^2 + lam TV(x)``,
optionally with ``x >= 0``.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_flag, check_projector, check_run, check_sinogram, initial_volume
from .functionals import LeastSquares, TotalVariation, _count, _DataTerm, _DifferencePenalty, _positive
from .state import IterationState, ReconResult, iterate, run_to_end

__all__ = ["fista_iterations", "fista", "fista_tv_iterations", "fista_tv"]


def _check_terms(smooth, prox):
    terms = list(smooth) if isinstance(smooth, (list, tuple)) else [smooth]
    if not terms:
        raise ValueError("smooth must be a smooth functional or a non-empty list of them")
    for t in terms:
        if not getattr(t, "smooth", False) or not callable(getattr(t, "gradient", None)):
            raise TypeError(f"smooth terms must be smooth functionals with value/gradient/lipschitz, "
                            f"got {type(t).__name__}")
    if prox is not None and not callable(getattr(prox, "prox", None)):
        raise TypeError(f"prox must be a functional with a prox(v, t) method or None, got {type(prox).__name__}")
    return terms


def _check_step(step, terms):
    L = sum(t.lipschitz() for t in terms)
    if step is None:
        if not math.isfinite(L) or L <= 0:
            raise ValueError(f"the smooth terms' Lipschitz constant is {L!r}; pass step explicitly")
        return 1.0 / L, L
    s = _positive(step, "step")
    if L > 0 and s > 1.0 / L * (1 + 1e-12):
        raise ValueError(f"step ({s:g}) must not exceed 1/L = {1.0 / L:g} (L = {L:g}, the Lipschitz constant of "
                         "the smooth part's gradient); FISTA diverges beyond it")
    return s, L


def fista_iterations(projector, smooth, prox=None, n_iter: int = 50, *, x0=None, step=None, monotone: bool = True,
                     tol=None, callback=None, cancel=None):
    """Generator of FISTA iterations on ``sum(smooth) + prox``; yields an :class:`IterationState` after each.

    ``smooth``: a smooth functional or a list of them (the first data term, if
    any, gives the reported ``residual``); ``prox``: a functional with
    ``prox(v, t)``, or None.  ``step``: at most ``1/L`` (default ``1/L`` from the
    terms' ``lipschitz()``).  ``monotone``: MFISTA (module docstring).
    ``tol``: stop once ``||x_k - x_{k-1}|| / ||x_k||`` falls to ``tol``.
    ``extra`` holds ``objective``, ``relative_change``, ``step`` and, with a
    data term, ``relative_residual``.  Arguments are checked when called.
    """
    return _prepare(projector, smooth, prox, n_iter, x0, step, monotone, tol, callback, cancel)[1]


def _prepare(projector, smooth, prox, n_iter, x0, step, monotone, tol, callback, cancel):
    check_projector(projector)
    terms = _check_terms(smooth, prox)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    monotone = check_flag(monotone, "monotone")
    if getattr(projector, "partition", None) in ("space", "hybrid") and any(
            isinstance(t, _DifferencePenalty) for t in [*terms, prox]):
        raise ValueError("TV/Huber penalties here act on the whole volume, not on a rank's slab: a "
                         f"{projector.partition!r}-partitioned projector is not supported (use tv_iterations)")
    data = [t for t in terms if isinstance(t, _DataTerm)]
    like = data[0].data if data else None
    if like is None:
        like = torch.zeros(tuple(projector.projection_shape), dtype=torch.float64)
    x = initial_volume(projector, like, x0)
    if prox is not None:
        x = _prox(prox, x, 1.0, exact_box=True)
    s, _ = _check_step(step, terms)
    return x, _fista_gen(projector, terms, prox, x, n_iter, s, monotone, tol, callback, cancel)


def _prox(prox, v, t, exact_box=False):
    if exact_box and hasattr(prox, "_clip"):
        return prox._clip(v)          # a feasible start: the box only, not a TV denoising of x0
    return prox.prox(v, t)


class _Point:
    """A volume and the projections every data term needs of it (kept so that y's are linear combinations)."""

    def __init__(self, x, proj):
        self.x, self.proj = x, proj


def _combo(*pairs) -> _Point:
    """``sum c * point`` over ``(c, point)`` pairs, projections alike."""
    x = sum(c * p.x for c, p in pairs)
    proj = [sum(c * p.proj[i] for c, p in pairs) for i in range(len(pairs[0][1].proj))]
    return _Point(x, proj)


def _fista_gen(P, terms, prox, x, n_iter, s, monotone, tol, callback, cancel):
    with torch.no_grad():
        data = [t for t in terms if isinstance(t, _DataTerm)]
        others = [t for t in terms if not isinstance(t, _DataTerm)]
        first = data[0] if data else None
        b_norm = (math.sqrt(float(P.inner_projection(first.data, first.data))) or 1.0) if first else 1.0

        def point(v):
            return _Point(v, [d.forward(v) for d in data])

        def objective(pt: _Point) -> float:
            val = sum(d.value_at(l) for d, l in zip(data, pt.proj)) + sum(o.value(pt.x) for o in others)
            return val + (prox.value(pt.x) if prox is not None else 0.0)

        def grad(pt: _Point):
            g = sum(P.backproject(d.grad_at(l)) for d, l in zip(data, pt.proj)) if data else 0.0
            for o in others:
                g = g + o.gradient(pt.x)
            return g

        cur = point(x)
        st = {"x": cur, "prev": cur, "y": cur, "t": 1.0, "F": objective(cur)}

        def step():
            y = st["y"]
            v = y.x - s * grad(y)
            z = point(prox.prox(v, s) if prox is not None else v)
            Fz = objective(z)
            t = st["t"]
            t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
            x_old = st["x"]
            if monotone and not Fz <= st["F"]:
                x_new, F_new = x_old, st["F"]
            else:
                x_new, F_new = z, Fz
            a, c = t / t_new, (t - 1.0) / t_new
            if monotone:
                # y = x_new + a (z - x_new) + c (x_new - x_old)
                y_new = _combo((1.0 - a + c, x_new), (a, z), (-c, x_old))
            else:
                y_new = _combo((1.0 + c, x_new), (-c, x_old))
            st.update(x=x_new, prev=x_old, y=y_new, t=t_new, F=F_new)
            dx = x_new.x - x_old.x
            change = math.sqrt(float(P.inner_volume(dx, dx)) / max(float(P.inner_volume(x_new.x, x_new.x)), 1e-300))
            res = first.residual_at(x_new.proj[0]) if first is not None else 0.0
            extra = {"objective": F_new, "relative_change": change, "step": s}
            if first is not None:
                extra["relative_residual"] = res / b_norm
            return res, x_new.x, extra

        def converged(state: IterationState) -> bool:
            return tol is not None and state.extra["relative_change"] <= tol

        return (yield from iterate(step, n_iter, converged=converged, callback=callback, cancel=cancel))


def fista(projector, smooth, prox=None, n_iter: int = 50, *, x0=None, step=None, monotone: bool = True, tol=None,
          callback=None, cancel=None) -> ReconResult:
    """Run FISTA for up to ``n_iter`` iterations; see :func:`fista_iterations`."""
    x_start, gen = _prepare(projector, smooth, prox, n_iter, x0, step, monotone, tol, callback, cancel)
    return run_to_end(gen, x_start)


# ------------------------------------------------------------------ FISTA-TV
def fista_tv_iterations(projector, sinogram: torch.Tensor, n_iter: int = 50, *, lam: float = 1e-3,
                        nonneg: bool = True, prox_iter: int = 20, monotone: bool = True, x0=None, tol=None,
                        callback=None, cancel=None):
    """Generator of FISTA iterations on ``1/2 ||A x - b||^2 + lam TV_0(x)`` (``x >= 0`` if ``nonneg``).

    ``lam`` as in :func:`ctbench.solvers.tv_iterations` (same objective);
    ``prox_iter``: FGP steps of each TV prox (warm-started); step ``1 / ||A||^2``
    from the cached :func:`operator_norm`.  ``extra`` as :func:`fista_iterations`.
    """
    return _prepare_tv(projector, sinogram, n_iter, lam, nonneg, prox_iter, monotone, x0, tol, callback, cancel)[1]


def _prepare_tv(projector, sinogram, n_iter, lam, nonneg, prox_iter, monotone, x0, tol, callback, cancel):
    b = check_sinogram(projector, sinogram)
    nonneg = check_flag(nonneg, "nonneg")
    _count(prox_iter, "prox_iter")
    tv = TotalVariation(lam, ndim=len(projector.volume_shape), prox_iter=prox_iter,
                        bounds=(0.0, None) if nonneg else None)
    return _prepare(projector, LeastSquares(projector, b), tv, n_iter, x0, None, monotone, tol, callback, cancel)


def fista_tv(projector, sinogram: torch.Tensor, n_iter: int = 50, *, lam: float = 1e-3, nonneg: bool = True,
             prox_iter: int = 20, monotone: bool = True, x0=None, tol=None, callback=None,
             cancel=None) -> ReconResult:
    """Run FISTA-TV for up to ``n_iter`` iterations; see :func:`fista_tv_iterations`."""
    x_start, gen = _prepare_tv(projector, sinogram, n_iter, lam, nonneg, prox_iter, monotone, x0, tol, callback,
                               cancel)
    return run_to_end(gen, x_start)
