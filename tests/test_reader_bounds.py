"""The napari reader path is bounded: lazy volumes, no FIFO hangs, metadata cannot make it allocate gigabytes."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
import zarr

from ctbench.workbench.dataset import save_dataset
from ctbench.workbench.design import TrajectoryDesign
from ctbench_napari._io import get_reader, read_dataset, read_trajectory


def _in_thread(fn, timeout=60):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the reader blocked"
    return out


def test_a_tiny_trajectory_json_cannot_ask_for_twenty_million_views(tmp_path, monkeypatch):
    g = TrajectoryDesign(kind="circular", n_views=4).build()
    g.trajectory.save(tmp_path / "t.json")
    d = json.loads((tmp_path / "t.json").read_text())
    d["meta"]["design"]["n_views"] = 20_000_000   # the saved design would build 2e7 views (2.7 GB)
    (tmp_path / "t.json").write_text(json.dumps(d))
    assert get_reader(str(tmp_path / "t.json")) is read_trajectory
    with pytest.raises(ValueError, match=r"20000000 views, more than the reader's bound of 100000.*"
                                         r"CTBENCH_READER_MAX_VIEWS"):
        read_trajectory(str(tmp_path / "t.json"))
    d["meta"]["design"]["n_views"] = 40
    (tmp_path / "t.json").write_text(json.dumps(d))
    monkeypatch.setenv("CTBENCH_READER_MAX_VIEWS", "30")
    with pytest.raises(ValueError, match="bound of 30"):
        read_trajectory(str(tmp_path / "t.json"))
    monkeypatch.setenv("CTBENCH_READER_MAX_VIEWS", "40")   # the explicit override
    assert read_trajectory(str(tmp_path / "t.json"))


def test_fifos_and_huge_json_are_not_read(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "pipe.json")
    out = _in_thread(lambda: get_reader(str(tmp_path / "pipe.json")))
    assert out == {"value": None}
    (tmp_path / "dev.json").symlink_to("/dev/zero")
    assert _in_thread(lambda: get_reader(str(tmp_path / "dev.json"))) == {"value": None}
    (tmp_path / "big.json").write_text(json.dumps({"format": "ctbench.trajectory", "pad": "x" * 5000}))
    monkeypatch.setenv("CTBENCH_READER_MAX_BYTES", "1000")
    assert get_reader(str(tmp_path / "big.json")) is None


def test_dataset_volume_stays_lazy_and_sinogram_is_bounded(tmp_path, monkeypatch):
    g = TrajectoryDesign(kind="circular", n_views=6, detector_u=8, detector_v=4, volume_d=3, volume_h=4,
                         volume_w=5).build()
    vol = np.random.default_rng(0).random((3, 4, 5)).astype(np.float32)
    p = save_dataset(tmp_path / "d.zarr", volume=vol, sinogram=np.ones(g.sinogram_shape, np.float32),
                     geometry=g, voxel_spacing=0.5)
    (vdata, vkw, _), _ = read_dataset(str(p))
    assert isinstance(vdata, zarr.Array)         # napari reads the slices it shows
    np.testing.assert_array_equal(vdata[...], vol)
    assert vkw["scale"] == [0.5, 0.5, 0.5]
    monkeypatch.setenv("CTBENCH_READER_MAX_BYTES", "100")
    with pytest.raises(ValueError, match="more than the reader's bound of 100 bytes; raise CTBENCH_READER_MAX_BYTES"):
        read_dataset(str(p))
