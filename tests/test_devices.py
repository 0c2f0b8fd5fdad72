"""Several devices in one process: ``Projector(..., devices=[...])``.

Truth is the single-device projector on the same data; CPU "devices" stand
in for GPUs (the sharding, threading and autograd paths are the same).
"""

from __future__ import annotations

import threading

import pytest
import torch

from ctbench import Projector, circular_trajectory_2d_fan, circular_trajectory_3d, spiral_trajectory_3d
from ctbench.engine.cpu import backend as cpu_backend
from ctbench.engine.devices import parse_devices, thread_shares, view_shards

TOL = {torch.float32: 2e-6, torch.float64: 1e-12}


def rel_err(a, b):
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def test_view_shards_are_contiguous_balanced_and_in_order():
    assert view_shards(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert view_shards(2, 3) == [(0, 1), (1, 2), (2, 2)]
    assert thread_shares(3, 8) == [3, 3, 2]
    assert thread_shares(3, 2) == [1, 1, 1]


def test_parse_devices_and_bad_devices():
    assert parse_devices(["cpu", "cpu"]) == [torch.device("cpu")] * 2
    assert parse_devices([1, "cuda"]) == [torch.device("cuda", 1), torch.device("cuda", 0)]
    traj = circular_trajectory_3d(4, 60.0, 110.0)
    with pytest.raises(ValueError, match="devices"):
        Projector(traj, (4, 6, 6), (8, 8), devices=[])
    with pytest.raises(ValueError, match="devices"):
        Projector(traj, (4, 6, 6), (8, 8), devices=["abacus"])
    with pytest.raises(ValueError, match="devices"):
        Projector(traj, (4, 6, 6), (8, 8), devices=["cpu"], backend="cuda")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            Projector(traj, (4, 6, 6), (8, 8), devices=["cuda:0", "cuda:1"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_views", [11, 2])
def test_three_cpu_devices_equal_one(dtype, n_views):
    torch.manual_seed(0)
    traj = spiral_trajectory_3d(n_views, 60.0, 110.0, z_range=5.0, dtype=dtype)
    kw = dict(voxel_spacing=1.3, detector_spacing=2.0)
    one = Projector(traj, (9, 12, 13), (16, 11), **kw)
    three = Projector(traj, (9, 12, 13), (16, 11), devices=["cpu", "cpu", "cpu"], **kw)
    vol = torch.rand(2, 9, 12, 13, dtype=dtype)
    sino = torch.rand(2, n_views, 16, 11, dtype=dtype)
    s3 = three.project(vol)
    assert s3.device == vol.device and s3.shape == (2, n_views, 16, 11)
    assert rel_err(s3, one.project(vol)) <= TOL[dtype]
    b3 = three.backproject(sino)
    assert b3.device == sino.device
    assert rel_err(b3, one.backproject(sino)) <= TOL[dtype]


def test_autograd_across_shards_uses_the_plain_full_loss():
    dtype = torch.float64
    traj = circular_trajectory_3d(7, 60.0, 110.0, dtype=dtype)
    one = Projector(traj, (6, 10, 9), (12, 10))
    many = Projector(traj, (6, 10, 9), (12, 10), devices=["cpu", "cpu", "cpu"])
    target = torch.rand(7, 12, 10, dtype=dtype)

    def grads(p):
        leaves = [t.clone().requires_grad_(True) for t in traj.tensors()]
        tr = traj.replace(source=leaves[0], detector_center=leaves[1], detector_u=leaves[2], detector_v=leaves[3])
        vol = torch.linspace(0, 1, 6 * 10 * 9, dtype=dtype).reshape(6, 10, 9).requires_grad_(True)
        loss = (p.project(vol, tr) - target).square().sum()  # no scaling by the number of devices
        back = p.backproject(target, tr)
        loss = loss + (back * vol.detach()).sum()
        return torch.autograd.grad(loss, [vol, *leaves])

    for a, b in zip(grads(many), grads(one)):
        assert rel_err(a, b) <= 1e-11


def test_cpu_shards_run_concurrently_with_their_thread_share(monkeypatch):
    seen = []
    real = cpu_backend.num_threads

    def spy():
        n = real()
        seen.append((threading.current_thread().name, n))
        return n

    monkeypatch.setattr(cpu_backend, "num_threads", spy)
    previous = torch.get_num_threads()
    torch.set_num_threads(6)
    try:
        traj = circular_trajectory_3d(9, 60.0, 110.0)
        p = Projector(traj, (5, 8, 8), (10, 8), devices=["cpu", "cpu", "cpu"])
        p.project(torch.rand(5, 8, 8))
    finally:
        torch.set_num_threads(previous)
    assert len(seen) == 3
    assert sorted(name for name, _ in seen) == ["ctbench-shard-0", "ctbench-shard-1", "ctbench-shard-2"]
    assert sorted(n for _, n in seen) == [2, 2, 2]     # 6 OpenMP threads split three ways
    assert getattr(cpu_backend._THREAD_SHARE, "count", None) is None  # nothing leaks into this thread


def test_grad_mode_carries_into_shard_threads():
    traj = circular_trajectory_3d(6, 60.0, 110.0)
    p = Projector(traj, (4, 6, 6), (8, 8), devices=["cpu", "cpu"])
    vol = torch.rand(4, 6, 6, requires_grad=True)
    with torch.no_grad():
        assert not p.project(vol).requires_grad
    assert p.project(vol).requires_grad


def test_devices_with_2d_scans_and_memory_budget():
    dtype = torch.float64
    traj = circular_trajectory_2d_fan(13, 60.0, 110.0, dtype=dtype)
    one = Projector(traj, (14, 15), 21)
    many = Projector(traj, (14, 15), 21, devices=["cpu", "cpu"], memory_budget=2500)
    assert many.plan("project", dtype).n_windows > 1
    img = torch.rand(14, 15, dtype=dtype)
    assert rel_err(many.project(img), one.project(img)) <= 1e-12
    sino = torch.rand(13, 21, dtype=dtype)
    assert rel_err(many.backproject(sino), one.backproject(sino)) <= 1e-12
