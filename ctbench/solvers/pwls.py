"""PWLS: penalised weighted least squares on the log data, with weights from the counts.

    minimise  1/2 sum_i w_i ((A x)_i - b_i)^2 + R(x)    (x >= 0 if nonneg)

with ``b = -log(y / I0)`` the line integrals of the counts ``y`` and
``w_i = y_i / mean(I0)``.  ``Var(b_i) ~ 1 / y_i`` (the delta method on
Poisson counts), so ``w`` is the inverse variance, scaled so that a ray
through nothing weighs about 1 (``lam`` then means what it means in
:func:`ctbench.solvers.fista_tv`).  ``R`` is ``lam`` times the Huber penalty
of the voxel differences (``penalty="huber"``, smooth: edges cost linearly
above ``delta``, noise quadratically below), isotropic TV (``"tv"``, by its
prox), or nothing (``"none"``: weighted least squares).

Solved by monotone FISTA (:mod:`ctbench.solvers.fista`) with step ``1/L``,
``L = ||W^(1/2) A||^2`` (a 15-step power method at set-up) plus the penalty's
constant: the objective never increases, and it converges at FISTA's
``O(1/k^2)`` rate (exactly for Huber, with an inexact prox for TV).
"""

from __future__ import annotations

import torch

from ._checks import check_flag, check_projector
from .fista import _prepare as _fista_prepare
from .functionals import (Huber, LeastSquares, TotalVariation, _count, _positive, _power_method, check_counts,
                          check_flat, nonnegativity)
from .state import ReconResult, run_to_end

__all__ = ["pwls", "pwls_iterations", "PENALTIES"]

PENALTIES = ("huber", "tv", "none")


class _WeightedData(LeastSquares):
    def lipschitz(self) -> float:
        if self._lipschitz is None:
            self._lipschitz = _power_method(self.projector, self.data.dtype, self.data.device,
                                            weights=self.weights, n_iter=15)
        return self._lipschitz


def pwls_iterations(projector, counts: torch.Tensor, flat, n_iter: int = 50, *, penalty: str = "huber",
                    lam: float = 1e-3, delta: float = 1e-3, nonneg: bool = True, prox_iter: int = 10, x0=None,
                    tol=None, callback=None, cancel=None):
    """Generator of PWLS iterations (module docstring); yields an :class:`IterationState` after each.

    ``counts``: photons per pixel (> 0: a pixel counting nothing has no finite
    line integral; clamp such pixels or use :func:`ctbench.solvers.mlem`);
    ``flat``: ``I0`` (a positive number or tensor).  ``penalty``: "huber",
    "tv" or "none"; ``lam``: its weight; ``delta``: the Huber threshold
    (attenuation/mm per voxel step: differences below it are smoothed as
    noise); ``prox_iter``: FGP steps per TV prox.  ``tol``: stop once the
    relative change falls to ``tol``.  ``extra`` as :func:`ctbench.solvers.fista_iterations`;
    ``residual`` is ``||A x - b||`` unweighted.
    """
    return _prepare(projector, counts, flat, n_iter, penalty, lam, delta, nonneg, prox_iter, x0, tol, callback,
                    cancel)[1]


def _prepare(projector, counts, flat, n_iter, penalty, lam, delta, nonneg, prox_iter, x0, tol, callback, cancel):
    check_projector(projector)
    y = check_counts(counts, projector, allow_zero=False)
    f = check_flat(flat, y)
    if penalty not in PENALTIES:
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}")
    lam = _positive(lam, "lam", allow_zero=True)
    delta = _positive(delta, "delta")
    nonneg = check_flag(nonneg, "nonneg")
    prox_iter = _count(prox_iter, "prox_iter")
    b = -torch.log(y / f)
    data = _WeightedData(projector, b, y / float(f.mean()))
    ndim = len(projector.volume_shape)
    bounds = (0.0, None) if nonneg else None
    smooth, prox = [data], (nonnegativity() if nonneg else None)
    if penalty == "huber" and lam > 0:
        smooth.append(Huber(lam, delta, ndim=ndim))
    elif penalty == "tv" and lam > 0:
        prox = TotalVariation(lam, ndim=ndim, prox_iter=prox_iter, bounds=bounds)
    return _fista_prepare(projector, smooth, prox, n_iter, x0, None, True, tol, callback, cancel)


def pwls(projector, counts: torch.Tensor, flat, n_iter: int = 50, *, penalty: str = "huber", lam: float = 1e-3,
         delta: float = 1e-3, nonneg: bool = True, prox_iter: int = 10, x0=None, tol=None, callback=None,
         cancel=None) -> ReconResult:
    """Run PWLS for up to ``n_iter`` iterations; see :func:`pwls_iterations`."""
    x_start, gen = _prepare(projector, counts, flat, n_iter, penalty, lam, delta, nonneg, prox_iter, x0, tol,
                            callback, cancel)
    return run_to_end(gen, x_start)
