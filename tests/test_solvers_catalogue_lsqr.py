"""LSQR (ctbench.solvers.lsqr): its iterates equal CGLS's (the same Krylov minimisers), its recurrence residual
and gradient norms equal the true ones, and it takes the run controls every solver takes."""

from __future__ import annotations

import threading

import pytest
import torch

from ctbench.solvers import cgls_iterations, lsqr, lsqr_iterations
from small_problems import small_2d, small_3d


@pytest.fixture(scope="module")
def problem():
    return small_2d()


@pytest.mark.parametrize("warm", [False, True])
def test_lsqr_iterates_equal_cgls_iterates(problem, warm):
    P, x_true, b = problem
    x0 = 0.5 * x_true if warm else None
    ours = [s.volume for s in lsqr_iterations(P, b, 12, x0=x0)]
    theirs = [s.volume for s in cgls_iterations(P, b, 12, x0=x0)]
    assert len(ours) == 12
    for k, (a, c) in enumerate(zip(ours, theirs), start=1):
        assert float((a - c).norm() / c.norm()) < 1e-5, k


def test_lsqr_recurrence_norms_are_the_true_norms(problem):
    P, _, b = problem
    for s in lsqr_iterations(P, b, 8):
        r = b - P.project(s.volume)
        assert s.residual == pytest.approx(float(r.norm()), rel=1e-8)
        assert s.extra["relative_residual"] == pytest.approx(float(r.norm() / b.norm()), rel=1e-8)
        assert s.extra["gradient_norm"] == pytest.approx(float(P.backproject(r).norm()), rel=1e-6)


def test_lsqr_stops_on_tol_cancel_callback_and_runs_in_3d():
    P, x_true, b = small_3d(n_views=12)
    r = lsqr(P, b, 50, tol=0.05)
    assert r.stopped == "tol" and r.history[-1]["relative_residual"] <= 0.05
    assert all(r2 <= r1 * (1 + 1e-12) for r1, r2 in zip(r.residuals, r.residuals[1:]))
    ev = threading.Event()
    ev.set()
    assert lsqr(P, b, 5, cancel=ev).n_iter == 0
    assert lsqr(P, b, 5, callback=lambda s: True).stopped == "callback"


def test_lsqr_of_zero_data_stays_at_zero(problem):
    P, _, b = problem
    r = lsqr(P, torch.zeros_like(b), 3)
    assert r.stopped == "tol" and float(r.volume.abs().max()) == 0.0


def test_lsqr_checks_its_arguments(problem):
    P, _, b = problem
    with pytest.raises(ValueError, match="n_iter"):
        lsqr(P, b, -1)
    with pytest.raises(ValueError, match="sinogram has shape"):
        lsqr(P, b[1:], 3)
    with pytest.raises(ValueError, match="tol"):
        lsqr(P, b, 3, tol=-1.0)
