"""Ordered-subset solvers (OS-SIRT, OS-TV): equality with SIRT for one subset, explicit
subset steps against a dense matrix, convergence, the TV proximal step, cancel and bad input.

Independent references: the projector's matrix built column by column (numpy
OS-SART steps), SIRT itself for one subset, the primal objective of the TV
denoising problem (the proximal step must decrease it below the input's).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from ctbench.solvers import (ReconResult, os_sirt, os_sirt_iterations, os_tv_iterations, os_tv_reconstruction, sirt,
                             total_variation)
from ctbench.solvers.ordered_subsets import auto_subsets, subset_order, tv_prox
from small_problems import dense_matrix, small_2d, small_3d

F64 = torch.float64


def _inv(s):
    return np.where(s > 1e-6, 1 / np.where(s > 1e-6, s, 1), 0)


def test_subset_order_is_a_permutation_spreading_neighbours():
    assert subset_order(1) == [0]
    assert subset_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    for s in (3, 5, 12, 30):
        assert sorted(subset_order(s)) == list(range(s))
    assert auto_subsets(120) == 15 and auto_subsets(721) == 16 and auto_subsets(5) == 1


@pytest.mark.parametrize("setup", [small_2d, small_3d])
def test_one_subset_is_sirt_exactly(setup):
    p, x_true, b = setup()
    ref = sirt(p, b, 6, bounds=(0.0, None))
    res = os_sirt(p, b, 6, n_subsets=1, bounds=(0.0, None))
    assert torch.equal(res.volume, ref.volume)
    # the pass residual of pass k+1 is SIRT's residual after iteration k
    np.testing.assert_allclose(res.residuals[1:], ref.residuals[:-1], rtol=1e-12)


def test_os_sirt_matches_explicit_subset_steps():
    p, x_true, b = small_2d(size=10, det=16, n_views=12)
    A = dense_matrix(p)
    bb = b.reshape(-1).numpy()
    S, relax = 3, 0.8
    nd = A.shape[0] // 12
    x = np.zeros(A.shape[1])
    for _ in range(2):
        for s in subset_order(S):
            rows = np.concatenate([np.arange(k * nd, (k + 1) * nd) for k in range(s, 12, S)])
            As = A[rows]
            x = np.clip(x + relax * _inv(As.sum(0)) * (As.T @ (_inv(As.sum(1)) * (bb[rows] - As @ x))), 0, None)
    res = os_sirt(p, b, 2, n_subsets=S, relax=relax, bounds=(0.0, None))
    np.testing.assert_allclose(res.volume.reshape(-1).numpy(), x, rtol=1e-9, atol=1e-12)
    assert res.history[-1]["n_subsets"] == 3


def test_os_sirt_beats_sirt_per_pass():
    """Equal work (one pass = one SIRT iteration): subsets get much closer to the truth."""
    p, x_true, b = small_3d()
    err = lambda v: float((v - x_true).norm() / x_true.norm())  # noqa: E731
    e_sirt = err(sirt(p, b, 4, bounds=(0.0, None)).volume)
    res = os_sirt(p, b, 4, n_subsets=6, bounds=(0.0, None))
    assert err(res.volume) < 0.7 * e_sirt
    assert res.residuals[-1] < 0.2 * res.residuals[0]


def test_tv_prox_solves_the_denoising_problem():
    g = torch.Generator().manual_seed(1)
    clean = torch.zeros(16, 16, dtype=F64)
    clean[4:12, 5:11] = 1.0
    noisy = clean + 0.2 * torch.randn(clean.shape, generator=g, dtype=F64)
    gamma = 0.3

    def objective(z):
        return 0.5 * float((z - noisy).square().sum()) + gamma * float(total_variation(z, eps=0.0, ndim=2))

    z, p = tv_prox(noisy, gamma, 2, 200)
    assert float(p.square().sum(0).max()) <= 1 + 1e-12  # dual stays feasible
    assert objective(z) < 0.7 * objective(noisy)
    # the optimality gap: no small random perturbation improves the objective by much
    for _ in range(5):
        d = 1e-3 * torch.randn(z.shape, generator=g, dtype=F64)
        assert objective(z + d) > objective(z) - 1e-3
    # warm start continues; zero weight is the identity
    z2, _ = tv_prox(noisy, gamma, 2, 10, p)
    assert objective(z2) <= objective(z) + 1e-3
    assert torch.equal(tv_prox(noisy, 0.0, 2, 5)[0], noisy)


def test_os_tv_lowers_its_objective_and_the_error_on_noisy_data():
    """OS-TV approximately minimises 1/2 ||A x - b||_R^2 + lam TV(x): it must beat OS-SIRT (and
    the truth) on that objective, and with a moderate weight land closer to the truth."""
    from ctbench.solvers.sirt import safe_reciprocal

    p, x_true, b = small_2d(size=24, det=32, n_views=30)
    R = safe_reciprocal(p.project(torch.ones_like(x_true)), 1e-6)
    noisy = b + 1.0 * torch.randn(b.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    err = lambda v: float((v - x_true).norm() / x_true.norm())  # noqa: E731
    plain = os_sirt(p, noisy, 8, n_subsets=5, bounds=(0.0, None)).volume
    lam = 0.3

    def objective(x):
        return 0.5 * float(((p.project(x) - noisy).square() * R).sum()) + lam * float(total_variation(x, eps=0.0))

    tv = os_tv_reconstruction(p, noisy, 8, n_subsets=5, lam=lam)
    assert objective(tv.volume) < 0.9 * objective(plain) and objective(tv.volume) < objective(x_true)
    assert float(tv.volume.min()) >= 0.0
    assert tv.history[-1]["tv"] == pytest.approx(float(total_variation(tv.volume, eps=0.0)), rel=1e-9)
    assert err(os_tv_reconstruction(p, noisy, 8, n_subsets=5, lam=0.1).volume) < 0.95 * err(plain)
    # lam = 0 is OS-SIRT with non-negativity
    zero = os_tv_reconstruction(p, noisy, 3, n_subsets=5, lam=0.0)
    torch.testing.assert_close(zero.volume, os_sirt(p, noisy, 3, n_subsets=5, bounds=(0.0, None)).volume)


@pytest.mark.parametrize("gen_fn", [os_sirt_iterations, os_tv_iterations])
def test_generators_callback_tol_and_x0(gen_fn):
    p, x_true, b = small_2d()
    states = list(gen_fn(p, b, 3, n_subsets=4))
    assert [s.iteration for s in states] == [1, 2, 3]
    assert all(s.volume.shape == p.volume_shape and "relative_residual" in s.extra for s in states)
    assert not torch.equal(states[0].volume, states[-1].volume)
    x0 = torch.full(p.volume_shape, 0.1, dtype=F64)
    keep = x0.clone()
    first = next(gen_fn(p, b, 1, n_subsets=4, x0=x0))
    assert torch.equal(x0, keep)  # the caller's x0 is never modified
    assert not torch.equal(first.volume, states[0].volume)


def test_tol_and_callback_stop():
    p, x_true, b = small_2d()
    res = os_sirt(p, b, 500, n_subsets=4, tol=0.05)
    assert res.stopped == "tol" and res.n_iter < 500 and res.history[-1]["relative_residual"] <= 0.05
    res = os_tv_reconstruction(p, b, 500, n_subsets=4, lam=1e-4, tol=1e-2)
    assert res.stopped == "tol" and res.history[-1]["relative_change"] <= 1e-2
    res = os_sirt(p, b, 10, n_subsets=4, callback=lambda s: s.iteration == 2)
    assert res.stopped == "callback" and res.n_iter == 2 and isinstance(res, ReconResult)


@pytest.mark.parametrize("solver", [os_sirt, os_tv_reconstruction])
def test_cancel(solver):
    p, x_true, b = small_2d()
    event = threading.Event()
    res = solver(p, b, 50, n_subsets=3, callback=lambda s: event.set() if s.iteration == 2 else None, cancel=event)
    assert res.stopped == "cancelled" and res.n_iter == 2
    res = solver(p, b, 50, cancel=lambda: True)
    assert res.n_iter == 0 and res.stopped == "cancelled" and float(res.volume.abs().max()) == 0.0


def test_bad_input_is_named():
    p, x_true, b = small_2d()
    with pytest.raises(ValueError, match="n_subsets"):
        os_sirt(p, b, 2, n_subsets=25)  # 24 views
    with pytest.raises(ValueError, match="n_subsets"):
        os_sirt(p, b, 2, n_subsets=-1)
    with pytest.raises(ValueError, match="n_subsets"):
        os_sirt_iterations(p, b, 2, n_subsets=2.5)
    with pytest.raises(ValueError, match="relax"):
        os_sirt(p, b, 2, relax=2.0)
    with pytest.raises(ValueError, match="lam"):
        os_tv_iterations(p, b, 2, lam=-1)
    with pytest.raises(ValueError, match="tv_iter"):
        os_tv_iterations(p, b, 2, tv_iter=0)
    with pytest.raises(ValueError, match="sinogram has shape"):
        os_sirt(p, b[:5], 2)
    with pytest.raises(ValueError, match="n_iter"):
        os_tv_reconstruction(p, b, -1)
    with pytest.raises(TypeError, match="cancel"):
        os_sirt(p, b, 2, cancel=3)
    with pytest.raises(TypeError, match="Projector"):
        os_sirt(object(), b, 2)


def test_workbench_offers_os_methods_with_defaults_and_runs_them():
    from ctbench.workbench.design import TrajectoryDesign
    from ctbench.workbench.workflow import ALGORITHMS, Progress, ReconRequest, reconstruct, run, simulate

    assert ALGORITHMS["os_sirt"].iterative and ALGORITHMS["os_tv"].iterative
    req = ReconRequest("os_sirt").validated()
    assert req.params == {"n_iter": 5, "n_subsets": 0, "nonneg": True}
    g = TrajectoryDesign(kind="parallel", n_views=24, detector_u=16, detector_v=4, volume_d=4, volume_h=12,
                         volume_w=12).build()
    vol = torch.zeros(g.volume_shape)
    vol[1:3, 3:9, 4:8] = 0.02
    sino = simulate(g, vol, backend="cpu")
    fin = run(g, sino, ReconRequest("os_sirt", {"n_iter": 3, "n_subsets": 4}), backend="cpu")
    ref = os_sirt(g.projector("cpu"), sino, 3, n_subsets=4, bounds=(0.0, None))
    torch.testing.assert_close(fin.volume, ref.volume.reshape(fin.volume.shape))
    # more subsets than a preview's views are clamped; OS-TV runs and cancels through the events
    events = list(reconstruct(g, sino, ReconRequest("os_tv", {"n_iter": 2, "n_subsets": 24}, "auto"),
                              backend="cpu"))
    assert [e.iteration for e in events if isinstance(e, Progress)] == [1, 2]
    with pytest.raises(ValueError, match="Subsets"):
        ReconRequest("os_sirt", {"n_subsets": -1}).validated()
