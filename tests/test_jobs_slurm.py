"""The Slurm launcher: the rendered multi_node.sbatch is valid bash with the job's allocation, and it runs
the job end to end when executed under stand-ins for srun/scontrol (this machine has no Slurm)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from jobs_support import ENV, ROOT, make_dataset

pytestmark = pytest.mark.distributed


def test_rendered_script_carries_the_allocation_and_is_valid_bash(tmp_path):
    from ctbench.jobs.slurm import render_sbatch

    text = render_sbatch(tmp_path / "job", nodes=3, gpus_per_node=4, account="acct", slurm_partition="gpu",
                         time_limit="00:30:00", cpus_per_node=16)
    for line in ("#SBATCH --nodes=3", "#SBATCH --gres=gpu:4", "#SBATCH --account=acct", "#SBATCH --partition=gpu",
                 "#SBATCH --time=00:30:00", "#SBATCH --cpus-per-task=16", f"#SBATCH --output={tmp_path / 'job'}/log",
                 "export NODES=3", "export GPUS_PER_NODE=4", f"export SCRIPT_ARGS={tmp_path / 'job'}"):
        assert line in text, line
    lines = text.splitlines()
    first_cmd = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH")) < first_cmd   # sbatch reads them all
    script = tmp_path / "x.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_rendered_script_runs_a_two_rank_job_under_stand_in_slurm_commands(tmp_path):
    from ctbench.solvers import fdk
    from ctbench.workbench.dataset import load_dataset

    geo, sino = make_dataset(tmp_path / "scan.zarr", n=8, n_views=12)
    r = subprocess.run([os.sys.executable, "-m", "ctbench.cli", "jobs", "--json", "slurm", "--dataset",
                        str(tmp_path / "scan.zarr"), "--algorithm", "fbp", "--job-dir", str(tmp_path / "job"),
                        "--nodes", "1", "--gpus-per-node", "2", "--dry-run"],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["slurm_job_id"] is None
    # Stand-ins: scontrol names this host; srun runs its command here.
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    (bin_ / "srun").write_text("#!/bin/sh\nwhile [ \"${1#-}\" != \"$1\" ]; do shift; done\nexec \"$@\"\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    env = dict(ENV, PATH=f"{bin_}:{ENV['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="node1",
               SLURM_JOB_NUM_NODES="1", MASTER_PORT=str(_free_port()))
    r = subprocess.run(["bash", out["script"]], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    job = tmp_path / "job"
    events = [json.loads(x) for x in (job / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events] == ["started", "progress", "finished"]
    assert events[0]["nproc"] == 2
    got = load_dataset(json.loads((job / "result.json").read_text())["output"]).volume
    np.testing.assert_allclose(got, fdk(geo.projector("cpu"), sino).numpy(), rtol=1e-4, atol=1e-5)


def _free_port() -> int:
    from ctbench.jobs.launcher import free_port
    return free_port()
