"""Bounded block operations on block stores (``read(window)``/``write(window, value)``) for the
diffct-style solvers: every read, write and fresh tensor holds at most ``limit`` elements.

Blocks are row-major boxes, so a stream of blocks visits the elements in C order whatever the
limit: a fingerprint or a float64 sum does not change when the memory bound does.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math

import torch


def boxes(shape, limit):
    """Row-major windows (tuples of slices) of at most ``limit`` elements covering ``shape``."""
    shape = tuple(int(n) for n in shape)
    if any(n == 0 for n in shape):
        return
    if not shape:
        yield ()
        return
    j = len(shape)  # the trailing axes j.. fit whole into one block
    while j > 0 and math.prod(shape[j - 1:]) <= limit:
        j -= 1
    if j == 0:
        yield tuple(slice(0, n) for n in shape)
        return
    axis, inner = j - 1, math.prod(shape[j:])
    step = max(1, int(limit) // inner)
    whole = tuple(slice(0, n) for n in shape[j:])
    for outer in itertools.product(*(range(n) for n in shape[:axis])):
        head = tuple(slice(i, i + 1) for i in outer)
        for a in range(0, shape[axis], step):
            yield head + (slice(a, min(a + step, shape[axis])),) + whole


def as_store(value):
    """A block store for a tensor (a view: writes reach the tensor) or the store itself."""
    if isinstance(value, torch.Tensor):
        from .storage import TensorStore

        return TensorStore(value.detach())
    return value


def _device(store):
    return getattr(store, "device", torch.device("cpu"))


def copy(source, target, limit):
    for w in boxes(target.shape, limit):
        target.write(w, source.read(w).to(device=_device(target), dtype=target.dtype))


def fill_zero(target, limit):
    for w in boxes(target.shape, limit):
        shape = tuple(s.stop - s.start for s in w)
        target.write(w, torch.zeros(shape, dtype=target.dtype, device=_device(target)))


def axpy(target, source, alpha, limit, scale=1.0):
    """``target = scale * target + alpha * source``, block by block."""
    for w in boxes(target.shape, limit):
        block = target.read(w).to(device=_device(target), dtype=target.dtype).clone()
        block.mul_(scale).add_(source.read(w).to(device=block.device, dtype=block.dtype), alpha=alpha)
        target.write(w, block)


def squared_norm(store, limit) -> float:
    """The float64 sum of squares (blocks cloned: the caller's data is never touched)."""
    total = 0.0
    for w in boxes(store.shape, limit):
        total += float(store.read(w).to(torch.float64).square().sum())
    return total


def all_finite(store, limit) -> bool:
    return all(bool(torch.isfinite(store.read(w)).all()) for w in boxes(store.shape, limit))


def fingerprint(value, limit) -> str:
    """sha256 of shape, dtype and the raw bytes in C order (tensors or block stores)."""
    store = as_store(value)
    digest = hashlib.sha256(json.dumps([list(store.shape), str(store.dtype)]).encode())
    for w in boxes(store.shape, limit):
        block = store.read(w).detach().to("cpu").contiguous()
        digest.update(block.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
