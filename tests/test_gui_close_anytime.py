"""Closing the viewer at any moment never aborts the process (issue 49, item 9).

The Jobs panel polls a bridge that accepts connections and never answers (each poll is a worker blocked in
its HTTP call), or a long SIRT run is going; the viewer is closed at varying moments, several times in one
process, and the script ends right after the last close (Python then deletes the Qt objects that workers
still running would emit on).  Before, the poll worker's error was emitted on deleted signals
(``WorkerBaseSignals has been deleted``) and the process aborted in 2 of 3 runs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gui, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import sys
    from ctbench_napari import launch
    from ctbench_napari._testing import wait_for

    mode, delays = sys.argv[1], [float(x) for x in sys.argv[2:]]
    for k, delay in enumerate(delays):
        viewer = launch(sample="phantom_scan" if mode == "run" else None, block=False)
        if mode == "run":
            recon = next(w for n, w in viewer.window.dock_widgets.items() if str(n).startswith("Reconstruction"))
            wait_for(lambda: recon.sinogram.layer() is not None, timeout=120)
            recon.select_algorithm("sirt", n_iter=100000)
            recon.run_button.click()
            wait_for(lambda: recon.runner.running, timeout=60)
        try:
            wait_for(lambda: False, timeout=delay)
        except TimeoutError:
            pass
        viewer.close()
        print("closed", k, flush=True)
    print("END", flush=True)
""")


class SilentBridge:
    """A TCP listener on the loopback that accepts and never answers (bounded: stops with the test)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.conns: list = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
                self.conns.append(c)
            except OSError:
                pass

    def close(self):
        self.stop.set()
        self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


def _run(tmp_path, mode, delays, state_dir):
    script = tmp_path / "close.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "CTBENCH_BRIDGE_STATE_DIR": str(state_dir),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
    return subprocess.run([sys.executable, str(script), mode, *map(str, delays)], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.parametrize("delays", [(0.2, 1.5, 3.0), (0.5, 2.5)])
def test_closing_while_the_jobs_panel_polls_a_bridge_that_never_answers_never_aborts(tmp_path, delays):
    bridge = SilentBridge()
    try:
        state = tmp_path / "bridge"
        state.mkdir()
        (state / "bridge.json").write_text(f'{{"url": "http://127.0.0.1:{bridge.port}"}}')
        (state / "token").write_text("t")
        out = _run(tmp_path, "poll", delays, state)
    finally:
        bridge.close()
    assert out.returncode == 0, out.stderr[-3000:]
    assert "END" in out.stdout and "Aborted" not in out.stderr and "has been deleted" not in out.stderr, \
        out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


def test_closing_mid_run_never_aborts(tmp_path):
    out = _run(tmp_path, "run", (0.3, 2.0), tmp_path / "no-bridge")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("closed") == 2 and "END" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "Aborted" not in out.stderr and "has been deleted" not in out.stderr and "Traceback" not in out.stderr, \
        out.stderr[-3000:]
