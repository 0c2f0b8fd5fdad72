"""The block-store protocol: an n-d array read and written in windows.

A block store has a ``shape``, a torch ``dtype`` and a ``chunks`` shape (the
unit it stores and writes; a window aligned to chunks is written as whole
chunks).  ``read(window)`` returns a new tensor that the caller owns;
``write(window, tensor)`` stores a tensor of the window's shape.  A window
is a tuple of ``slice(start, stop)`` per axis (step 1), or ``...``/``None``
for the whole array.

Two stores implement it: :class:`~ctbench.storage.memory.TensorStore` (a
tensor in memory) and :class:`~ctbench.storage.zarr_store.ZarrStore` (a zarr
v3 array on disk, each chunk written atomically).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

Window = tuple[slice, ...]


class StoreIntegrityError(ValueError):
    """Stored data is damaged, missing, unsafe to read or incomplete; the message names what and where."""


class IncompleteStoreError(StoreIntegrityError):
    """A store written by a streaming call holds windows that were never written (an interrupted run)."""


@runtime_checkable
class BlockStore(Protocol):
    """An array stored in chunks, read and written in windows."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def chunks(self) -> tuple[int, ...]: ...

    def read(self, window=None) -> torch.Tensor: ...

    def write(self, window, value: torch.Tensor) -> None: ...


def normalize_window(window, shape: tuple[int, ...], name: str = "window") -> Window:
    """A full tuple of bounded ``slice(start, stop)`` (step 1) for ``shape``; clear errors otherwise."""
    if window is None or window is Ellipsis:
        return tuple(slice(0, n) for n in shape)
    if isinstance(window, slice):
        window = (window,)
    if not isinstance(window, tuple):
        raise TypeError(f"{name} must be a tuple of slices, got {type(window).__name__}")
    if len(window) > len(shape):
        raise ValueError(f"{name} has {len(window)} axes but the store has {len(shape)} (shape {shape})")
    out = []
    for axis, n in enumerate(shape):
        s = window[axis] if axis < len(window) else slice(None)
        if not isinstance(s, slice):
            raise TypeError(f"{name}[{axis}] must be a slice (windows keep every axis), got {s!r}")
        if s.step not in (None, 1):
            raise ValueError(f"{name}[{axis}] must have step 1, got {s.step}")
        start = 0 if s.start is None else int(s.start)
        stop = n if s.stop is None else int(s.stop)
        if not 0 <= start <= stop <= n:
            raise ValueError(f"{name}[{axis}] = [{start}, {stop}) is outside the store's axis of length {n}")
        out.append(slice(start, stop))
    return tuple(out)


def window_shape(window: Window) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in window)


def is_chunk_aligned(window: Window, chunks: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether the window covers whole chunks only (so a write replaces chunks, never merges)."""
    return all(s.start % c == 0 and (s.stop % c == 0 or s.stop == n) for s, c, n in zip(window, chunks, shape))


def check_value(value, window: Window, dtype: torch.dtype, name: str = "value") -> torch.Tensor:
    """The tensor to write: right shape (a view of the window's shape) and converted dtype."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    shape = window_shape(window)
    if tuple(value.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(value.shape)}; the window needs {shape}")
    return value.detach().to(dtype=dtype)


def check_store(store, name: str, shape: tuple[int, ...] | None = None, dtypes=None):
    """Validate a store argument: the protocol, its shape and its dtype; returns the store."""
    if not isinstance(store, BlockStore):
        raise TypeError(f"{name} must be a block store (shape, dtype, chunks, read, write), e.g. "
                        f"ctbench.storage.ZarrStore or TensorStore; got {type(store).__name__}")
    if shape is not None and tuple(store.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(store.shape)}; this projector needs {tuple(shape)}")
    if dtypes is not None and store.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {store.dtype}; expected one of {', '.join(map(str, dtypes))}")
    return store


def chunks_touched(window_shape, chunks) -> int:
    """Chunks a window of this shape covers when it starts on a chunk boundary."""
    n = 1
    for w, c in zip(window_shape, chunks):
        n *= -(-int(w) // int(c))
    return n


def staging_bytes(store, window_shape, write: bool = False) -> int:
    """Bytes a store holds besides the window's tensor while reading (or writing) it.

    Stores may say (``store.staging_bytes(window_shape, write)``); otherwise
    one chunk buffer per chunk touched, two when a write merges into chunks.
    """
    fn = getattr(store, "staging_bytes", None)
    if fn is not None:
        return int(fn(tuple(window_shape), write))
    itemsize = torch.empty((), dtype=store.dtype).element_size()
    chunk = itemsize
    for c in store.chunks:
        chunk *= int(c)
    merge = write and not covers_whole_chunks(window_shape, store.chunks, store.shape)
    return chunks_touched(window_shape, store.chunks) * chunk * (2 if merge else 1)


def covers_whole_chunks(window_shape, chunks, shape) -> bool:
    """Whether windows of this shape, laid end to end from 0, cover whole chunks (or reach the end)."""
    return all(w % c == 0 or w == n for w, c, n in zip(window_shape, chunks, shape))
