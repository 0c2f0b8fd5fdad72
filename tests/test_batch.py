"""Leading batch/channel dimensions and per-call trajectories (issue 5).

A batched call must equal the per-item calls exactly (the kernels compute
each item with the same operations in the same order) and must reach the
backend as one call per window, not a Python loop over items.
"""

from __future__ import annotations

import pytest
import torch

from ctbench import Projector, circular_trajectory_2d_fan, circular_trajectory_3d, custom_trajectory_3d
from ctbench.engine.cpu import CpuBackend

F64 = torch.float64


def _cone(n_views=5, dtype=torch.float32, **kw):
    tr = circular_trajectory_3d(n_views, 40.0, 80.0, start_angle=0.1, dtype=dtype)
    return tr, Projector(tr, (6, 7, 8), (9, 6), detector_spacing=2.0, backend="cpu", **kw)


def _count_backend_calls(monkeypatch):
    calls = {"project": 0, "backproject": 0, "geometry_vjp": 0}
    for name in calls:
        original = getattr(CpuBackend, name)

        def counted(self, *args, _name=name, _orig=original, **kwargs):
            calls[_name] += 1
            return _orig(self, *args, **kwargs)
        monkeypatch.setattr(CpuBackend, name, counted)
    return calls


def test_batched_project_and_backproject_equal_per_item_exactly(monkeypatch):
    torch.manual_seed(0)
    _, P = _cone()
    vol = torch.rand(2, 3, 6, 7, 8)
    sino = torch.rand(2, 3, 5, 9, 6)
    calls = _count_backend_calls(monkeypatch)
    out = P.project(vol)
    back = P.backproject(sino)
    assert calls == {"project": 1, "backproject": 1, "geometry_vjp": 0}  # one launch for all six items
    assert out.shape == (2, 3, 5, 9, 6) and back.shape == (2, 3, 6, 7, 8)
    for b in range(2):
        for c in range(3):
            assert torch.equal(out[b, c], P.project(vol[b, c]))
            assert torch.equal(back[b, c], P.backproject(sino[b, c]))


def test_batched_2d_fan_equals_per_item_exactly():
    torch.manual_seed(1)
    tr = circular_trajectory_2d_fan(7, 40.0, 80.0, dtype=F64)
    P = Projector(tr, (9, 10), 13, detector_spacing=1.7, backend="cpu")
    vol = torch.rand(4, 9, 10, dtype=F64)
    sino = torch.rand(2, 2, 7, 13, dtype=F64)
    out, back = P.project(vol), P.backproject(sino)
    assert out.shape == (4, 7, 13) and back.shape == (2, 2, 9, 10)
    for b in range(4):
        assert torch.equal(out[b], P.project(vol[b]))
    for b in range(2):
        for c in range(2):
            assert torch.equal(back[b, c], P.backproject(sino[b, c]))


def test_batched_volume_gradient_equals_per_item_exactly():
    torch.manual_seed(2)
    _, P = _cone()
    vol = torch.rand(3, 2, 6, 7, 8, requires_grad=True)
    target = torch.rand(3, 2, 5, 9, 6)
    ((P.project(vol) - target) ** 2).sum().backward()
    for b in range(3):
        for c in range(2):
            v = vol[b, c].detach().clone().requires_grad_(True)
            ((P.project(v) - target[b, c]) ** 2).sum().backward()
            assert torch.equal(vol.grad[b, c], v.grad)


def test_batched_geometry_gradient_is_the_sum_of_per_item_gradients(monkeypatch):
    torch.manual_seed(3)
    tr, P = _cone(dtype=F64)
    vol = torch.rand(2, 2, 6, 7, 8, dtype=F64)
    w = torch.randn(2, 2, 5, 9, 6, dtype=F64)
    geo = [t.detach() + 0.1 * torch.randn_like(t) for t in tr.tensors()]
    calls = _count_backend_calls(monkeypatch)
    leaves = [t.clone().requires_grad_(True) for t in geo]
    (P.project(vol, trajectory=custom_trajectory_3d(*leaves)) * w).sum().backward()
    assert calls["geometry_vjp"] == 1
    total = [torch.zeros_like(t) for t in geo]
    for b in range(2):
        for c in range(2):
            item = [t.clone().requires_grad_(True) for t in geo]
            (P.project(vol[b, c], trajectory=custom_trajectory_3d(*item)) * w[b, c]).sum().backward()
            total = [s + t.grad for s, t in zip(total, item)]
    for leaf, want in zip(leaves, total):
        torch.testing.assert_close(leaf.grad, want, rtol=1e-12, atol=1e-12)


def test_per_call_trajectory_equals_a_projector_built_on_it():
    torch.manual_seed(4)
    tr, P = _cone()
    other = circular_trajectory_3d(5, 45.0, 85.0, start_angle=0.7, detector_offset=(1.3, -0.4))
    Q = Projector(other, (6, 7, 8), (9, 6), detector_spacing=2.0, backend="cpu")
    vol = torch.rand(2, 6, 7, 8)
    sino = torch.rand(2, 5, 9, 6)
    assert torch.equal(P.project(vol, trajectory=other), Q.project(vol))
    assert torch.equal(P.backproject(sino, trajectory=other), Q.backproject(sino))
    # Omitted means the constructor trajectory, which the override did not replace.
    assert torch.equal(P.project(vol), P.project(vol, trajectory=tr))
    assert not torch.equal(P.project(vol), Q.project(vol))


def test_per_call_trajectory_must_keep_the_view_count():
    _, P = _cone()
    with pytest.raises(ValueError, match="views"):
        P.project(torch.rand(6, 7, 8), trajectory=circular_trajectory_3d(4, 40.0, 80.0))
    with pytest.raises(TypeError, match="trajectory"):
        P.backproject(torch.rand(5, 9, 6), trajectory="not a trajectory")
