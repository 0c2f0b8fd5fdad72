"""Distributed execution under real torchrun processes (Gloo, CPU).

Each launch runs many cases in one set of ranks; every rank torch.saves its
local results and the test compares them, after assembling the global
pieces from ``view_slice``/``volume_slice``, with the same computation done
by an ordinary single-process Projector in this process.  The loss-scaling
rules of docs/DISTRIBUTED.md are applied by ``tests/distributed_scripts/cases.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "distributed_scripts"
ROOT = HERE.parent
sys.path.insert(0, str(SCRIPTS))

from cases import make_projector, run_projector_case  # noqa: E402

pytestmark = pytest.mark.distributed

LAUNCH_TIMEOUT = 150  # seconds; every launch is bounded


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, script: Path, *args, timeout: float = LAUNCH_TIMEOUT, env=None, monitor: float = 0.2):
    """Run ``script`` under torchrun with ``nproc`` local ranks; returns the CompletedProcess."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--max-restarts=0",
           f"--monitor-interval={monitor}", str(script), *map(str, args)]
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    e.update(env or {})
    # Own process group, so that a launch that overruns is killed with all its ranks.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun {script.name} did not finish within {timeout} s:\n{out[-3000:]}\n{err[-5000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _run_cases(tmp_path_factory, nproc: int, cases: list[dict]) -> list[dict]:
    out = tmp_path_factory.mktemp(f"ranks{nproc}")
    spec = out / "cases.json"
    spec.write_text(json.dumps(cases))
    proc = torchrun(nproc, SCRIPTS / "check_partitions.py", out, spec)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(nproc)]


# ------------------------------------------------------------------ the cases
def _case(name, partition, n_views, volume_shape, grid=None, **kw):
    c = {"name": name, "partition": partition, "n_views": n_views, "volume_shape": list(volume_shape),
         "detector_shape": [8, 6], "kind": "projector", **kw}
    if grid is not None:
        c["partition_grid"] = list(grid)
    return c


def _solver_case(name, partition, n_views, volume_shape, grid=None, dtype="float64", **kw):
    return _case(name, partition, n_views, volume_shape, grid, kind="solvers", dtype=dtype, **kw)


CASES = {
    2: [_case("views", "views", 7, (8, 8, 8)),
        _case("space", "space", 6, (7, 8, 8)),
        _case("views64", "views", 6, (8, 7, 8), dtype="float64", orbit="spiral"),
        _case("space64", "space", 6, (8, 7, 8), dtype="float64", orbit="spiral"),
        _case("hybrid1x2", "hybrid", 5, (6, 8, 8), grid=(1, 2)),
        _solver_case("solvers_views32", "views", 7, (6, 8, 8), dtype="float32"),
        _solver_case("solvers_space32", "space", 7, (6, 8, 8), dtype="float32")],
    3: [_case("views", "views", 8, (8, 8, 8), orbit="spiral"),
        _case("space", "space", 6, (8, 8, 8), orbit="spiral")],
    4: [_case("views_zero_views", "views", 3, (8, 8, 8)),          # rank 3 owns no view
        _case("space_empty_slab", "space", 6, (3, 8, 8)),           # rank 3 owns no plane
        _case("hybrid2x2", "hybrid", 7, (5, 8, 8), grid=(2, 2)),
        _case("hybrid2x2_empty", "hybrid", 1, (1, 8, 8), grid=(2, 2)),  # empty shard and slab
        # process_group=: two independent 2-rank jobs in one world of 4
        _case("space_on_subgroups", "space", 5, (7, 8, 8), jobs=[[0, 2], [1, 3]]),
        _case("hybrid_on_subgroups", "hybrid", 5, (7, 8, 8), grid=(1, 2), jobs=[[0, 1], [2, 3]]),
        _case("hybrid2x2_on_group", "hybrid", 6, (6, 8, 8), grid=(2, 2), jobs=[[0, 1, 2, 3]]),
        _solver_case("solvers_views", "views", 3, (5, 8, 8)),
        _solver_case("solvers_space", "space", 6, (3, 8, 8)),
        _solver_case("solvers_space5", "space", 6, (5, 8, 8)),
        _solver_case("solvers_hybrid", "hybrid", 5, (5, 8, 8), grid=(2, 2))],
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Rank results per world size, launched lazily (one torchrun per world size)."""
    cache = {}

    def get(nproc):
        if nproc not in cache:
            cache[nproc] = _run_cases(tmp_path_factory, nproc, CASES[nproc])
        return cache[nproc]
    return get


def _tol(case):
    return 1e-12 if case.get("dtype") == "float64" else 2e-5


def _close(got, want, case, what):
    got, want = got.double(), want.double()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.numel() == 0:
        return
    scale = max(want.abs().max().item(), 1e-30)
    err = (got - want).abs().max().item()
    assert err <= _tol(case) * scale, f"{case['name']}: {what} differs by {err:.3g} (scale {scale:.3g})"


def _sl(t):
    return slice(*t)


def _params(kind):
    picked = [(n, i) for n in CASES for i, c in enumerate(CASES[n]) if c["kind"] == kind]
    return dict(argnames="nproc,index", argvalues=picked,
                ids=[f"ws{n}-{CASES[n][i]['name']}" for n, i in picked])


@pytest.mark.parametrize(**_params("projector"))
def test_partition_matches_single_process(launched, nproc, index):
    case = CASES[nproc][index]
    everyone = [r[case["name"]] for r in launched(nproc)]
    ref = run_projector_case(make_projector(case), case)
    for job in case.get("jobs", [list(range(nproc))]):
        _check_job(case, [everyone[r] for r in job], ref)


def _check_job(case, ranks, ref):
    """The ranks of one process group against the single-process reference."""
    nproc = len(ranks)
    n_views, D = case["n_views"], case["volume_shape"][0]

    # Ownership: balanced half-open splits, hybrid rank = view_rank * space_ranks + space_rank.
    grid = {"views": (nproc, 1), "space": (1, nproc)}.get(case["partition"], tuple(case.get("partition_grid", ())))
    views_of, slabs_of = {}, {}
    for r, rk in enumerate(ranks):
        a = rk["attrs"]
        assert a["rank"] == r and a["world_size"] == nproc and a["partition"] == case["partition"]
        assert tuple(a["partition_grid"]) == grid
        assert (a["view_world_size"], a["space_world_size"]) == grid
        vr, sr = divmod(r, grid[1])
        views_of.setdefault(vr, a["view_slice"])
        slabs_of.setdefault(sr, a["volume_slice"])
        assert a["view_slice"] == views_of[vr] and a["volume_slice"] == slabs_of[sr]
        nv = a["view_slice"].stop - a["view_slice"].start
        nz = a["volume_slice"].stop - a["volume_slice"].start
        assert a["projection_shape"] == (nv, 8, 6)
        assert a["volume_shape"] == a["local_volume_shape"] == (nz, *case["volume_shape"][1:])
        assert a["global_volume_shape"] == tuple(case["volume_shape"])
    for parts, n in ((views_of, n_views), (slabs_of, D)):
        sizes = [parts[i].stop - parts[i].start for i in range(len(parts))]
        assert [parts[i].start for i in range(len(parts))] == [sum(sizes[:i]) for i in range(len(parts))]
        assert sum(sizes) == n and max(sizes) - min(sizes) <= 1

    # Outputs and gradients, each rank against its part of the single-process result.
    for rk in ranks:
        res = rk["results"]
        vs, ws = _sl(res["volume_slice"]), _sl(res["view_slice"])
        _close(res["project"], ref["project"][ws], case, "project")
        _close(res["batched_project"], ref["batched_project"][:, ws], case, "batched project")
        _close(res["backproject"], ref["backproject"][vs], case, "backproject")
        for k in ("grad1_volume", "grad3_volume", "grad4_volume"):
            _close(res[k], ref[k][vs], case, k)
        for k in ("grad1_geometry", "grad2_geometry", "grad3_geometry", "grad4_geometry"):
            _close(res[k], ref[k], case, k)  # every rank holds the full geometry gradient
        for k in ("inner_volume", "inner_projection"):
            _close(res[k], ref[k], case, k)
    # Per-rank losses add up to the global loss (the logging rule).
    for k in ("loss1", "loss2", "loss3", "loss4"):
        _close(sum(rk["results"][k].double() for rk in ranks), ref[k], case, f"sum of {k}")
    # Sinogram gradients through backproject are partial over the ranks sharing views.
    by_views = {}
    for rk in ranks:
        key = tuple(rk["results"]["view_slice"])
        by_views[key] = by_views.get(key, 0) + rk["results"]["grad2_sinogram"].double()
    for key, g in by_views.items():
        _close(g, ref["grad2_sinogram"][_sl(key)], case, "grad2_sinogram")


@pytest.mark.parametrize(**_params("solvers"))
def test_distributed_solvers_follow_the_single_process_iterates(launched, nproc, index):
    from solver_cases import run_solver_case

    case = CASES[nproc][index]
    ranks = [r[case["name"]]["results"] for r in launched(nproc)]
    ref = run_solver_case(make_projector(case), case)
    for res in ranks:
        vs = _sl(res["volume_slice"])
        for k in ("cgls", "sirt", "tv"):
            if case["dtype"] == "float64":
                _close(res[f"{k}_iterates"], ref[f"{k}_iterates"][:, vs], case, f"{k} iterates")
                _close(res[f"{k}_residuals"], ref[f"{k}_residuals"], case, f"{k} residuals")
            else:  # float32: round-off grows over the iterations
                err = (res[f"{k}_iterates"].double() - ref[f"{k}_iterates"][:, vs].double()).abs().max().item()
                scale = ref[f"{k}_iterates"].abs().max().item()
                assert err <= 1e-4 * scale, f"{case['name']}: {k} iterates differ by {err:.3g} (scale {scale:.3g})"
                rel = (res[f"{k}_residuals"] - ref[f"{k}_residuals"]).abs().max() / ref[f"{k}_residuals"].max()
                assert rel <= 1e-4, (k, rel)
        _close(res["tv_objective"], ref["tv_objective"], case, "tv objective")
        _close(res["fdk"], ref["fdk"][vs], case, "fdk")
        _close(res["tv_value"], ref["tv_value"], case, "total_variation value")
        _close(res["tv_grad"], ref["tv_grad"][vs], case, "total_variation gradient")
    # The oracle's iterates change, so the comparisons above are not between copies of x0.
    assert (ref["cgls_iterates"][-1] - ref["cgls_iterates"][0]).abs().max() > 1e-3


# ------------------------------------------------------------ the spec's demo
def _reference_half_mse() -> float:
    from ctbench import Projector, spiral_trajectory_3d

    tr = spiral_trajectory_3d(31, sid=80.0, sdd=128.0, z_range=8.0, n_turns=1.0, dtype=torch.float64)
    y = Projector(tr, (32, 32, 32), (48, 40)).project(torch.ones(32, 32, 32, dtype=torch.float64))
    return (0.5 * y.square().sum() / (31 * 48 * 40)).item()


def _printed_half_mse(text: str) -> float:
    found = re.findall(r"global half-MSE: ([0-9.eE+-]+)", text)
    assert len(found) == 1, f"expected one report line (rank 0 only), got:\n{text[-3000:]}"
    return float(found[0])


def test_distributed_demo_prints_the_single_process_half_mse():
    want = _reference_half_mse()
    assert want > 1  # a real signal, not an empty projection
    demo = ROOT / "examples" / "distributed_demo.py"
    proc = torchrun(2, demo)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got_2 = _printed_half_mse(proc.stdout)
    # Started without torchrun, the same script runs as a single rank.
    single = subprocess.run([sys.executable, str(demo)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1"))
    assert single.returncode == 0, single.stderr[-4000:]
    got_1 = _printed_half_mse(single.stdout)
    # Six significant digits are printed; float32 sums differ from the float64 truth below that.
    assert abs(got_2 - want) <= 2e-5 * want and abs(got_1 - want) <= 2e-5 * want, (got_1, got_2, want)


# --------------------------------------------------------------- failing ranks
@pytest.mark.parametrize("mode,nproc,timeout", [("raise", 3, 30), ("hang", 2, 4)])
def test_a_failing_rank_stops_every_rank_with_a_clear_error(mode, nproc, timeout):
    import time

    t0 = time.monotonic()
    # A slow monitor interval gives the surviving ranks time to report before torchrun stops them.
    proc = torchrun(nproc, SCRIPTS / "failing_rank.py", mode, timeout, timeout=90, monitor=2)
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "finished a projection it should not have finished" not in out
    if mode == "raise":
        assert "deliberate failure on rank 1" in out
    survivors = [r for r in range(nproc) if r != 1]
    for r in survivors:
        assert re.search(rf"DistributedError: ctbench distributed all_reduce failed on rank {r} of {nproc}", out), \
            out[-6000:]
    if mode == "hang":
        assert "Timed out" in out or "timed out" in out.lower()
    assert elapsed < 80


# ------------------------------------------------- ownership and bad arguments
def test_balanced_split_is_balanced_contiguous_and_allows_empty_parts():
    from ctbench.distributed import balanced_split

    for n in range(0, 12):
        for parts in range(1, 7):
            got = [balanced_split(n, parts, i) for i in range(parts)]
            sizes = [s.stop - s.start for s in got]
            assert got[0].start == 0 and got[-1].stop == n
            assert all(a.stop == b.start for a, b in zip(got, got[1:]))
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert balanced_split(3, 4, 3) == slice(3, 3)
    with pytest.raises(ValueError, match="index"):
        balanced_split(5, 2, 2)


def test_partition_arguments_are_checked():
    from ctbench.distributed.partition import _check_grid

    from cases import make_projector as mk

    case = CASES[2][0]
    with pytest.raises(RuntimeError, match="init_process_group"):
        mk(case, distributed=True)
    with pytest.raises(ValueError, match="distributed=True"):
        mk(case, partition="space")
    assert _check_grid("views", None, 4) == (4, 1) and _check_grid("space", None, 4) == (1, 4)
    assert _check_grid("hybrid", (2, 3), 6) == (2, 3)
    with pytest.raises(ValueError, match="partition_grid"):
        _check_grid("hybrid", None, 4)
    with pytest.raises(ValueError, match="has 6 ranks but the process group has 4"):
        _check_grid("hybrid", (2, 3), 4)
    with pytest.raises(ValueError, match="partition='hybrid'"):
        _check_grid("views", (2, 2), 4)
    with pytest.raises(ValueError, match="partition must be one of"):
        _check_grid("pixels", None, 4)
    with pytest.raises(ValueError, match="positive integers"):
        _check_grid("hybrid", (0, 4), 4)


def test_single_rank_group_matches_plain_projector_and_checks_2d():
    """A world of one rank (in this process) behaves like the ordinary projector."""
    import datetime

    import torch.distributed as dist

    from ctbench import Projector, circular_trajectory_2d_fan

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        case = CASES[2][1]
        ref = run_projector_case(make_projector(case), case)
        for part, grid in (("views", None), ("space", None), ("hybrid", (1, 1))):
            op = make_projector(case, distributed=True, partition=part, partition_grid=grid)
            assert (op.rank, op.world_size, op.partition_grid) == (0, 1, (1, 1))
            got = run_projector_case(op, case)
            for k in ("project", "backproject", "grad1_volume", "grad1_geometry", "grad3_volume", "loss1"):
                _close(got[k], ref[k], case, f"{part}: {k}")
        with pytest.raises(ValueError, match="partition_grid"):
            make_projector(case, distributed=True, partition="hybrid")
        with pytest.raises(ValueError, match="devices="):
            make_projector(case, distributed=True, devices=["cpu"])
        op2d = Projector(circular_trajectory_2d_fan(5, 40.0, 80.0), (8, 8), 9, distributed=True, partition="space")
        assert op2d.volume_shape == (8, 8) and op2d.projection_shape == (5, 9)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ slurm file
def test_slurm_script_submits_itself_and_launches_torchrun_per_node(tmp_path):
    """Fake sbatch/srun/scontrol record what the script asks of Slurm."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for name, body in (("sbatch", 'echo "sbatch $*" >> "$LOG"'), ("srun", 'echo "srun $*" >> "$LOG"'),
                       ("scontrol", 'printf "node-a\\nnode-b\\n"')):
        f = bin_dir / name
        f.write_text(f"#!/usr/bin/env bash\n{body}\n")
        f.chmod(0o755)
    script = ROOT / "examples" / "slurm" / "multi_node.sbatch"
    base = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", LOG=str(log), ACCOUNT="proj42",
                PARTITION="gpu-long", GPUS_PER_NODE="2", NODES="3")
    base.pop("SLURM_JOB_ID", None)
    subprocess.run(["bash", str(script)], env=base, check=True, timeout=30, cwd=ROOT)
    sub = log.read_text()
    assert "--account=proj42" in sub and "--partition=gpu-long" in sub and "--gres=gpu:2" in sub
    assert "--nodes=3" in sub
    log.unlink()
    inside = dict(base, SLURM_JOB_ID="77", SLURM_JOB_NUM_NODES="3", SLURM_JOB_NODELIST="node-[a-c]",
                  SLURM_CPUS_PER_TASK="8", SLURM_SUBMIT_DIR=str(ROOT), SCRIPT="examples/distributed_demo.py")
    subprocess.run(["bash", str(script)], env=inside, check=True, timeout=30, cwd=ROOT)
    run = log.read_text()
    assert run.startswith("srun ") and "torchrun" in run
    for arg in ("--nnodes=3", "--nproc-per-node=2", "--rdzv-endpoint=node-a:29500", "--rdzv-id=77",
                "examples/distributed_demo.py"):
        assert arg in run, run


# ------------------------------------------------------- the iterative example
def test_iterative_example_under_torchrun_matches_one_process(tmp_path):
    from ctbench.workbench.dataset import load_dataset

    example = ROOT / "examples" / "iterative_reconstruction.py"
    common = ["--algorithm", "tv", "--size", "12", "--views", "10", "--n-iter", "3", "--dtype", "float64"]
    proc = torchrun(2, example, *common, "--out", tmp_path / "ranks")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("iteration    3") == 1  # rank 0 reports, once
    single = subprocess.run([sys.executable, str(example), *common, "--out", str(tmp_path / "one")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert single.returncode == 0, single.stderr[-4000:]
    got = torch.as_tensor(load_dataset(tmp_path / "ranks" / "reconstruction.zarr").volume[...])
    want = torch.as_tensor(load_dataset(tmp_path / "one" / "reconstruction.zarr").volume[...])
    assert want.abs().max() > 0
    assert (got - want).abs().max() <= 1e-10 * want.abs().max()
