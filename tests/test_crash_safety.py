"""Crash safety of every write path, with real SIGKILLs of real subprocesses on real zarr stores.

- save_dataset(overwrite=True) killed at each stage of the save: the path then
  holds the old dataset or the new one, complete (checked against both, value
  by value), and the next save leaves no temporary folder behind.
- project_into / fdk_into killed between windows: the output store reports
  itself incomplete on read (IncompleteStoreError), a resume writes only what
  is missing and equals the in-memory result, a run over an older output that
  is killed reports the mixture, and fdk's scratch lives next to the output
  and is cleaned up, with no .partial files left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "crash_scripts"
sys.path.insert(0, str(SCRIPTS))

from crash_cases import N_VIEWS, VOLUME_SHAPE, projector  # noqa: E402

from ctbench.storage import IncompleteStoreError, TensorStore, ZarrStore, project_into  # noqa: E402
from ctbench.workbench.dataset import load_dataset, save_dataset  # noqa: E402

OLD_VOLUME = np.arange(12 * 10 * 8, dtype=np.float32).reshape(12, 10, 8) * -1.0
NEW_VOLUME = np.arange(12 * 10 * 8, dtype=np.float32).reshape(12, 10, 8) + 1000


def run_child(script: str, *args, tmpdir=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)


def assert_killed(proc):
    assert proc.returncode == -signal.SIGKILL, f"child was not killed (rc {proc.returncode}):\n{proc.stdout}\n" \
                                               f"{proc.stderr[-3000:]}"


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


# ------------------------------------------------------------ save_dataset
@pytest.mark.parametrize("mode, n, expect", [
    ("writing_new", 5, "old"),            # killed while the new dataset is being written aside
    ("before_swap", 0, "old"),            # new one complete, not swapped in
    ("after_swap", 0, "new"),             # atomic exchange done, old not deleted yet
    ("between_renames", 0, "new"),        # fallback swap: old moved aside, new not in place yet
    ("deleting_old", 4, "new"),           # old dataset half deleted (after the exchange)
    ("deleting_old_renames", 4, "new"),   # old dataset half deleted (after the fallback renames)
])
def test_save_dataset_overwrite_killed_keeps_old_or_new_complete(tmp_path, mode, n, expect):
    path = tmp_path / "scan.zarr"
    save_dataset(path, volume=OLD_VOLUME, voxel_spacing=0.25, chunks=4, meta={"which": "old"})
    assert_killed(run_child("save_and_die.py", mode, path, n))

    ds = load_dataset(path)  # finishes a swap that the kill interrupted, verifies every chunk
    assert ds.meta == {"which": expect}
    if expect == "old":
        np.testing.assert_array_equal(ds.volume, OLD_VOLUME)
        assert ds.sinogram is None and ds.voxel_spacing == (0.25,) * 3
    else:
        np.testing.assert_array_equal(ds.volume, NEW_VOLUME)
        np.testing.assert_array_equal(ds.sinogram, np.full((5, 6, 4), 3.0, np.float32))
        assert ds.voxel_spacing == (0.5,) * 3
    # The next save cleans what the dead writer left next to the dataset.
    save_dataset(path, volume=OLD_VOLUME[:2], voxel_spacing=1.0, overwrite=True)
    assert siblings(path) == []
    np.testing.assert_array_equal(load_dataset(path).volume, OLD_VOLUME[:2])


def test_save_dataset_refuses_to_replace_what_is_not_a_dataset(tmp_path):
    other = tmp_path / "notes.zarr"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a ctbench dataset"):
        save_dataset(other, volume=OLD_VOLUME, voxel_spacing=1.0, overwrite=True)
    assert (other / "keep.txt").read_text() == "mine"


# ------------------------------------------------------- streaming outputs
def _volume_store(tmp_path, name, seed):
    g = torch.Generator().manual_seed(seed)
    vol = torch.rand(VOLUME_SHAPE, generator=g, dtype=torch.float64)
    store = ZarrStore.create(tmp_path / name, VOLUME_SHAPE, torch.float64, chunks=(4, 10, 10))
    store.write(None, vol)
    return vol


@pytest.mark.slow
def test_project_into_killed_is_reported_resumed_and_mixed_runs_are_caught(tmp_path):
    P = projector()
    vol_a = _volume_store(tmp_path, "a.zarr", 1)
    vol_b = _volume_store(tmp_path, "b.zarr", 2)
    truth_a, truth_b = P.project(vol_a), P.project(vol_b)
    sino = tmp_path / "sino.zarr"
    ZarrStore.create(sino, (N_VIEWS, *P.detector_shape), torch.float64, chunks=(2, 10, 6))

    # Killed after the 3rd of 6 view batches was written, before it was recorded.
    assert_killed(run_child("stream_and_die.py", "project", tmp_path / "a.zarr", sino, 3))
    store = ZarrStore.open(sino, "r")
    rec = store.completion_record()
    assert rec.operation == "project" and not rec.complete and rec.done == [[0, 2], [2, 4]]
    torch.testing.assert_close(store.read((slice(0, 4),)), truth_a[:4], rtol=0, atol=0)
    with pytest.raises(IncompleteStoreError, match=r"stopped after 2 of 6 windows.*resume=True"):
        store.read()
    from ctbench.storage import backproject_into
    back = ZarrStore.create(tmp_path / "back.zarr", VOLUME_SHAPE, torch.float64)
    with pytest.raises(IncompleteStoreError):  # an incomplete store is refused as an input too
        backproject_into(P, store, back)

    # Resume: only the missing windows are computed; the result is the in-memory projection.
    written = []
    real_write = ZarrStore.write
    ZarrStore.write = lambda self, w, v: (written.append(w[0].start), real_write(self, w, v))[1]
    try:
        project_into(P, ZarrStore.open(tmp_path / "a.zarr", "r"), ZarrStore.open(sino), resume=True)
    finally:
        ZarrStore.write = real_write
    assert written == [4, 6, 8, 10]
    done = ZarrStore.open(sino, "r")
    assert done.completion_record().complete
    torch.testing.assert_close(done.read(), truth_a, rtol=1e-12, atol=1e-12)

    # A run of other inputs over this complete output, killed midway: the mixture is reported.
    assert_killed(run_child("stream_and_die.py", "project", tmp_path / "b.zarr", sino, 2))
    mixed = ZarrStore.open(sino, "r")
    assert mixed.completion_record().done == [[0, 2]]
    torch.testing.assert_close(mixed.read((slice(0, 2),)), truth_b[:2], rtol=1e-12, atol=1e-12)
    with pytest.raises(IncompleteStoreError, match="earlier run"):
        mixed.read((slice(2, 6),))
    assert torch.equal(ZarrStore.open(sino, "r", allow_incomplete=True).read((slice(4, 6),)), truth_a[4:6])
    with pytest.raises(ValueError, match="other inputs"):  # resuming with the wrong input is refused
        project_into(P, ZarrStore.open(tmp_path / "a.zarr", "r"), ZarrStore.open(sino), resume=True)
    project_into(P, ZarrStore.open(tmp_path / "a.zarr", "r"), ZarrStore.open(sino))  # redo
    torch.testing.assert_close(ZarrStore.open(sino, "r").read(), truth_a, rtol=1e-12, atol=1e-12)


def test_fdk_into_killed_leaves_scratch_next_to_the_output_and_the_rerun_cleans_it(tmp_path):
    from ctbench.solvers import fdk, fdk_into

    P = projector(fdk=True)
    vol = torch.rand(VOLUME_SHAPE, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    sino = P.project(vol)
    sino_store = ZarrStore.create(tmp_path / "s.zarr", tuple(sino.shape), torch.float64, chunks=(3, 10, 6))
    sino_store.write(None, sino)
    out = tmp_path / "out" / "v.zarr"
    ZarrStore.create(out, VOLUME_SHAPE, torch.float64, chunks=(2, 10, 10))
    child_tmp = tmp_path / "child_tmp"
    child_tmp.mkdir()

    # Killed half-way through a chunk file of the 2nd slab.
    assert_killed(run_child("stream_and_die.py", "fdk", out, tmp_path / "s.zarr", 1, "partial", tmpdir=child_tmp))
    left = siblings(out)
    assert len(left) == 1 and left[0].startswith(".v.zarr.fdk-scratch-"), left  # scratch next to the output
    assert list(child_tmp.iterdir()) == []                                       # nothing in the system temp
    partial = [f for _, _, fs in os.walk(out) for f in fs if f.endswith(".partial")]
    assert partial, "the kill should have left a half-written chunk file"
    with pytest.raises(IncompleteStoreError):
        ZarrStore.open(out, "r").read()

    fdk_into(P, ZarrStore.open(tmp_path / "s.zarr", "r"), ZarrStore.open(out), resume=True)
    assert siblings(out) == []                                                   # dead run's scratch removed
    assert [f for _, _, fs in os.walk(out) for f in fs if f.endswith(".partial")] == []
    torch.testing.assert_close(ZarrStore.open(out, "r").read(), fdk(P, sino), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["project", "backproject"])
def test_tensor_store_outputs_carry_the_record_too(kind):
    from ctbench.storage import backproject_into

    P = projector()
    vol = torch.rand(VOLUME_SHAPE, dtype=torch.float64)
    sino = P.project(vol)
    if kind == "project":
        source, out, call, truth = TensorStore(vol), TensorStore.empty(tuple(sino.shape), torch.float64), \
            project_into, sino
    else:
        source, out, call, truth = TensorStore(sino), TensorStore.empty(VOLUME_SHAPE, torch.float64), \
            backproject_into, P.backproject(sino)
    calls = [0]
    real = TensorStore.write

    def failing(self, w, v):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError("disk full")
        real(self, w, v)
    TensorStore.write = failing
    try:
        with pytest.raises(OSError, match="disk full"):
            call(P, source, out)
    finally:
        TensorStore.write = real
    assert out.completion_record().done == [list(out.completion_record().windows[0])]
    with pytest.raises(IncompleteStoreError):
        out.read()
    call(P, source, out, resume=True)
    assert out.completion_record().complete
    torch.testing.assert_close(out.read(), truth, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------ file outputs (issue 47)
@pytest.mark.parametrize("mode, expect", [
    ("reserved", "old"),           # staging file created beside the output, nothing written
    ("writing", "old"),            # half of the new JSON written into it
    ("before_exchange", "old"),    # new file complete and flushed, not swapped
    ("after_exchange", "new"),     # swapped, the old bytes not yet deleted
    ("between_renames", "new"),    # no atomic exchange: old moved aside, new not in place yet
])
def test_trajectory_save_killed_keeps_old_or_new_and_the_next_save_cleans_up(tmp_path, mode, expect):
    from ctbench.geometry import circular_trajectory_3d, load_trajectory

    path = tmp_path / "orbit.json"
    circular_trajectory_3d(5, 300.0, 600.0).save(path)
    assert_killed(run_child("trajectory_and_die.py", mode, path))
    assert load_trajectory(path).n_views == (5 if expect == "old" else 7)     # whole, never a mixture
    circular_trajectory_3d(3, 300.0, 600.0).save(path)
    assert load_trajectory(path).n_views == 3 and siblings(path) == []     # the dead writer's staging is gone


def _selfcal_config(tmp_path):
    import json

    from ctbench.io.selfcal_sample import SelfCalSpec, write_selfcal_sample

    scan = write_selfcal_sample(tmp_path / "scan", SelfCalSpec(n_views=12, detector_u=16, detector_v=12, pitch=4.0,
                                                                offset_u_px=1.0, roll_deg=0.0, drift_rms_px=0.0))
    out = tmp_path / "out"
    out.mkdir()
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"input": {"path": str(scan)}, "geometry": {"detector_offset_u_mm": 0.0},
                               "calibrate": {"free": ["offset_u"], "levels": [1], "n_outer": [1], "n_inner": 1,
                                             "trajectory": str(out / "t.json"), "report": str(out / "r.json")}}))
    return cfg, out


def test_calibrate_killed_mid_run_or_between_its_two_files_keeps_each_whole(tmp_path):
    import json

    from ctbench.cli import main
    from ctbench.geometry import load_trajectory

    cfg, out = _selfcal_config(tmp_path)
    assert main(["calibrate", str(cfg)]) == 0
    first_traj, first_report = (out / "t.json").read_bytes(), (out / "r.json").read_bytes()

    # killed while calibrating: both files as they were, the two staging files the only leftovers
    assert_killed(run_child("calibrate_and_die.py", "calibrating", cfg))
    assert (out / "t.json").read_bytes() == first_traj and (out / "r.json").read_bytes() == first_report
    left = sorted(os.listdir(out))
    assert len(left) == 4 and all(n.startswith((".t.json.new-", ".r.json.new-")) for n in left[:2]), left

    # killed between the two commits: the trajectory is the new one, the report still the old one, both whole
    doc = json.loads(cfg.read_text())
    doc["calibrate"]["bounds"] = {"offset_u": [-3, 3]}          # another run: its report differs
    cfg.write_text(json.dumps(doc))
    assert_killed(run_child("calibrate_and_die.py", "between_commits", cfg))
    load_trajectory(out / "t.json")
    assert json.loads((out / "r.json").read_bytes()) == json.loads(first_report)

    # the next run cleans what the dead ones left and writes both
    assert main(["calibrate", str(cfg), "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == ["r.json", "t.json"]
    assert json.loads((out / "r.json").read_text())["parameters"][0]["bounds"] == [-3, 3]


def test_a_job_rank_killed_while_writing_its_result_leaves_nothing_the_next_write_keeps(tmp_path):
    import json

    sys.path.insert(0, str(HERE))
    from jobs_support import make_dataset

    make_dataset(tmp_path / "scan.zarr", n=8, n_views=8)
    job = tmp_path / "jobs" / "job-1"
    job.mkdir(parents=True)
    out = tmp_path / "res.zarr"
    (job / "spec.json").write_text(json.dumps({"request": {"algorithm": "fbp"}, "dataset": str(tmp_path / "scan.zarr"),
                                               "output": str(out)}))
    assert_killed(run_child("result_and_die.py", "writing", job))
    left = siblings(tmp_path / "res.zarr")
    assert not out.exists() and any(n.startswith(".res.zarr.new-") for n in left), left
    p = run_child("result_and_die.py", "complete", job)
    assert p.returncode == 0, p.stderr[-3000:]
    ds = load_dataset(out)                                  # whole, every chunk verified
    np.testing.assert_array_equal(ds.volume, np.ones((8, 8, 8), np.float32))
    assert not any(n.startswith(".res.zarr.") for n in siblings(out))   # the killed rank's staging removed
