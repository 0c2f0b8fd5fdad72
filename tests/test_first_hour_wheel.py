"""The README's examples, run as a wheel user runs them (issue 48): the wheel built from this checkout
(tests/conftest.py ``built_wheel``) installed into a fresh venv (tests/wheel_install.py), each example run
in a folder outside the checkout with that venv's ``python`` and ``ctbench`` first on PATH, no PYTHONPATH,
an empty kernel cache.

Which blocks are examples: every ```python block, and every ```bash block (run line by line with
``bash -e``).  Install commands (pip, make) are ```sh blocks: they need the network or a checkout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ctbench.engine.cpu import prebuilt as cpu_prebuilt
from wheel_install import install_wheel

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
BASH_BLOCKS = re.findall(r"```bash\n(.*?)```", README, flags=re.S)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(cpu_prebuilt.machine() != "x86_64", reason="the x86-64 wheel is built here")]


def strict_loads(text: str):
    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def user(built_wheel, tmp_path_factory):
    """(venv python, environment, a working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("first-hour")
    vpy, site = install_wheel(built_wheel["wheel"], tmp / "venv")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CTBENCH_CPU_BUILD", "CTBENCH_MARCH", "CTBENCH_CXXFLAGS", "CTBENCH_CPU_PATH")}
    env.update(PATH=f"{vpy.parent}{os.pathsep}/usr/bin{os.pathsep}/bin", CTBENCH_CACHE_DIR=str(tmp / "cache"),
               HOME=str(tmp / "home"), MPLBACKEND="Agg")
    (tmp / "home").mkdir()
    work = tmp / "work"
    work.mkdir()
    assert not str(work).startswith(str(ROOT))
    return vpy, env, work, site


def test_the_readme_has_the_examples_this_test_runs():
    assert len(PYTHON_BLOCKS) >= 2 and BASH_BLOCKS
    assert any("ctbench recon" in b for b in BASH_BLOCKS) and any('"sample"' in b for b in BASH_BLOCKS)
    assert "```sh\npip install" in README                  # install commands are not run here


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_example_runs_from_the_wheel(user, index):
    vpy, env, work, site = user
    script = work / f"example_{index}.py"
    script.write_text(PYTHON_BLOCKS[index] + "\nimport ctbench, sys\nprint('CTBENCH=' + ctbench.__file__)\n")
    r = subprocess.run([str(vpy), script.name], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    used = r.stdout.strip().splitlines()[-1].removeprefix("CTBENCH=")
    assert used.startswith(str(site)), used                 # the installed wheel, not the checkout


@pytest.mark.parametrize("index", range(len(BASH_BLOCKS)))
def test_shell_example_runs_from_the_wheel(user, index):
    vpy, env, work, site = user
    folder = work / f"shell_{index}"
    folder.mkdir()
    r = subprocess.run(["bash", "-e", "-c", BASH_BLOCKS[index]], cwd=folder, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "Traceback" not in r.stderr, r.stderr[-4000:]
    if "ctbench recon" in BASH_BLOCKS[index]:
        report = strict_loads((folder / "report.json").read_text())   # no NaN in the report
        out = Path(report["output"])
        assert out.is_file() and out.parent == folder
        assert report["input"]["source"].startswith(str(site))        # the sample installed with the wheel
        assert report["centre"]["confidence"] > 0.9 and abs(report["centre"]["offset_px"] - 3.3) < 0.5


def test_samples_point_into_the_installed_package(user):
    vpy, env, work, site = user
    r = subprocess.run(["ctbench", "samples", "--json"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = strict_loads(r.stdout)
    with_files = [row for row in rows if not row["computed"]]
    assert {row["name"] for row in with_files} == {"lab_scan", "selfcal_scan", "htc2022"}
    for row in with_files:
        assert row["path"].startswith(str(site / "ctbench" / "sample_data")) and Path(row["path"]).exists(), row


def test_help_of_the_installed_command_does_not_import_torch(user):
    vpy, env, work, site = user
    r = subprocess.run([str(vpy), "-X", "importtime", str(vpy.parent / "ctbench"), "--help"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)     # the console script pip writes
    assert r.returncode == 0 and "usage: ctbench" in r.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "ctbench.cli" in imported and "torch" not in imported
