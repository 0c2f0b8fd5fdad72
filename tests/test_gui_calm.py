"""The workbench stays calm in long use: no uncaught worker exception, no toast, no abort without a bridge."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gui
ROOT = Path(__file__).resolve().parents[1]


def test_a_script_that_docks_every_widget_without_napari_run_and_without_a_bridge_survives(tmp_path):
    """Every widget docked, no ``napari.run()``, no bridge: the Jobs panel polls several times (an uncaught
    BridgeNotFound in a worker used to abort the process) and shows its no-bridge state; nothing is raised."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import napari
        import napari._qt.qt_main_window as qmw
        qmw.SHOW_QT_WARNING = False      # napari's one-off "PyQt5 is deprecated" toast is not ours
        from napari.utils.notifications import notification_manager
        from ctbench_napari import PLUGIN, WIDGETS
        from ctbench_napari._testing import wait_for

        toasts = []
        notification_manager.notification_ready.connect(lambda n: toasts.append(str(n.message)))
        viewer = napari.Viewer(show=True)
        widgets = {name: viewer.window.add_plugin_dock_widget(PLUGIN, name, tabify=True)[1] for name in WIDGETS}
        jobs = widgets["Jobs"]
        jobs.timer.setInterval(100)
        wait_for(lambda: jobs.bridge_found is False, timeout=120)   # the first look (imports the client)
        try:
            wait_for(lambda: False, timeout=3)      # then the event loop runs on: many polls of a missing bridge
        except TimeoutError:
            pass
        print("STATE:", jobs.bridge_state.text(), flush=True)
        print("MESSAGE:", repr(jobs.message.text()), flush=True)
        print("TOASTS:", toasts, flush=True)
        viewer.close()
        print("SURVIVED", flush=True)
    """))
    env = {**os.environ, "LIBGL_ALWAYS_SOFTWARE": "1", "CTBENCH_BRIDGE_STATE_DIR": str(tmp_path / "no-bridge"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SURVIVED" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "STATE: no bridge running" in out.stdout and "MESSAGE: ''" in out.stdout and "TOASTS: []" in out.stdout, \
        out.stdout
    assert "Traceback" not in out.stderr and "BridgeNotFound" not in out.stderr, out.stderr[-3000:]
