"""The workbench under each Qt binding napari supports: PyQt5 (the default), PyQt6 and PySide6.

Each binding's smoke run (``scripts/gui_qt_smoke.py``: every widget docks, a SIRT reconstruction runs, a
screenshot that is not blank) in a process of its own, where ``QT_API`` picks the binding.  A binding that is
not installed in the interpreter skips.  The interpreter is this one, or ``CTBENCH_QT_PYTHON`` (a second
environment with PyQt6 and PySide6 beside the project, e.g. one made by ``scripts/gui_qt_smoke.py``'s
instructions in docs/GUI.md); nothing here installs anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gui, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
PYTHON = os.environ.get("CTBENCH_QT_PYTHON") or sys.executable
MODULES = {"pyqt5": "PyQt5", "pyqt6": "PyQt6", "pyside6": "PySide6"}


def _has(binding: str) -> bool:
    out = subprocess.run([PYTHON, "-c", f"import {MODULES[binding]}.QtWidgets"], capture_output=True)
    return out.returncode == 0


@pytest.mark.parametrize("binding", list(MODULES))
def test_every_widget_opens_a_reconstruction_runs_and_the_screen_shows_it(binding, tmp_path):
    if not _has(binding):
        pytest.skip(f"{MODULES[binding]} is not installed in {PYTHON} (set CTBENCH_QT_PYTHON to an environment "
                    "that has it)")
    env = {**os.environ, "QT_API": binding, "PYTEST_QT_API": binding,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
           "CTBENCH_BRIDGE_STATE_DIR": str(tmp_path / "no-bridge")}
    out = subprocess.run([PYTHON, str(ROOT / "scripts" / "gui_qt_smoke.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("{"))
    report = json.loads(line)
    assert report["binding"].lower() == binding
    assert len(report["widgets"]) == 6 and report["recon"]["n_iter"] == 5 and report["recon"]["mean"] > 0
    assert Path(report["screenshot"]).is_file() and report["pixels"]["colours"] >= 8
    # Nothing went wrong on the way: no traceback, no PySide6 slot errors, no failed disconnects.
    assert "Traceback" not in out.stderr and "TypeError" not in out.stderr, out.stderr[-4000:]
    assert "Failed to disconnect" not in out.stderr, out.stderr[-4000:]
