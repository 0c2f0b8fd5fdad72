"""Disk-backed CGLS and its rank-local checkpoints (real zarr stores on disk).

Truth is the in-memory :func:`ctbench.solvers.cgls` on the same data (to round-off), and an
uninterrupted disk run for resumed ones (bit for bit, float64).  Refused checkpoints must leave
every file of the work folder byte for byte as it was.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.plan import PlanError
from ctbench.solvers import CheckpointError, cgls, disk_cgls, disk_cgls_iterations, plan_disk_cgls
from ctbench.storage import ZarrStore

f64 = torch.float64


def rel_err(a, b):
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def make_projector(n_views=12, shape=(10, 16, 16), sid=100.0, spacing=1.0, **opts):
    traj = circular_trajectory_3d(n_views, sid, 2 * sid, dtype=f64)
    return Projector(traj, shape, (20, 14), detector_spacing=1.5, voxel_spacing=spacing, **opts)


def phantom(shape, dtype=f64):
    z, y, x = torch.meshgrid(*(torch.linspace(-1, 1, n, dtype=dtype) for n in shape), indexing="ij")
    return ((x ** 2 + y ** 2 + z ** 2) < 0.6).to(dtype) + 0.3 * torch.cos(3 * x) * (z > 0)


def sinogram_store(path, P, dtype=f64, scale=1.0):
    b = P.project(phantom(P.global_volume_shape, dtype)) * scale
    store = ZarrStore.create(path, b.shape, dtype, chunks=(3, 20, 14))
    store.write(None, b)
    return store, b


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------ equals cgls
@pytest.mark.parametrize("budget", [None, 90_000])
def test_disk_cgls_equals_in_memory_cgls_for_10_iterations(tmp_path, budget):
    P = make_projector()
    store, b = sinogram_store(tmp_path / "b.zarr", P)
    x0 = 0.1 * phantom(P.global_volume_shape)
    x0_store = ZarrStore.create(tmp_path / "x0.zarr", x0.shape, f64)
    x0_store.write(None, x0)
    ref = cgls(P, b, 10, x0=x0)
    plan = plan_disk_cgls(P, store, memory_budget=budget)
    if budget is not None:
        assert len(plan.slabs()) > 1 and len(plan.view_batches()) > 1  # really windowed
    seen = []
    res = disk_cgls(P, store, tmp_path / "work", 10, x0_store=x0_store, memory_budget=budget,
                    callback=lambda s: seen.append(s.iteration))
    assert seen == list(range(1, 11)) and res.n_iter == 10 and res.stopped == "completed"
    assert rel_err(res.volume.read(), ref.volume) <= 1e-12
    for got, want in zip(res.residuals, ref.residuals):
        assert abs(got - want) <= 1e-12 * ref.residuals[0]
    for got, want in zip(res.history, ref.history):
        assert got["gradient_norm"] == pytest.approx(want["gradient_norm"], rel=1e-10, abs=1e-14)


def test_result_goes_to_a_volume_store_and_float32_follows_the_data(tmp_path):
    P = make_projector()
    store, b = sinogram_store(tmp_path / "b.zarr", P, dtype=torch.float32)
    out = ZarrStore.create(tmp_path / "volume.zarr", P.global_volume_shape, torch.float32)
    res = disk_cgls(P, store, tmp_path / "work", 4, volume_store=out)
    assert res.volume is out and out.dtype == torch.float32
    assert rel_err(out.read().double(), cgls(P, b.double(), 4).volume) <= 1e-4


# ------------------------------------------------------------- checkpoints
def test_resume_after_an_interrupted_run_is_bit_identical(tmp_path):
    P = make_projector()
    store, _ = sinogram_store(tmp_path / "b.zarr", P)
    full = disk_cgls(P, store, tmp_path / "full", 9, checkpoint_every=2)
    gen = disk_cgls_iterations(P, store, tmp_path / "work", 9, checkpoint_every=2)
    for state in gen:
        if state.iteration == 5:
            break  # stopped between checkpoints 4 and 6
    gen.close()
    ck = tmp_path / "work" / "rank-00000" / "checkpoints"
    assert sorted(os.listdir(ck)) == ["iter-000004"]  # older checkpoints are removed
    seen = []
    res = disk_cgls(P, store, tmp_path / "work", 9, checkpoint_every=2, resume=True,
                    callback=lambda s: seen.append(s.iteration))
    assert seen == [5, 6, 7, 8, 9]
    assert torch.equal(res.volume.read(), full.volume.read())
    assert res.residuals == full.residuals and res.n_iter == 9


def test_cancel_stops_between_iterations_and_resume_continues(tmp_path):
    import threading
    P = make_projector()
    store, _ = sinogram_store(tmp_path / "b.zarr", P)
    full = disk_cgls(P, store, tmp_path / "full", 6)
    stop = threading.Event()
    res = disk_cgls(P, store, tmp_path / "work", 6, checkpoint_every=1, cancel=stop,
                    callback=lambda s: stop.set() if s.iteration == 3 else None)
    assert res.stopped == "cancelled" and res.n_iter == 3
    res = disk_cgls(P, store, tmp_path / "work", 6, checkpoint_every=1, resume=True)
    assert res.stopped == "completed" and res.n_iter == 6 and len(res.residuals) == 6
    assert torch.equal(res.volume.read(), full.volume.read())


def test_without_resume_a_work_dir_with_checkpoints_is_refused(tmp_path):
    P = make_projector()
    store, _ = sinogram_store(tmp_path / "b.zarr", P)
    disk_cgls(P, store, tmp_path / "work", 2, checkpoint_every=1)
    before = snapshot(tmp_path / "work")
    with pytest.raises(FileExistsError, match="holds checkpoints.*resume=True"):
        disk_cgls_iterations(P, store, tmp_path / "work", 3)
    assert snapshot(tmp_path / "work") == before


def _corrupt(work: Path, how: str) -> None:
    part = work / "rank-00000" / "checkpoints" / "iter-000002"
    chunk = next(p for p in sorted((part / "x.zarr").rglob("*")) if p.is_file() and p.name != "zarr.json")
    if how == "truncated":
        chunk.write_bytes(chunk.read_bytes()[:-8])
    elif how == "corrupted":
        data = bytearray(chunk.read_bytes())
        data[3] ^= 0xFF
        chunk.write_bytes(bytes(data))
    else:
        (part / "manifest.json").write_text('{"format": "ctbench-disk-solver')


REFUSALS = {
    "another scan": (dict(sid=110.0), {}, "scan geometry"),
    "other data": ({}, dict(scale=1.01), "data"),
    "another grid": (dict(spacing=1.1), {}, "grid"),
    "another dtype": ({}, dict(dtype=torch.float32), "dtype"),
    "other windows": ({}, dict(memory_budget=90_000), "windows"),
    "truncated file": ({}, {}, "x.zarr/.* is truncated"),
    "corrupted file": ({}, {}, "x.zarr/.* is corrupted"),
    "corrupted manifest": ({}, {}, "corrupted or truncated manifest"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_mismatched_or_damaged_checkpoints_are_refused_and_left_unchanged(tmp_path, case):
    P = make_projector()
    store, _ = sinogram_store(tmp_path / "b.zarr", P)
    work = tmp_path / "work"
    disk_cgls(P, store, work, 3, checkpoint_every=2)
    proj_kw, run_kw, message = REFUSALS[case]
    if case.startswith(("truncated", "corrupted")):
        _corrupt(work, case.split()[0] if case != "corrupted manifest" else "manifest")
    P2 = make_projector(**proj_kw)
    dtype = run_kw.get("dtype", f64)
    store2, _ = sinogram_store(tmp_path / "b2.zarr", P2, dtype=dtype, scale=run_kw.get("scale", 1.0))
    before = snapshot(work)
    with pytest.raises(CheckpointError, match=message) as err:
        disk_cgls(P2, store2, work, 5, checkpoint_every=2, resume=True, memory_budget=run_kw.get("memory_budget"))
    assert "nothing was changed" in str(err.value) or "does not match" in str(err.value) or "checkpoint" in str(
        err.value)
    assert snapshot(work) == before


# ----------------------------------------------------------------- checks
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    P = make_projector()
    store, _ = sinogram_store(tmp_path / "b.zarr", P)
    work = tmp_path / "work"
    with pytest.raises(ValueError, match="checkpoint_every must be a non-negative integer"):
        disk_cgls_iterations(P, store, work, 3, checkpoint_every=-1)
    with pytest.raises(ValueError, match="sinogram_store has shape"):
        disk_cgls_iterations(make_projector(n_views=10), store, work, 3)
    with pytest.raises(PlanError, match="memory_budget=.*too small for disk CGLS"):
        disk_cgls_iterations(P, store, work, 3, memory_budget=1000)
    with pytest.raises(ValueError, match="3D volumes"):
        from ctbench import circular_trajectory_2d_parallel
        disk_cgls_iterations(Projector(circular_trajectory_2d_parallel(8), (16, 16), 20), store, work, 3)
    assert not work.exists()


def test_capacity_model_counts_x_s_p_rays_and_disk():
    P = make_projector(n_views=40, shape=(64, 64, 64))
    plan = P.plan("cgls", f64, memory_budget="2 MiB")
    vol, ray = 64 ** 3 * 8, 40 * 20 * 14 * 8
    assert plan.in_memory["x, s, p"] == 3 * vol and plan.in_memory["b, r, q"] == 3 * ray
    assert plan.disk["x, s, p"] == 3 * vol and plan.disk["r, q"] == 2 * ray
    assert plan.peak_bytes <= 2 * (1 << 20) and len(plan.slabs()) > 1
    assert plan.slab_depth % plan.volume_chunks[0] == 0  # windows replace whole chunks
    assert "peak" in plan.summary() and "in memory would hold" in plan.summary()


# ------------------------------------------------------------ under torchrun
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLE = ROOT / "examples" / "disk_reconstruction.py"


def _torchrun(*args, **kw):
    from test_distributed import torchrun
    return torchrun(*args, **kw)


def _disk_case(**opts):
    import sys
    sys.path.insert(0, str(HERE / "distributed_scripts"))
    from disk_cgls_ranks import disk_case
    return disk_case(**opts)


def _launch(tmp_path, name, steps):
    import json
    out = tmp_path / name
    out.mkdir()
    (out / "steps.json").write_text(json.dumps(steps))
    b_path = tmp_path / "b.zarr"
    (out / "b.zarr").symlink_to(b_path)
    proc = _torchrun(2, HERE / "distributed_scripts" / "disk_cgls_ranks.py", out, out / "steps.json")
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.distributed
def test_two_ranks_in_views_and_space_equal_in_memory_cgls_and_refuse_foreign_checkpoints(tmp_path):
    P, truth = _disk_case()
    b = P.project(truth)
    ZarrStore.create(tmp_path / "b.zarr", b.shape, f64, chunks=(4, 18, 13)).write(None, b)
    ref = cgls(P, b, 10)
    # A single-process checkpoint, to be refused by two ranks (world size, partition).
    disk_cgls(P, ZarrStore.open(tmp_path / "b.zarr"), tmp_path / "single", 2, checkpoint_every=2)
    single_before = snapshot(tmp_path / "single")
    views = _launch(tmp_path, "views", [
        {"name": "hybrid", "partition": "hybrid", "partition_grid": [2, 1], "work": str(tmp_path / "wh"),
         "n_iter": 2},
        {"name": "world size", "partition": "views", "work": str(tmp_path / "single"), "n_iter": 4,
         "resume": True},
        {"name": "run", "partition": "views", "work": str(tmp_path / "wv"), "n_iter": 10, "checkpoint_every": 5,
         "volume": str(tmp_path / "views.zarr"), "memory_budget": 60_000},
    ])
    views_before = snapshot(tmp_path / "wv")
    space = _launch(tmp_path, "space", [
        {"name": "partition", "partition": "space", "work": str(tmp_path / "wv"), "n_iter": 12, "resume": True},
        {"name": "run", "partition": "space", "work": str(tmp_path / "ws"), "n_iter": 10,
         "volume": str(tmp_path / "space.zarr"), "memory_budget": 60_000},
    ])
    for ranks in (views, space):
        for r in ranks:
            assert "error" not in r["run"], r["run"]
            assert r["run"]["residuals"] == pytest.approx(ref.residuals, rel=1e-10)
    for name in ("views", "space"):
        got = ZarrStore.open(tmp_path / f"{name}.zarr").read()
        assert rel_err(got, ref.volume) <= 1e-11, name
    hybrid = views[0]["hybrid"]
    assert hybrid["type"] == "ValueError" and "only partition='views' or partition='space'" in hybrid["error"]
    assert not (tmp_path / "wh").exists()
    # Rank 0 names the mismatch; rank 1 (no checkpoint of its own) says another rank refused.
    msg = views[0]["world size"]["error"]
    assert views[0]["world size"]["type"] == "CheckpointError"
    assert "world size: checkpoint has 1, this run has 2" in msg and "partition" in msg
    assert "another rank" in views[1]["world size"]["error"]
    assert snapshot(tmp_path / "single") == single_before
    assert snapshot(tmp_path / "wv") == views_before
    for r in range(2):
        err = space[r]["partition"]
        assert err["type"] == "CheckpointError" and "partition: checkpoint has 'views [2, 1]'" in err["error"]


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        for c in map(int, text):
            out += [c, *_children(c)]
    return out


def _kill_after_checkpoint(cmd, work: Path, env, pick, ranks: int):
    """Start ``cmd``, SIGKILL the process ``pick(pid)`` once checkpoint 2 is complete; returns the Popen."""
    import signal
    import subprocess
    import time
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    manifests = [work / f"rank-{r:05d}" / "checkpoints" / "iter-000002" / "manifest.json" for r in range(ranks)]
    deadline = time.monotonic() + 120
    while not all(m.exists() for m in manifests):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.005)
    victim = pick(proc.pid)
    os.kill(victim, signal.SIGKILL)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    return proc, victim


@pytest.mark.distributed
@pytest.mark.parametrize("launch", ["one process", "torchrun"])
def test_kill_9_after_a_checkpoint_then_resume_is_bit_identical(tmp_path, launch):
    import subprocess
    import sys
    args = ["--size", "16", "--views", "12", "--iterations", "14", "--checkpoint-every", "2", "--dtype", "float64",
            "--memory-budget", "200000"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def run(out, *extra):
        if launch == "one process":
            p = subprocess.run([sys.executable, str(EXAMPLE), "--output", str(out), *args, *extra], cwd=ROOT,
                               env=env, capture_output=True, text=True, timeout=180)
        else:
            p = _torchrun(2, EXAMPLE, "--output", out, *args, *extra, "--partition", "space")
        assert p.returncode == 0, p.stderr[-4000:]
        return p

    full = run(tmp_path / "full")
    assert "capacity estimate" in full.stdout and "wrote" in full.stdout
    out = tmp_path / "killed"
    if launch == "one process":
        cmd = [sys.executable, str(EXAMPLE), "--output", str(out), *args]
        pick = lambda pid: pid  # noqa: E731
    else:
        from test_distributed import _free_port
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--max-restarts=0",
               "--monitor-interval=0.2", str(EXAMPLE), "--output", str(out), *args, "--partition", "space"]

        def pick(pid):  # one rank: a child running the example
            ranks = [c for c in _children(pid) if "disk_reconstruction" in Path(f"/proc/{c}/cmdline").read_text()]
            assert ranks, "no rank process found"
            return ranks[-1]
    proc, victim = _kill_after_checkpoint(cmd, out / "work", env, pick, 1 if launch == "one process" else 2)
    assert proc.returncode != 0 and not (out / "volume.zarr").exists()  # killed before the end
    resumed = run(out, "--resume")
    assert "wrote" in resumed.stdout
    got = ZarrStore.open(out / "volume.zarr").read()
    want = ZarrStore.open(tmp_path / "full" / "volume.zarr").read()
    assert got.dtype == f64 and want.abs().max() > 0
    assert torch.equal(got, want)
