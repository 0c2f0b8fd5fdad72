"""diffct's ``cgls_into`` for a linear operator that is not a ctbench Projector: CGLS whose
vectors live in block stores and whose every read, write, update and norm holds at most
``block_elements`` values.  The operator's ``project_into(volume, sinogram)`` and
``backproject_into(sinogram, volume)`` do the projections; ``x`` is the caller's output (so a
callback sees it current), ``s``/``p``/``r``/``q`` are memory-mapped ``.npy`` files in the new
``workspace``.  Checkpoints are diffct's (:mod:`ctbench.compat._checkpoint`).

A ctbench Projector takes ctbench's disk-backed CGLS instead (:mod:`ctbench.compat._disk`), which
plans its own windows under the memory budget and keeps the ``view_chunk_size`` bound.
"""

from __future__ import annotations

import math
from pathlib import Path

from . import _blocks
from . import _checkpoint as _ck


def check_output(output, shape):
    """Refuse an output of the wrong shape, or one that cannot be written, before any work."""
    if tuple(output.shape) != tuple(shape):
        raise ValueError(f"output has shape {tuple(output.shape)}; the operator's volume_shape is {tuple(shape)}")
    if getattr(output, "writable", True) is False:
        raise PermissionError(f"output {output!r} is read-only; cgls_into writes the solution into it")


def _global(operator, kind, value: float) -> float:
    """A local sum of squares made global over the ranks of a distributed operator: its own inner
    product (rays summed over the view shards, volumes over the slabs, replicas counted once)."""
    inner = getattr(operator, "inner_projection" if kind == "rays" else "inner_volume", None)
    if inner is None or int(getattr(operator, "world_size", 1) or 1) <= 1:
        return value
    import torch

    one = torch.ones((), dtype=torch.float64)
    return float(inner(torch.tensor(value, dtype=torch.float64), one))


def _agreed(operator, step, token):
    """Run ``step()`` here, then agree with the other ranks (compat/_agreement.py): if it failed on
    any rank every rank raises the same ValueError, before any operator call or output write."""
    from ._agreement import agree

    result, error = None, None
    try:
        result = step()
    except (ValueError, TypeError, OSError, NotImplementedError) as caught:
        error = caught
    agree(operator, error, token)
    return result


def block_cgls(operator, measurements, output, iterations, *, workspace, block_elements, rtol, atol, callback,
               checkpoint_directory, resume):
    """Run CGLS as described above; returns (iterations, residual_history, converged, reason).
    The controls were checked by the caller; the stores, workspace and checkpoint are checked here,
    all before anything is written; on torchrun ranks the ranks agree on the checks, then on the
    creation of the workspace, before any operator call (norms are global: :func:`_global`)."""
    limit = block_elements
    rays, vol = tuple(operator.projection_shape), tuple(operator.volume_shape)
    work = Path(workspace)
    rank = int(getattr(operator, "rank", 0) or 0)
    token = ("cgls_into", iterations, rtol, atol, limit, resume is None, checkpoint_directory is None)

    def checks():
        source = _blocks.as_store(measurements)
        if tuple(source.shape) != rays:
            raise ValueError(f"measurements have shape {tuple(source.shape)}; the operator's projection_shape is "
                             f"{rays}")
        check_output(output, vol)
        x = _blocks.as_store(output)
        if not _blocks.all_finite(source, limit):
            raise ValueError("measurements must be finite")
        if work.exists():
            raise ValueError(f"workspace must be a new directory; {work} exists")
        metadata = saved = None
        if checkpoint_directory is not None or resume is not None:
            metadata = _ck.signature(operator, source, "cgls_into", {}, limit, x.dtype)
            if resume is not None:
                saved = _ck.load(resume, metadata, iterations, dict(x=vol, s=vol, p=vol, r=rays, q=rays), limit,
                                 scalars=("gamma",), rank=rank)
            _ck.refuse_overwrite(checkpoint_directory, saved[0]["iteration"] if saved else 0, rank)
        return source, x, metadata, saved

    source, x, metadata, saved = _agreed(operator, checks, token)
    from .storage import NpyStore

    def prepare():
        work.mkdir(parents=True)
        st = dict(x=x)
        for name, shape in (("s", vol), ("p", vol), ("r", rays), ("q", rays)):
            st[name] = NpyStore.create(work / f"{name}.npy", shape, dtype=x.dtype)
        return st

    st = _agreed(operator, prepare, token + ("workspace",))

    def norm2(kind, store):
        return _global(operator, kind, _blocks.squared_norm(store, limit))

    if saved is not None:
        meta, stores = saved
        for name, store in st.items():
            _blocks.copy(stores[name], store, limit)
        k, history, norm_b, gamma = meta["iteration"], list(meta["residual_history"]), meta["measurement_norm"], \
            meta["gamma"]
    else:
        k = 0
        _blocks.fill_zero(x, limit)
        _blocks.fill_zero(st["q"], limit)
        _blocks.copy(source, st["r"], limit)
        norm_b = math.sqrt(norm2("rays", source))
        history = [norm_b]
        if iterations and norm_b > atol + rtol * norm_b:
            operator.backproject_into(st["r"], st["s"])
            _blocks.copy(st["s"], st["p"], limit)
        else:
            _blocks.fill_zero(st["s"], limit)
            _blocks.fill_zero(st["p"], limit)
        gamma = norm2("volume", st["s"])
    threshold = atol + rtol * norm_b
    stopped = breakdown = False
    while k < iterations and history[-1] > threshold:
        if gamma == 0:
            breakdown = True
            break
        operator.project_into(st["p"], st["q"])
        denom = norm2("rays", st["q"])
        if denom == 0:
            breakdown = True
            break
        alpha = gamma / denom
        _blocks.axpy(st["x"], st["p"], alpha, limit)
        _blocks.axpy(st["r"], st["q"], -alpha, limit)
        operator.backproject_into(st["r"], st["s"])
        gamma_next = norm2("volume", st["s"])
        _blocks.axpy(st["p"], st["s"], 1.0, limit, scale=gamma_next / gamma)
        gamma = gamma_next
        k += 1
        history.append(math.sqrt(norm2("rays", st["r"])))
        if hasattr(x, "flush"):
            x.flush()
        if checkpoint_directory is not None:
            _ck.save(checkpoint_directory, k, st, metadata, history, norm_b, limit, rank=rank, gamma=gamma)
        if callback is not None and callback(k, history[-1], output) is False:
            stopped = True
            break
    for store in st.values():
        if hasattr(store, "flush"):
            store.flush()
    converged = history[-1] <= threshold and not stopped
    reason = ("callback stopped" if stopped else "residual tolerance reached" if converged
              else "normal equation breakdown" if breakdown else "iteration limit reached")
    return k, history, converged, reason
