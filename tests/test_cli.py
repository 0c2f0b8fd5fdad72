"""The `ctbench` command: the demo that `make run` executes, and diagnostics."""

import subprocess
import sys

import numpy as np
import pytest

from ctbench.cli import main
from ctbench.json_report import loads as strict_loads  # refuses NaN and Infinity
from ctbench.workbench.dataset import load_dataset


@pytest.mark.slow
def test_demo_writes_zarr_png_and_reports_accuracy(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--size", "48", "--views", "90"]) == 0
    report = strict_loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["mae"] < 0.05 and report["psnr_db"] > 20
    ds = load_dataset(tmp_path / "demo.zarr")
    assert ds.volume.shape == (48, 48, 48) and ds.sinogram.shape == (90, 48, 48)
    assert ds.geometry is not None and ds.geometry.n_views == 90
    vol = np.asarray(ds.volume)
    assert 0.9 < vol.max() < 1.3  # the skull of the modified phantom has density 1
    png = (tmp_path / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_bad_arguments_are_rejected():
    proc = subprocess.run([sys.executable, "-m", "ctbench.cli", "demo", "--size", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--size and --views must be positive" in proc.stderr


def test_info_reports_the_cpu_backend(capsys):
    assert main(["info"]) == 0
    info = strict_loads(capsys.readouterr().out)
    assert info["cpu_backend"] == "ok" and info["threads"] >= 1
    # which kernel build is loaded: prebuilt level (installed wheel) or the JIT build (a checkout)
    joseph = info["cpu_kernels"]["joseph"]
    assert joseph["source"] in ("prebuilt", "jit") and joseph["variant"]
    assert info["cpu_levels"] and (joseph["source"] == "jit" or joseph["variant"] in info["cpu_levels"])
