"""Jobs on a Slurm cluster: render ``examples/slurm/multi_node.sbatch`` for a job and submit it with sbatch.

The rendered script is the example template with ``#SBATCH`` directives
for the allocation (account, partition, nodes, GPUs, time, log file) and
its settings block filled in: SCRIPT is ``examples/slurm/ctbench_job.py``
and SCRIPT_ARGS the job directory, which must be on a file system every node
sees.  Slurm then owns the job (``squeue``, ``sacct``, ``scancel``); its
events and result land in the job directory as for a bridge job.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from ..atomic_files import atomic_write_bytes
from ._files import write_json_atomic
from .spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "examples" / "slurm" / "multi_node.sbatch"
ENTRY = ROOT / "examples" / "slurm" / "ctbench_job.py"


def render_sbatch(job_dir: Path, *, nodes: int = 1, gpus_per_node: int = 1, account: str | None = None,
                  slurm_partition: str | None = None, time_limit: str = "01:00:00", cpus_per_node: int | None = None,
                  gpu_request: str | None = None, checkout: Path = ROOT, venv: Path | None = None,
                  template: Path = TEMPLATE) -> str:
    """The template with this job's allocation and command filled in."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be at least 1, got {nodes} and {gpus_per_node}")
    text = template.read_text()
    job_dir = Path(job_dir).resolve()
    q = shlex.quote
    directives = [f"#SBATCH --nodes={nodes}", f"#SBATCH --gres={gpu_request or f'gpu:{gpus_per_node}'}",
                  f"#SBATCH --time={time_limit}", f"#SBATCH --output={job_dir}/log",
                  f"#SBATCH --job-name=ctbench-{job_dir.name}"]
    if account:
        directives.append(f"#SBATCH --account={account}")
    if slurm_partition:
        directives.append(f"#SBATCH --partition={slurm_partition}")
    if cpus_per_node:
        directives.append(f"#SBATCH --cpus-per-task={cpus_per_node}")
    settings = {"NODES": nodes, "GPUS_PER_NODE": gpus_per_node, "SCRIPT": ENTRY, "SCRIPT_ARGS": job_dir,
                "CHECKOUT": Path(checkout).resolve(), "VENV": Path(venv or Path(sys.executable).parents[1])}
    if account:
        settings["ACCOUNT"] = account
    if slurm_partition:
        settings["PARTITION"] = slurm_partition
    prelude = "\n".join(f"export {k}={q(str(v))}" for k, v in settings.items())
    lines = text.splitlines()
    # Directives go after the template's own (sbatch reads them up to the first command).
    last = max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    lines[last + 1:last + 1] = ["# ---- rendered by ctbench.jobs.slurm for " + str(job_dir), *directives]
    i = lines.index("set -euo pipefail")
    lines[i + 1:i + 1] = ["", "# ---- this job (rendered by ctbench.jobs.slurm)", prelude,
                          "export CTBENCH_JOB=" + q(job_dir.name)]
    return "\n".join(lines) + "\n"


def prepare_job(spec: JobSpec, job_dir: Path, **render) -> Path:
    """Write the job directory (spec.json, job.sbatch) and return the script's path."""
    job_dir = Path(job_dir)
    if job_dir.exists() and any(job_dir.iterdir()):
        raise FileExistsError(f"job directory {job_dir} is not empty")
    job_dir.mkdir(parents=True, exist_ok=True)
    ds = Path(spec.dataset).resolve()
    spec = spec.model_copy(update={"dataset": str(ds), "output": spec.output and str(Path(spec.output).resolve())})
    write_json_atomic(job_dir / "spec.json", spec.model_dump(mode="json"))
    script = job_dir / "job.sbatch"
    atomic_write_bytes(script, render_sbatch(job_dir, **render).encode(), suffix=".tmp", mode=0o755)
    return script


def sbatch_available() -> bool:
    return shutil.which("sbatch") is not None


def submit(script: Path) -> str:
    """Submit with ``sbatch --parsable``; returns the Slurm job id. FileNotFoundError without Slurm."""
    if not sbatch_available():
        raise FileNotFoundError("sbatch is not on PATH: this machine has no Slurm client; copy the rendered "
                                f"script {script} to the cluster's login node and run 'sbatch {script.name}'")
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"sbatch failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]
