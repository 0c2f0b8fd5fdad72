"""Transmission MLEM / OS-EM (ctbench.solvers.em): the likelihood of the counts (computed here from scipy's
Poisson pmf) never decreases, the first update is the separable-paraboloidal-surrogate step written out with the
dense matrix, one subset is MLEM, and bad counts or flat fields are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch

from ctbench.solvers import mlem, mlem_iterations, osem, osem_iterations
from small_problems import dense_matrix, small_2d, small_3d

F64 = torch.float64


@pytest.fixture(scope="module")
def scan():
    P, x_true, b = small_2d()
    flat = 20.0                           # few photons: some pixels count none
    g = torch.Generator().manual_seed(7)
    counts = torch.poisson(flat * torch.exp(-0.3 * b), generator=g)
    assert int((counts == 0).sum()) > 0
    return P, 0.3 * x_true, counts, flat


def _log_likelihood(P, x, counts, flat):
    lam = flat * np.exp(-P.project(x).numpy().ravel())
    return float(scipy.stats.poisson.logpmf(counts.numpy().ravel(), lam).sum())


def test_mlem_likelihood_never_decreases_with_zero_counts(scan):
    P, x_true, counts, flat = scan
    states = list(mlem_iterations(P, counts, flat, 25))
    ll = [_log_likelihood(P, torch.zeros_like(x_true), counts, flat)]
    ll += [_log_likelihood(P, s.volume, counts, flat) for s in states]
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(ll, ll[1:]))
    assert ll[-1] > ll[0] + 1.0
    # the reported log-likelihood is the true one up to a constant (the saturated model's)
    offsets = [s.extra["log_likelihood"] - t for s, t in zip(states, ll[1:])]
    assert max(offsets) - min(offsets) < 1e-6 * abs(ll[-1])
    assert all(float(s.volume.min()) >= 0.0 for s in states)


def test_mlem_first_update_is_the_sps_step(scan):
    P, x_true, counts, flat = scan
    A = dense_matrix(P)
    x = 0.5 * x_true.numpy().ravel()
    y = counts.numpy().ravel()
    l = A @ x
    curv = np.where(l > 1e-8, 2 * flat * (1 - np.exp(-l) * (1 + l)) / np.maximum(l, 1e-8) ** 2, flat)
    numer = A.T @ (y - flat * np.exp(-l))
    denom = A.T @ (curv * A.sum(axis=1))
    expected = np.maximum(0.0, x - np.where(denom > 0, numer / np.where(denom > 0, denom, 1), 0))
    got = next(iter(mlem_iterations(P, counts, flat, 1, x0=0.5 * x_true))).volume.numpy().ravel()
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_one_subset_is_mlem_and_subsets_raise_the_likelihood(scan):
    P, x_true, counts, flat = scan
    a = mlem(P, counts, flat, 4)
    b = osem(P, counts, flat, 4, n_subsets=1)
    assert torch.allclose(a.volume, b.volume, rtol=0, atol=0)
    o = osem(P, counts, flat, 4, n_subsets=4)
    assert o.history[-1]["n_subsets"] == 4
    start = _log_likelihood(P, torch.zeros_like(x_true), counts, flat)
    # four OS passes get further than four MLEM iterations
    assert _log_likelihood(P, o.volume, counts, flat) > _log_likelihood(P, a.volume, counts, flat) > start


def test_flat_field_per_pixel_and_3d():
    P, x_true, b = small_3d(n_views=12)
    flat = torch.full(b.shape[1:], 500.0, dtype=F64)      # one flat image, broadcast over views
    counts = torch.poisson(flat * torch.exp(-0.2 * b), generator=torch.Generator().manual_seed(1))
    gen = osem_iterations(P, counts, flat, 3, n_subsets=3)
    obj = [s.extra["objective"] for s in gen]
    assert len(obj) == 3 and obj[-1] < obj[0]


def test_em_checks_counts_and_flat(scan):
    P, _, counts, flat = scan
    with pytest.raises(ValueError, match="counts must be non-negative"):
        mlem(P, counts - 5.0, flat, 2)
    with pytest.raises(ValueError, match="flat"):
        mlem(P, counts, 0.0, 2)
    with pytest.raises(ValueError, match="flat"):
        mlem(P, counts, -torch.ones_like(counts), 2)
    with pytest.raises(ValueError, match="counts has shape"):
        mlem(P, counts[1:], flat, 2)
    with pytest.raises(TypeError, match="counts must be a torch.Tensor"):
        mlem(P, counts.numpy(), flat, 2)
    with pytest.raises(ValueError, match="n_subsets"):
        osem(P, counts, flat, 2, n_subsets=10 ** 6)
