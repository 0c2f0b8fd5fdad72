"""Helpers of the job-bridge tests: tiny datasets, a real bridge process, the real CLI."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
           PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))


def make_dataset(path: Path, n: int = 16, n_views: int = 24, dtype=None):
    """A cone-beam scan of the Shepp-Logan phantom on an n^3 grid, saved as a ctbench dataset
    (float32, or ``dtype``)."""
    import torch

    from ctbench import circular_trajectory_3d
    from ctbench.phantoms import shepp_logan_3d
    from ctbench.workbench.dataset import save_dataset
    from ctbench.workbench.design import ScanGeometry

    traj = circular_trajectory_3d(n_views, 4.0 * n, 8.0 * n)
    geo = ScanGeometry(traj, (n + n // 2, n + n // 4), (2.0, 2.0), (n, n, n), (1.0, 1.0, 1.0))
    vol = shepp_logan_3d((n, n, n), 1.0, modified=True, scale=n / 2 - 1).to(dtype or torch.float32)
    sino = geo.projector("cpu").project(vol.contiguous())
    save_dataset(path, volume=vol, sinogram=sino, geometry=geo, overwrite=True)
    return geo, sino


class BridgeProcess:
    """``ctbench bridge serve`` as a real subprocess (its own session, so kill -9 hits only it)."""

    def __init__(self, state_dir: Path, *args: str, timeout: float = 90.0):
        self.state_dir = Path(state_dir)
        cmd = [sys.executable, "-m", "ctbench.cli", "bridge", "serve", "--state-dir", str(state_dir), "--json",
               *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.kill()
            raise RuntimeError(f"the bridge did not start within {timeout} s: {self.proc.stderr.read()}")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the bridge exited: {self.proc.stderr.read()}")
        self.info = json.loads(line)
        self.url = self.info["url"]
        self.token = (self.state_dir / "token").read_text().strip()

    def client(self, **kw):
        from ctbench.jobs.client import BridgeClient
        return BridgeClient(self.url, self.token, **kw)

    def wait_ready(self, timeout: float = 30.0) -> None:
        import httpx
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("bridge not answering")

    def kill(self) -> None:
        """SIGKILL the bridge process alone (its jobs have their own process groups)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Cancel what still runs (no stray ranks after a test), then stop the bridge."""
        if self.proc.poll() is None:
            try:
                with self.client() as c:
                    for j in c.list():
                        if j["state"] in ("queued", "running"):
                            c.cancel(j["id"], wait=15)
            except Exception:  # noqa: BLE001 - best effort: the bridge may be dead already
                pass
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        for s in (self.proc.stdout, self.proc.stderr):
            s.close()


@contextmanager
def running_bridge(state_dir: Path, *args: str):
    """A BridgeProcess on ``state_dir`` with ``args``, stopped on leaving (the body of a bridge fixture)."""
    b = BridgeProcess(state_dir, *args)
    try:
        yield b
    finally:
        b.stop()


def http_client(bridge: BridgeProcess, timeout: float = 60.0):
    """An httpx client of ``bridge``'s HTTP API with its token (no proxy settings taken from the environment)."""
    import httpx
    return httpx.Client(base_url=bridge.url, headers={"Authorization": f"Bearer {bridge.token}"}, trust_env=False,
                        timeout=timeout)


def cli(state_dir: Path, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess:
    """``ctbench jobs --state-dir STATE --json ARGS`` as a real subprocess."""
    cmd = [sys.executable, "-m", "ctbench.cli", "jobs", "--state-dir", str(state_dir), "--json", *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = predicate()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def pid_gone(pid: int) -> bool:
    """True if the process no longer exists or is a zombie (it ran to its end)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"
