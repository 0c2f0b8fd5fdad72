"""Rank-local checkpoints of a disk-backed solver, written atomically and verified on resume.

Every rank keeps its checkpoints under its own folder (``<work_dir>/rank-00000/checkpoints``), so ranks
on different nodes need no shared file system.  Writing checkpoint ``k``:

1. each rank copies the state it owns into ``.iter-0000k.partial-<pid>`` and records the size and
   SHA-256 of every file in ``part.json``, then renames the folder to ``iter-0000k`` (atomic);
2. all ranks meet at a barrier: every rank's part is complete;
3. each rank writes ``manifest.json`` (iteration, solver scalars, fingerprints of the scan geometry,
   data, grid, partition, world size and dtype, and a SHA-256 ``checksum`` over all of that) through a
   temporary file, an fsync and a rename, last;
4. after a second barrier, older checkpoints are removed.

A checkpoint counts only with its manifest: a crash at any point leaves the previous complete
checkpoint on every rank.  Resume agrees across ranks on the newest iteration complete on all of
them, checks the manifest's fingerprints against the run (a mismatch names what differs) and every
file's size and checksum (a truncated or corrupted file is named), and only then restores.  A refused
checkpoint is left exactly as it was.

What the checks cover: every byte a resume reads.  The manifest's own checksum covers its scalars
(``gamma``, ``b_norm``), residuals, history, fingerprints and ``part_sha256``; ``part.json`` lists every
state file by its path relative to the checkpoint with its size and SHA-256, so a chunk file copied
over another chunk's position fails its check (the digest is bound to the path, i.e. the chunk index).
The parts are flushed (fsync) before the rename that publishes them, and the folder after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import torch

from .. import guarded_open
from ..atomic_files import atomic_write_bytes, fsync_dir, fsync_tree

FORMAT = "ctbench-disk-solver-checkpoint"
VERSION = 2   # 2: the manifest carries a checksum over its content (version 1 manifests are refused)
_NAME = re.compile(r"^iter-(\d{6,})$")


class CheckpointError(ValueError):
    """A checkpoint cannot be used to resume this run (the message names why); nothing was changed."""


# ------------------------------------------------------------------ collectives
def _group_size(group) -> int:
    if group is None:
        return 1
    import torch.distributed as dist
    return dist.get_world_size(group)


def all_min(values: list[int], group) -> list[int]:
    """Element-wise minimum of integer lists over the ranks of ``group`` (identity in one process)."""
    if _group_size(group) == 1:
        return [int(v) for v in values]
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return [int(v) for v in t.tolist()]


def barrier(group) -> None:
    if _group_size(group) > 1:
        from ..distributed.collectives import barrier as _barrier
        _barrier(group, "checkpoint barrier")


def agree_on_error(message: str | None, group, what: str) -> None:
    """Raise on every rank when any rank failed ``what``: the failing rank with its own message."""
    failed = all_min([0 if message else 1], group)[0] == 0
    if message:
        raise CheckpointError(message)
    if failed:
        raise CheckpointError(f"{what} failed on another rank (see that rank's error); nothing was changed")


# --------------------------------------------------------------------- files
def manifest_checksum(doc: dict) -> str:
    """SHA-256 of a manifest's content (every key but ``checksum``), in one canonical JSON spelling."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

MANIFEST_LIMIT = 16 << 20     # a manifest or part list read whole: far above any real one (a few KiB)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with guarded_open.open_regular(path) as f:      # a FIFO or device in a checkpoint folder never blocks
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_table(folder: Path) -> dict:
    """{relative path: [size, sha256]} of every file under ``folder``."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            out[p.relative_to(folder).as_posix()] = [p.stat().st_size, _sha256(p)]
    return out


def tensor_digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu", torch.float64).contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def fingerprints(projector, dtype: torch.dtype, data_digest: str, windows: tuple[int, int]) -> dict:
    """What a checkpoint must agree with to be resumed: one entry per named property."""
    tr = projector.trajectory
    scan = hashlib.sha256()
    scan.update(json.dumps([projector.beam, list(projector.detector_shape), list(projector.detector_spacing)])
                .encode())
    scan.update(tensor_digest(*tr.tensors()).encode())
    return {
        "scan geometry": scan.hexdigest()[:32],
        "data": data_digest,
        "grid": f"{list(projector.global_volume_shape)} voxels of {list(projector.voxel_spacing)} mm",
        "partition": f"{projector.partition or 'single process'} {list(projector.partition_grid)}",
        "world size": int(projector.world_size),
        "rank": int(projector.rank),
        "dtype": str(dtype).replace("torch.", ""),
        "windows": f"slabs of {windows[0]} planes x {windows[1]} views",
    }


# --------------------------------------------------------------- checkpoints
class Checkpoints:
    """The checkpoints of one rank under ``folder`` (``<work_dir>/rank-NNNNN/checkpoints``)."""

    def __init__(self, folder, group=None):
        self.folder = Path(folder)
        self.group = group

    def path(self, iteration: int) -> Path:
        return self.folder / f"iter-{int(iteration):06d}"

    def complete(self) -> list[int]:
        """Iterations with a manifest on this rank, newest first (contents are checked by :meth:`load`)."""
        if not self.folder.is_dir():
            return []
        found = []
        for p in self.folder.iterdir():
            m = _NAME.match(p.name)
            if m and (p / "manifest.json").is_file():
                found.append(int(m.group(1)))
        return sorted(found, reverse=True)

    def any_files(self) -> bool:
        return self.folder.is_dir() and any(self.folder.iterdir())

    # ---------------------------------------------------------------- write
    def write(self, iteration: int, copy_state, manifest: dict) -> Path:
        """Write checkpoint ``iteration``: ``copy_state(folder)`` fills the rank's part; then the manifest.

        Collective: every rank of ``group`` calls it with the same iteration.
        """
        final = self.path(iteration)
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{final.name}.partial-{os.getpid()}"
        error = None
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            copy_state(tmp)
            atomic_write_bytes(tmp / "part.json", json.dumps({"files": file_table(tmp)}, indent=1).encode(), fsync=True)
            if final.exists():  # a part without manifest, left by a crash: never complete
                shutil.rmtree(final)
            fsync_tree(tmp)   # the state is on disk before the name that publishes it
            os.replace(tmp, final)
            fsync_dir(self.folder)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            error = f"writing checkpoint {iteration} failed on rank {manifest['fingerprints']['rank']}: {e}"
            shutil.rmtree(tmp, ignore_errors=True)
        agree_on_error(error, self.group, f"writing checkpoint {iteration}")  # barrier: all parts are in place
        doc = dict(manifest, format=FORMAT, version=VERSION, iteration=int(iteration),
                   part_sha256=_sha256(final / "part.json"))
        doc["checksum"] = manifest_checksum(doc)
        atomic_write_bytes(final / "manifest.json", json.dumps(doc, indent=1).encode(), fsync=True)
        barrier(self.group)  # every rank has the manifest: older checkpoints can go
        for old in self.complete():
            if old < iteration:
                shutil.rmtree(self.path(old), ignore_errors=True)
        for p in self.folder.glob(".iter-*.partial-*"):
            shutil.rmtree(p, ignore_errors=True)
        return final

    # ----------------------------------------------------------------- read
    def newest_common(self) -> int | None:
        """The newest iteration with a manifest on every rank (collective); None when there is none."""
        mine = self.complete()
        bound = None
        while True:
            cand = next((i for i in mine if bound is None or i <= bound), -1)
            m = all_min([cand], self.group)[0]
            if m < 0:
                return None
            if all_min([1 if m in mine else 0], self.group)[0] == 1:
                return m
            bound = m - 1

    def read_manifest(self, iteration: int) -> dict:
        path = self.path(iteration) / "manifest.json"
        try:
            doc = json.loads(guarded_open.read_bytes(path, limit=MANIFEST_LIMIT))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {iteration} has a corrupted or truncated manifest {path}: {e}") \
                from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("iteration") != iteration:
            raise CheckpointError(f"{path} is not a ctbench checkpoint manifest of iteration {iteration}")
        if doc.get("version") != VERSION or "checksum" not in doc:
            raise CheckpointError(f"{path} is a version {doc.get('version')!r} checkpoint manifest without the "
                                  f"checksum over its scalars that version {VERSION} has; it cannot be trusted to "
                                  "resume: start afresh (another work_dir, or delete this one)")
        if doc["checksum"] != manifest_checksum(doc):
            raise CheckpointError(f"checkpoint {iteration}: the manifest {path} was modified after it was written "
                                  "(its checksum over the scalars, residuals and fingerprints does not match); "
                                  "refusing to resume from it")
        return doc

    def check_manifest(self, doc: dict, expected: dict, solver: str) -> None:
        """Refuse a manifest whose fingerprints differ from the run's; the message names each mismatch."""
        where = self.path(doc["iteration"])
        if doc.get("solver") != solver:
            raise CheckpointError(f"checkpoint {where} is of solver {doc.get('solver')!r}, not {solver!r}")
        got = doc.get("fingerprints") or {}
        diffs = [f"{k}: checkpoint has {got.get(k)!r}, this run has {v!r}" for k, v in expected.items()
                 if got.get(k) != v]
        if diffs:
            raise CheckpointError(f"checkpoint {where} does not match this run (" + "; ".join(diffs)
                                  + "); use the same scan, data, grid, partition, world size, dtype and "
                                    "memory_budget, or another work_dir")

    def check_files(self, doc: dict) -> None:
        """Every file of the part exists with its recorded size and checksum."""
        folder = self.path(doc["iteration"])
        part = folder / "part.json"
        if not part.is_file() or _sha256(part) != doc.get("part_sha256"):
            raise CheckpointError(f"checkpoint {folder}: part.json is missing, truncated or corrupted")
        files = json.loads(guarded_open.read_bytes(part, limit=MANIFEST_LIMIT))["files"]
        for rel, (size, digest) in files.items():
            p = folder / rel
            if not p.is_file():
                raise CheckpointError(f"checkpoint {folder}: file {rel} is missing")
            if p.stat().st_size != size:
                raise CheckpointError(f"checkpoint {folder}: file {rel} is truncated ({p.stat().st_size} bytes, "
                                      f"expected {size})")
            if _sha256(p) != digest:
                raise CheckpointError(f"checkpoint {folder}: file {rel} is corrupted (checksum mismatch)")

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
