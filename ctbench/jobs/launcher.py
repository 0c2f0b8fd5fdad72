"""Start a job as a ``torchrun`` process tree in its own process group, and end it.

The group leader is a small ``sh`` that runs ``python -m torch.distributed.run``
(in a process group of its own) and then writes torchrun's exit status to ``exit_code`` in the job directory
(write aside, then rename).  The status therefore survives the bridge: a
bridge restarted after a crash reads it, or sees the group still alive and
re-attaches.  Cancelling signals the whole group (the shell, torchrun and
every rank): SIGTERM, then SIGKILL after a grace period, so no rank is left.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(job_dir: Path, nproc: int, *, port: int | None = None, monitor: float = 0.1) -> list[str]:
    """The torchrun command line that runs :mod:`ctbench.jobs.worker` for ``job_dir`` on this host."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port or free_port()}", "--max-restarts=0",
            f"--monitor-interval={monitor}", "-m", "ctbench.jobs.worker", str(job_dir)]


def job_environment(threads: int | None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # torchrun would set OMP_NUM_THREADS=1 with a warning; a job says how many it wants.
    env["OMP_NUM_THREADS"] = str(threads or env.get("OMP_NUM_THREADS") or 1)
    # The worker must import this ctbench even when it runs from a checkout.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def single_rank_command(job_dir: Path) -> list[str]:
    """One rank needs no torchrun agent: the worker runs directly (one interpreter start instead of two)."""
    return [sys.executable, "-m", "ctbench.jobs.worker", str(job_dir)]


def launch(job_id: str, job_dir: Path, nproc: int, threads: int | None = None) -> subprocess.Popen:
    """Start the job's process group; its output goes to ``job_dir/log``. Returns the leader (pgid = pid)."""
    job_dir = Path(job_dir)
    for name in ("exit_code", "exit_code.tmp"):
        (job_dir / name).unlink(missing_ok=True)
    env = job_environment(threads)
    env[TAG] = job_id
    if nproc == 1:
        cmd = shlex.join(single_rank_command(job_dir))
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()))
    else:
        cmd = shlex.join(torchrun_command(job_dir, nproc))
    d = shlex.quote(str(job_dir))
    script = f'{cmd}\nrc=$?\necho $rc > {d}/exit_code.tmp && mv {d}/exit_code.tmp {d}/exit_code\nexit $rc\n'
    log = open(job_dir / "log", "ab")
    try:
        return subprocess.Popen(["/bin/sh", "-c", script], cwd=job_dir, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        log.close()


TAG = "CTBENCH_JOB"


def _proc_state(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split(" ", 1)[0]


def job_processes(job_id: str | None = None) -> dict[str, list[int]] | list[int]:
    """Live (non-zombie) processes of a job, found by the ``CTBENCH_JOB`` variable every one of them inherits.

    torchrun starts each rank in a session of its own, so the launcher's
    process group does not hold the ranks; the environment marker does, and
    it survives a bridge restart.  Without ``job_id``: ``{job_id: [pids]}``
    of every job on this machine.
    """
    found: dict[str, list[int]] = {}
    needle = None if job_id is None else f"{TAG}={job_id}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(TAG.encode() + b"="):
                if needle is not None and var != needle:
                    break
                if _proc_state(entry.name) not in (None, "Z", "X"):
                    found.setdefault(var.split(b"=", 1)[1].decode(), []).append(int(entry.name))
                break
    return found if job_id is None else found.get(job_id, [])


def job_alive(job_id: str) -> bool:
    return bool(job_processes(job_id))


def _signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate_job(job_id: str, grace: float = 5.0, poll: float = 0.05) -> bool:
    """SIGTERM every process of the job, SIGKILL what is left after ``grace`` s; True if none is left."""
    _signal_all(job_processes(job_id), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not job_processes(job_id):
            return True
        time.sleep(poll)
    for _ in range(50):   # also catches a rank started between two scans
        pids = job_processes(job_id)
        if not pids:
            return True
        _signal_all(pids, signal.SIGKILL)
        time.sleep(poll)
    return not job_processes(job_id)


def read_exit_code(job_dir: Path) -> int | None:
    try:
        return int((Path(job_dir) / "exit_code").read_text().strip())
    except (OSError, ValueError):
        return None
