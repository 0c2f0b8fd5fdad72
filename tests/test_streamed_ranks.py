"""The streamed recon shared by torchrun ranks (ctbench/pipeline/ranks.py): each rank does its share of every
stage's windows on one run folder, and the volume is the single process's bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from ctbench.io.ome_zarr import OmeZarrVolume
from ctbench.io.sample_scan import LabScanSpec, write_lab_scan

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

# Small, but a budget that gives every stage several windows, so both ranks have work in each.  The ranks of a
# machine share its budget, so two ranks with twice the budget plan the windows of one process: the same plan.
SPEC = LabScanSpec(n_views=96, detector_u=96, detector_v=80, pitch=1.0, volume=64, phantom_name="chiral",
                   seen_from="source", rotation="cw")
BUDGET_MB = 580          # windows of 18 views, bands of 32 rows, slabs of 48 planes: several of each


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    return write_lab_scan(tmp_path_factory.mktemp("scan") / "scan", SPEC)


def _config(scan, where: Path, name: str, ranks: int = 1) -> Path:
    cfg = where / f"{name}.json"
    cfg.write_text(json.dumps({"input": {"path": str(scan)}, "algorithm": {"name": "fdk"},
                               "preprocess": {"ring_filter": 5},
                               "geometry": {"image_seen_from": "auto", "rotation_direction": "auto"},
                               "output": {"path": str(where / f"{name}.ome.zarr")},
                               "resources": {"memory": f"{BUDGET_MB * ranks}MB", "threads": 1}}))
    return cfg


def _recon(cfg: Path, *extra, **popen):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "ctbench.cli", "recon", str(cfg), "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen)


def _finish(p) -> tuple[list[dict], str]:
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    return [json.loads(x) for x in out.splitlines() if x.strip()], err


def _same_volume(a: Path, b: Path) -> None:
    va, vb = OmeZarrVolume.open(a), OmeZarrVolume.open(b)
    assert va.n_levels == vb.n_levels
    for k in range(va.n_levels):
        assert np.array_equal(va.read(level=k), vb.read(level=k)), f"level {k} differs"


@pytest.fixture(scope="module")
def single(scan, tmp_path_factory):
    """The volume of one process (the reference every ranked run must equal bit for bit)."""
    where = tmp_path_factory.mktemp("single")
    events, _ = _finish(_recon(_config(scan, where, "one")))
    report = events[-1]
    assert report["ranks"]["world"] == 1
    return where / "one.ome.zarr", report


def test_two_ranks_share_every_stage_and_give_the_single_process_volume_bit_for_bit(scan, single, tmp_path):
    ref, ref_report = single
    events, err = _finish(_recon(_config(scan, tmp_path, "two", 2), "--ranks", "2"))
    reports = [e for e in events if e.get("event") == "report"]
    assert len(reports) == 1                       # rank 0 speaks for the job; the other rank is silent
    report = reports[0]
    assert report["ranks"]["world"] == 2
    per_rank = report["ranks"]["windows"]
    for stage in ("read", "rings", "backproject"):  # each rank did part of each stage
        assert all(w.get(stage, 0) >= 1 for w in per_rank), per_rank
        assert sum(w[stage] for w in per_rank) == ref_report["ranks"]["windows"][0][stage]
    assert report["plan"] == ref_report["plan"]      # the same windows as one process
    assert report["centre"] == ref_report["centre"]
    _same_volume(ref, tmp_path / "two.ome.zarr")
    assert not (tmp_path / ".two.ome.zarr.ctbench-run").exists()
    assert "Traceback" not in err
    # the bars follow every rank's markers: the last backprojection event counts the whole volume
    bp = [e for e in events if e.get("event") == "progress" and e.get("stage") == "backproject"]
    assert bp[-1]["done"] == bp[-1]["total"] == report["geometry"]["volume_shape"][0]


def test_kill_9_of_the_ranks_while_they_read_then_the_same_command_resumes_bit_for_bit(scan, single, tmp_path):
    # (the single-process suite kills every stage; here the whole process tree dies while both ranks write)
    cfg = _config(scan, tmp_path, "killed", 2)
    done = tmp_path / ".killed.ome.zarr.ctbench-run" / "done" / "read"
    p = _recon(cfg, "--ranks", "2")
    try:
        for line in p.stdout:
            e = json.loads(line)
            if e.get("event") == "report":
                raise AssertionError("the run finished before it could be killed")
            if e.get("stage") == "read" and done.is_dir() and any(done.iterdir()):
                # the launcher, torchrun and both ranks at once (torchrun starts each rank in its own session)
                tree = psutil.Process(p.pid)
                for proc in [tree] + tree.children(recursive=True):
                    proc.send_signal(signal.SIGKILL)
                break
    finally:
        p.wait(60)
    assert not (tmp_path / "killed.ome.zarr").exists()  # nothing that looks finished
    events, _ = _finish(_recon(cfg, "--ranks", "2"))
    starts = [e for e in events if e.get("stage") == "read"]
    assert starts[0]["done"] > 0                        # the windows finished before the kill were kept
    _same_volume(single[0], tmp_path / "killed.ome.zarr")


def test_a_refused_input_under_ranks_is_one_line_from_rank_0_and_exit_status_2(scan, tmp_path):
    cfg = _config(scan, tmp_path, "bad", 2)
    doc = json.loads(cfg.read_text())
    doc["output"]["path"] = str(Path(scan) / "inside.ome.zarr")     # an output inside the scan
    cfg.write_text(json.dumps(doc))
    p = subprocess.run([sys.executable, "-m", "ctbench.cli", "recon", str(cfg), "--ranks", "2"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("ctbench recon:")]
    assert len(lines) == 1 and "output.path" in lines[0], p.stderr
    assert "Traceback" not in p.stderr and "ChildFailedError" not in p.stderr


@pytest.mark.parametrize("value,words", [("0", "positive"), ("100000", "cores")])
def test_a_bad_number_of_ranks_is_refused_naming_the_option(scan, tmp_path, value, words):
    p = subprocess.run([sys.executable, "-m", "ctbench.cli", "recon", str(_config(scan, tmp_path, "r")),
                        "--ranks", value], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--ranks" in p.stderr and words in p.stderr, p.stderr
