"""diffct's solver checkpoints: ``<checkpoint_directory>/step-NNNNNN/rank-NNNNN/`` holding one
``.npy`` file per solver state and ``metadata.json`` (docs/FROM_DIFFCT.md, Checkpoints).

A checkpoint is published by writing every state file (each made aside and renamed, then flushed)
and only then renaming ``metadata.json.tmp`` onto ``metadata.json``: a crash leaves a step
without metadata, which no resume accepts.  The metadata carries a signature of the request
(algorithm and its settings, shapes, beam, spacings, dtypes, and sha256 fingerprints of the
geometry tensors and of the measurements); a resume compares it, the iteration, the residual
history and each state's shape, dtype and fingerprint before any projection runs.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from pathlib import Path

import torch

from .. import guarded_open
from ..atomic_files import atomic_write_bytes
from . import _blocks

SCHEMA = 1
_STEP = re.compile(r"^step-(\d{6,})$")


def _plain(value):
    """JSON-safe form of an operator attribute (tuples as lists, tensors as lists of numbers)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list, torch.Size)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


def _geometry(operator):
    trajectory = getattr(operator, "trajectory", None)
    if trajectory is not None and hasattr(trajectory, "tensors"):
        return tuple(trajectory.tensors())
    frames = getattr(operator, "_trajectory", None)  # a diffct-style operator's frames
    return tuple(frames) if isinstance(frames, (tuple, list)) else ()


def signature(operator, measurements, algorithm, settings, limit, compute_dtype):
    """What a checkpoint must agree with to be resumed (JSON-normalised)."""
    document = dict(
        schema_version=SCHEMA, algorithm=algorithm, settings=settings,
        rank=getattr(operator, "rank", 0), world_size=getattr(operator, "world_size", 1),
        partition=getattr(operator, "partition", "views"),
        volume_shape=getattr(operator, "volume_shape", None),
        projection_shape=getattr(operator, "projection_shape", None),
        beam=getattr(operator, "beam", None), voxel_spacing=getattr(operator, "voxel_spacing", None),
        detector_spacing=getattr(operator, "detector_spacing", None),
        input_dtype=str(measurements.dtype), compute_dtype=str(compute_dtype),
        precision=getattr(operator, "precision", None),
        geometry=[_blocks.fingerprint(t, limit) for t in _geometry(operator)
                  if isinstance(t, torch.Tensor)],
        measurements=_blocks.fingerprint(measurements, limit),
    )
    offsets = getattr(operator, "surface_offsets", None)
    if callable(offsets):  # a curved detector: the pixels it gives now (its sampler or captured tensors may change)
        document["detector_surface"] = _blocks.fingerprint(offsets(), limit)
    return json.loads(json.dumps(_plain(document)))


def _rank_dir(step: Path, rank: int) -> Path:
    return step / f"rank-{rank:05d}"


def _steps(directory: Path, rank: int):
    """(iteration, rank directory) of the published checkpoints in a checkpoint directory."""
    found = []
    if directory.is_dir():
        for step in directory.iterdir():
            m = _STEP.match(step.name)
            if m and (_rank_dir(step, rank) / "metadata.json").is_file():
                found.append((int(m.group(1)), _rank_dir(step, rank)))
    return sorted(found)


def locate(resume, rank=0) -> Path:
    """The rank directory of a checkpoint: ``resume`` itself (diffct's spelling, the folder holding
    ``metadata.json``), a step folder, or a checkpoint directory (its newest published step)."""
    path = Path(resume)
    if (path / "metadata.json").is_file():
        return path
    if (_rank_dir(path, rank) / "metadata.json").is_file():
        return _rank_dir(path, rank)
    steps = _steps(path, rank)
    if steps:
        return steps[-1][1]
    raise FileNotFoundError(f"resume: no checkpoint in {path} (a step-NNNNNN/rank-{rank:05d} folder with "
                            "metadata.json, written by a solver with checkpoint_directory=)")


def refuse_overwrite(checkpoint_directory, start, rank=0) -> None:
    """A run must not publish over the checkpoints of another: refuse steps beyond ``start``."""
    if checkpoint_directory is None:
        return
    later = [k for k, _ in _steps(Path(checkpoint_directory), rank) if k > start]
    if later:
        raise FileExistsError(f"checkpoint_directory {checkpoint_directory} holds checkpoints of an earlier run "
                              f"(step {later[0]}); pass resume={str(checkpoint_directory)!r} to continue it, "
                              "or use a new directory")


def _finite(value, what, positive=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"checkpoint {what} must be a finite number >= 0, got {value!r}")
    return float(value)


def load(resume, expected, iterations, shapes, limit, *, scalars=(), rank=0):
    """Validate a checkpoint against ``expected`` (from :func:`signature`) and ``shapes`` (state
    name -> shape); returns (metadata, {name: read-only NpyStore}).  Raises ValueError (or
    FileNotFoundError for a missing checkpoint) before the caller computes anything."""
    from .storage import NpyStore

    folder = locate(resume, rank)
    try:
        saved = json.loads(guarded_open.read_bytes(folder / "metadata.json", limit=16 << 20))
    except (OSError, ValueError) as error:
        raise ValueError(f"resume: {folder}/metadata.json is not readable JSON ({error})") from None
    if not isinstance(saved, dict):
        raise ValueError(f"resume: {folder}/metadata.json must hold an object")
    differ = sorted(k for k, v in expected.items() if saved.get(k) != v)
    if differ:
        raise ValueError(f"resume: the checkpoint in {folder} was written for another request ({', '.join(differ)} "
                         "differ: scan, data, dtype or algorithm settings)")
    completed = saved.get("iteration")
    if isinstance(completed, bool) or not isinstance(completed, int) or completed < 0:
        raise ValueError(f"resume: checkpoint iteration must be a nonnegative integer, got {completed!r}")
    if completed > iterations:
        raise ValueError(f"resume: the checkpoint has {completed} iterations, more than iterations={iterations}")
    history = saved.get("residual_history")
    if not isinstance(history, list) or len(history) != completed + 1:
        raise ValueError("resume: checkpoint residual_history must list iteration + 1 residuals")
    saved["residual_history"] = [_finite(v, "residual") for v in history]
    saved["measurement_norm"] = _finite(saved.get("measurement_norm"), "measurement norm")
    for name in scalars:
        saved[name] = _finite(saved.get(name), name)
    manifest = saved.get("states")
    if not isinstance(manifest, dict) or set(manifest) != set(shapes):
        raise ValueError(f"resume: checkpoint states must be an object naming {sorted(shapes)}")
    stores = {}
    for name, shape in shapes.items():
        spec = manifest[name]
        if not isinstance(spec, dict):
            raise ValueError(f"resume: checkpoint state {name!r} must be described by an object")
        try:
            store = NpyStore(folder / f"{name}.npy", mode="r")
        except (OSError, ValueError, TypeError, EOFError) as error:  # (a zero-byte file: EOFError)
            raise ValueError(f"resume: checkpoint state {name}.npy is unreadable ({error})") from None
        if (list(store.shape) != list(shape) or spec.get("shape") != list(shape)
                or spec.get("dtype") != str(store.dtype)):
            raise ValueError(f"resume: checkpoint state {name!r} has shape {list(store.shape)} and dtype "
                             f"{store.dtype}; expected shape {list(shape)} as recorded")
        if _blocks.fingerprint(store, limit) != spec.get("fingerprint"):
            raise ValueError(f"resume: checkpoint state {name}.npy does not match its recorded fingerprint")
        stores[name] = store
    return saved, stores


def save(directory, iteration, states, metadata, history, measurement_norm, limit, *, rank=0, **scalars):
    """Publish one checkpoint (module docstring); ``states`` maps names to tensors or stores."""
    from .storage import NpyStore

    folder = _rank_dir(Path(directory) / f"step-{iteration:06d}", rank)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name, value in states.items():
        source = _blocks.as_store(value)
        target_path = folder / f"{name}.npy"
        if target_path.exists():  # a step left without metadata by an interrupted run
            target_path.unlink()
        target = NpyStore.create(target_path, source.shape, dtype=source.dtype)
        _blocks.copy(source, target, limit)
        target.flush()
        manifest[name] = dict(shape=list(source.shape), dtype=str(source.dtype),
                              fingerprint=_blocks.fingerprint(target, limit))
    document = dict(metadata, iteration=int(iteration), residual_history=[float(v) for v in history],
                    measurement_norm=float(measurement_norm), states=manifest,
                    **{k: float(v) for k, v in scalars.items()})
    # a new temporary sibling created exclusively (no planted link written through), flushed, then renamed
    atomic_write_bytes(folder / "metadata.json", json.dumps(document).encode(), fsync=True, suffix=".tmp")
