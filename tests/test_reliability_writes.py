"""One way out (issue 47): trajectory saves and every other small write go through the output policy and an
exclusively created temporary file, so a planted link never redirects a write and nothing is half-written.

Before issue 47, ``Trajectory.save`` wrote through the fixed name ``x.json.tmp`` (a link planted there
overwrote its target), and so did ``save_config``, the job files, the bridge token, the Slurm script, the
diffct checkpoints and ``NpyStore.create`` under their fixed or pid-derived names.
"""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
import torch

from ctbench.geometry import Trajectory, circular_trajectory_3d, load_trajectory
from ctbench.output_policy import (FileReservation, ForeignOutputError, OutputLocationError, OutputOverlapError,
                                   write_file, written_by_ctbench)

VICTIM = b"precious bytes of another file\n"


def _victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_bytes(VICTIM)
    return v


def _leftovers(folder, keep):
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_a_link_planted_at_the_old_temporary_name_does_not_redirect_trajectory_save(tmp_path):
    victim = _victim(tmp_path)
    path = tmp_path / "orbit.json"
    os.symlink(victim, tmp_path / "orbit.json.tmp")              # the name Trajectory.save used to write through
    traj = circular_trajectory_3d(6, 300.0, 600.0)
    traj.save(path)
    assert victim.read_bytes() == VICTIM
    assert load_trajectory(path).n_views == 6 and not path.is_symlink()
    assert _leftovers(tmp_path, {"orbit.json", "victim.txt"}) == ["orbit.json.tmp"]   # the planted link, untouched


def test_trajectory_save_follows_the_output_policy(tmp_path):
    traj = circular_trajectory_3d(4, 300.0, 600.0)
    path = tmp_path / "t.json"
    traj.save(path)
    assert written_by_ctbench(path)
    circular_trajectory_3d(5, 300.0, 600.0).save(path)           # its own output: replaced (overwrite=True default)
    assert load_trajectory(path).n_views == 5
    with pytest.raises(FileExistsError, match="overwrite"):
        traj.save(path, overwrite=False)
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": true}')
    with pytest.raises(ForeignOutputError, match="not a ctbench"):
        traj.save(foreign)
    assert foreign.read_text() == '{"mine": true}'
    traj.save(foreign, force=True)                               # forced: the user's decision
    assert load_trajectory(foreign).n_views == 4
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "pipe.json")
    for p in ("dir.json", "pipe.json"):                          # never replaced by a file, even forced
        with pytest.raises(ForeignOutputError, match="a file output replaces only a file"):
            traj.save(tmp_path / p, force=True)
    scan = tmp_path / "scan.tif"
    scan.write_bytes(b"II*\x00")
    with pytest.raises(OutputOverlapError, match="is the input"):
        traj.save(scan, force=True, inputs=[scan])
    assert scan.read_bytes() == b"II*\x00"
    assert _leftovers(tmp_path, {"t.json", "notes.json", "dir.json", "pipe.json", "scan.tif"}) == []


def test_saved_files_get_the_users_permissions_not_the_temporary_files(tmp_path):
    old = os.umask(0o022)
    try:
        circular_trajectory_3d(3, 300.0, 600.0).save(tmp_path / "t.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "t.json").st_mode) == 0o644


def test_a_reservation_fails_at_once_where_the_output_cannot_go(tmp_path):
    with pytest.raises(OutputLocationError, match="does not exist"):
        FileReservation(tmp_path / "missing" / "t.json")
    with FileReservation(tmp_path / "t.json", reserve_bytes=1 << 20) as r:
        staging = r.staging
        assert staging.exists() and os.stat(staging).st_blocks * 512 >= 1 << 20   # the space is allocated now
    assert not staging.exists() and not (tmp_path / "t.json").exists()           # no commit: nothing stays
    r = FileReservation(tmp_path / "t.json", reserve_bytes=100)
    r.commit(b'{"format": "ctbench.test"}')
    assert (tmp_path / "t.json").read_bytes() == b'{"format": "ctbench.test"}'
    assert _leftovers(tmp_path, {"t.json"}) == []
    with pytest.raises(ValueError, match="already committed"):
        r.commit(b"again")


def test_write_file_refuses_what_ctbench_did_not_write_unless_forced(tmp_path):
    p = tmp_path / "r.json"
    write_file(p, b'{"format": "ctbench.calibration-report", "x": 1}')
    write_file(p, b'{"format": "ctbench.calibration-report", "x": 2}', overwrite=True)
    assert json.loads(p.read_text())["x"] == 2
    p.write_text('{"x": 3}')                                     # edited by someone else: no longer ctbench's
    with pytest.raises(ForeignOutputError):
        write_file(p, b"{}", overwrite=True)
    assert p.read_text() == '{"x": 3}'


# ------------------------------------------------------------------ the other writers' temporary files
def test_the_other_small_writers_never_write_through_a_planted_link(tmp_path):
    from ctbench.jobs._files import write_json_atomic
    from ctbench.jobs.bridge import read_or_create_token
    from ctbench.pipeline.config import parse_config, save_config

    pid = os.getpid()
    victim = _victim(tmp_path)
    # save_config: ".NAME.tmp-PID"
    os.symlink(victim, tmp_path / f".recon.json.tmp-{pid}")
    save_config(parse_config({"input": {"path": "scan"}}), tmp_path / "recon.json")
    # the bridge's and the worker's JSON files: "NAME.PID.tmp"
    os.symlink(victim, tmp_path / f"spec.json.{pid}.tmp")
    write_json_atomic(tmp_path / "spec.json", {"a": 1})
    # the bridge token: "token.PID.tmp" (its target was truncated and got the token)
    state = tmp_path / "state"
    state.mkdir()
    os.symlink(victim, state / f"token.{pid}.tmp")
    token = read_or_create_token(state)
    assert victim.read_bytes() == VICTIM
    assert json.loads((tmp_path / "recon.json").read_text())["input"]["path"] == "scan"
    assert json.loads((tmp_path / "spec.json").read_text()) == {"a": 1}
    assert len(token) > 20 and (state / "token").read_text().strip() == token
    assert stat.S_IMODE(os.stat(state / "token").st_mode) == 0o600
    assert read_or_create_token(state) == token


def test_a_fifo_token_file_is_refused_without_blocking(tmp_path):
    from ctbench.guarded_open import InputError
    from ctbench.jobs.bridge import read_or_create_token

    os.mkfifo(tmp_path / "token")
    with pytest.raises(InputError, match="FIFO"):
        read_or_create_token(tmp_path)


def test_slurm_script_and_diffct_checkpoint_and_npy_store_never_follow_a_planted_link(tmp_path):
    from ctbench.compat.storage import NpyStore
    from ctbench.jobs.slurm import prepare_job
    from ctbench.jobs.spec import JobSpec

    victim = _victim(tmp_path)
    job = tmp_path / "job"
    job.mkdir()
    os.symlink(victim, job / "job.sbatch.tmp")
    (tmp_path / "scan.zarr").mkdir()
    spec = JobSpec(request={"algorithm": "fbp"}, dataset=str(tmp_path / "scan.zarr"))
    with pytest.raises(FileExistsError):           # the job folder is not empty (the planted link): refused
        prepare_job(spec, job)
    os.unlink(job / "job.sbatch.tmp")
    script = prepare_job(spec, job)
    assert script.read_text().startswith("#!") and os.access(script, os.X_OK)

    npy = tmp_path / "x.npy"
    os.symlink(victim, tmp_path / f".x.npy.{os.getpid()}.tmp")
    store = NpyStore.create(npy, (2, 3), dtype=torch.float32)
    assert store.shape == (2, 3) and victim.read_bytes() == VICTIM
    assert np.load(npy).shape == (2, 3)


def test_the_diffct_checkpoint_metadata_never_follows_a_planted_link(tmp_path):
    from ctbench.compat import _checkpoint

    victim = _victim(tmp_path)
    folder = _checkpoint._rank_dir(tmp_path / "ck" / "step-000003", 0)
    folder.mkdir(parents=True)
    os.symlink(victim, folder / "metadata.json.tmp")                # the name it used to write through
    _checkpoint.save(tmp_path / "ck", 3, {"x": torch.ones(2, 2)}, {"algorithm": "cgls"}, [1.0], 1.0, 1 << 20)
    assert victim.read_bytes() == VICTIM
    assert json.loads((folder / "metadata.json").read_text())["iteration"] == 3


def test_a_trajectory_loaded_from_a_file_is_checked_field_by_field(tmp_path):
    from ctbench.guarded_open import InputError

    doc = circular_trajectory_3d(4, 300.0, 600.0).to_dict()
    cases = {"float16": ({"dtype": "float16"}, "'dtype' must be one of ['float32', 'float64']"),
             "dict source": ({"source": {"x": 1}}, "'source' must be a list of [x, y, z] per view, got an object"),
             "strings": ({"detector_u": [["a", "b", "c"]] * 4}, "view 0 must be [x, y, z]"),
             "short": ({"detector_v": [[0, 0, 1]] * 3}, "has 3 views but 'source' has 4"),
             "inf": ({"dtype": "float64", "source": [[1e999, 0, 0]] * 4}, "NaN or infinite at views [0, 1, 2, 3]"),
             "float32 overflow": ({"dtype": "float32", "source": [[1e300, 0, 0]] * 4}, "beyond float32's range"),
             "huge int": ({"source": [[10 ** 400, 0, 0]] * 4}, "beyond the range of float64"),
             "ndim": ({"ndim": True}, "'ndim' must be 2 or 3"),
             "meta": ({"meta": None}, "'meta' must be an object, got null"),
             "angles": ({"meta": {"angles": [0.0, "x"]}}, "'meta.angles' must be 4 finite numbers")}
    for name, (change, words) in cases.items():
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({**doc, **change}))
        with pytest.raises(InputError) as e:
            load_trajectory(p)
        assert str(p) in str(e.value) and words in str(e.value), (name, str(e.value))
    p = tmp_path / "deep.json"
    p.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(InputError, match="nested too deeply"):
        load_trajectory(p)
    with pytest.raises(ValueError, match="malformed"):
        Trajectory.from_json("{" * 50000)


def test_a_trajectory_file_that_is_a_fifo_a_device_or_a_bomb_is_refused_without_reading_it(tmp_path):
    from ctbench.guarded_open import InputError

    os.mkfifo(tmp_path / "fifo.json")
    os.symlink("/dev/zero", tmp_path / "zero.json")
    with open(tmp_path / "sparse.json", "wb") as f:
        f.truncate(4 << 30)
    for name, words in (("fifo.json", "FIFO"), ("zero.json", "character device"), ("sparse.json", "bound")):
        with pytest.raises(InputError, match=words):
            load_trajectory(tmp_path / name)
