"""LSMR (ctbench.solvers.lsmr): its iterates equal scipy's LSMR on the dense matrix, ||A^T r|| and ||r|| both
decrease, and the recurrence norms are the true ones."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse.linalg
import torch

from ctbench.solvers import lsmr, lsmr_iterations, lsqr_iterations
from small_problems import dense_matrix, small_2d


@pytest.fixture(scope="module")
def problem():
    P, x_true, b = small_2d()
    noisy = b + 0.05 * torch.randn(b.shape, generator=torch.Generator().manual_seed(2), dtype=b.dtype)
    return P, x_true, noisy


def test_lsmr_iterates_equal_scipys_lsmr(problem):
    P, _, b = problem
    A = dense_matrix(P)
    states = list(lsmr_iterations(P, b, 10))
    for k in (1, 2, 5, 10):
        ref = scipy.sparse.linalg.lsmr(A, b.numpy().ravel(), atol=0, btol=0, conlim=0, maxiter=k)[0]
        got = states[k - 1].volume.numpy().ravel()
        assert np.linalg.norm(got - ref) <= 1e-6 * np.linalg.norm(ref), k


def test_lsmr_norms_are_true_and_decrease(problem):
    P, _, b = problem
    states = list(lsmr_iterations(P, b, 12))
    grads, ress = [], []
    for s in states:
        r = b - P.project(s.volume)
        g = float(P.backproject(r).norm())
        assert s.residual == pytest.approx(float(r.norm()), rel=1e-7)
        assert s.extra["gradient_norm"] == pytest.approx(g, rel=1e-5)
        grads.append(g)
        ress.append(float(r.norm()))
    assert all(b2 <= b1 * (1 + 1e-9) for b1, b2 in zip(grads, grads[1:]))
    assert all(b2 <= b1 * (1 + 1e-9) for b1, b2 in zip(ress, ress[1:]))
    # LSQR minimises ||r|| over the same spaces: never above LSMR's
    for s, q in zip(states, lsqr_iterations(P, b, 12)):
        assert q.residual <= s.residual * (1 + 1e-9)


def test_lsmr_tol_and_checks(problem):
    P, _, b = problem
    r = lsmr(P, b, 200, tol=1e-3)
    assert r.stopped == "tol" and r.history[-1]["relative_gradient"] <= 1e-3
    with pytest.raises(ValueError, match="sinogram has shape"):
        lsmr(P, b[1:], 2)
    with pytest.raises(ValueError, match="n_iter"):
        lsmr(P, b, -2)
