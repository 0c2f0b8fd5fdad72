"""fsync at the commit points (issue 20, "survive kill -9 but not a power cut").

A power cut cannot be simulated here; what is checked is that every byte of a commit and the directory
entry that publishes it are handed to ``fsync`` before (bytes) and after (directory) the commit, by
recording the path behind each fsynced descriptor, and that ``CTBENCH_FSYNC=0`` turns it off.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ctbench import atomic_files


@pytest.fixture
def fsynced(monkeypatch):
    """The real paths of the descriptors passed to os.fsync, in order."""
    seen: list[str] = []
    real = os.fsync

    def recording(fd):
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return seen


def _files(folder: Path) -> set[str]:
    return {os.path.realpath(p) for p in folder.rglob("*") if p.is_file()}


def test_a_dataset_save_flushes_every_file_before_the_swap_and_the_folder_after(tmp_path, fsynced):
    from ctbench.workbench.dataset import save_dataset

    path = save_dataset(tmp_path / "d.zarr", volume=np.ones((4, 5, 6), np.float32), voxel_spacing=1.0, chunks=2)
    files = {os.path.relpath(p, tmp_path) for p in _files(path)}
    # every file was flushed under its staging name (before the rename that published it)
    rel = [Path(os.path.relpath(p, tmp_path)).parts for p in fsynced]
    flushed = {"/".join(r[1:]) for r in rel if r and r[0].startswith(".d.zarr.new-")}
    assert {"/".join(Path(f).parts[1:]) for f in files} <= flushed
    assert fsynced[-1] == str(tmp_path)       # the parent folder, last: the rename itself is durable


def test_an_export_replace_is_flushed_and_nothing_when_fsync_is_off(tmp_path, fsynced, monkeypatch):
    from ctbench.io.export import export_volume

    path = export_volume(tmp_path / "v.h5", np.ones((3, 4, 4), np.float32), 0.5)
    assert any(Path(p).name.startswith(".v.h5.new-") for p in fsynced) and fsynced[-1] == str(tmp_path)
    fsynced.clear()
    monkeypatch.setenv("CTBENCH_FSYNC", "0")
    export_volume(path, np.zeros((3, 4, 4), np.float32), 0.5, overwrite=True)
    assert fsynced == []
    with atomic_files.durability(True):
        export_volume(path, np.ones((3, 4, 4), np.float32), 0.5, overwrite=True)
    assert fsynced and fsynced[-1] == str(tmp_path)


def test_a_checkpoint_flushes_its_state_before_publishing_it_and_its_manifest(tmp_path, fsynced):
    from test_disk_cgls import make_projector, sinogram_store

    from ctbench.solvers import disk_cgls

    P = make_projector()
    store, _ = sinogram_store(tmp_path / "b.zarr", P)
    fsynced.clear()
    disk_cgls(P, store, tmp_path / "work", 1, checkpoint_every=1)
    ck = tmp_path / "work" / "rank-00000" / "checkpoints"
    final = ck / "iter-000001"
    state = {os.path.relpath(p, final) for p in _files(final)} - {"manifest.json", "part.json"}
    flushed = {"/".join(Path(os.path.relpath(p, ck)).parts[1:]) for p in fsynced
               if os.path.relpath(p, ck).startswith(".iter-000001.partial-")}
    assert state and state <= flushed                       # every state file, before the rename
    names = [os.path.relpath(p, ck) for p in fsynced if p.startswith(str(ck))]
    i_manifest = max(i for i, n in enumerate(names) if n.startswith("iter-000001/.manifest.json."))
    assert "iter-000001" in names[i_manifest + 1:]          # the folder holding the manifest, after its rename


def test_the_job_table_commits_with_synchronous_full(tmp_path):
    from ctbench.jobs.store import JobStore

    store = JobStore(tmp_path / "jobs.db")
    assert store._conn().execute("PRAGMA synchronous").fetchone()[0] == 2     # 2 = FULL
    assert store._conn().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert isinstance(store._conn(), sqlite3.Connection)
