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


def block_cgls(operator, measurements, output, iterations, *, workspace, block_elements, rtol, atol, callback,
               checkpoint_directory, resume):
    """Run CGLS as described above; returns (iterations, residual_history, converged, reason).
    The controls were checked by the caller; the stores, workspace and checkpoint are checked here,
    all before anything is written."""
    limit = block_elements
    source = _blocks.as_store(measurements)
    rays, vol = tuple(operator.projection_shape), tuple(operator.volume_shape)
    if tuple(source.shape) != rays:
        raise ValueError(f"measurements have shape {tuple(source.shape)}; the operator's projection_shape is {rays}")
    check_output(output, vol)
    x = _blocks.as_store(output)
    if not _blocks.all_finite(source, limit):
        raise ValueError("measurements must be finite")
    work = Path(workspace)
    if work.exists():
        raise ValueError(f"workspace must be a new directory; {work} exists")
    rank = int(getattr(operator, "rank", 0) or 0)
    metadata = saved = None
    if checkpoint_directory is not None or resume is not None:
        metadata = _ck.signature(operator, source, "cgls_into", {}, limit, x.dtype)
        if resume is not None:
            saved = _ck.load(resume, metadata, iterations, dict(x=vol, s=vol, p=vol, r=rays, q=rays), limit,
                             scalars=("gamma",), rank=rank)
        _ck.refuse_overwrite(checkpoint_directory, saved[0]["iteration"] if saved else 0, rank)
    from .storage import NpyStore

    work.mkdir(parents=True)
    st = dict(x=x)
    for name, shape in (("s", vol), ("p", vol), ("r", rays), ("q", rays)):
        st[name] = NpyStore.create(work / f"{name}.npy", shape, dtype=x.dtype)
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
        norm_b = math.sqrt(_blocks.squared_norm(source, limit))
        history = [norm_b]
        if iterations and norm_b > atol + rtol * norm_b:
            operator.backproject_into(st["r"], st["s"])
            _blocks.copy(st["s"], st["p"], limit)
        else:
            _blocks.fill_zero(st["s"], limit)
            _blocks.fill_zero(st["p"], limit)
        gamma = _blocks.squared_norm(st["s"], limit)
    threshold = atol + rtol * norm_b
    stopped = breakdown = False
    while k < iterations and history[-1] > threshold:
        if gamma == 0:
            breakdown = True
            break
        operator.project_into(st["p"], st["q"])
        denom = _blocks.squared_norm(st["q"], limit)
        if denom == 0:
            breakdown = True
            break
        alpha = gamma / denom
        _blocks.axpy(st["x"], st["p"], alpha, limit)
        _blocks.axpy(st["r"], st["q"], -alpha, limit)
        operator.backproject_into(st["r"], st["s"])
        gamma_next = _blocks.squared_norm(st["s"], limit)
        _blocks.axpy(st["p"], st["s"], 1.0, limit, scale=gamma_next / gamma)
        gamma = gamma_next
        k += 1
        history.append(math.sqrt(_blocks.squared_norm(st["r"], limit)))
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
