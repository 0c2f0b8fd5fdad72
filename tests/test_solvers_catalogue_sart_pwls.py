"""SART (one view per update, against SART written out with the dense matrix) and PWLS (its objective, monotone,
evaluated independently; its argument checks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ctbench.solvers import os_sart, os_sirt, pwls, pwls_iterations, sart, sart_iterations
from ctbench.solvers.ordered_subsets import subset_order
from small_problems import dense_matrix, small_2d

F64 = torch.float64


@pytest.fixture(scope="module")
def problem():
    return small_2d(n_views=12)


def test_sart_is_one_view_per_update(problem):
    P, x_true, b = problem
    A = dense_matrix(P)
    n_det = b.shape[1] * b.shape[2] if b.ndim == 3 else b.shape[1]
    bn = b.numpy().reshape(P.n_views, -1)
    x = np.zeros(A.shape[1])
    relax = 0.8
    for _ in range(2):
        for v in subset_order(P.n_views):      # the visit order: far-apart views in turn
            Av = A[v * n_det:(v + 1) * n_det]
            rows, cols = Av.sum(axis=1), Av.sum(axis=0)
            R = np.where(rows > 1e-9, 1 / np.where(rows > 1e-9, rows, 1), 0)
            C = np.where(cols > 1e-9, 1 / np.where(cols > 1e-9, cols, 1), 0)
            x = np.maximum(x + relax * C * (Av.T @ (R * (bn[v] - Av @ x))), 0.0)
    got = sart(P, b, 2, relax=relax, bounds=(0.0, None))
    np.testing.assert_allclose(got.volume.numpy().ravel(), x, rtol=1e-9, atol=1e-12)
    assert got.history[-1]["n_subsets"] == P.n_views
    assert os_sart is os_sirt
    assert [s.iteration for s in sart_iterations(P, b, 2)] == [1, 2]


@pytest.fixture(scope="module")
def low_dose():
    P, x_true, b = small_2d()
    flat = 400.0
    counts = torch.poisson(flat * torch.exp(-0.3 * b), generator=torch.Generator().manual_seed(3)).clamp(min=1)
    return P, 0.3 * x_true, counts, flat


@pytest.mark.parametrize("penalty", ["huber", "tv"])
def test_pwls_objective_is_monotone_and_is_its_definition(low_dose, penalty):
    P, x_true, counts, flat = low_dose
    lam, delta = 2.0, 0.01
    r = pwls(P, counts, flat, 25, penalty=penalty, lam=lam, delta=delta)
    obj = [h["objective"] for h in r.history]
    assert all(o2 <= o1 for o1, o2 in zip(obj, obj[1:])) and obj[-1] < obj[0]
    x = r.volume
    assert float(x.min()) >= 0.0
    b = -torch.log(counts / flat)
    w = counts / flat
    data = 0.5 * float((w * (P.project(x) - b) ** 2).sum())
    xn = x.numpy()
    dy = np.zeros_like(xn)
    dx = np.zeros_like(xn)
    dy[:-1] = xn[1:] - xn[:-1]
    dx[:, :-1] = xn[:, 1:] - xn[:, :-1]
    mag = np.sqrt(dy ** 2 + dx ** 2)
    pen = np.where(mag <= delta, mag ** 2 / (2 * delta), mag - delta / 2).sum() if penalty == "huber" else mag.sum()
    assert obj[-1] == pytest.approx(data + lam * pen, rel=1e-9)


def test_pwls_weights_follow_the_counts(low_dose):
    """Without a penalty PWLS is weighted least squares: its gradient A^T W (A x - b) vanishes at the end,
    while the unweighted gradient does not (the weights matter)."""
    P, x_true, counts, flat = low_dose
    r = pwls(P, counts, flat, 300, penalty="none", nonneg=False)
    b = -torch.log(counts / flat)
    res = P.project(r.volume) - b
    g_w = P.backproject(counts / flat * res)
    g_u = P.backproject(res)
    assert float(g_w.norm()) < 0.05 * float(g_u.norm())


def test_pwls_checks_its_arguments(low_dose):
    P, _, counts, flat = low_dose
    zeroed = counts.clone()
    zeroed[0, 0] = 0.0
    with pytest.raises(ValueError, match="counts must be positive here"):
        pwls(P, zeroed, flat, 2)
    with pytest.raises(ValueError, match="counts must be non-negative"):
        pwls(P, -counts, flat, 2)
    with pytest.raises(ValueError, match="flat"):
        pwls(P, counts, -1.0, 2)
    with pytest.raises(ValueError, match="penalty must be one of"):
        pwls(P, counts, flat, 2, penalty="l1")
    with pytest.raises(ValueError, match="delta"):
        pwls(P, counts, flat, 2, delta=0.0)
    with pytest.raises(ValueError, match="lam"):
        pwls_iterations(P, counts, flat, 2, lam=-1.0)
