"""Iterative solvers: SIRT, CGLS, TV (Chambolle-Pock), total_variation, and the generator/result API.

Independent references: the projector's matrix built column by column and
solved with numpy (least squares, explicit SIRT steps), a numpy
implementation of the TV formula, finite differences (gradcheck).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from ctbench import Projector, circular_trajectory_2d_fan
from ctbench.phantoms import Ellipsoid, ellipsoid_phantom
from ctbench.solvers import (
    IterationState,
    ReconResult,
    cgls,
    cgls_iterations,
    divergence,
    gradient,
    sirt,
    sirt_iterations,
    total_variation,
    tv_iterations,
    tv_reconstruction,
)
from small_problems import dense_matrix, small_2d, small_3d

F64 = torch.float64




def _monotone(seq, slack=1e-12):
    return all(b <= a * (1 + slack) + 1e-300 for a, b in zip(seq, seq[1:]))


# ------------------------------------------------------------------ SIRT
def test_sirt_matches_explicit_iteration():
    p, x_true, b = small_2d(size=10, det=16, n_views=12)
    A = dense_matrix(p)
    R = np.where(A.sum(1) > 0, 1 / np.where(A.sum(1) > 0, A.sum(1), 1), 0)
    C = np.where(A.sum(0) > 0, 1 / np.where(A.sum(0) > 0, A.sum(0), 1), 0)
    x = np.zeros(A.shape[1])
    bb = b.reshape(-1).numpy()
    for _ in range(5):
        x = np.clip(x + C * (A.T @ (R * (bb - A @ x))), 0, None)
    res = sirt(p, b, 5, bounds=(0.0, None))
    np.testing.assert_allclose(res.volume.reshape(-1).numpy(), x, rtol=1e-9, atol=1e-12)
    assert res.n_iter == 5 and res.stopped == "completed"


@pytest.mark.parametrize("setup", [small_2d, pytest.param(lambda: small_3d(n_views=20), id="small_3d")])
def test_sirt_residual_decreases_monotonically(setup):
    p, x_true, b = setup()
    res = sirt(p, b, 30)
    weighted = [h["weighted_residual"] for h in res.history]
    assert _monotone(weighted)       # guaranteed: SIRT is a gradient step in the R-weighted norm
    assert _monotone(res.residuals)  # and on this consistent data the plain residual follows
    assert res.residuals[-1] < 0.2 * res.residuals[0]


def test_sirt_bounds_are_respected():
    p, x_true, b = small_2d()
    res = sirt(p, b + 0.05 * torch.randn(b.shape, generator=torch.Generator().manual_seed(0), dtype=F64), 10,
               bounds=(0.0, 0.8))
    assert float(res.volume.min()) >= 0.0 and float(res.volume.max()) <= 0.8


# ------------------------------------------------------------------ CGLS
@pytest.mark.slow
def test_cgls_converges_to_least_squares_solution():
    p, x_true, b = small_2d(size=8, det=14, n_views=10)
    A = dense_matrix(p)
    noisy = b + 0.01 * torch.randn(b.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    x_ls, *_ = np.linalg.lstsq(A, noisy.reshape(-1).numpy(), rcond=None)
    res = cgls(p, noisy, 200, tol=0.0)
    r_ls = np.linalg.norm(A @ x_ls - noisy.reshape(-1).numpy())
    assert res.residuals[-1] == pytest.approx(r_ls, rel=1e-6)
    # the residual history is the true residual of the returned volume
    assert float((p.project(res.volume) - noisy).norm()) == pytest.approx(res.residuals[-1], rel=1e-6)


@pytest.mark.parametrize("setup", [small_2d, pytest.param(lambda: small_3d(n_views=20), id="small_3d")])
def test_cgls_residual_decreases_monotonically(setup):
    p, x_true, b = setup()
    res = cgls(p, b, 15)
    assert _monotone(res.residuals)
    assert res.residuals[-1] < 0.1 * res.residuals[0]


def test_cgls_tolerance_stops_early():
    p, x_true, b = small_2d()
    res = cgls(p, b, 100, tol=0.05)
    assert res.stopped == "tol"
    assert res.history[-1]["relative_residual"] <= 0.05
    assert res.n_iter < 100 and len(res.residuals) == res.n_iter
    assert res.history[-2]["relative_residual"] > 0.05


# ------------------------------------------------------------------ total variation
def _tv_numpy(x: np.ndarray, eps: float) -> float:
    g2 = np.zeros_like(x)
    for a in range(x.ndim):
        d = np.diff(x, axis=a)
        pad = [(0, 0)] * x.ndim
        pad[a] = (0, 1)
        g2 += np.pad(d, pad) ** 2
    return float(np.sqrt(g2 + eps).sum())


@pytest.mark.parametrize("shape", [(7, 9), (4, 5, 6)])
def test_total_variation_value(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    for eps in (0.0, 1e-3):
        assert float(total_variation(x, eps=eps)) == pytest.approx(_tv_numpy(x.numpy(), eps), rel=1e-12)
    # a constant has no variation; a unit step across a plane of n voxels has TV n
    assert float(total_variation(torch.ones(shape, dtype=F64), eps=0.0)) == 0.0
    step = torch.zeros(shape, dtype=F64)
    step[..., shape[-1] // 2:] = 1.0
    assert float(total_variation(step, eps=0.0)) == pytest.approx(np.prod(shape[:-1]))


def test_total_variation_is_differentiable():
    x = torch.randn((3, 4, 5), generator=torch.Generator().manual_seed(4), dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: total_variation(v, eps=1e-2), (x,))


def test_total_variation_with_projector_and_batch():
    p, x_true, b = small_2d()
    batch = torch.stack([x_true, 2 * x_true])
    assert float(total_variation(batch, projector=p, eps=0.0)) == pytest.approx(
        3 * float(total_variation(x_true, eps=0.0)), rel=1e-12)


@pytest.mark.parametrize("shape", [(6, 7), (3, 4, 5), (1, 4, 5)])
def test_gradient_divergence_adjoint(shape):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=g, dtype=F64)
    q = torch.randn((len(shape), *shape), generator=g, dtype=F64)
    lhs = float((gradient(x, len(shape)) * q).sum())
    rhs = -float((x * divergence(q)).sum())
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)


# ------------------------------------------------------------------ TV reconstruction
@pytest.mark.slow
def test_tv_objective_decreases_and_beats_least_squares_on_sparse_noisy_data():
    traj = circular_trajectory_2d_fan(12, 60.0, 120.0, dtype=F64)
    p = Projector(traj, (24, 24), 32, voxel_spacing=1.0, detector_spacing=1.5)
    truth = ellipsoid_phantom([Ellipsoid(1.0, (8.0, 6.0, 8.0)), Ellipsoid(-0.5, (2.5, 2.5, 2.5), (2.0, 1.0, 0.0))],
                              (24, 24), 1.0, scale=1.0, dtype=F64)
    b = p.project(truth)
    b = b + 0.3 * torch.randn(b.shape, generator=torch.Generator().manual_seed(6), dtype=F64)
    res = tv_reconstruction(p, b, 300, lam=2.0)
    obj = [h["objective"] for h in res.history]
    # primal-dual iterations are not monotone step by step, but over blocks of iterations they are
    blocks = [min(obj[i:i + 25]) for i in range(0, 300, 25)]
    assert _monotone(blocks)
    assert obj[-1] < 0.5 * obj[0]
    assert float(res.volume.min()) >= 0.0  # non-negativity
    ls = cgls(p, b, 30).volume
    err_tv = float((res.volume - truth).norm() / truth.norm())
    err_ls = float((ls - truth).norm() / truth.norm())
    assert err_tv < 0.7 * err_ls


@pytest.mark.slow
def test_tv_with_zero_lambda_fits_the_data():
    p, x_true, b = small_2d()
    res = tv_reconstruction(p, b, 200, lam=0.0)
    assert res.history[-1]["relative_residual"] < 0.05
    assert res.history[-1]["objective"] == pytest.approx(0.5 * res.residuals[-1] ** 2, rel=1e-9)


# ------------------------------------------------------------------ generators, callbacks, cancel, warm start
@pytest.mark.parametrize("gen_fn", [sirt_iterations, cgls_iterations, tv_iterations])
def test_generators_yield_states(gen_fn):
    p, x_true, b = small_2d()
    gen = gen_fn(p, b, 4)
    states = list(gen)
    assert [s.iteration for s in states] == [1, 2, 3, 4]
    assert all(isinstance(s, IterationState) and s.volume.shape == p.volume_shape for s in states)
    assert all(math.isfinite(s.residual) and "relative_residual" in s.extra for s in states)
    # the estimate a state holds is not modified by later iterations
    assert not torch.equal(states[0].volume, states[-1].volume)
    first = gen_fn(p, b, 1)
    assert torch.equal(next(first).volume, states[0].volume)


@pytest.mark.parametrize("solver", [sirt, cgls, tv_reconstruction])
def test_callback_sees_every_iteration_and_can_stop(solver):
    p, x_true, b = small_2d()
    seen = []
    res = solver(p, b, 10, callback=lambda s: seen.append(s.iteration))
    assert seen == list(range(1, 11)) and isinstance(res, ReconResult)
    res = solver(p, b, 10, callback=lambda s: s.iteration == 3)
    assert res.n_iter == 3 and res.stopped == "callback" and len(res.residuals) == 3


@pytest.mark.parametrize("solver", [sirt, cgls, tv_reconstruction])
def test_cancel_stops_within_one_iteration(solver):
    p, x_true, b = small_2d()
    event = threading.Event()

    def cb(state):
        if state.iteration == 2:
            event.set()  # as a GUI would, from anywhere, during iteration 2

    res = solver(p, b, 50, callback=cb, cancel=event)
    assert res.stopped == "cancelled" and res.n_iter == 2
    # a callable works too, and a cancel set before the start runs no iteration
    res = solver(p, b, 50, cancel=lambda: True)
    assert res.n_iter == 0 and res.stopped == "cancelled"
    assert res.volume.shape == p.volume_shape and float(res.volume.abs().max()) == 0.0


def test_cancel_from_another_thread():
    p, x_true, b = small_3d(n_views=20)
    event = threading.Event()
    started = threading.Event()
    out = {}

    def run():
        out["res"] = sirt(p, b, 100000, callback=lambda s: started.set(), cancel=event)

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(60)
    event.set()
    t.join(60)
    assert not t.is_alive()
    assert out["res"].stopped == "cancelled" and 1 <= out["res"].n_iter < 100000


@pytest.mark.parametrize("solver", [sirt, cgls])
def test_warm_start_continues(solver):
    p, x_true, b = small_2d()
    first = solver(p, b, 5)
    cont = solver(p, b, 5, x0=first.volume)
    assert cont.residuals[0] < first.residuals[-1] * (1 + 1e-9)
    zero = solver(p, b, 0, x0=first.volume)
    assert zero.n_iter == 0 and torch.equal(zero.volume, first.volume)
    assert zero.volume is not first.volume  # a copy: the caller's x0 is never modified


def test_sirt_warm_start_is_exact_continuation():
    p, x_true, b = small_2d()
    ten = sirt(p, b, 10)
    five = sirt(p, b, 5)
    again = sirt(p, b, 5, x0=five.volume)
    torch.testing.assert_close(again.volume, ten.volume, rtol=1e-10, atol=1e-12)


def test_float32_runs():
    p, x_true, b = small_2d(torch.float32)
    for solver in (sirt, cgls, tv_reconstruction):
        res = solver(p, b, 5)
        assert res.volume.dtype == torch.float32 and res.residuals[-1] < res.residuals[0]
