"""The catalogue's functionals (ctbench.solvers.functionals): values against their definitions, gradients
against finite differences, proximal maps against brute-force minimisation, the operator norm against an SVD."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import torch

from ctbench.solvers.functionals import (Box, Huber, LeastSquares, PoissonTransmission, TotalVariation,
                                         operator_norm, projector_fingerprint)
from ctbench.engine.finite_differences import gradient
from small_problems import dense_matrix, small_2d

F64 = torch.float64


def _directional_fd(f, x, d, h=1e-6):
    return (f(x + h * d) - f(x - h * d)) / (2 * h)


def _tv_np(z, shape, eps=0.0):
    """Isotropic TV of a 2D image by its definition: forward differences, zero on the last row/column."""
    z = z.reshape(shape)
    dy = np.zeros(shape)
    dx = np.zeros(shape)
    dy[:-1, :] = z[1:, :] - z[:-1, :]
    dx[:, :-1] = z[:, 1:] - z[:, :-1]
    return np.sqrt(dy ** 2 + dx ** 2 + eps)


@pytest.fixture(scope="module")
def problem():
    return small_2d()


def test_least_squares_value_and_gradient(problem):
    P, x_true, b = problem
    g = torch.Generator().manual_seed(1)
    w = torch.rand(b.shape, generator=g, dtype=F64) + 0.1
    f = LeastSquares(P, b, w)
    x = torch.rand(x_true.shape, generator=g, dtype=F64)
    A = dense_matrix(P)
    r = A @ x.numpy().ravel() - b.numpy().ravel()
    assert f.value(x) == pytest.approx(0.5 * float(np.sum(w.numpy().ravel() * r ** 2)), rel=1e-10)
    d = torch.randn(x.shape, generator=g, dtype=F64)
    assert float((f.gradient(x) * d).sum()) == pytest.approx(_directional_fd(f.value, x, d), rel=1e-6)
    # the weighted Lipschitz constant is ||W^1/2 A||^2 (power method raised by 1 %)
    top = np.linalg.eigvalsh(A.T @ (w.numpy().ravel()[:, None] * A)).max()
    assert top <= f.lipschitz() <= 1.02 * top


def test_poisson_value_is_the_saturated_negative_log_likelihood(problem):
    P, x_true, b = problem
    flat = 300.0
    g = torch.Generator().manual_seed(2)
    counts = torch.poisson(flat * torch.exp(-b), generator=g)
    assert bool((counts == 0).any()) or True   # zero counts are allowed
    f = PoissonTransmission(P, counts, flat)
    x = 0.8 * x_true
    l = P.project(x).numpy().ravel()
    y = counts.numpy().ravel()
    nll = -scipy.stats.poisson.logpmf(y, flat * np.exp(-l)).sum()
    saturated = -scipy.stats.poisson.logpmf(y, np.maximum(y, 1e-300)).sum()
    assert f.value(x) == pytest.approx(nll - saturated, rel=1e-9)
    d = torch.randn(x.shape, generator=g, dtype=F64)
    assert float((f.gradient(x) * d).sum()) == pytest.approx(_directional_fd(f.value, x, d), rel=1e-6)


def test_poisson_optimal_curvature_is_a_tight_majoriser(problem):
    P, _, b = problem
    counts = torch.full(b.shape, 40.0, dtype=F64)
    f = PoissonTransmission(P, counts, 100.0)
    y, I0 = 40.0, 100.0
    h = lambda l: I0 * np.exp(-l) + y * l
    dh = lambda l: y - I0 * np.exp(-l)
    grid = np.linspace(0.0, 12.0, 2401)
    for l0 in (0.0, 1e-5, 0.3, 1.0, 4.0):
        c = float(f.curvature_at(torch.full(b.shape, l0, dtype=F64))[0, 0])
        parabola = h(l0) + dh(l0) * (grid - l0) + 0.5 * c * (grid - l0) ** 2
        assert (parabola >= h(grid) - 1e-9 * I0).all(), l0
        # tight: a 2 % smaller curvature no longer majorises (the parabola touches h at l = 0)
        if l0 > 0.1:
            smaller = h(l0) + dh(l0) * (grid - l0) + 0.98 * 0.5 * c * (grid - l0) ** 2
            assert (smaller < h(grid) - 1e-9).any(), l0
        assert c <= I0 * (1 + 1e-12)


def test_tv_and_huber_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(3)
    x = torch.rand((6, 7), generator=g, dtype=F64)
    d = torch.randn((6, 7), generator=g, dtype=F64)
    for fn in (TotalVariation(0.7, eps=1e-3, ndim=2), Huber(0.7, 0.05, ndim=2)):
        assert float((fn.gradient(x) * d).sum()) == pytest.approx(_directional_fd(fn.value, x, d), rel=1e-6)
    tv = TotalVariation(0.7, eps=1e-3, ndim=2)
    assert tv.value(x) == pytest.approx(0.7 * _tv_np(x.numpy(), (6, 7), 1e-3).sum(), rel=1e-12)
    r = _tv_np(x.numpy(), (6, 7))
    hub = np.where(r <= 0.05, r ** 2 / 0.1, r - 0.025).sum()
    assert Huber(0.7, 0.05, ndim=2).value(x) == pytest.approx(0.7 * hub, rel=1e-12)


def _brute_prox(v, t, lam, bounds, penalty):
    """Minimise 1/2 |z - v|^2 + t lam penalty(z) with L-BFGS-B (TV smoothed by 1e-12 for the optimiser)."""
    shape = v.shape

    def obj(z):
        return 0.5 * np.sum((z - v.ravel()) ** 2) + t * lam * penalty(z, shape)

    res = scipy.optimize.minimize(obj, v.ravel(), method="L-BFGS-B", bounds=[bounds] * v.size,
                                  options={"maxiter": 20000, "maxfun": 10 ** 6, "ftol": 1e-15, "gtol": 1e-12})
    return res.x.reshape(shape), obj


def _brute_prox(v, g, bounds, penalty, eps_steps=(1e-6, 1e-9, 1e-12)):
    """Minimise 1/2 |z - v|^2 + g penalty(z) by L-BFGS-B (gradients by autograd), the penalty's
    |D z| smoothed to sqrt(|D z|^2 + eps) with eps decreasing to 1e-12 (continuation)."""
    vt = torch.as_tensor(v)
    z = v.ravel().copy()
    for eps in eps_steps:
        def fg(u):
            ut = torch.tensor(u, dtype=F64, requires_grad=True)
            zz = ut.reshape(vt.shape)
            r = torch.sqrt(gradient(zz, 2).square().sum(0) + eps)
            f = 0.5 * (zz - vt).square().sum() + g * penalty(r).sum()
            f.backward()
            return float(f.detach()), ut.grad.numpy().copy()

        z = scipy.optimize.minimize(fg, z, jac=True, method="L-BFGS-B", bounds=[bounds] * v.size,
                                    options={"maxiter": 5000, "maxfun": 20000, "ftol": 1e-16,
                                             "gtol": 1e-13}).x
    return z.reshape(v.shape)


def _prox_objective(z, v, g, penalty):
    r = torch.as_tensor(_tv_np(z, v.shape))
    return 0.5 * np.sum((z - v) ** 2) + g * float(penalty(r).sum())


@pytest.mark.parametrize("bounds", [(None, None), (0.0, None)])
def test_tv_prox_minimises_its_definition(bounds):
    g = torch.Generator().manual_seed(4)
    v = torch.randn((3, 4), generator=g, dtype=F64)
    tv = TotalVariation(0.5, ndim=2, prox_iter=3000, bounds=bounds if bounds[0] is not None else None)
    z = tv.prox(v, 0.6).numpy()
    ref = _brute_prox(v.numpy(), 0.3, bounds, lambda r: r)
    # ours is at least as good as the brute-force minimiser, and (the objective being 1-strongly convex) near it
    assert _prox_objective(z, v.numpy(), 0.3, lambda r: r) <= _prox_objective(ref, v.numpy(), 0.3, lambda r: r) + 1e-9
    assert np.abs(z - ref).max() < 1e-3
    if bounds[0] is not None:
        assert z.min() >= 0 and v.numpy().min() < 0      # the bound was active


def test_huber_prox_minimises_its_definition():
    g = torch.Generator().manual_seed(5)
    v = torch.randn((3, 4), generator=g, dtype=F64)
    delta = 0.3
    z = Huber(0.5, delta, ndim=2, prox_iter=3000).prox(v, 0.6).numpy()

    def pen(r):
        return torch.where(r <= delta, r ** 2 / (2 * delta), r - delta / 2)

    ref = _brute_prox(v.numpy(), 0.3, (None, None), pen, eps_steps=(0.0,))  # smooth: no smoothing needed
    assert _prox_objective(z, v.numpy(), 0.3, pen) <= _prox_objective(ref, v.numpy(), 0.3, pen) + 1e-10
    assert np.abs(z - ref).max() < 1e-5


def test_box_prox_is_the_clip():
    v = torch.tensor([-2.0, 0.5, 3.0], dtype=F64)
    assert torch.equal(Box(0.0, 1.0).prox(v, 1.0), torch.tensor([0.0, 0.5, 1.0], dtype=F64))
    assert Box(0.0, None).value(v) == math.inf and Box(-3, 3).value(v) == 0.0


def test_operator_norm_matches_the_svd_and_is_cached(problem):
    P, _, _ = problem
    A = dense_matrix(P)
    top = np.linalg.svd(A, compute_uv=False)[0]
    est = operator_norm(P)
    assert top <= est <= top * 1.01
    calls = {"n": 0}
    project = P.project

    def counting(*a, **k):
        calls["n"] += 1
        return project(*a, **k)

    P.project = counting
    try:
        assert operator_norm(P) == est and calls["n"] == 0
    finally:
        del P.project
    P2, _, _ = small_2d(n_views=20)
    assert projector_fingerprint(P2) != projector_fingerprint(P)


def test_bad_arguments_name_themselves(problem):
    P, x_true, b = problem
    with pytest.raises(ValueError, match="weights must be non-negative"):
        LeastSquares(P, b, -torch.ones_like(b))
    with pytest.raises(ValueError, match="counts must be non-negative"):
        PoissonTransmission(P, -torch.ones_like(b), 100.0)
    with pytest.raises(ValueError, match="flat"):
        PoissonTransmission(P, torch.ones_like(b), 0.0)
    with pytest.raises(ValueError, match="flat"):
        PoissonTransmission(P, torch.ones_like(b), -torch.ones_like(b))
    with pytest.raises(ValueError, match="lam"):
        TotalVariation(-1.0)
    with pytest.raises(ValueError, match="delta"):
        Huber(1.0, 0.0)
    with pytest.raises(ValueError, match="eps > 0"):
        TotalVariation(1.0).gradient(x_true)
    with pytest.raises(ValueError, match="bounds lower"):
        Box(1.0, 0.0)
