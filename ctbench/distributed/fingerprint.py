"""A fingerprint of a projector's configuration, compared across ranks when a distributed projector is built.

Every rank of a job must build the same operator: same trajectory (source /
sid, detector centres and axes, number of views), detector, grid, partition
and dtype.  A rank that differs would silently compute a different operator
(wrong results on every rank, exit code 0).  :func:`check_same_configuration`
hashes each field on the CPU (8 bytes each), gathers the small hash tensor
from every rank in one ``all_gather`` and, on a difference, raises the same
:class:`ConfigurationMismatchError` on every rank, naming the fields and the
ranks that differ from rank 0.  The digest also identifies the inputs of a
store written by a streaming call (:mod:`ctbench.storage.completion`).
"""

from __future__ import annotations

import hashlib
import json

import torch
import torch.distributed as dist

from .collectives import _run


class ConfigurationMismatchError(ValueError):
    """The ranks of a distributed projector were built with different configurations."""


# (field name, what it means in an error message)
FIELDS = (
    ("beam", "beam (cone or parallel)"),
    ("n_views", "number of views (n_views)"),
    ("source", "trajectory source positions (sid / source path)"),
    ("detector_center", "trajectory detector centres (sdd / detector path)"),
    ("detector_u", "trajectory detector u axes"),
    ("detector_v", "trajectory detector v axes"),
    ("detector_shape", "detector shape"),
    ("detector_spacing", "detector pixel spacing"),
    ("volume_shape", "volume grid shape"),
    ("voxel_spacing", "voxel spacing"),
    ("partition", "partition and rank grid"),
    ("dtype", "trajectory dtype"),
)


def _digest(value) -> int:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        raw = str(t.dtype).encode() + str(tuple(t.shape)).encode() + t.numpy().tobytes()
    else:
        raw = json.dumps(value, sort_keys=True, default=str).encode()
    # signed 64-bit, to live in an int64 tensor
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little", signed=True)


def config_values(projector, dtype=None) -> dict:
    """The configuration fields of a projector (global, not this rank's share)."""
    tr = projector.trajectory
    return {
        "beam": projector.beam,
        "n_views": int(tr.n_views),
        "source": tr.source,
        "detector_center": tr.detector_center,
        "detector_u": tr.detector_u,
        "detector_v": tr.detector_v,
        "detector_shape": list(projector.detector_shape),
        "detector_spacing": list(projector.detector_spacing),
        "volume_shape": list(projector.global_volume_shape),
        "voxel_spacing": list(projector.voxel_spacing),
        "partition": [projector.partition, list(projector.partition_grid)],
        "dtype": str(dtype if dtype is not None else tr.source.dtype),
    }


def config_hashes(projector, dtype=None) -> torch.Tensor:
    """One int64 hash per field of :data:`FIELDS` (CPU)."""
    values = config_values(projector, dtype)
    return torch.tensor([_digest(values[name]) for name, _ in FIELDS], dtype=torch.int64)


def config_digest(projector, dtype=None) -> str:
    """A hex digest of the whole configuration (ignores the partition: a store holds global data)."""
    hashes = config_hashes(projector, dtype)
    keep = [i for i, (name, _) in enumerate(FIELDS) if name != "partition"]
    return hashlib.blake2b(hashes[keep].numpy().tobytes(), digest_size=16).hexdigest()


def mismatch_message(gathered: torch.Tensor) -> str | None:
    """The error for a (ranks, fields) table of hashes, or None when every rank agrees."""
    parts = []
    for j, (name, label) in enumerate(FIELDS):
        column = gathered[:, j]
        differ = (column != column[0]).nonzero()[:, 0].tolist()
        if differ:
            parts.append(f"{name} ({label}) differs from rank 0 on ranks {differ}")
    if not parts:
        return None
    return ("the ranks of this distributed Projector were built with different configurations: "
            + "; ".join(parts) + ". Every rank must pass the same trajectory, volume_shape, detector_shape, "
            "spacings, partition and dtype; check per-rank arguments, files and random seeds")


def check_same_configuration(projector, group) -> None:
    """All ranks of ``group`` compare their configuration hashes; every rank raises on a difference."""
    if group is None or dist.get_world_size(group) == 1:
        return
    mine = config_hashes(projector)
    backend = dist.get_backend(group)
    if backend == "nccl":
        mine = mine.to(torch.device("cuda", torch.cuda.current_device()))
    out = mine.new_empty(dist.get_world_size(group) * mine.numel())
    _run("all_gather", group, lambda: dist.all_gather_into_tensor(out, mine, group=group),
         mine.numel() * mine.element_size())
    message = mismatch_message(out.view(-1, mine.numel()).cpu())
    if message is not None:
        raise ConfigurationMismatchError(f"rank {dist.get_rank(group)}: {message}")
