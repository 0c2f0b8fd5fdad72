"""project_into / backproject_into between block stores, in bounded memory.

Truth is the direct in-memory call of the same projector; peak memory is the
resident-set growth of this test process (/proc/self/status).
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from ctbench import Projector, circular_trajectory_2d_parallel, circular_trajectory_3d, spiral_trajectory_3d
from ctbench.engine.plan import PlanError
from ctbench.storage import TensorStore, ZarrStore, backproject_into, project_into
from peak_memory import peak_growth

MiB = 1 << 20


def rel_err(a, b):
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def chunk_files(path):
    return sorted(os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs if f != "zarr.json")


def _stores(kind, tmp_path, tag, vshape, sshape, dtype, rng):
    if kind == "tensor":
        return (TensorStore.empty(vshape, dtype, chunks=tuple(rng.randint(1, n) for n in vshape)),
                TensorStore.empty(sshape, dtype, chunks=tuple(rng.randint(1, n) for n in sshape)))
    return (ZarrStore.create(tmp_path / f"v{tag}.zarr", vshape, dtype, chunks=tuple(rng.randint(1, n) for n in vshape)),
            ZarrStore.create(tmp_path / f"s{tag}.zarr", sshape, dtype, chunks=tuple(rng.randint(1, n) for n in sshape)))


@pytest.mark.parametrize("seed", range(6))
def test_streamed_calls_equal_direct_calls(tmp_path, seed):
    rng = random.Random(seed)
    dtype = rng.choice([torch.float32, torch.float64])
    n = rng.randint(3, 10)
    if seed % 3 == 2:
        traj = circular_trajectory_2d_parallel(n, dtype=dtype)
        vshape, dshape = (rng.randint(5, 12), rng.randint(5, 12)), rng.randint(6, 16)
    else:
        traj = (spiral_trajectory_3d(n, 60.0, 110.0, z_range=4.0, dtype=dtype) if seed % 2
                else circular_trajectory_3d(n, 60.0, 110.0, dtype=dtype))
        vshape, dshape = (rng.randint(3, 14), rng.randint(5, 12), rng.randint(5, 12)), (rng.randint(5, 14), 9)
    direct = Projector(traj, vshape, dshape)
    smallest = Projector(traj, vshape, dshape, volume_chunk_shape=1, view_chunk_size=1)
    vol = torch.rand(vshape, dtype=dtype)
    for kind in ("tensor", "zarr"):
        vs, ss = _stores(kind, tmp_path, f"{seed}{kind}", vshape, direct.projection_shape, dtype, rng)
        vs.write(None, vol)
        # A budget between the smallest window and the whole call, for both directions.
        lo = max(smallest.plan(k, volume_store=vs, sinogram_store=ss).working_set_bytes
                 for k in ("project", "backproject"))
        hi = min(direct.plan(k, volume_store=vs, sinogram_store=ss).working_set_bytes
                 for k in ("project", "backproject"))
        budget = rng.randint(lo, max(lo, hi - 1))
        streamed = Projector(traj, vshape, dshape, memory_budget=budget)
        plan = streamed.project_into(vs, ss)
        assert plan.working_set_bytes <= budget
        assert rel_err(ss.read(), direct.project(vol)) <= (2e-6 if dtype == torch.float32 else 1e-12)
        out = (TensorStore.empty(vshape, dtype) if kind == "tensor"
               else ZarrStore.create(tmp_path / f"o{seed}.zarr", vshape, dtype, chunks=vs.chunks))
        plan = streamed.backproject_into(ss, out)
        assert plan.working_set_bytes <= budget
        assert rel_err(out.read(), direct.backproject(ss.read())) <= (2e-6 if dtype == torch.float32 else 1e-12)


def test_windows_align_to_store_chunks_when_the_budget_allows(tmp_path):
    traj = circular_trajectory_3d(12, 60.0, 110.0)
    p = Projector(traj, (32, 16, 16), (10, 10), memory_budget=20 * 1024)
    vs = ZarrStore.create(tmp_path / "v.zarr", (32, 16, 16), chunks=(4, 16, 16))
    ss = ZarrStore.create(tmp_path / "s.zarr", (12, 10, 10), chunks=(5, 10, 10))
    plan = p.plan("backproject", volume_store=vs, sinogram_store=ss)
    assert plan.slab_depth % 4 == 0 and plan.slab_depth < 32
    assert plan.view_batch % 5 == 0 or plan.view_batch == 12
    assert p.plan("project", volume_store=vs, sinogram_store=ss).working_set_bytes <= 20 * 1024


def test_bad_stores_and_budgets_fail_before_any_output_is_written(tmp_path):
    traj = circular_trajectory_3d(6, 60.0, 110.0)
    p = Projector(traj, (8, 10, 10), (12, 9))
    vol = TensorStore(torch.rand(8, 10, 10))
    out_path = tmp_path / "s.zarr"
    sino = ZarrStore.create(out_path, (6, 12, 9), chunks=(1, 12, 9))

    def untouched():
        return chunk_files(out_path) == []

    with pytest.raises(ValueError, match=r"volume_store has shape \(8, 10, 11\)"):
        p.project_into(TensorStore.empty((8, 10, 11)), sino)
    with pytest.raises(ValueError, match="sinogram_store has shape"):
        p.project_into(vol, TensorStore.empty((6, 9, 12)))
    with pytest.raises(TypeError, match="volume_store has dtype torch.int32"):
        p.project_into(TensorStore.empty((8, 10, 10), torch.int32), sino)
    with pytest.raises(TypeError, match="same dtype"):
        p.project_into(TensorStore.empty((8, 10, 10), torch.float64), sino)
    # A dense tensor is taken as diffct takes it (written in place: docs/FROM_DIFFCT.md); anything else that is
    # not a block store is refused.
    with pytest.raises(TypeError, match="block store"):
        p.project_into(torch.zeros(8, 10, 10).numpy(), sino)
    tiny = Projector(traj, (8, 10, 10), (12, 9), memory_budget=500)
    with pytest.raises(PlanError, match="memory_budget=.*too small for a single window"):
        tiny.project_into(vol, sino)
    assert untouched()
    # backproject_into: the volume store is the output.
    out_vol = ZarrStore.create(tmp_path / "v.zarr", (8, 10, 10), chunks=(2, 10, 10))
    with pytest.raises(PlanError, match="memory_budget"):
        tiny.backproject_into(TensorStore(torch.rand(6, 12, 9)), out_vol)
    with pytest.raises(ValueError, match="sinogram_store has shape"):
        p.backproject_into(TensorStore(torch.rand(5, 12, 9)), out_vol)
    assert chunk_files(tmp_path / "v.zarr") == []


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc to measure peak RSS")
def test_512_cubed_zarr_volume_streams_in_bounded_memory(tmp_path):
    N = 512
    traj = circular_trajectory_3d(6, 3000.0, 6000.0)
    p = Projector(traj, (N, N, N), (48, 48), detector_spacing=24.0, memory_budget=64 * MiB)
    vol_store = ZarrStore.create(tmp_path / "v.zarr", (N, N, N), chunks=(64, 64, 64))
    ramp = torch.linspace(0, 1, N)
    for z in range(0, N, 32):  # filled slab by slab: the 512 MiB volume is never in memory
        slab = torch.sin(torch.arange(z, z + 32, dtype=torch.float32) / 40)[:, None, None] + ramp[:, None] * ramp
        vol_store.write((slice(z, z + 32),), slab)
        del slab
    sino_store = ZarrStore.create(tmp_path / "s.zarr", (6, 48, 48), chunks=(1, 48, 48))
    back_store = ZarrStore.create(tmp_path / "b.zarr", (N, N, N), chunks=(64, 64, 64))

    grown, plan = peak_growth(lambda: p.project_into(vol_store, sino_store))
    assert plan.n_windows > 1 and plan.peak_bytes <= 64 * MiB
    print(f"project_into: peak growth {grown / MiB:.1f} MiB, plan {plan.peak_bytes / MiB:.1f} MiB")
    assert grown < 256 * MiB, f"project_into grew the resident set by {grown / MiB:.0f} MiB"
    grown, plan = peak_growth(lambda: p.backproject_into(sino_store, back_store))
    assert plan.n_windows > 1 and plan.peak_bytes <= 64 * MiB
    print(f"backproject_into: peak growth {grown / MiB:.1f} MiB, plan {plan.peak_bytes / MiB:.1f} MiB")
    assert grown < 256 * MiB, f"backproject_into grew the resident set by {grown / MiB:.0f} MiB"

    # Spot checks against direct calls on pieces that fit: a slab's projection
    # is its share of the sum; the backprojection of a slab is that slab.
    sino = sino_store.read()
    assert sino.abs().max() > 0
    slab_p = Projector(traj, (N, N, N), (48, 48), detector_spacing=24.0)
    rays = slab_p._rays(None, torch.float32, torch.device("cpu"))
    ex = slab_p._executor(torch.device("cpu"))
    z0, z1 = 200, 216
    expect = ex.backproject(sino[None], z0, z1, rays)[0]
    assert rel_err(back_store.read((slice(z0, z1),)), expect) <= 2e-6


def test_streamed_equals_direct_on_a_smaller_zarr_case(tmp_path):
    N = 64
    traj = circular_trajectory_3d(9, 300.0, 600.0)
    direct = Projector(traj, (N, N, N), (40, 36), detector_spacing=3.0)
    streamed = Projector(traj, (N, N, N), (40, 36), detector_spacing=3.0, memory_budget=512 * 1024)
    vol = torch.rand(N, N, N)
    vs = ZarrStore.create(tmp_path / "v.zarr", (N, N, N), chunks=(8, 32, 32))
    vs.write(None, vol)
    ss = ZarrStore.create(tmp_path / "s.zarr", (9, 40, 36), chunks=(2, 40, 36))
    plan = project_into(streamed, vs, ss)
    assert plan.n_windows > 4
    assert rel_err(ss.read(), direct.project(vol)) <= 2e-6
    out = ZarrStore.create(tmp_path / "b.zarr", (N, N, N), chunks=(8, 32, 32))
    plan = backproject_into(streamed, ss, out)
    assert plan.n_windows > 4 and plan.slab_depth % 8 == 0
    assert rel_err(out.read(), direct.backproject(ss.read())) <= 2e-6


# ----------------------------------------------------------------- fdk_into
@pytest.mark.parametrize("case", ["cone", "fan2d", "parallel"])
@pytest.mark.slow
def test_fdk_into_equals_in_memory_fdk(tmp_path, case):
    from ctbench import circular_trajectory_2d_fan, circular_trajectory_3d_parallel
    from ctbench.solvers import fbp, fdk
    from ctbench.solvers import fdk_into

    f64 = torch.float64
    if case == "cone":
        traj, vshape, dshape, solver = circular_trajectory_3d(24, 100.0, 200.0, dtype=f64), (10, 16, 16), (24, 14), fdk
    elif case == "fan2d":
        traj, vshape, dshape, solver = circular_trajectory_2d_fan(30, 100.0, 200.0, dtype=f64), (16, 16), 24, fdk
    else:
        traj, vshape, dshape, solver = circular_trajectory_3d_parallel(20, dtype=f64), (6, 12, 12), (18, 6), fbp
    direct = Projector(traj, vshape, dshape)
    sino = direct.project(torch.rand(vshape, dtype=f64))
    expect = solver(direct, sino, filter="hann")
    windows = []
    for budget, m in ((None, 1), (60_000, 1), (40_000, 1), (120_000, 2)):
        if m > 1:
            expect = solver(direct, sino, filter="hann", oversample=m)
        p = Projector(traj, vshape, dshape, memory_budget=budget)
        sino_store = ZarrStore.create(tmp_path / f"s{budget}{m}.zarr", tuple(sino.shape), f64,
                                      chunks=(2, *sino.shape[1:]))
        sino_store.write(None, sino)
        out = ZarrStore.create(tmp_path / f"v{budget}{m}.zarr", vshape, f64, chunks=(2,) * len(vshape))
        plan = fdk_into(p, sino_store, out, filter="hann", oversample=m)
        if budget is not None:
            assert plan.working_set_bytes <= budget
        assert rel_err(out.read(), expect) <= 1e-12
        windows.append(plan.n_windows)
    assert max(windows) > 1


def test_fdk_into_filters_each_view_batch_once_through_a_scratch_store(monkeypatch):
    from ctbench.solvers import analytic, fdk
    from ctbench.solvers import fdk_into

    traj = circular_trajectory_3d(24, 100.0, 200.0)
    direct = Projector(traj, (12, 16, 16), (24, 14))
    p = Projector(traj, (12, 16, 16), (24, 14), view_chunk_size=5, volume_chunk_shape=3)
    sino = direct.project(torch.rand(12, 16, 16))
    calls = []
    real = analytic.filtered_views
    monkeypatch.setattr(analytic, "filtered_views", lambda *a, **k: calls.append(1) or real(*a, **k))
    scratch = TensorStore.empty((24, 24, 14))
    with pytest.raises(ValueError, match="scratch has shape"):
        fdk_into(p, TensorStore(sino), TensorStore.empty((12, 16, 16)), scratch=TensorStore.empty((24, 47, 14)))
    out = TensorStore.empty((12, 16, 16))
    plan = fdk_into(p, TensorStore(sino), out, scratch=scratch)
    assert len(plan.view_batches()) == 5 and len(plan.slabs()) == 4
    assert len(calls) == 5  # once per view batch, not once per (slab, batch)
    assert scratch.read().abs().max() > 0
    assert rel_err(out.read(), fdk(direct, sino)) <= 2e-6


def test_fdk_into_refuses_bad_input_before_writing(tmp_path):
    from ctbench.solvers import fdk_into

    helix = spiral_trajectory_3d(20, 100.0, 200.0, z_range=10.0)
    p = Projector(helix, (6, 8, 8), (12, 8))
    out = ZarrStore.create(tmp_path / "v.zarr", (6, 8, 8))
    with pytest.raises(ValueError, match="circular"):
        fdk_into(p, TensorStore(torch.rand(20, 12, 8)), out)
    circ = Projector(circular_trajectory_3d(20, 100.0, 200.0), (6, 8, 8), (12, 8))
    with pytest.raises(ValueError, match="sinogram_store has shape"):
        fdk_into(circ, TensorStore(torch.rand(19, 12, 8)), out)
    with pytest.raises(ValueError, match="filter"):
        fdk_into(circ, TensorStore(torch.rand(20, 12, 8)), out, filter="sharpest")
    assert chunk_files(tmp_path / "v.zarr") == []
