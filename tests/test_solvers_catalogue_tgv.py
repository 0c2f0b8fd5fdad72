"""TGV (ctbench.solvers.tgv): the symmetrised gradient and its adjoint, the objective (evaluated here from its
definition) falling, and the point of TGV: on a noisy affine ramp it beats TV at the same jump weight."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ctbench import Projector, circular_trajectory_2d_fan
from ctbench.solvers import tgv, tv_reconstruction
from ctbench.solvers.tgv import symmetrised_gradient, symmetrised_gradient_adjoint

F64 = torch.float64


@pytest.mark.parametrize("shape", [(5, 6), (3, 4, 5)])
def test_symmetrised_gradient_adjoint_and_kernel(shape):
    g = torch.Generator().manual_seed(1)
    nd = len(shape)
    w = torch.randn((nd, *shape), generator=g, dtype=F64)
    r = torch.randn((nd, nd, *shape), generator=g, dtype=F64)
    Ew = symmetrised_gradient(w)
    assert torch.allclose(Ew, Ew.transpose(0, 1))
    assert float((Ew * r).sum()) == pytest.approx(float((w * symmetrised_gradient_adjoint(r)).sum()), rel=1e-12)
    # a constant field has no symmetrised gradient; (J w)_ab = D_b w_a by hand for a linear one
    assert float(symmetrised_gradient(torch.ones((nd, *shape), dtype=F64)).abs().max()) == 0.0
    lin = torch.zeros((nd, *shape), dtype=F64)
    lin[0] = torch.arange(shape[-1], dtype=F64).expand(shape)        # w_0 = index along the last axis
    E = symmetrised_gradient(lin)
    inner = (slice(None, -1),) * nd
    last = nd - 1
    assert float(E[0, last][inner].sub(0.5).abs().max()) < 1e-12 and float(E[last, 0][inner].sub(0.5).abs().max()) < 1e-12


@pytest.fixture(scope="module")
def ramp():
    n = 24
    P = Projector(circular_trajectory_2d_fan(40, 60.0, 120.0, dtype=F64), (n, n), 40, voxel_spacing=1.0,
                  detector_spacing=1.0)
    yy, xx = torch.meshgrid(torch.arange(n, dtype=F64), torch.arange(n, dtype=F64), indexing="ij")
    r = ((yy - 11.5) ** 2 + (xx - 11.5) ** 2).sqrt()
    x = torch.where(r < 9, 0.02 + 0.01 * (xx - 11.5) / 9 + 0.005 * (yy - 11.5) / 9, torch.zeros_like(r))
    b = P.project(x)
    b = b + 0.01 * float(b.abs().max()) * torch.randn(b.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    return P, x, b


def test_tgv_beats_tv_on_a_noisy_ramp_and_its_objective_falls(ramp):
    P, x, b = ramp
    alpha1 = 0.01
    res = tgv(P, b, 200, alpha1=alpha1)
    tv = tv_reconstruction(P, b, 200, lam=alpha1)
    rmse = lambda v: float((v - x).square().mean().sqrt())
    assert rmse(res.volume) < 0.85 * rmse(tv.volume)
    obj = [h["objective"] for h in res.history]
    assert obj[-1] < obj[99] < obj[9] < obj[0]
    assert float(res.volume.min()) >= 0.0
    # TGV's objective at its result is at most TV's (w = 0 is allowed, so TGV <= TV objective at any x)
    xn = res.volume.numpy()
    d = np.zeros((2, *xn.shape))
    d[0, :-1] = xn[1:] - xn[:-1]
    d[1, :, :-1] = xn[:, 1:] - xn[:, :-1]
    tv_of_x = 0.5 * float((P.project(res.volume) - b).square().sum()) + alpha1 * np.sqrt((d ** 2).sum(0)).sum()
    assert obj[-1] <= tv_of_x * (1 + 1e-12)


def test_tgv_checks_its_arguments(ramp):
    P, _, b = ramp
    with pytest.raises(ValueError, match="alpha1"):
        tgv(P, b, 2, alpha1=-1.0)
    with pytest.raises(ValueError, match="alpha0"):
        tgv(P, b, 2, alpha0=-1.0)
    with pytest.raises(TypeError, match="nonneg"):
        tgv(P, b, 2, nonneg=1)
    assert tgv(P, b, 3, callback=lambda s: s.iteration == 1).stopped == "callback"
