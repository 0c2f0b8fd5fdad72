"""A wheel built from the repository works outside the checkout (kernels ship inside it)."""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_projects_outside_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ROOT)], check=True, capture_output=True, text=True)
    (wheel,) = wheels.glob("ctbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for required in ("ctbench/kernels/joseph.cuh", "ctbench/kernels/joseph_cpu.cpp", "ctbench/kernels/common.cuh",
                     "ctbench/kernels/joseph_cuda.cu", "ctbench_napari/napari.yaml"):
        assert required in names, f"{required} missing from the wheel"

    # A fresh venv with the wheel installed; its dependencies (torch, numpy, ...) come
    # from this environment's site-packages through a .pth file instead of the network.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    deps = sysconfig.get_paths()["purelib"]
    Path(site, "ctbench_deps.pth").write_text(deps + "\n")
    # The editable install's finder must not leak into the fresh venv.
    script = (
        "import torch, ctbench, pathlib\n"
        "assert 'site-packages' in ctbench.__file__ and '/work/main/ctbench' not in ctbench.__file__, ctbench.__file__\n"
        "from ctbench import Projector, circular_trajectory_3d\n"
        "op = Projector(circular_trajectory_3d(6, 50.0, 100.0), (8, 8, 8), (10, 10))\n"
        "s = op.project(torch.ones(8, 8, 8))\n"
        "assert s.shape == (6, 10, 10) and float(s.max()) > 7.0\n"
        "print('ok', ctbench.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["CTBENCH_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([str(vpy), "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")
