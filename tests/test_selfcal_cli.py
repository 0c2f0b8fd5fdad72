"""``ctbench calibrate CONFIG.json`` and ``ctbench recon`` with the calibrated trajectory (issue 26)."""

from __future__ import annotations

import json

import pytest

from ctbench.cli import main
from ctbench.geometry import load_trajectory
from ctbench.io.selfcal_sample import SelfCalSpec, write_selfcal_sample

SPEC = SelfCalSpec(n_views=24, detector_u=32, detector_v=28, pitch=4.0, offset_u_px=1.8, roll_deg=0.0,
                   drift_rms_px=0.0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = write_selfcal_sample(tmp_path_factory.mktemp("cal") / "scan", SPEC)
    cfg = json.loads((root / "calibrate.json").read_text())
    cfg["calibrate"].update(free=["offset_u"], levels=[1], n_outer=[4])
    cfg["algorithm"] = {"name": "cgls", "params": {"n_iter": 5}}
    (root / "calibrate.json").write_text(json.dumps(cfg))
    return root


@pytest.mark.slow
def test_calibrate_writes_trajectory_and_report_then_recon_uses_it(folder, capsys):
    cfg = str(folder / "calibrate.json")
    assert main(["calibrate", cfg]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["parameters"]["offset_u"] - SPEC.offset_u_px) < 0.15
    report = json.loads((folder / "calibration_report.json").read_text())
    assert report["format"] == "ctbench.calibration-report" and report["stopped"] == "completed"
    [row] = report["parameters"]
    assert row["name"] == "offset_u" and row["status"] == "estimated" and row["uncertainty"] > 0
    traj = load_trajectory(folder / "calibrated_trajectory.json")
    assert traj.n_views == SPEC.n_views and traj.meta.get("calibrated") is True
    # a second run refuses to replace the files unless told to
    assert main(["calibrate", cfg]) == 2
    assert "exists; set calibrate.overwrite" in capsys.readouterr().err
    # ctbench recon reconstructs with geometry.trajectory (the calibrated one)
    assert main(["recon", cfg, "--overwrite"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["output"].endswith("selfcal_recon.tif")


def test_recon_refuses_a_trajectory_of_another_scan(folder, tmp_path, capsys):
    from ctbench import circular_trajectory_3d
    from ctbench.geometry import save_trajectory

    other = tmp_path / "other.json"
    save_trajectory(circular_trajectory_3d(7, 300.0, 600.0), other)
    cfg = json.loads((folder / "calibrate.json").read_text())
    cfg["input"]["path"] = str(folder)
    cfg["geometry"]["trajectory"] = str(other)
    cfg["output"] = {"path": str(tmp_path / "r.tif")}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["recon", str(tmp_path / "c.json")]) == 2
    assert "has 7 cone-beam views" in capsys.readouterr().err


def test_bad_calibrate_section_is_named(folder, tmp_path, capsys):
    cfg = json.loads((folder / "calibrate.json").read_text())
    cfg["input"]["path"] = str(folder)
    cfg["calibrate"]["free"] = ["wobble"]
    cfg["calibrate"]["trajectory"] = str(tmp_path / "t.json")
    cfg["calibrate"]["report"] = str(tmp_path / "r.json")
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["calibrate", str(tmp_path / "c.json")]) == 2
    assert "unknown parameter 'wobble'" in capsys.readouterr().err
    cfg["calibrate"]["n_inner"] = 0
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["calibrate", str(tmp_path / "c.json")]) == 2
    assert "calibrate.n_inner" in capsys.readouterr().err


@pytest.mark.slow
def test_calibrate_prints_the_scans_orientation_warnings_on_stderr(tmp_path):
    """A camera-convention scan stated as seen from the detector: ``ctbench calibrate`` (a real subprocess)
    says on stderr that the data contradict the stated orientation, as ``ctbench recon`` does, and still
    writes its files; the warning is in the report too."""
    import subprocess
    import sys

    from ctbench.io.sample_scan import LabScanSpec, write_lab_scan

    spec = LabScanSpec(n_views=64, detector_u=48, detector_v=24, offset_px=2.37, phantom_name="chiral",
                       rotation="ccw", seen_from="source", seed=5, volume=32)
    scan = write_lab_scan(tmp_path / "scan", spec)
    cfg = {"input": {"path": str(scan)}, "geometry": {"image_seen_from": "detector"},
           "calibrate": {"free": ["offset_u"], "levels": [1], "n_outer": [2],
                         "trajectory": str(tmp_path / "t.json"), "report": str(tmp_path / "r.json")}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    p = subprocess.run([sys.executable, "-m", "ctbench.cli", "calibrate", str(tmp_path / "c.json")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    warnings = [line for line in p.stderr.splitlines() if line.startswith("ctbench calibrate: warning: ")]
    assert len(warnings) == 1 and "contradict the stated orientation" in warnings[0]
    assert "warning" not in p.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert any("contradict the stated orientation" in w for w in report["warnings"])
    # the same scan stated rightly: no warning
    cfg["geometry"] = {"image_seen_from": "source"}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    p = subprocess.run([sys.executable, "-m", "ctbench.cli", "calibrate", str(tmp_path / "c.json"), "--overwrite"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "warning" not in p.stderr
