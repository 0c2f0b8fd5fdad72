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

Reads are checked (docs/RELIABILITY.md): a key that is a symlink out of the
store's folder, or anything but a regular file (a FIFO, a device), is refused;
metadata files are bounded in size; chunks of arrays with zarr's ``crc32c``
codec (every array :meth:`ZarrStore.create` makes) are verified, and a
damaged one raises :class:`~ctbench.storage.base.StoreIntegrityError` naming
the array and the chunk.  Arrays whose every chunk must exist (``require_chunks``)
raise the same error for a missing chunk instead of reading zeros.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import stat
import sys
from pathlib import Path

import numpy as np
import torch
import zarr
from zarr.storage import LocalStore

from ..atomic_files import atomic_write_bytes
from .base import StoreIntegrityError, check_value, chunks_touched, covers_whole_chunks, normalize_window

#: Largest metadata file (zarr.json) a store reads: metadata is small, a huge one is damage or an attack.
MAX_METADATA_BYTES = 16 << 20

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


def _buffer_bytes(value):
    fn = getattr(value, "as_buffer_like", None)
    return fn() if fn is not None else value.to_bytes()


def split_chunk_key(key: str) -> tuple[str, str] | None:
    """``"volume/c/0/1/2"`` -> ``("volume", "c/0/1/2")``; None for a key that is not a chunk (v3 default keys)."""
    parts = key.split("/")
    for i, p in enumerate(parts):
        if p == "c" and i + 1 < len(parts) and all(q.isdigit() for q in parts[i + 1:]):
            return "/".join(parts[:i]), "/".join(parts[i:])
    return None


def describe_array(array_path: str) -> str:
    return f"array '{array_path}'" if array_path else "the array"


def safe_file_size(path: Path, root_real: str, what: str) -> int | None:
    """Size of the regular file at ``path`` (None if absent or a folder); refuses unsafe entries.

    A symlink must resolve to a regular file inside ``root_real``; FIFOs,
    devices and sockets are refused, so that a planted entry can neither
    block a read (FIFO) nor feed it endless data (``/dev/zero``).
    """
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        if os.path.commonpath([real, root_real]) != root_real:
            raise StoreIntegrityError(f"{what} ({path}) is a symlink out of the store folder {root_real} "
                                      f"(to {real}); refusing to read it")
        try:
            st = os.stat(real)
        except FileNotFoundError:
            return None
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        raise StoreIntegrityError(f"{what} ({path}) is not a regular file (a FIFO, device or socket); "
                                  "refusing to read it")
    return st.st_size


# CRC-32C of any message followed by its own little-endian CRC: checking the whole chunk
# against this constant verifies it without copying the payload.
_CRC32C_RESIDUE = 0x48674BC7


def crc32c_ok(data: bytes) -> bool:
    """Whether the last 4 bytes of ``data`` are the crc32c of the rest (zarr's crc32c codec layout)."""
    import google_crc32c

    if len(data) < 4:
        return False
    if sys.byteorder == "little":
        return google_crc32c.value(data) == _CRC32C_RESIDUE
    return google_crc32c.value(data[:-4]) == int.from_bytes(data[-4:], sys.byteorder)


# ------------------------------------------------------------ chunk positions
#: Beside an array's zarr.json: the crc32c each chunk carries, in the chunk grid's C order, then the crc32c
#: of the table.  A chunk whose own crc32c is not the one recorded for its position holds another chunk's
#: data (a valid chunk copied over another): the content check alone cannot tell.
POSITIONS_FILE = "ctbench-chunk-crc32c"


def _grid(meta: dict) -> tuple[list[int], str] | None:
    """(chunks per axis, key separator) of an array's zarr.json; None when it is not a regular v3 grid."""
    try:
        shape, chunks = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
        enc = meta.get("chunk_key_encoding") or {"name": "default"}
        if enc.get("name") != "default" or len(shape) != len(chunks):
            return None
        sep = (enc.get("configuration") or {}).get("separator", "/")
        return [max(1, -(-int(n) // int(c))) for n, c in zip(shape, chunks)], sep
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def write_chunk_positions(array_folder) -> bool:
    """Record, beside a complete crc32c-checksummed array, the checksum each chunk carries at its position.

    Called by writers once every chunk is written (save_dataset, job results).  False (nothing written)
    when the array has no crc32c codec, a missing chunk, or not the default chunk grid."""
    import google_crc32c
    import itertools

    folder = Path(array_folder)
    try:
        meta = json.loads((folder / "zarr.json").read_bytes())
    except (OSError, ValueError):
        return False
    codecs = meta.get("codecs") or []
    grid = _grid(meta)
    if grid is None or not codecs or not isinstance(codecs[-1], dict) or codecs[-1].get("name") != "crc32c":
        return False
    counts, sep = grid
    table = bytearray()
    for idx in itertools.product(*(range(n) for n in counts)):
        key = sep.join(["c", *map(str, idx)])
        try:
            with open(folder / key, "rb") as f:
                f.seek(-4, os.SEEK_END)
                table += f.read(4)
        except OSError:
            return False
    table += google_crc32c.value(bytes(table)).to_bytes(4, "little")
    atomic_write_bytes(folder / POSITIONS_FILE, bytes(table))
    return True


class AtomicLocalStore(LocalStore):
    """zarr's LocalStore whose ``set`` writes each key atomically (temporary file + rename) and whose
    reads are checked (safe files only, bounded metadata, crc32c-verified chunks, required chunks)."""

    def __init__(self, root, *, read_only: bool = False, fsync: bool = False, require_chunks=()) -> None:
        super().__init__(root, read_only=read_only)
        self.fsync = fsync
        # Array paths ("" for a store that is one array) whose every chunk must exist.
        self.require_chunks = frozenset(require_chunks)
        self._checksummed: dict[str, bool] = {}
        self._positions: dict[str, tuple | None] = {}
        self._root_real: str | None = None

    def with_read_only(self, read_only: bool = False) -> "AtomicLocalStore":
        return type(self)(self.root, read_only=read_only, fsync=self.fsync, require_chunks=self.require_chunks)

    # ----------------------------------------------------------------- writes
    async def set(self, key: str, value) -> None:
        if not self._is_open:
            await self._open()
        self._check_writable()
        self._forget(key)
        await asyncio.to_thread(atomic_write_bytes, self.root / key, _buffer_bytes(value), self.fsync)

    def set_sync(self, key: str, value) -> None:
        self._check_writable()
        self._forget(key)
        atomic_write_bytes(self.root / key, _buffer_bytes(value), self.fsync)

    def _forget(self, key: str) -> None:
        if key.endswith("zarr.json"):
            self._checksummed.clear()
        self._positions.clear()   # a write makes a recorded table stale: writers record a new one at the end

    # ------------------------------------------------------------------ reads
    def _is_checksummed(self, array_path: str) -> bool:
        """Whether the array's codecs end with crc32c (read from its zarr.json once)."""
        if array_path not in self._checksummed:
            meta = self._read_checked(f"{array_path}/zarr.json" if array_path else "zarr.json", None)
            codecs = []
            if meta is not None:
                with contextlib.suppress(ValueError, AttributeError):
                    codecs = json.loads(bytes(meta)).get("codecs") or []
            self._checksummed[array_path] = bool(codecs) and isinstance(codecs[-1], dict) and \
                codecs[-1].get("name") == "crc32c"
        return self._checksummed[array_path]

    def _read_checked(self, key: str, byte_range):
        """The bytes of ``key`` (None when absent), after the safety and integrity checks."""
        path = self.root / key
        chunk = split_chunk_key(key)
        what = (f"chunk {chunk[1]} of {describe_array(chunk[0])}" if chunk else f"'{key}'") + \
            f" in the store {self.root}"
        if self._root_real is None:
            self._root_real = os.path.realpath(self.root)
        size = safe_file_size(path, self._root_real, what)
        if size is None:
            if chunk is not None and chunk[0] in self.require_chunks:
                raise StoreIntegrityError(f"{what} is missing (every chunk of this array was written; "
                                          "the data is damaged)")
            return None
        if chunk is None and size > MAX_METADATA_BYTES:
            raise StoreIntegrityError(f"{what} is {size} bytes; metadata is at most {MAX_METADATA_BYTES} "
                                      "(damaged or not a ctbench store)")
        if byte_range is not None:
            return ("range", path, byte_range)
        with open(path, "rb") as f:
            data = f.read(size + 1)
        if len(data) != size:
            raise StoreIntegrityError(f"{what} changed size while being read")
        if chunk is not None and self._is_checksummed(chunk[0]):
            if not crc32c_ok(data):
                raise StoreIntegrityError(f"{what} fails its crc32c checksum (bit rot, truncation or an "
                                          "overwrite from outside ctbench)")
            # Read-only stores only: a writer may rewrite chunks after a table was recorded.
            want = self._recorded_crc(chunk[0], chunk[1], what) if self.read_only else None
            if want is not None and bytes(data[-4:]) != want:
                raise StoreIntegrityError(f"{what} is a valid chunk but not the one written at this position "
                                          "(its checksum is not the one recorded for it: a chunk copied over "
                                          "another?)")
        return data

    def _recorded_crc(self, array_path: str, chunk_key: str, what: str) -> bytes | None:
        """The crc32c recorded for this chunk position (None when the array has no position table)."""
        import google_crc32c

        if array_path not in self._positions:
            entry = None
            table_path = self.root / array_path / POSITIONS_FILE if array_path else self.root / POSITIONS_FILE
            meta = self._read_checked(f"{array_path}/zarr.json" if array_path else "zarr.json", None)
            grid = None
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                grid = _grid(json.loads(bytes(meta))) if meta is not None else None
            size = safe_file_size(table_path, self._root_real, f"the chunk position table of {what}")
            if size is not None and grid is not None:
                n = math.prod(grid[0])
                if size != 4 * n + 4:
                    raise StoreIntegrityError(f"the chunk position table {table_path} has {size} bytes; "
                                              f"{4 * n + 4} expected for {n} chunks (damaged)")
                with open(table_path, "rb") as f:
                    table = f.read(size)
                if google_crc32c.value(table[:-4]).to_bytes(4, "little") != table[-4:]:
                    raise StoreIntegrityError(f"the chunk position table {table_path} fails its checksum")
                entry = (grid[0], grid[1], table)
            self._positions[array_path] = entry
        entry = self._positions[array_path]
        if entry is None:
            return None
        counts, sep, table = entry
        parts = chunk_key.split("/")[1:]   # split_chunk_key matched the default "/" keys only
        if len(parts) != len(counts):
            return None
        flat = 0
        for i, n in zip(parts, counts):
            i = int(i)
            if i >= n:
                return None
            flat = flat * n + i
        return table[4 * flat:4 * flat + 4]

    def _buffer(self, key: str, prototype, byte_range):
        from zarr.core.buffer import default_buffer_prototype
        from zarr.storage._local import _get

        prototype = prototype or default_buffer_prototype()
        data = self._read_checked(key, byte_range)
        if data is None:
            return None
        if isinstance(data, tuple):  # a byte range (sharded arrays): zarr reads it
            return _get(data[1], prototype, data[2])
        return prototype.buffer.from_bytes(data)

    def get_sync(self, key: str, *, prototype=None, byte_range=None):
        self._ensure_open_sync()
        return self._buffer(key, prototype, byte_range)

    async def get(self, key: str, prototype=None, byte_range=None):
        if not self._is_open:
            await self._open()
        return await asyncio.to_thread(self._buffer, key, prototype, byte_range)

    async def get_partial_values(self, prototype, key_ranges):
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]


def atomic_local_store(path, *, read_only: bool = False, fsync: bool = False, require_chunks=()) -> AtomicLocalStore:
    """A zarr filesystem store rooted at ``path`` whose chunk writes are atomic and whose reads are checked."""
    return AtomicLocalStore(Path(path), read_only=read_only, fsync=fsync, require_chunks=require_chunks)


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
        # Every chunk written lands on disk, even an all-zero one, so that a missing chunk is damage.
        self.array = array.with_config({"write_empty_chunks": True})
        self._dtype = numpy_to_torch_dtype(array.dtype)
        self.allow_incomplete = False
        self._required_when_complete(self.completion_record())

    @classmethod
    def create(cls, path, shape, dtype: torch.dtype = torch.float32, chunks=None, attrs: dict | None = None, *,
               overwrite: bool = False, compressors=None, fsync: bool = False, checksum: bool = True) -> "ZarrStore":
        """A new zero-filled zarr v3 array at ``path`` (a folder).

        ``chunks`` defaults to 64 per axis; ``attrs`` is stored as JSON attributes;
        ``compressors`` (zarr codecs) default to none: fastest for float CT data.
        ``checksum=True`` appends zarr's crc32c codec, so every chunk read is verified.
        ``overwrite=False`` refuses an existing path.
        """
        path = Path(path)
        shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list, torch.Size)) else (shape,)))
        if not shape or any(n <= 0 for n in shape):
            raise ValueError(f"shape must be positive integers, got {shape!r}")
        given = chunks
        try:
            chunks = default_chunks(shape) if chunks is None else tuple(int(c) for c in chunks)
        except (TypeError, ValueError):
            raise ValueError(f"chunks must be {len(shape)} positive integers (one per axis of {shape}), got "
                             f"{given!r}") from None
        if len(chunks) != len(shape) or any(c <= 0 for c in chunks):
            raise ValueError(f"chunks must be {len(shape)} positive integers (one per axis of {shape}), got "
                             f"{chunks!r}")
        np_dtype = torch_to_numpy_dtype(dtype)
        if path.exists() and any(path.iterdir() if path.is_dir() else [path]):
            if not overwrite:
                raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
        store = atomic_local_store(path, fsync=fsync)
        codecs = list(compressors or ())
        if checksum:
            from zarr.codecs import Crc32cCodec
            codecs.append(Crc32cCodec())
        array = zarr.create_array(store=store, shape=shape, chunks=chunks, dtype=np_dtype, fill_value=0,
                                  compressors=codecs or None, attributes=dict(attrs or {}), zarr_format=3,
                                  overwrite=overwrite)
        return cls(array)

    @classmethod
    def open(cls, path, mode: str = "r+", *, fsync: bool = False, allow_incomplete: bool = False) -> "ZarrStore":
        """Open the zarr array at ``path``; ``mode`` "r" (read only) or "r+" (read and write).

        A store left incomplete by an interrupted streaming call raises
        :class:`~ctbench.storage.base.IncompleteStoreError` on reads of the unwritten
        windows, unless ``allow_incomplete=True``.
        """
        if mode not in ("r", "r+"):
            raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}")
        path = Path(path)
        root_real = os.path.realpath(path)
        if safe_file_size(path / "zarr.json", root_real, f"{path}/zarr.json") is None and \
                safe_file_size(path / ".zarray", root_real, f"{path}/.zarray") is None:
            raise FileNotFoundError(f"no zarr array at {path}")
        store = atomic_local_store(path, read_only=(mode == "r"), fsync=fsync)
        out = cls(zarr.open_array(store=store, mode=mode))
        out.allow_incomplete = allow_incomplete
        return out

    # ---------------------------------------------------- completion records
    def location(self):
        """The resolved folder of the array (equal for two objects over the same data), or None."""
        root = getattr(self.array.store, "root", None)
        if root is None:
            return None
        return os.path.join(os.path.realpath(root), self.array.path or "")

    def completion_record(self):
        """The completion record of the last streaming call into this store, or None."""
        from .completion import RECORD_KEY, CompletionRecord
        return CompletionRecord.from_json(self.array.attrs.get(RECORD_KEY))

    def set_completion_record(self, record) -> None:
        """Store the record in the array's attributes (zarr.json, rewritten atomically)."""
        from .completion import RECORD_KEY
        self.array.update_attributes({RECORD_KEY: record.to_json()})
        self._required_when_complete(record)

    def _required_when_complete(self, record) -> None:
        # A complete record promises every chunk was written: a missing one is damage, not zeros.
        store = self.array.store
        if isinstance(store, AtomicLocalStore) and record is not None and record.complete:
            store.require_chunks = store.require_chunks | {self.array.path or ""}

    def remove_partial_files(self) -> int:
        """Delete temporary ``*.partial`` files that killed writers left in the store's folder."""
        loc = self.location()
        n = 0
        if loc is None or self.array.store.read_only:
            return n
        for dirpath, _, files in os.walk(loc):
            for f in files:
                if f.endswith(".partial"):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(dirpath, f))
                        n += 1
        return n

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
        part of a chunk also holds the stored chunk it merges into, and a
        checksummed write holds the encoded chunk (bytes plus crc32c, a copy)
        beside the chunk it encodes (measured: tests/test_plan.py).
        """
        in_flight = min(int(zarr.config.get("async.concurrency") or 10), chunks_touched(window_shape, self.chunks))
        chunk_bytes = self.array.dtype.itemsize
        for c in self.chunks:
            chunk_bytes *= int(c)
        copies = 1
        if write:
            copies += int(not covers_whole_chunks(window_shape, self.chunks, self.shape)) + int(self.checksummed)
        return in_flight * chunk_bytes * copies

    @property
    def checksummed(self) -> bool:
        """Whether the chunks carry a crc32c checksum (verified on every read)."""
        codecs = getattr(self.array.metadata, "codecs", None) or ()
        return bool(codecs) and type(codecs[-1]).__name__ == "Crc32cCodec"

    def read(self, window=None) -> torch.Tensor:
        w = normalize_window(window, self.shape)
        if not self.allow_incomplete:
            from .completion import check_window_complete
            check_window_complete(self, self.completion_record(), w[0].start, w[0].stop, f"the store {self.location()}")
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


def settle_pending_io(timeout: float = 10.0) -> None:
    """Let zarr's chunk reads and writes still in flight finish after one of them failed.

    zarr runs a window's chunk I/O as concurrent tasks on its own event loop; when one fails (a full disk) the
    error reaches the caller while the others are still pending, and they would be torn down at exit with
    "Task was destroyed but it is pending" noise.  Waiting for them (their own errors retrieved, not raised)
    leaves the loop quiet; every chunk write is atomic, so what they write is whole or absent.
    """
    import asyncio

    from zarr.core import sync as zsync

    loop = zsync.loop[0]
    if loop is None or loop.is_closed() or not loop.is_running():
        return

    async def _settle():
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for t in tasks:
            if t.done() and not t.cancelled():
                t.exception()

    try:
        asyncio.run_coroutine_threadsafe(_settle(), loop).result(timeout + 1.0)
    except Exception:  # noqa: BLE001 - best effort: the caller is already reporting the real error
        pass
