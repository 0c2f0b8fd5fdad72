"""Shared fixtures and the suite's own checks.

- ``built_wheel``: one wheel built from the checkout per session (tests/test_wheel.py and
  tests/test_first_hour_wheel.py install it; a build takes about a minute of two cores).
- The tree stays clean: ``git status --porcelain`` is taken when the session starts and again when it ends;
  anything a test wrote into the checkout (a tracked file changed, a new file that .gitignore does not
  cover) is listed at the end, and fails the run where ``CTBENCH_TREE_MUST_STAY_CLEAN=1`` (.ci/run sets it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _porcelain() -> set[str] | None:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        return None
    r = subprocess.run([git, "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    return set(r.stdout.splitlines()) if r.returncode == 0 else None


def pytest_sessionstart(session):
    session.config._ctbench_tree = _porcelain()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_ctbench_tree", None)
    after = _porcelain() if before is not None else None
    if after is None:
        return
    dirtied = sorted(after - before)
    if not dirtied:
        return
    text = "the tests changed the checkout (git status --porcelain): " + "; ".join(dirtied)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, red=True)
    else:
        print(text, file=sys.stderr)
    if os.environ.get("CTBENCH_TREE_MUST_STAY_CLEAN") == "1" and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> dict:
    """``{"wheel": path, "build_s": seconds}``: the checkout built as a user's ``pip wheel .`` would
    (scikit-build-core + CMake, every kernel family at every instruction-set level), once per session."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheels = tmp / "wheels"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--config-settings", f"build-dir={tmp / 'build'}", "-w", str(wheels), str(ROOT)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (wheel,) = wheels.glob("ctbench-*.whl")
    return {"wheel": wheel, "build_s": time.perf_counter() - t0, "tmp": tmp}
