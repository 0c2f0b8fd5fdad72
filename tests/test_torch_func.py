"""torch.func transforms and higher derivatives of the projector (issue 5).

What is claimed in docs/PRECISION.md is tested here: grad/vjp/jvp/vmap for
the volume and sinogram, per-sample gradients (vmap of grad), Hessians and
Hessian-vector products for the volume (double backward and forward-over-
reverse), reverse-mode Jacobians with respect to the geometry, and clear
errors for what is not implemented (forward mode and second derivatives in
the geometry).  Truth: explicit adjoint formulas and dense Jacobians.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, hessian, jacrev, jvp, vjp, vmap

from ctbench import Projector, circular_trajectory_3d, custom_trajectory_3d
from ctbench.engine.cpu import CpuBackend
from ctbench.engine.ops import project_op

F64 = torch.float64
# torch.func itself calls torch.jit.script on first use in this torch version.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    tr = circular_trajectory_3d(4, 60.0, 120.0, start_angle=0.2, dtype=F64)
    P = Projector(tr, (4, 5, 6), (7, 4), detector_spacing=1.6, backend="cpu")
    x = torch.rand(P.volume_shape, dtype=F64)
    y = torch.rand(P.projection_shape, dtype=F64)
    return tr, P, x, y


def test_grad_and_vjp_match_the_adjoint(setup):
    _, P, x, y = setup
    g = grad(lambda v: 0.5 * (P.project(v) - y).square().sum())(x)
    torch.testing.assert_close(g, P.backproject(P.project(x) - y), rtol=0, atol=0)
    out, pullback = vjp(P.project, x)
    torch.testing.assert_close(out, P.project(x), rtol=0, atol=0)
    torch.testing.assert_close(pullback(y)[0], P.backproject(y), rtol=0, atol=0)
    out, pullback = vjp(P.backproject, y)
    torch.testing.assert_close(pullback(x)[0], P.project(x), rtol=0, atol=0)


def test_jvp_is_the_operator_on_the_tangent(setup):
    _, P, x, y = setup
    t = torch.rand_like(x)
    out, tangent = jvp(P.project, (x,), (t,))
    torch.testing.assert_close(tangent, P.project(t), rtol=0, atol=0)
    s = torch.rand_like(y)
    _, tangent = jvp(P.backproject, (y,), (s,))
    torch.testing.assert_close(tangent, P.backproject(s), rtol=0, atol=0)


def test_vmap_folds_into_one_backend_call(setup, monkeypatch):
    _, P, x, y = setup
    X = torch.rand(3, *P.volume_shape, dtype=F64)
    Y = torch.rand(*P.projection_shape, 3, dtype=F64)  # mapped axis last
    calls = []
    original = CpuBackend.project
    monkeypatch.setattr(CpuBackend, "project", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    out = vmap(P.project)(X)
    assert len(calls) == 1
    assert torch.equal(out, torch.stack([P.project(v) for v in X]))
    back = vmap(P.backproject, in_dims=-1, out_dims=1)(Y)
    assert torch.equal(back, torch.stack([P.backproject(Y[..., i]) for i in range(3)], dim=1))


def test_per_sample_gradients_with_vmap_of_grad(setup):
    _, P, x, y = setup
    X = torch.rand(3, *P.volume_shape, dtype=F64)
    loss = lambda v: (P.project(v) - y).square().sum()
    per_sample = vmap(grad(loss))(X)
    for i in range(3):
        torch.testing.assert_close(per_sample[i], 2 * P.backproject(P.project(X[i]) - y), rtol=1e-14, atol=1e-14)


def test_hessian_of_least_squares_is_2_AtA():
    torch.manual_seed(1)
    tr = circular_trajectory_3d(3, 60.0, 120.0, start_angle=0.4, dtype=F64)
    P = Projector(tr, (2, 3, 4), (4, 3), detector_spacing=1.5, backend="cpu")
    x = torch.rand(2, 3, 4, dtype=F64)
    y = torch.rand(3, 4, 3, dtype=F64)
    H = hessian(lambda v: (P.project(v) - y).square().sum())(x).reshape(24, 24)
    A = jacrev(P.project)(x).reshape(-1, 24)
    assert A.abs().sum() > 0
    torch.testing.assert_close(H, 2 * A.T @ A, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["project", "backproject"])
def test_hessian_vector_product_by_double_backward(setup, op):
    _, P, x, y = setup
    fwd = P.project if op == "project" else P.backproject
    adj = P.backproject if op == "project" else P.project
    inp = (x if op == "project" else y).clone().requires_grad_(True)
    target = y if op == "project" else x
    t = torch.rand_like(inp)
    loss = (fwd(inp) - target).square().sum() + (fwd(inp) ** 3).sum()
    (g,) = torch.autograd.grad(loss, inp, create_graph=True)
    (hv,) = torch.autograd.grad((g * t).sum(), inp)
    Ax, At = fwd(inp.detach()), fwd(t)
    torch.testing.assert_close(hv, adj(2 * At + 6 * Ax * At), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["project", "backproject"])
@pytest.mark.slow
def test_gradgradcheck_volume(op):
    torch.manual_seed(3)
    tr = circular_trajectory_3d(2, 60.0, 120.0, start_angle=0.4, dtype=F64)
    P = Projector(tr, (2, 3, 3), (3, 2), detector_spacing=1.5, backend="cpu")
    fwd = P.project if op == "project" else P.backproject
    shape = P.volume_shape if op == "project" else P.projection_shape
    inp = torch.rand(shape, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda v: fwd(v) ** 2, (inp,))


def test_geometry_gradient_by_torch_func_grad_and_jacrev(setup):
    tr, P, x, y = setup
    torch.manual_seed(2)
    src0 = tr.source + 0.2 * torch.randn_like(tr.source)

    def loss(src):
        T = custom_trajectory_3d(src, tr.detector_center, tr.detector_u, tr.detector_v)
        return (P.project(x, trajectory=T) - y).square().sum()

    leaf = src0.clone().requires_grad_(True)
    loss(leaf).backward()
    torch.testing.assert_close(grad(loss)(src0), leaf.grad, rtol=0, atol=0)
    torch.testing.assert_close(jacrev(loss)(src0), leaf.grad, rtol=1e-14, atol=1e-14)


def test_vmap_over_the_geometry_at_the_op_level(setup):
    """Mapped geometry (e.g. a batch of candidate scans) loops over the mapped items."""
    tr, P, x, y = setup
    ex = P._executor(torch.device("cpu"))
    rays = P._rays(None, F64, x.device)
    srcs = torch.stack([rays.source, rays.source * 1.01, rays.source + 0.3])

    def f(src):
        return project_op(x[None], src, rays.center, rays.ustep, rays.vstep, ex, 0, True, P.detector_shape)

    out = vmap(f)(srcs)
    for i in range(3):
        assert torch.equal(out[i], f(srcs[i]))
    g = vmap(grad(lambda s: (f(s) * y).sum()))(srcs)
    for i in range(3):
        s = srcs[i].clone().requires_grad_(True)
        (f(s) * y).sum().backward()
        torch.testing.assert_close(g[i], s.grad, rtol=1e-14, atol=1e-14)


def test_forward_mode_in_the_geometry_raises_clearly(setup):
    tr, P, x, y = setup

    def f(src):
        return P.project(x, trajectory=custom_trajectory_3d(src, tr.detector_center, tr.detector_u,
                                                             tr.detector_v))

    with pytest.raises(NotImplementedError, match="geometry"):
        jvp(f, (tr.source,), (torch.ones_like(tr.source),))


def test_second_derivative_through_a_geometry_gradient_raises_clearly(setup):
    tr, P, x, y = setup
    src = tr.source.clone().requires_grad_(True)
    vol = x.clone().requires_grad_(True)
    T = custom_trajectory_3d(src, tr.detector_center, tr.detector_u, tr.detector_v)
    loss = (P.project(vol, trajectory=T) - y).square().sum()
    g_src, g_vol = torch.autograd.grad(loss, (src, vol), create_graph=True)
    # Volume Hessian-vector products still work with a learnable geometry in the graph ...
    (hv,) = torch.autograd.grad((g_vol * x).sum(), vol)
    torch.testing.assert_close(hv, 2 * P.backproject(P.project(x, trajectory=T.detach()), trajectory=T.detach()),
                               rtol=1e-12, atol=1e-12)
    # ... but a geometry gradient cannot be differentiated again.
    with pytest.raises(NotImplementedError, match="second derivatives"):
        torch.autograd.grad(g_src.sum(), vol)


def test_mixed_derivative_of_the_volume_gradient_wrt_geometry():
    """d/d(source) of <grad_x L, t> for L = |A(g) x - y|^2, against central differences (float64)."""
    torch.manual_seed(5)
    tr = circular_trajectory_3d(3, 60.0, 120.0, start_angle=0.3, dtype=F64)
    P = Projector(tr, (4, 5, 6), (7, 4), detector_spacing=1.6, backend="cpu")
    x, y, t = torch.rand(4, 5, 6, dtype=F64), torch.rand(3, 7, 4, dtype=F64), torch.rand(4, 5, 6, dtype=F64)
    src0 = tr.source + 0.2 * torch.randn_like(tr.source)

    def h(src):
        xr = x.clone().requires_grad_(True)
        T = custom_trajectory_3d(src, tr.detector_center, tr.detector_u, tr.detector_v)
        (gx,) = torch.autograd.grad((P.project(xr, trajectory=T) - y).square().sum(), xr, create_graph=True)
        return (gx * t).sum()

    leaf = src0.clone().requires_grad_(True)
    (analytic,) = torch.autograd.grad(h(leaf), leaf)
    assert analytic.abs().max() > 0
    direction = torch.randn_like(src0)
    eps = 1e-5
    fd = (h(src0 + eps * direction) - h(src0 - eps * direction)).item() / (2 * eps)
    assert abs(fd - (analytic * direction).sum().item()) <= 1e-6 * max(1.0, abs(fd))
