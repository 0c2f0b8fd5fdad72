"""Planner and planned executor: windows under a memory budget equal the untiled call.

Truth is the untiled call of the same projector (one window, the path that
existed before planning) and the independent reference backend; the planner's
memory estimate is compared with the resident memory measured in a fresh
process.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ctbench import (
    Projector,
    circular_trajectory_2d_fan,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    spiral_trajectory_3d,
)
from ctbench.engine.base import Tile
from ctbench.engine.plan import Plan, PlanError, make_plan, parse_bytes

REPO = Path(__file__).resolve().parents[1]
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


# ------------------------------------------------------------------ planner
def test_parse_bytes_units_and_errors():
    assert parse_bytes(1000) == 1000
    assert parse_bytes("64 MiB") == 64 << 20
    assert parse_bytes("2GB") == 2 * 10 ** 9
    assert parse_bytes("1.5KiB") == 1536
    assert parse_bytes(None) is None
    for bad in ("lots", -5, 0, True, "3 parsecs", [1]):
        with pytest.raises(ValueError, match="memory_budget"):
            parse_bytes(bad)


def test_no_budget_is_one_window_in_memory():
    plan = make_plan("project", (16, 20, 24), (30, 10), 12)
    assert plan.single and plan.n_windows == 1 and plan.mode == "inplace"
    w, = plan.windows
    assert (w.z0, w.z1, w.view0, w.view1, w.tile) == (0, 16, 0, 12, Tile(0, 30, 0, 10))
    # An untiled in-memory call allocates its output, and the CPU forward kernel
    # an x/y-swapped copy of the slab (3600 rays >= a quarter of 7680 voxels).
    assert plan.buffers == {"output": 12 * 30 * 10 * 4, "kernel_scratch": 16 * 20 * 24 * 4}
    assert plan.peak_bytes == 12 * 30 * 10 * 4 + 16 * 20 * 24 * 4
    few_rays = make_plan("project", (16, 20, 24), (30, 10), 2)  # 600 rays: no copy
    assert few_rays.peak_bytes == 2 * 30 * 10 * 4
    back = make_plan("backproject", (16, 20, 24), (30, 10), 12, dtype=torch.float64)
    assert back.peak_bytes == 16 * 20 * 24 * 8


def _covers_exactly_once(plan: Plan, D0, D1, n, U, V):
    hits = torch.zeros(D1 - D0, n, U, V, dtype=torch.int32)
    for w in plan.windows:
        hits[w.z0 - D0:w.z1 - D0, w.view0:w.view1, w.tile.u0:w.tile.u1, w.tile.v0:w.tile.v1] += 1
    return bool((hits == 1).all())


@pytest.mark.parametrize("seed", range(8))
def test_windows_partition_the_call_and_fit_the_budget(seed):
    rng = random.Random(seed)
    D, H, W = rng.randint(1, 20), rng.randint(1, 12), rng.randint(1, 12)
    U, V, n = rng.randint(1, 15), rng.randint(1, 9), rng.randint(1, 13)
    z0 = rng.randint(0, D - 1)
    z1 = rng.randint(z0 + 1, D)
    kind = rng.choice(["project", "backproject"])
    B = rng.choice([1, 2])
    smallest = make_plan(kind, (D, H, W), (U, V), n, z_range=(z0, z1), batch=B, volume_chunk_shape=1,
                         view_chunk_size=1, detector_chunk_shape=(1, 1)).working_set_bytes
    full = make_plan(kind, (D, H, W), (U, V), n, z_range=(z0, z1), batch=B).working_set_bytes
    budget = rng.randint(smallest, full)
    plan = make_plan(kind, (D, H, W), (U, V), n, z_range=(z0, z1), batch=B, memory_budget=budget)
    assert plan.working_set_bytes <= budget
    assert _covers_exactly_once(plan, z0, z1, n, U, V)
    assert plan.n_windows == len(plan.windows)
    # Execution order: project sums slabs innermost, backproject sums views/tiles innermost.
    ws = plan.windows
    if kind == "project" and len(plan.slabs()) > 1:
        assert ws[0].z1 == ws[1].z0 and ws[0].view0 == ws[1].view0
    if kind == "backproject" and plan.n_windows > len(plan.slabs()):
        assert ws[0].z0 == ws[1].z0


def test_explicit_chunks_are_kept_and_validated():
    plan = make_plan("project", (10, 8, 8), (12, 6), 9, volume_chunk_shape=(3, 8, 8), view_chunk_size=4,
                     detector_chunk_shape=(5, 6))
    assert (plan.slab_depth, plan.view_batch, plan.tile_shape) == (3, 4, (5, 6))
    assert plan.slabs() == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert plan.view_batches() == [(0, 4), (4, 8), (8, 9)]
    with pytest.raises(ValueError, match="volume_chunk_shape"):
        make_plan("project", (10, 8, 8), (12, 6), 9, volume_chunk_shape=(3, 4, 8))
    with pytest.raises(ValueError, match="view_chunk_size"):
        make_plan("project", (10, 8, 8), (12, 6), 9, view_chunk_size=0)
    with pytest.raises(ValueError, match="detector_chunk_shape"):
        make_plan("project", (10, 8, 8), (12, 6), 9, detector_chunk_shape=(0, 2))
    with pytest.raises(ValueError, match="kind"):
        make_plan("rotate", (10, 8, 8), (12, 6), 9)


def test_budget_too_small_for_one_window_is_a_clear_error():
    with pytest.raises(PlanError, match=r"memory_budget=.*too small for a single window"):
        make_plan("project", (10, 64, 64), (12, 6), 9, memory_budget=1000)
    # Explicit chunk shapes that exceed the budget are not silently shrunk.
    with pytest.raises(PlanError, match="volume_chunk_shape"):
        make_plan("project", (10, 64, 64), (12, 6), 9, memory_budget=20000, volume_chunk_shape=5)
    # The projector fails at the call, before computing anything.
    traj = circular_trajectory_3d(4, 100.0, 200.0)
    p = Projector(traj, (6, 64, 64), (8, 8), memory_budget=1000)
    with pytest.raises(PlanError, match="memory_budget"):
        p.project(torch.ones(6, 64, 64))
    with pytest.raises(ValueError, match="memory_budget"):
        Projector(traj, (6, 8, 8), (8, 8), memory_budget="huge").project(torch.ones(6, 8, 8))


def test_projector_plan_is_inspectable():
    traj = circular_trajectory_3d(10, 100.0, 200.0)
    p = Projector(traj, (12, 16, 16), (20, 18), memory_budget=8192)
    plan = p.plan("backproject", torch.float64)
    assert isinstance(plan, Plan) and plan.kind == "backproject" and plan.dtype == torch.float64
    assert plan.n_windows > 1 and plan.working_set_bytes <= 8192
    assert "windows" in repr(plan) and plan.peak_bytes > 0
    assert Projector(traj, (12, 16, 16), (20, 18)).plan().single


# ------------------------------------------------------- tiled == untiled
def _geometry(kind: str, n_views: int, dtype):
    if kind == "cone":
        return circular_trajectory_3d(n_views, 60.0, 110.0, dtype=dtype)
    if kind == "spiral":
        return spiral_trajectory_3d(n_views, 60.0, 110.0, z_range=6.0, n_turns=1.0, dtype=dtype)
    if kind == "parallel":
        return circular_trajectory_3d_parallel(n_views, dtype=dtype)
    return circular_trajectory_2d_fan(n_views, 60.0, 110.0, dtype=dtype)


def _case(seed):
    rng = random.Random(1000 + seed)
    dtype = rng.choice([torch.float32, torch.float64])
    geo = rng.choice(["cone", "spiral", "parallel", "fan2d"])
    n = rng.randint(3, 9)
    if geo == "fan2d":
        vshape, dshape = (rng.randint(6, 14), rng.randint(6, 14)), rng.randint(8, 20)
        sino_core = (n, dshape)
    else:
        vshape = (rng.randint(3, 12), rng.randint(6, 12), rng.randint(6, 12))
        dshape = (rng.randint(6, 16), rng.randint(5, 14))
        sino_core = (n, *dshape)
    B = rng.choice([(), (2,)])
    kw = dict(voxel_spacing=rng.uniform(0.8, 1.6), detector_spacing=rng.uniform(1.0, 2.5))
    if rng.random() < 0.5:
        # A budget between the smallest and the whole working set.
        traj, batch = _geometry(geo, n, dtype), 2 if B else 1
        full = Projector(traj, vshape, dshape, **kw).plan("project", dtype, batch=batch).working_set_bytes
        smallest = Projector(traj, vshape, dshape, volume_chunk_shape=1, view_chunk_size=1,
                             detector_chunk_shape=(1, 1), **kw).plan("project", dtype, batch=batch).working_set_bytes
        opts = dict(memory_budget=rng.randint(max(smallest, full // 4), full - 1))
    else:
        # Window counts kept moderate: every window is a kernel call.
        opts = dict(volume_chunk_shape=rng.randint(1, 4), view_chunk_size=rng.randint(2, 4),
                    detector_chunk_shape=(rng.randint(3, 9), rng.randint(3, 9)))
    return dtype, geo, n, vshape, dshape, sino_core, B, kw, opts


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.slow
def test_tiled_equals_untiled_including_autograd(seed):
    dtype, geo, n, vshape, dshape, sino_core, B, kw, opts = _case(seed)
    torch.manual_seed(seed)
    traj = _geometry(geo, n, dtype)
    untiled = Projector(traj, vshape, dshape, **kw)
    try:
        tiled = Projector(traj, vshape, dshape, **kw, **opts)
        plan = tiled.plan("project", dtype, batch=2 if B else 1)
    except PlanError:
        pytest.fail(f"a budget above the smallest window was refused: {opts}")
    assert plan.n_windows > 1 or opts.get("memory_budget") is None
    vol = torch.rand(*B, *vshape, dtype=dtype)
    sino = torch.rand(*B, *sino_core, dtype=dtype)
    tol = TOL[dtype]
    assert rel_err(tiled.project(vol), untiled.project(vol)) <= tol
    assert rel_err(tiled.backproject(sino), untiled.backproject(sino)) <= tol

    # Autograd: volume and geometry gradients of a projection loss and of a backprojection loss.
    def grads(p, which):
        leaves = [t.detach().clone().requires_grad_(True) for t in traj.tensors()]
        tr = type(traj)(*leaves, beam=traj.beam, ndim=traj.ndim)
        x = (vol if which == "project" else sino).clone().requires_grad_(True)
        y = p.project(x, tr) if which == "project" else p.backproject(x, tr)
        weight = torch.linspace(-1, 1, y.numel(), dtype=dtype).reshape(y.shape)
        gx, *gg = torch.autograd.grad((weight * y).sum(), [x, *leaves])
        return gx, gg

    for which in ("project", "backproject"):
        gx_t, gg_t = grads(tiled, which)
        gx_u, gg_u = grads(untiled, which)
        assert rel_err(gx_t, gx_u) <= tol
        # Geometry gradients sum many signed window terms: compare against their own scale.
        for a, b in zip(gg_t, gg_u):
            assert rel_err(a, b) <= (1e-4 if dtype == torch.float32 else 1e-10)


def test_tiled_matches_reference_backend():
    traj = circular_trajectory_3d(5, 60.0, 110.0, dtype=torch.float64)
    vol = torch.rand(7, 9, 10, dtype=torch.float64)
    ref = Projector(traj, (7, 9, 10), (12, 8), backend="reference").project(vol)
    tiled = Projector(traj, (7, 9, 10), (12, 8), volume_chunk_shape=2, view_chunk_size=2,
                      detector_chunk_shape=(5, 3)).project(vol)
    assert rel_err(tiled, ref) <= 1e-12


def test_windows_of_a_distributed_style_slab_keep_global_coordinates():
    # The executor takes a slab starting at plane z0 (space partitions): windows stay inside it.
    traj = circular_trajectory_3d(6, 60.0, 110.0, dtype=torch.float64)
    full = Projector(traj, (10, 8, 9), (12, 9))
    tiled = Projector(traj, (10, 8, 9), (12, 9), volume_chunk_shape=2, view_chunk_size=4)
    vol = torch.rand(1, 10, 8, 9, dtype=torch.float64)
    rays = full._rays(None, torch.float64, vol.device)
    ex_full, ex_tiled = full._executor(vol.device), tiled._executor(vol.device)
    part = ex_tiled.project(vol[:, 3:8].contiguous(), 3, rays)
    assert rel_err(part, ex_full.project(vol[:, 3:8].contiguous(), 3, rays)) <= 1e-12
    sino = torch.rand(1, 6, 12, 9, dtype=torch.float64)
    assert rel_err(ex_tiled.backproject(sino, 3, 8, rays), ex_full.backproject(sino, 0, 10, rays)[:, 3:8]) <= 1e-12


def test_streamed_loops_on_a_stand_in_device(monkeypatch):
    """The streamed (host -> device) loops, with a CPU stand-in for the CUDA double buffer.

    The stand-in checks the buffer discipline: a slot is refilled only after
    the kernels that read it were released.
    """
    from ctbench.engine import executor as ex_mod

    class FakeHostToDevice:
        instances = []

        def __init__(self, device, dtype, numel):
            self.buffers = [torch.full((numel,), float("nan"), dtype=dtype) for _ in range(2)]
            self.busy = [False, False]
            self.slot = 1
            self.uploads = 0
            FakeHostToDevice.instances.append(self)

        def upload(self, host):
            k = self.slot = 1 - self.slot
            assert not self.busy[k], "a device buffer was refilled before its kernels were released"
            self.busy[k] = True
            self.uploads += 1
            dst = self.buffers[k][:host.numel()].view(host.shape)
            dst.copy_(host)
            return dst

        def release(self):
            self.busy[self.slot] = False

    monkeypatch.setattr(ex_mod, "_HostToDevice", FakeHostToDevice)
    traj = circular_trajectory_3d(7, 60.0, 110.0, dtype=torch.float64)
    base = Projector(traj, (9, 8, 10), (11, 9))
    p = Projector(traj, (9, 8, 10), (11, 9), volume_chunk_shape=2, view_chunk_size=3, detector_chunk_shape=(6, 9))
    ex = p._executor(torch.device("cpu"))
    monkeypatch.setattr(ex, "_compute_on", lambda device: (torch.device("cpu"), "streamed"))
    vol = torch.rand(2, 9, 8, 10, dtype=torch.float64)
    sino = torch.rand(2, 7, 11, 9, dtype=torch.float64)
    rays = base._rays(None, torch.float64, torch.device("cpu"))
    ref = base._executor(torch.device("cpu"))
    assert rel_err(ex.project(vol, 0, rays), ref.project(vol, 0, rays)) <= 1e-12
    assert rel_err(ex.backproject(sino, 0, 9, rays), ref.backproject(sino, 0, 9, rays)) <= 1e-12
    gs, gr = ex.geometry_vjp(vol, 0, sino, rays), ref.geometry_vjp(vol, 0, sino, rays)
    for a, b in zip(gs, gr):
        assert rel_err(a, b) <= 1e-10
    project_streamer, back_streamer = FakeHostToDevice.instances[:2]
    assert project_streamer.uploads == 3 * 2 * 5  # view batches x tiles x slabs
    assert back_streamer.uploads == 5 * 3 * 2     # slabs x view batches x tiles


# ------------------------------------------------------ estimate vs measured
_MEASURE = textwrap.dedent("""
    import json, sys, tempfile
    sys.path.insert(0, "tests")
    from peak_memory import follow_allocations, peak_growth as peak_growth_once
    follow_allocations()
    import torch
    from ctbench import Projector, circular_trajectory_3d
    from ctbench.storage import TensorStore, ZarrStore

    def peak_growth(fn):
        # The smaller of two calls: the first call of a path may also grow library caches once
        # (zarr's codec and thread-pool state, allocator arenas), which is not the plan's working set.
        first, result = peak_growth_once(fn)
        del result
        second, result = peak_growth_once(fn)
        return min(first, second), result

    MiB = 1 << 20
    f64 = torch.float64
    rows = []
    # Cheap geometries with large outputs: many rays through a thin volume
    # (projection), a large volume seen by few rays (backprojection).
    wide = dict(volume_shape=(96, 40, 40), detector_shape=(256, 256), traj=circular_trajectory_3d(32, 400.0, 800.0,
                                                                                               dtype=f64))
    deep = dict(volume_shape=(64, 256, 256), detector_shape=(48, 48), traj=circular_trajectory_3d(6, 900.0, 1800.0,
                                                                                              dtype=f64))

    def make(case, **opts):
        return Projector(case["traj"], case["volume_shape"], case["detector_shape"], detector_spacing=4.0, **opts)

    calls = (("project", wide, lambda q: torch.rand(q.volume_shape, dtype=f64)),
             ("backproject", deep, lambda q: torch.rand(q.projection_shape, dtype=f64)))
    for kind, case, data in calls:
        arg = data(make(case))
        getattr(make(case), kind)(arg)  # warm up: kernels loaded, threads started
        for opts in ({}, {"memory_budget": 4 * MiB}, {"volume_chunk_shape": 8, "view_chunk_size": 3,
                                                      "detector_chunk_shape": (24, 256)}):
            q = make(case, **opts)
            plan = q.plan(kind, f64)
            grown, out = peak_growth(lambda: getattr(q, kind)(arg))
            del out
            rows.append({"case": f"{kind} {opts}", "estimate": plan.peak_bytes, "measured": grown})
    # Block stores, zarr on disk and tensors in memory, under a 12 MiB budget.
    tmp = tempfile.mkdtemp()
    for kind, case, data in calls:
        q = make(case, memory_budget=12 * MiB)
        vol = torch.rand(q.volume_shape, dtype=f64)
        vz = ZarrStore.create(tmp + f"/v{kind}.zarr", q.volume_shape, f64, chunks=(8, 64, 64))
        vz.write(None, vol)
        sz = ZarrStore.create(tmp + f"/s{kind}.zarr", q.projection_shape, f64, chunks=(2, 128, 128))
        vt, st = TensorStore(vol.clone()), TensorStore.empty(q.projection_shape, f64)
        if kind == "backproject":
            q.project_into(vz, sz); q.project_into(vt, st)
        for name, vs, ss in (("zarr", vz, sz), ("tensor", vt, st)):
            plan = q.plan(kind, volume_store=vs, sinogram_store=ss)
            if kind == "project":
                grown, _ = peak_growth(lambda: q.project_into(vs, ss))
            else:
                grown, _ = peak_growth(lambda: q.backproject_into(ss, vs))
            rows.append({"case": f"{kind}_into {name}", "estimate": plan.peak_bytes, "measured": grown})
    # FDK between stores: filtering per view batch, then slabs.
    from ctbench.solvers import fdk_into
    q = make(wide, memory_budget=12 * MiB)
    sino = q.project(torch.rand(q.volume_shape, dtype=f64))
    sz = ZarrStore.create(tmp + "/fs.zarr", q.projection_shape, f64, chunks=(2, 128, 128))
    sz.write(None, sino)
    vz = ZarrStore.create(tmp + "/fv.zarr", q.volume_shape, f64, chunks=(8, 40, 40))
    fdk_into(q, TensorStore(sino), TensorStore.empty(q.volume_shape, f64))  # warm up: FFT plans and buffers
    for name, ss, vs in (("zarr", sz, vz), ("tensor", TensorStore(sino), TensorStore.empty(q.volume_shape, f64))):
        plan = q.plan("fdk", volume_store=vs, sinogram_store=ss)
        grown, _ = peak_growth(lambda: fdk_into(q, ss, vs))
        rows.append({"case": f"fdk_into {name}", "estimate": plan.peak_bytes, "measured": grown})
    print(json.dumps(rows))
""")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to measure peak RSS")
def test_planner_estimate_within_25_percent_of_measured_peak():
    env = dict(os.environ, OMP_NUM_THREADS="2")
    run = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True, timeout=300, env=env,
                         cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(rows) == 12
    print(json.dumps(rows, indent=1))
    for row in rows:
        ratio = row["measured"] / row["estimate"]
        assert 0.75 <= ratio <= 1.25, f"{row['case']}: estimated {row['estimate']}, measured {row['measured']}"
