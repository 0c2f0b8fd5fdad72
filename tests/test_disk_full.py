"""Full disks (issue 20, finding 12): small tmpfs mounts filled to the last byte, a real bridge on 127.0.0.1.

Needs root (``mount -t tmpfs``); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

from jobs_support import BridgeProcess, make_dataset, wait_for


def _mount(path, size="2m"):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root and mount permission): {r.stderr.strip()}")


def _umount(path):
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(folder):
    """Write until the file system is full; returns the filler (delete it to free the space).

    Unbuffered: a buffered file would try to flush what the full disk refused again when it is closed."""
    filler = folder / "filler.bin"
    block = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError:
            pass
        for _ in range(1 << 16):          # the last partial block, byte by byte
            try:
                if not f.write(b"\0"):
                    break
            except OSError:
                break
    return filler


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "small"
    _mount(mnt)
    yield mnt
    _umount(mnt)


@pytest.mark.slow
def test_submit_and_upload_on_a_full_state_disk_answer_507_and_leave_nothing(tmp_path, tmpfs):
    dataset = tmp_path / "scan.zarr"
    make_dataset(dataset, n=8, n_views=8)
    state = tmpfs / "bridge"
    b = BridgeProcess(state)
    try:
        with httpx.Client(base_url=b.url, headers={"Authorization": f"Bearer {b.token}"}, trust_env=False,
                          timeout=60) as http:
            _fill(tmpfs)
            r = http.post("/jobs", json={"request": {"algorithm": "fbp"}, "dataset": str(dataset)})
            assert r.status_code == 507, r.text
            assert "disk is full" in r.json()["detail"]
            assert list((state / "jobs").iterdir()) == []      # no half-made job directory
            r = http.put("/data/upload.bin", content=os.urandom(200_000))
            assert r.status_code == 507 and "disk is full" in r.json()["detail"], r.text
            assert sorted(p.name for p in (state / "data").iterdir()) == []   # no upload.bin.part
            (tmpfs / "filler.bin").unlink()                   # space again: the bridge works on
            r = http.post("/jobs", json={"request": {"algorithm": "fbp"}, "dataset": str(dataset)})
            assert r.status_code == 201, r.text
            http.post(f"/jobs/{r.json()['id']}/cancel", params={"wait": 60})
    finally:
        b.stop()


@pytest.mark.slow
def test_a_job_whose_output_disk_fills_fails_clearly_and_leaves_no_tmp_write(tmp_path, tmpfs):
    dataset = tmp_path / "scan.zarr"
    make_dataset(dataset, n=16, n_views=12)
    b = BridgeProcess(tmp_path / "state")
    try:
        with httpx.Client(base_url=b.url, headers={"Authorization": f"Bearer {b.token}"}, trust_env=False,
                          timeout=60) as http:
            _fill(tmpfs)
            out = tmpfs / "res.zarr"
            r = http.post("/jobs", json={"request": {"algorithm": "fbp"}, "dataset": str(dataset),
                                         "output": str(out), "threads_per_rank": 1})
            assert r.status_code == 201, r.text
            job = r.json()["id"]
            end = _wait(http, job)
            assert end["state"] == "failed" and "No space left" in end["reason"], end
            assert sorted(p.name for p in tmpfs.iterdir()) == ["filler.bin"]   # no res.zarr(.tmp-write)
    finally:
        b.stop()


def _wait(http, job):
    return wait_for(lambda: (s := http.get(f"/jobs/{job}").json())["state"] in ("succeeded", "failed", "cancelled")
                    and s, 240, f"job {job} to end", poll=0.2)


def test_export_on_a_full_disk_leaves_the_old_file_and_no_staging_sibling(tmpfs):
    from ctbench.io import read_volume
    from ctbench.io.export import export_volume

    old = np.full((4, 8, 8), 3.0, np.float32)
    path = export_volume(tmpfs / "v.h5", old, 0.5)
    _fill(tmpfs)
    with pytest.raises(OSError):
        export_volume(path, np.random.default_rng(0).random((64, 64, 64), dtype=np.float32), 0.5, overwrite=True)
    np.testing.assert_array_equal(read_volume(path)[0], old)
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler.bin", "v.h5"]


def test_a_trajectory_save_on_a_full_disk_keeps_the_old_file_and_leaves_nothing(tmpfs):
    from ctbench.geometry import circular_trajectory_3d, load_trajectory
    from ctbench.output_policy import OutputLocationError

    path = tmpfs / "t.json"
    circular_trajectory_3d(4, 300.0, 600.0).save(path)
    _fill(tmpfs)
    with pytest.raises(OutputLocationError, match="is full"):
        circular_trajectory_3d(3000, 300.0, 600.0).save(path)
    assert load_trajectory(path).n_views == 4
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler.bin", "t.json"]


def test_calibrate_onto_a_full_disk_fails_at_once_not_after_the_calibration(tmp_path, tmpfs):
    import json

    from ctbench.cli import main
    from ctbench.io.selfcal_sample import SelfCalSpec, write_selfcal_sample

    scan = write_selfcal_sample(tmp_path / "scan", SelfCalSpec(n_views=12, detector_u=16, detector_v=12, pitch=4.0,
                                                                offset_u_px=1.0, roll_deg=0.0, drift_rms_px=0.0))
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"input": {"path": str(scan)}, "geometry": {"detector_offset_u_mm": 0.0},
                               "calibrate": {"free": ["offset_u"], "levels": [1], "n_outer": [1],
                                             "trajectory": str(tmpfs / "t.json"), "report": str(tmpfs / "r.json")}}))
    _fill(tmpfs)
    code = subprocess.run([sys.executable, "-m", "ctbench.cli", "calibrate", str(cfg)], capture_output=True,
                          text=True, timeout=300)
    assert code.returncode == 2 and "Traceback" not in code.stderr, code.stderr
    assert "is full" in code.stderr and "nothing was written" in code.stderr
    assert "read scanner scan" not in code.stderr and "calibrating" not in code.stderr   # before any work
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler.bin"]
    (tmpfs / "filler.bin").unlink()
    assert main(["calibrate", str(cfg)]) == 0                  # with space again it runs
    assert sorted(p.name for p in tmpfs.iterdir()) == ["r.json", "t.json"]
