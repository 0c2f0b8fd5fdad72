"""FISTA (ctbench.solvers.fista): its convergence bound on a smooth problem solved independently, the monotone
variant's objective, FISTA-TV against the primal-dual TV solver's minimum, and its argument checks."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.optimize
import torch

from ctbench.solvers import fista, fista_tv, fista_tv_iterations, tv_reconstruction
from ctbench.solvers.functionals import Huber, LeastSquares, TotalVariation, nonnegativity
from small_problems import dense_matrix, small_2d, small_3d

F64 = torch.float64


@pytest.fixture(scope="module")
def problem():
    return small_2d()


def test_fista_meets_its_rate_bound_on_a_smooth_problem(problem):
    P, x_true, b = problem
    hub = Huber(0.5, 0.05, ndim=2)
    data = LeastSquares(P, b)
    A = dense_matrix(P)
    bn = b.numpy().ravel()

    def F(u):
        ut = torch.tensor(u, dtype=F64, requires_grad=True)
        r = torch.as_tensor(A) @ ut - torch.as_tensor(bn)
        x = ut.reshape(x_true.shape)
        d = torch.stack([torch.nn.functional.pad(torch.diff(x, dim=0), (0, 0, 0, 1)),
                         torch.nn.functional.pad(torch.diff(x, dim=1), (0, 1))]).square().sum(0)
        # huber(|d|) with |d| = sqrt(d2) taken only where it is large (its derivative is finite there)
        hub_d = torch.where(d <= 0.05 ** 2, d / 0.1, torch.sqrt(torch.clamp(d, min=0.05 ** 2)) - 0.025)
        f = 0.5 * r.square().sum() + 0.5 * hub_d.sum()
        f.backward()
        return float(f.detach()), ut.grad.numpy()

    ref = scipy.optimize.minimize(F, x_true.numpy().ravel(), jac=True, method="L-BFGS-B",
                                  options={"maxiter": 20000, "ftol": 1e-16, "gtol": 1e-12})
    f_star, x_star = ref.fun, ref.x
    res = fista(P, [data, hub], None, 60, monotone=False)
    L = data.lipschitz() + hub.lipschitz()
    dist0 = float(np.sum(x_star ** 2))  # x0 = 0
    for k, h in enumerate(res.history, start=1):
        assert h["objective"] - f_star <= 2 * L * dist0 / (k + 1) ** 2 + 1e-9, k
        assert h["objective"] >= f_star - 1e-6 * abs(f_star)
    # and the reported objective is the objective
    assert res.history[-1]["objective"] == pytest.approx(F(res.volume.numpy().ravel())[0], rel=1e-10)


def test_monotone_fista_tv_never_raises_the_objective_and_reaches_the_tv_minimum(problem):
    P, x_true, b = problem
    res = fista_tv(P, b, 80, lam=0.05, prox_iter=10)
    obj = [h["objective"] for h in res.history]
    assert all(o2 <= o1 for o1, o2 in zip(obj, obj[1:]))
    cp = tv_reconstruction(P, b, 250, lam=0.05)       # the same objective by Chambolle-Pock
    best = min(obj[-1], cp.history[-1]["objective"])
    assert obj[-1] <= best * 1.003
    assert float(res.volume.min()) >= 0.0
    # the objective is 1/2 |Ax - b|^2 + lam TV_0(x), evaluated independently
    r = P.project(res.volume) - b
    tv = TotalVariation(1.0, ndim=2).value(res.volume)
    assert obj[-1] == pytest.approx(0.5 * float(r.square().sum()) + 0.05 * tv, rel=1e-9)


def test_fista_tv_runs_in_3d_with_warm_start_callback_and_cancel():
    P, x_true, b = small_3d(n_views=12)
    r1 = fista_tv(P, b, 5, lam=0.01)
    r2 = fista_tv(P, b, 5, lam=0.01, x0=r1.volume)
    assert r2.history[-1]["objective"] < r1.history[-1]["objective"]
    assert fista_tv(P, b, 10, callback=lambda s: s.iteration == 2).stopped == "callback"
    ev = threading.Event()
    ev.set()
    assert fista_tv(P, b, 10, cancel=ev).n_iter == 0
    gen = fista_tv_iterations(P, b, 3)
    assert [s.iteration for s in gen] == [1, 2, 3]


def test_fista_checks_its_arguments(problem):
    P, _, b = problem
    data = LeastSquares(P, b)
    with pytest.raises(ValueError, match=r"step .* must not exceed 1/L"):
        fista(P, data, nonnegativity(), 3, step=3.0 / data.lipschitz())
    with pytest.raises(ValueError, match="step"):
        fista(P, data, None, 3, step=-1.0)
    with pytest.raises(TypeError, match="smooth terms"):
        fista(P, nonnegativity(), None, 3)
    with pytest.raises(ValueError, match="lam"):
        fista_tv(P, b, 3, lam=-1.0)
    with pytest.raises(ValueError, match="prox_iter"):
        fista_tv(P, b, 3, prox_iter=0)
    with pytest.raises(ValueError, match="sinogram has shape"):
        fista_tv(P, b[:-1], 3)
    P.partition = "space"          # a rank's slab: the penalties would miss the neighbours' planes
    try:
        with pytest.raises(ValueError, match="partitioned projector is not supported"):
            fista_tv(P, b, 3)
    finally:
        P.partition = None
