"""Disk-CGLS checkpoints: every byte a resume reads is checked (issue 20, finding 6), chunk positions included.

Real zarr stores on disk; a refused checkpoint must leave the work folder byte for byte as it was, and an
untouched checkpoint must still resume to the uninterrupted run's result.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ctbench.solvers import CheckpointError, disk_cgls

from test_disk_cgls import make_projector, sinogram_store, snapshot

CK = Path("rank-00000") / "checkpoints" / "iter-000002"


def _run(tmp_path, budget=None):
    P = make_projector()
    store, _ = sinogram_store(tmp_path / "b.zarr", P)
    work = tmp_path / "work"
    disk_cgls(P, store, work, 2, checkpoint_every=2, memory_budget=budget)
    return P, store, work


def _edit_manifest(work: Path, edit) -> None:
    path = work / CK / "manifest.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, indent=1))   # still valid JSON, as a hand edit would leave it


@pytest.mark.parametrize("what, edit", [
    ("gamma", lambda d: d["scalars"].__setitem__("gamma", d["scalars"]["gamma"] * 1.5)),
    ("b_norm", lambda d: d["scalars"].__setitem__("b_norm", 1.0)),
    ("residuals", lambda d: d["residuals"].__setitem__(0, 0.0)),
    ("history", lambda d: d["history"].append({})),
])
def test_an_edited_manifest_scalar_is_detected_and_resume_refused(tmp_path, what, edit):
    P, store, work = _run(tmp_path)
    _edit_manifest(work, edit)
    before = snapshot(work)
    with pytest.raises(CheckpointError, match="was modified after it was written"):
        disk_cgls(P, store, work, 4, checkpoint_every=2, resume=True)
    assert snapshot(work) == before


def test_a_manifest_without_checksum_is_refused_with_the_reason(tmp_path):
    P, store, work = _run(tmp_path)
    _edit_manifest(work, lambda d: (d.pop("checksum"), d.__setitem__("version", 1)))
    with pytest.raises(CheckpointError, match="without the checksum"):
        disk_cgls(P, store, work, 4, checkpoint_every=2, resume=True)


def test_a_valid_chunk_copied_over_another_chunks_position_is_refused(tmp_path):
    P, store, work = _run(tmp_path, budget=90_000)   # small windows: stores of several chunks
    stores = [sorted(p for p in (work / CK / f"{n}.zarr").rglob("*") if p.is_file() and p.name != "zarr.json")
              for n in ("x", "r", "p")]
    chunks = max(stores, key=len)
    assert len(chunks) >= 2, "no store of the checkpoint has two chunks"
    a, b = chunks[0], chunks[1]
    assert a.read_bytes() != b.read_bytes()
    shutil.copyfile(a, b)     # a complete, self-consistent chunk, in the wrong place
    with pytest.raises(CheckpointError, match=f"{b.relative_to(work / CK).as_posix()} is (corrupted|truncated)"):
        disk_cgls(P, store, work, 4, checkpoint_every=2, resume=True, memory_budget=90_000)


def test_an_untouched_checkpoint_still_resumes_to_the_uninterrupted_result(tmp_path):
    P, store, work = _run(tmp_path)
    resumed = disk_cgls(P, store, work, 4, checkpoint_every=2, resume=True)
    straight = disk_cgls(P, store, tmp_path / "straight", 4)
    assert torch.equal(resumed.volume.read(), straight.volume.read())
    assert resumed.residuals == straight.residuals and resumed.n_iter == 4
