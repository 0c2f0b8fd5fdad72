"""``ctbench recon`` on refused inputs: one line on stderr and exit status 2 (docs/SCANS.md), never a traceback.
Each case runs the real command in a subprocess with a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))


def _memory_limit() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))


def _recon(cfg_path: Path) -> subprocess.CompletedProcess:
    """The real command, with 2 GiB of data memory (a regression that allocates fails instead of swapping)."""
    return subprocess.run([sys.executable, "-m", "ctbench.cli", "recon", str(cfg_path)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300, preexec_fn=_memory_limit)


def _raw_scan(tmp_path: Path) -> Path:
    p = tmp_path / "scan.raw"
    rng = np.random.default_rng(0)
    p.write_bytes(rng.integers(100, 1000, (4, 6, 8)).astype("<u2").tobytes())
    return p


def _config(tmp_path: Path, **preprocess) -> dict:
    return {"input": {"path": str(_raw_scan(tmp_path)), "format": "raw",
                      "raw": {"shape": [4, 6, 8], "dtype": "uint16"}},
            "preprocess": preprocess,
            "geometry": {"sid_mm": 100.0, "sdd_mm": 200.0, "pixel_size_mm": [1.0, 1.0],
                         "detector_offset_u_mm": 0.0}}


def _check_rc2(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    for n in needles:
        assert n in r.stderr, r.stderr[-2000:]


def test_a_config_of_100000_nested_brackets_is_rc_2(tmp_path):
    cfg = tmp_path / "deep.json"
    cfg.write_text("[" * 100000)
    _check_rc2(_recon(cfg), "deep.json", "nested too deeply")


@pytest.mark.slow
def test_a_ring_filter_wider_than_the_detector_is_rc_2(tmp_path):
    cfg = tmp_path / "ring.json"
    cfg.write_text(json.dumps(_config(tmp_path, ring_filter=10 ** 9)))
    _check_rc2(_recon(cfg), "ring filter size must be at most the detector width")


@pytest.mark.parametrize("key, value, field", [("shape", [2.7, 3.2, 4.9], "input.raw.shape"),
                                               ("shape", [True, True, True], "input.raw.shape")])
@pytest.mark.slow
def test_fractional_or_boolean_raw_shapes_are_rc_2_naming_the_field(tmp_path, key, value, field):
    doc = _config(tmp_path)
    doc["input"]["raw"][key] = value
    cfg = tmp_path / "raw.json"
    cfg.write_text(json.dumps(doc))
    _check_rc2(_recon(cfg), field)


@pytest.mark.slow
def test_fractional_crop_rows_are_rc_2_naming_the_field(tmp_path):
    cfg = tmp_path / "crop.json"
    cfg.write_text(json.dumps(_config(tmp_path, rows=[0.5, 3.9])))
    _check_rc2(_recon(cfg), "preprocess.rows")
