"""Start a job as a ``torchrun`` process tree in its own process group, and end it.

The group leader is a small ``sh`` that runs ``python -m torch.distributed.run``
and then writes torchrun's exit status to ``exit_code`` in the job directory
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


def launch(job_dir: Path, nproc: int, threads: int | None = None) -> subprocess.Popen:
    """Start the job's process group; its output goes to ``job_dir/log``. Returns the leader (pgid = pid)."""
    job_dir = Path(job_dir)
    for name in ("exit_code", "exit_code.tmp"):
        (job_dir / name).unlink(missing_ok=True)
    cmd = shlex.join(torchrun_command(job_dir, nproc))
    d = shlex.quote(str(job_dir))
    script = f'{cmd}\nrc=$?\necho $rc > {d}/exit_code.tmp && mv {d}/exit_code.tmp {d}/exit_code\nexit $rc\n'
    log = open(job_dir / "log", "ab")
    try:
        return subprocess.Popen(["/bin/sh", "-c", script], cwd=job_dir, env=job_environment(threads),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        log.close()


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes of process group ``pgid`` (read from /proc)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp ...
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) >= 3 and int(rest[2]) == pgid and rest[0] not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def group_alive(pgid: int | None) -> bool:
    if not pgid:
        return False
    if not Path("/proc/self/stat").exists():   # no /proc: ask the kernel (counts zombies as alive)
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    return bool(group_members(pgid))


def terminate_group(pgid: int, grace: float = 5.0, poll: float = 0.05) -> bool:
    """SIGTERM every process of the group, SIGKILL what is left after ``grace`` s; True if it all ended."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return True
            time.sleep(poll)
    return not group_alive(pgid)


def read_exit_code(job_dir: Path) -> int | None:
    try:
        return int((Path(job_dir) / "exit_code").read_text().strip())
    except (OSError, ValueError):
        return None
