"""diffct's checkpointed CGLS spellings on ctbench's disk-backed CGLS (docs/FROM_DIFFCT.md).

``cgls(..., checkpoint_directory=, resume=)`` and ``cgls_into(..., workspace=)`` run
:func:`ctbench.solvers.disk_cgls`: the CGLS vectors live in zarr work stores under a work
directory, with crash-safe checkpoints in ``<work dir>/rank-NNNNN/checkpoints`` (one per
iteration when checkpointing, older ones removed).  diffct's directories map onto it:

- ``checkpoint_directory=d``: ``d`` is the work directory, checkpointed after every iteration
  (as diffct); a ``d`` that already holds checkpoints is refused unless ``resume=d``;
- ``resume=r``: continue from the newest checkpoint in ``r``; with a different
  ``checkpoint_directory`` (or, for ``cgls_into``, the new ``workspace``) ``r`` is first copied
  there, so ``r`` is left as it was;
- ``cgls_into`` without checkpoints works in ``workspace``.

Iteration counts are totals including resumed iterations, ``residual_history`` starts with
``||b - A x0||`` as diffct's, the stop rule is diffct's ``||r|| <= atol + rtol ||b||`` and a
callback returning False stops.  A resumed run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import torch

from ..storage import TensorStore


def _store(source, name):
    if isinstance(source, torch.Tensor):
        if not source.is_floating_point() or source.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{name} must be a float32 or float64 tensor or block store, got {source.dtype}")
        return TensorStore(source.detach())
    if hasattr(source, "read") and hasattr(source, "shape") and hasattr(source, "chunks"):
        return source
    raise TypeError(f"{name} must be a tensor or a block store, got {type(source).__name__}")


def _squared_norm(store, n_views, view_chunk_size=None) -> float:
    total = 0.0
    step = max(1, int(store.chunks[0]))
    if view_chunk_size is not None:  # the projector's view bound holds for this pass too
        step = min(step, int(view_chunk_size))
    for a in range(0, n_views, step):
        block = store.read((slice(a, min(a + step, n_views)),) + tuple(slice(0, s) for s in store.shape[1:]))
        total += float(block.double().square().sum())
    return total


def _has_checkpoints(folder: Path) -> bool:
    return any(p.is_dir() and any(p.glob("checkpoints/iter-*/manifest.json")) for p in folder.glob("rank-*"))


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a resume directory aside, then rename: a crash leaves no half-copied work directory."""
    tmp = dst.with_name(f".{dst.name}.copy-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.replace(tmp, dst)


def plan_directories(work_dir, checkpoint_directory, resume):
    """(work directory, checkpoint every n iterations, resume?) for diffct's directory arguments."""
    if checkpoint_directory is not None:
        work = Path(checkpoint_directory)
    elif resume is not None:
        work = Path(resume)
    else:
        work = Path(work_dir)
    if resume is not None:
        r = Path(resume)
        if not r.is_dir() or not _has_checkpoints(r):
            raise FileNotFoundError(f"resume: no ctbench CGLS checkpoint in {r} (a directory written with "
                                    "checkpoint_directory=)")
        if work.resolve() != r.resolve():
            if work.exists() and any(work.iterdir()):
                raise ValueError(f"checkpoint_directory {work} must be new or empty when resuming from another "
                                 f"directory ({r}); the checkpoint is copied there")
            if work.exists():
                work.rmdir()
            work.parent.mkdir(parents=True, exist_ok=True)
            _copy_tree(r, work)
    elif checkpoint_directory is not None and work.is_dir() and _has_checkpoints(work):
        raise FileExistsError(f"checkpoint_directory {work} holds checkpoints of an earlier run; pass "
                              f"resume={str(work)!r} to continue it, or use a new directory")
    return work, (1 if checkpoint_directory is not None else 0), resume is not None


def disk_cgls_request(operator, measurements, iterations, *, work_dir, checkpoint_every, resume, x0=None,
                      rtol=1e-6, atol=0.0, callback=None, volume_store=None, callback_x="tensor"):
    """Run disk CGLS with diffct's controls; returns (volume, iterations, residual_history, converged, reason).

    ``volume`` is ``volume_store`` when given, else an in-memory tensor.  ``callback(k, residual, x)``
    gets ``x`` as a tensor (``callback_x="tensor"``) or as the work x store (``"store"``)."""
    from ..solvers.disk_cgls import disk_cgls

    if getattr(operator, "is_2d", False):
        raise ValueError("checkpoint_directory/resume and cgls_into use ctbench's disk-backed CGLS, which is for 3D "
                         "volumes; a 2D problem fits in memory: call cgls without them")
    if getattr(operator, "world_size", 1) > 1:
        raise NotImplementedError("checkpointed cgls and cgls_into take one process here; under torchrun call "
                                  "ctbench.solvers.disk_cgls(projector, global_sinogram_store, work_dir, ...)")
    b = _store(measurements, "measurements")
    n = int(b.shape[0])
    norm_b = math.sqrt(_squared_norm(b, n, getattr(operator, "options", {}).get("view_chunk_size")))
    threshold = float(atol) + float(rtol) * norm_b
    x0_store = None
    if x0 is not None:
        x0_store = TensorStore(x0.detach().to(b.dtype))
        r0 = b.read(None) - operator.project(x0.detach().to(b.dtype))
        first = float(r0.double().norm())
    else:
        first = norm_b
    if volume_store is None:
        volume = torch.zeros(operator.global_volume_shape, dtype=b.dtype)
        volume_store = TensorStore(volume)
    else:
        volume = volume_store
    if iterations == 0 or first <= threshold:
        # nothing to iterate (diffct's rule): the start is the answer
        start = x0.detach().to(b.dtype) if x0 is not None else torch.zeros(operator.global_volume_shape, dtype=b.dtype)
        volume_store.write(tuple(slice(0, s) for s in start.shape), start)
        return volume, 0, [first], first <= threshold, ("residual tolerance reached" if first <= threshold
                                                        else "iteration limit reached")
    stopped = []

    def on_iteration(state):
        if callback is None:
            return False
        x = state.volume if callback_x == "store" else state.volume.read(None)
        if callback(state.iteration, float(state.residual), x) is False:
            stopped.append(state.iteration)
            return True
        return False

    tol = threshold / norm_b if norm_b > 0 else None
    res = disk_cgls(operator, b, work_dir, iterations, x0_store=x0_store, checkpoint_every=checkpoint_every,
                    resume=resume, tol=tol, callback=on_iteration, volume_store=volume_store)
    history = [first, *[float(v) for v in res.residuals]]
    converged = history[-1] <= threshold
    if stopped:
        reason = "callback stopped"
        converged = False
    elif converged:
        reason = "residual tolerance reached"
    elif res.stopped == "tol":
        reason = "normal equation breakdown"
    else:
        reason = "iteration limit reached"
    return volume, res.n_iter, history, converged, reason
