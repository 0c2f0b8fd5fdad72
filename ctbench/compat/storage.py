"""diffct 2.5's block stores (``diffct.storage``): :class:`TensorStore` and :class:`NpyStore`
(diffct's ``read(slices)`` / ``write(slices, value, accumulate=)`` / ``flush()``, and ctbench's
block-store protocol)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .. import guarded_open
from ..atomic_files import create_exclusive
from ..storage import TensorStore as _TensorStore
from ..storage import normalize_window

__all__ = ["TensorStore", "NpyStore"]  # ForeignStore: an adapter, not a diffct name

# ------------------------------------------------------------------ stores


def _window(slices, shape):
    # diffct passes a slice or a tuple (or list) of slices; ctbench also None for the whole store
    return normalize_window(tuple(slices) if isinstance(slices, list) else slices, tuple(shape), "block indices")


def _value(value, shape):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"block values must be tensors, got {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"block value has shape {tuple(value.shape)}; the window needs {tuple(shape)}")
    return value.detach()


class TensorStore(_TensorStore):
    """ctbench's in-memory block store, with diffct's extras: ``write(..., accumulate=True)``,
    ``flush()``, ``writable`` and ``device``."""

    writable = True

    def __init__(self, tensor, chunks=None):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise TypeError("TensorStore requires a floating-point tensor")
        super().__init__(tensor, chunks)

    @property
    def device(self):
        return self.tensor.device

    def read(self, window=None):
        return self.tensor[_window(window, self.shape)].detach().clone()

    def write(self, window, value, *, accumulate=False):
        with torch.no_grad():
            block = self.tensor[_window(window, self.shape)]
            value = _value(value, block.shape).to(device=block.device, dtype=block.dtype)
            block.add_(value) if accumulate else block.copy_(value)

    def flush(self):
        pass


_NP = {torch.float32: np.float32, torch.float64: np.float64}


class NpyStore:
    """A float32/float64 ``.npy`` file mapped into memory, as diffct's ``NpyStore``: ``read(slices)``,
    ``write(slices, value, accumulate=False)``, ``flush()``; ``NpyStore.create(path, shape, dtype=)``
    makes a new file (written aside and renamed, so a crash leaves no half-made file).  It is also a
    ctbench block store (``chunks``), usable with ``project_into`` and ``fdk_into``."""

    def __init__(self, path, *, mode="r+"):
        if mode not in ("r", "r+"):
            raise ValueError(f"NpyStore mode must be 'r' or 'r+', got {mode!r}")
        self.path = Path(path).resolve()
        if not self.path.exists():
            raise FileNotFoundError(f"NpyStore: no such file {self.path}")
        guarded_open.check_regular(self.path)        # np.load opens by name: a FIFO or device is refused first
        arr = np.load(self.path, mmap_mode=mode, allow_pickle=False)
        if not isinstance(arr, np.memmap) or arr.dtype not in (np.float32, np.float64):
            raise TypeError(f"NpyStore needs a float32 or float64 .npy file; {self.path} holds {arr.dtype}")
        self._array = arr

    @classmethod
    def create(cls, path, shape, *, dtype=torch.float32):
        if dtype not in _NP:
            raise TypeError(f"NpyStore dtype must be torch.float32 or torch.float64, got {dtype}")
        shape = tuple(shape)
        if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
            raise ValueError(f"NpyStore shape must hold nonnegative integers, got {shape!r}")
        path = Path(path).resolve()
        if path.exists():
            raise FileExistsError(f"NpyStore.create: {path} exists")
        fd, tmp = create_exclusive(path.parent, f".{path.name}.", ".tmp", 0o666)   # never through a planted link
        os.close(fd)
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=_NP[dtype], shape=shape)
        arr.flush()
        del arr
        os.replace(tmp, path)
        return cls(path)

    @property
    def shape(self):
        return tuple(self._array.shape)

    @property
    def dtype(self):
        return torch.float32 if self._array.dtype == np.float32 else torch.float64

    @property
    def chunks(self):
        return self.shape  # one memory-mapped block: any window reads directly

    def staging_bytes(self, window_shape, write=False):
        return 0

    @property
    def device(self):
        return torch.device("cpu")

    @property
    def writable(self):
        return bool(self._array.flags.writeable)

    def read(self, window=None):
        return torch.from_numpy(np.array(self._array[_window(window, self.shape)]))

    def write(self, window, value, *, accumulate=False):
        if not self.writable:
            raise PermissionError(f"NpyStore {self.path} is read-only (mode='r')")
        block = self._array[_window(window, self.shape)]
        v = _value(value, block.shape).to(device="cpu", dtype=self.dtype).numpy()
        if accumulate:
            block += v
        else:
            block[...] = v

    def flush(self):
        self._array.flush()

    def location(self):
        """The file's identity (device, inode): equal for two stores over one file, whatever the path
        (``..``, a symbolic or a hard link), so streaming refuses to write a file into itself."""
        st = os.stat(self.path)
        return ("npy-file", st.st_dev, st.st_ino)

    def __repr__(self):
        return f"NpyStore({str(self.path)!r}, shape={self.shape}, dtype={self.dtype})"




class ForeignStore:
    """A block store of diffct's protocol (``shape``, ``dtype``, ``read(window)``,
    ``write(window, value)``, optionally ``writable`` and ``flush``) seen as a ctbench block store:
    one chunk, reads and writes passed on.  Its ``location`` is the wrapped object, so an input
    and an output that are one object are refused as aliases."""

    def __init__(self, store):
        for name in ("shape", "dtype", "read", "write"):
            if not hasattr(store, name):
                raise TypeError(f"a block store needs shape, dtype, read and write; {type(store).__name__} lacks {name}")
        self.store = store

    @property
    def shape(self):
        return tuple(self.store.shape)

    @property
    def dtype(self):
        return self.store.dtype

    @property
    def chunks(self):
        return self.shape

    @property
    def writable(self):
        return getattr(self.store, "writable", True)

    def staging_bytes(self, window_shape, write=False):
        return 0

    def read(self, window=None):
        return self.store.read(_window(window, self.shape))

    def write(self, window, value):
        if not self.writable:
            raise PermissionError(f"{type(self.store).__name__} is read-only (writable=False)")
        self.store.write(_window(window, self.shape), value)

    def flush(self):
        if hasattr(self.store, "flush"):
            self.store.flush()

    def location(self):
        return ("object", id(self.store))
