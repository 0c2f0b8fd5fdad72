"""fdk/fbp are differentiable in the sinogram (issue 25): gradcheck in float64 against finite
differences, and the differentiable path computes the same volume as the no-grad one."""

from __future__ import annotations

import math

import pytest
import torch

import ctbench
from ctbench import solvers

F64 = torch.float64


def _cone():
    tr = ctbench.circular_trajectory_3d(7, 60.0, 90.0, dtype=F64)
    P = ctbench.Projector(tr, (3, 4, 4), (6, 3), detector_spacing=1.5)
    return P, solvers.fdk


def _fan():
    tr = ctbench.circular_trajectory_2d_fan(8, 60.0, 90.0, dtype=F64)
    P = ctbench.Projector(tr, (5, 5), 7, beam="fan", detector_spacing=1.5)
    return P, solvers.fbp


def _parallel():
    tr = ctbench.circular_trajectory_2d_parallel(6, dtype=F64)
    P = ctbench.Projector(tr, (5, 5), 7, beam="parallel")
    return P, solvers.fbp


@pytest.mark.parametrize("case", [_cone, _fan, _parallel], ids=["fdk-cone", "fbp-fan", "fbp-parallel"])
def test_gradcheck_float64(case):
    P, fn = case()
    torch.manual_seed(0)
    sino = torch.rand(P.projection_shape, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: fn(P, s), (sino,), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("case", [_cone, _fan], ids=["fdk-cone", "fbp-fan"])
def test_the_differentiable_path_is_the_same_reconstruction(case):
    P, fn = case()
    torch.manual_seed(1)
    sino = torch.rand(P.projection_shape, dtype=F64)
    plain = fn(P, sino)
    tracked = fn(P, sino.clone().requires_grad_(True))
    assert tracked.requires_grad and not plain.requires_grad
    torch.testing.assert_close(tracked.detach(), plain, rtol=1e-12, atol=1e-12)


def test_the_gradient_is_the_adjoint_of_the_linear_map():
    # fdk is linear in the sinogram: <fdk(s), g> == <s, grad>, and the gradient of a linear map
    # does not depend on where it is taken
    P, fn = _cone()
    torch.manual_seed(2)
    s = torch.rand(P.projection_shape, dtype=F64, requires_grad=True)
    g = torch.rand(P.volume_shape, dtype=F64)
    (grad,) = torch.autograd.grad((fn(P, s) * g).sum(), s)
    s2 = (3 * torch.rand(P.projection_shape, dtype=F64)).requires_grad_(True)
    (grad2,) = torch.autograd.grad((fn(P, s2) * g).sum(), s2)
    torch.testing.assert_close(grad, grad2, rtol=1e-12, atol=1e-12)
    lhs = float((fn(P, s.detach()) * g).sum())
    rhs = float((s.detach() * grad).sum())
    assert math.isclose(lhs, rhs, rel_tol=1e-10)


def test_diffct_spelling_is_differentiable():
    tr = ctbench.circular_trajectory_2d_parallel(6, dtype=F64)
    angles = torch.linspace(0, math.pi, 7, dtype=F64)[:-1]
    sino = torch.rand(6, 7, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda s: ctbench.fbp(s, tr, (5, 5), angles, beam="parallel", precision="float64"), (sino,),
        eps=1e-6, atol=1e-7, rtol=1e-5)
