"""A zarr v3 array on disk as a block store, with atomic chunk writes.

Each zarr chunk is a separate file.  Writes go through :class:`AtomicLocalStore`,
which writes a chunk to a temporary file in the same folder and renames it
over the chunk (``os.replace``, atomic on POSIX and Windows): a crash or an
error mid-way leaves the old chunk or the new one, never a mixture.  A write
of a window that covers chunks only partly is a read-modify-write of those
whole chunks (zarr merges the window into the stored chunk, then the whole
chunk is written as above); the streaming loops of
:mod:`ctbench.storage.streaming` align windows to chunks where the memory
budget allows, so that they replace whole chunks without reading them.
``fsync=True`` also flushes each chunk to the disk before the rename
(survives power loss, at a cost per chunk).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
import zarr
from zarr.storage import LocalStore

from .base import check_value, chunks_touched, covers_whole_chunks, normalize_window

_TORCH_DTYPES = (torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.uint8, torch.bool)


def torch_to_numpy_dtype(dtype: torch.dtype) -> np.dtype:
    if dtype not in _TORCH_DTYPES:
        raise TypeError(f"dtype must be one of {', '.join(map(str, _TORCH_DTYPES))}, got {dtype}")
    return torch.empty(0, dtype=dtype).numpy().dtype


def numpy_to_torch_dtype(dtype) -> torch.dtype:
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        raise TypeError(f"zarr dtype {dtype} has no torch equivalent") from None


def atomic_write_bytes(path: Path, data, fsync: bool = False) -> int:
    """Write ``data`` to ``path`` through a temporary sibling and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            n = f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return n


def _buffer_bytes(value):
    fn = getattr(value, "as_buffer_like", None)
    return fn() if fn is not None else value.to_bytes()


class AtomicLocalStore(LocalStore):
    """zarr's LocalStore whose ``set`` writes each key atomically (temporary file + rename)."""

    def __init__(self, root, *, read_only: bool = False, fsync: bool = False) -> None:
        super().__init__(root, read_only=read_only)
        self.fsync = fsync

    def with_read_only(self, read_only: bool = False) -> "AtomicLocalStore":
        return type(self)(self.root, read_only=read_only, fsync=self.fsync)

    async def set(self, key: str, value) -> None:
        if not self._is_open:
            await self._open()
        self._check_writable()
        await asyncio.to_thread(atomic_write_bytes, self.root / key, _buffer_bytes(value), self.fsync)

    def set_sync(self, key: str, value) -> None:
        self._check_writable()
        atomic_write_bytes(self.root / key, _buffer_bytes(value), self.fsync)


def atomic_local_store(path, *, read_only: bool = False, fsync: bool = False) -> AtomicLocalStore:
    """A zarr filesystem store rooted at ``path`` whose chunk writes are atomic."""
    return AtomicLocalStore(Path(path), read_only=read_only, fsync=fsync)


def default_chunks(shape) -> tuple[int, ...]:
    """64 along every axis (1 MiB float32 blocks for volumes), clipped to the shape."""
    return tuple(max(1, min(64, int(n))) for n in shape)


class ZarrStore:
    """A zarr array (v3 on disk) as a block store: ``read(window)`` / ``write(window, tensor)``.

    Create one with :meth:`create`, open one with :meth:`open`, or wrap any
    zarr array (for example an array of a ctbench dataset opened lazily).
    """

    def __init__(self, array):
        if not isinstance(array, zarr.Array):
            raise TypeError(f"array must be a zarr.Array, got {type(array).__name__}")
        self.array = array
        self._dtype = numpy_to_torch_dtype(array.dtype)

    @classmethod
    def create(cls, path, shape, dtype: torch.dtype = torch.float32, chunks=None, attrs: dict | None = None, *,
               overwrite: bool = False, compressors=None, fsync: bool = False) -> "ZarrStore":
        """A new zero-filled zarr v3 array at ``path`` (a folder).

        ``chunks`` defaults to 64 per axis; ``attrs`` is stored as JSON attributes;
        ``compressors`` (zarr codecs) default to none: fastest for float CT data.
        ``overwrite=False`` refuses an existing path.
        """
        path = Path(path)
        shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list, torch.Size)) else (shape,)))
        if not shape or any(n <= 0 for n in shape):
            raise ValueError(f"shape must be positive integers, got {shape!r}")
        chunks = default_chunks(shape) if chunks is None else tuple(int(c) for c in chunks)
        if len(chunks) != len(shape) or any(c <= 0 for c in chunks):
            raise ValueError(f"chunks must be {len(shape)} positive integers (one per axis of {shape}), got "
                             f"{chunks!r}")
        np_dtype = torch_to_numpy_dtype(dtype)
        if path.exists() and any(path.iterdir() if path.is_dir() else [path]):
            if not overwrite:
                raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
        store = atomic_local_store(path, fsync=fsync)
        array = zarr.create_array(store=store, shape=shape, chunks=chunks, dtype=np_dtype, fill_value=0,
                                  compressors=compressors, attributes=dict(attrs or {}), zarr_format=3,
                                  overwrite=overwrite)
        return cls(array)

    @classmethod
    def open(cls, path, mode: str = "r+", *, fsync: bool = False) -> "ZarrStore":
        """Open the zarr array at ``path``; ``mode`` "r" (read only) or "r+" (read and write)."""
        if mode not in ("r", "r+"):
            raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}")
        path = Path(path)
        if not (path / "zarr.json").is_file() and not (path / ".zarray").is_file():
            raise FileNotFoundError(f"no zarr array at {path}")
        store = atomic_local_store(path, read_only=(mode == "r"), fsync=fsync)
        return cls(zarr.open_array(store=store, mode=mode))

    # ------------------------------------------------------------- protocol
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def chunks(self) -> tuple[int, ...]:
        return tuple(self.array.chunks)

    @property
    def attrs(self) -> dict:
        return dict(self.array.attrs)

    def staging_bytes(self, window_shape, write: bool = False) -> int:
        """Chunk buffers zarr holds while reading or writing a window: one per chunk in flight.

        zarr decodes/encodes up to ``async.concurrency`` chunks at once, each a
        whole chunk even when the window covers only part of it; a write into
        part of a chunk also holds the stored chunk it merges into.
        """
        in_flight = min(int(zarr.config.get("async.concurrency") or 10), chunks_touched(window_shape, self.chunks))
        chunk_bytes = self.array.dtype.itemsize
        for c in self.chunks:
            chunk_bytes *= int(c)
        merge = write and not covers_whole_chunks(window_shape, self.chunks, self.shape)
        return in_flight * chunk_bytes * (2 if merge else 1)

    def read(self, window=None) -> torch.Tensor:
        w = normalize_window(window, self.shape)
        data = self.array[w]
        data = np.asarray(data)
        if not data.flags.writeable or not data.flags.c_contiguous:
            data = np.array(data)
        return torch.from_numpy(data)

    def write(self, window, value: torch.Tensor) -> None:
        w = normalize_window(window, self.shape)
        value = check_value(value, w, self.dtype)
        self.array[w] = value.cpu().contiguous().numpy()

    def __repr__(self) -> str:
        return f"ZarrStore({self.array.store_path}, shape={self.shape}, dtype={self.dtype}, chunks={self.chunks})"
