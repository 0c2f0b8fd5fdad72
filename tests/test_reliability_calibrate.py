"""``ctbench calibrate`` and ``ctbench recon`` never write over what they read (issue 47, "Data loss").

Before issue 47, ``calibrate.trajectory`` equal to the config file (or to a file of the scan) replaced it,
``trajectory`` and ``report`` on one path lost one of them, a read-only or full output location failed only
after the whole calibration, and ``ctbench recon`` with ``--force`` replaced ``geometry.trajectory`` or the
known object when ``output.path`` named it.  Each case runs the real command line on a real scan folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ctbench.cli import main
from ctbench.geometry import circular_trajectory_3d, load_trajectory
from ctbench.io.selfcal_sample import SelfCalSpec, write_selfcal_sample

SPEC = SelfCalSpec(n_views=12, detector_u=16, detector_v=12, pitch=4.0, offset_u_px=1.0, roll_deg=0.0,
                   drift_rms_px=0.0)


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    return write_selfcal_sample(tmp_path_factory.mktemp("rel") / "scan", SPEC)


def _config(tmp_path, scan, **calibrate):
    cal = {"free": ["offset_u"], "levels": [1], "n_outer": [1], "n_inner": 1,
           "trajectory": str(tmp_path / "t.json"), "report": str(tmp_path / "r.json")} | calibrate
    doc = {"input": {"path": str(scan)}, "geometry": {"detector_offset_u_mm": 0.0}, "calibrate": cal}
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(doc))
    return cfg


def _refused(capsys, args, *words):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "read scanner scan" not in err, "refused only after reading the scan"
    for w in words:
        assert w in err, err
    return err


def test_calibrate_never_writes_over_its_config_or_its_known_object(tmp_path, scan, capsys):
    cfg = _config(tmp_path, scan)
    cfg = _config(tmp_path, scan, trajectory=str(cfg))
    before = cfg.read_bytes()
    _refused(capsys, ["calibrate", str(cfg), "--force"], "is the input", "c.json")
    assert cfg.read_bytes() == before
    obj = tmp_path / "object.tif"
    obj.write_bytes(b"II*\x00 not really a volume")
    cfg = _config(tmp_path, scan, known_object=str(obj), report=str(obj))
    _refused(capsys, ["calibrate", str(cfg), "--force"], "calibrate.report", "is the input")
    assert obj.read_bytes() == b"II*\x00 not really a volume"


def test_calibrate_never_replaces_a_file_of_the_scan_folder_but_may_write_beside_them(tmp_path, scan, capsys):
    scan_json = scan / "scan.json"
    before = scan_json.read_bytes()
    cfg = _config(tmp_path, scan, trajectory=str(scan_json))
    _refused(capsys, ["calibrate", str(cfg), "--force"], "would replace a file of the input")
    assert scan_json.read_bytes() == before
    flat = sorted((scan / "flats").iterdir())[0]
    cfg = _config(tmp_path, scan, report=str(flat))
    _refused(capsys, ["calibrate", str(cfg), "--force"], "would replace a file of the input")
    # a new file beside the scan's files is fine (the bundled sample keeps its outputs there)
    cfg = _config(tmp_path, scan, trajectory=str(scan / "calibrated.json"))
    try:
        assert main(["calibrate", str(cfg)]) == 0
        assert load_trajectory(scan / "calibrated.json").n_views == SPEC.n_views
        assert main(["calibrate", str(cfg), "--overwrite"]) == 0          # and replaced by the next run
    finally:
        (scan / "calibrated.json").unlink(missing_ok=True)
    capsys.readouterr()


def test_calibrate_refuses_trajectory_and_report_on_one_path(tmp_path, scan, capsys):
    cfg = _config(tmp_path, scan, report=str(tmp_path / "t.json"))
    _refused(capsys, ["calibrate", str(cfg)], "calibrate.trajectory and calibrate.report name the same file")
    # the config through a hard link is still the config
    cfg = _config(tmp_path, scan, trajectory=str(tmp_path / "hard.json"))
    os.link(cfg, tmp_path / "hard.json")
    before = cfg.read_bytes()
    _refused(capsys, ["calibrate", str(cfg), "--force"], "share a file (a hard link)")
    assert cfg.read_bytes() == before


def test_calibrate_replaces_only_its_own_files_without_force(tmp_path, scan, capsys):
    cfg = _config(tmp_path, scan)
    (tmp_path / "t.json").write_text('{"mine": 1}')
    _refused(capsys, ["calibrate", str(cfg)], "exists; set calibrate.overwrite")
    _refused(capsys, ["calibrate", str(cfg), "--overwrite"], "not a ctbench dataset or export", "force")
    assert (tmp_path / "t.json").read_text() == '{"mine": 1}'
    assert main(["calibrate", str(cfg), "--force"]) == 0
    assert load_trajectory(tmp_path / "t.json").meta.get("calibrated") is True
    assert main(["calibrate", str(cfg), "--overwrite"]) == 0          # now it is ctbench's: overwrite will do
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "r.json", "t.json"]
    capsys.readouterr()


def test_calibrate_output_folder_that_cannot_take_the_files_is_an_error_at_once(tmp_path, scan, capsys):
    cfg = _config(tmp_path, scan, trajectory=str(tmp_path / "nowhere" / "t.json"))
    _refused(capsys, ["calibrate", str(cfg)], "calibrate.trajectory", "does not exist", "nothing was written")
    ro = tmp_path / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs: {r.stderr.strip()}")
    try:
        cfg = _config(tmp_path, scan, trajectory=str(ro / "t.json"))
        _refused(capsys, ["calibrate", str(cfg)], "read-only file system", "nothing was written")
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)


def test_calibrate_of_a_grid_too_large_for_memory_is_refused_before_allocating(tmp_path, scan, capsys):
    doc = json.loads(_config(tmp_path, scan).read_text())
    doc["geometry"].update(volume_shape=[7000, 7000, 7000], voxel_size_mm=1e-5)
    (tmp_path / "c.json").write_text(json.dumps(doc))
    assert main(["calibrate", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "the calibration needs about" in err and "Unable to allocate" not in err and "Traceback" not in err
    assert not (tmp_path / "t.json").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


def _recon(tmp_path, scan, **extra):
    doc = {"input": {"path": str(scan)}, "geometry": {"detector_offset_u_mm": 0.0, "volume_shape": [8, 16, 16]},
           "output": {"path": str(tmp_path / "v.tif")}} | extra
    cfg = tmp_path / "recon.json"
    cfg.write_text(json.dumps(doc))
    return cfg


def test_recon_never_writes_over_the_trajectory_or_the_known_object_it_names(tmp_path, scan, capsys):
    traj = tmp_path / "calibrated.json"
    circular_trajectory_3d(SPEC.n_views, SPEC.sid, SPEC.sdd).save(traj)
    before = traj.read_bytes()
    cfg = _recon(tmp_path, scan, geometry={"detector_offset_u_mm": 0.0, "trajectory": str(traj)},
                 output={"path": str(traj), "format": "tiff", "force": True})
    _refused(capsys, ["recon", str(cfg), "--quiet"], "is the input")
    assert traj.read_bytes() == before
    obj = tmp_path / "object.tif"
    obj.write_bytes(b"II*\x00")
    cfg = _recon(tmp_path, scan, calibrate={"known_object": str(obj)})
    _refused(capsys, ["recon", str(cfg), "--out", str(obj), "--force", "--quiet"], "is the input")
    assert obj.read_bytes() == b"II*\x00"


def test_recon_with_a_fifo_as_geometry_trajectory_is_rc_2_not_a_hang(tmp_path, scan):
    os.mkfifo(tmp_path / "fifo.json")
    cfg = _recon(tmp_path, scan, geometry={"detector_offset_u_mm": 0.0, "trajectory": str(tmp_path / "fifo.json")})
    p = subprocess.run([sys.executable, "-m", "ctbench.cli", "recon", str(cfg), "--quiet"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "fifo.json: is a FIFO (named pipe), not a regular file" in p.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("change, words", [
    ({"dtype": "float16"}, "'dtype' must be one of ['float32', 'float64']"),
    ({"source": {"x": 1}}, "'source' must be a list of [x, y, z] per view, got an object"),
])
def test_recon_with_a_broken_trajectory_names_the_file_and_field(tmp_path, scan, capsys, change, words):
    doc = circular_trajectory_3d(SPEC.n_views, SPEC.sid, SPEC.sdd).to_dict() | change
    (tmp_path / "t.json").write_text(json.dumps(doc))
    cfg = _recon(tmp_path, scan, geometry={"detector_offset_u_mm": 0.0, "trajectory": str(tmp_path / "t.json")})
    assert main(["recon", str(cfg), "--quiet"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith("ctbench recon: ") and str(tmp_path / "t.json") in last
    assert words in last, last
