"""Raw binary stacks: the caller says the shape, dtype, byte order and header length."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .errors import ScanFileError, check_frame, check_input
from .scan import lazy_stack

BYTE_ORDERS = {"little": "<", "big": ">", "<": "<", ">": ">", "native": "="}


def raw_dtype(dtype, byte_order: str = "little") -> np.dtype:
    """The numpy dtype of ``dtype`` in ``byte_order`` ("little", "big" or "native"); ValueError otherwise."""
    if byte_order not in BYTE_ORDERS:
        raise ValueError(f"byte_order must be one of {sorted(BYTE_ORDERS)}, got {byte_order!r}")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must be a numeric type such as 'uint16' or 'float32', got {dtype!r}") from None
    if dt.kind not in "uif":
        raise ValueError(f"dtype must be a numeric type such as 'uint16' or 'float32', got {dtype!r}")
    return dt.newbyteorder(BYTE_ORDERS[byte_order])


def _whole(v) -> bool:
    """An integer, or a float/numpy number with no fraction; never a bool (True is not a size)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return False
    return bool(np.isfinite(v)) and v == int(v)


def raw_shape(shape) -> tuple[int, ...]:
    """``shape`` as (views, rows, cols) or (rows, cols) positive integers; ValueError for fractions, bools, ..."""
    try:
        items = tuple(shape)
    except TypeError:
        raise ValueError(f"shape must be (views, rows, cols) positive integers, got {shape!r}") from None
    if len(items) not in (2, 3) or not all(_whole(s) and s > 0 for s in items):
        raise ValueError(f"shape must be (views, rows, cols) or (rows, cols) positive integers "
                         f"(no fractions or booleans), got {shape!r}")
    return tuple(int(s) for s in items)


def read_raw(path, shape, dtype="uint16", byte_order: str = "little", header: int = 0):
    """A raw binary file of ``shape`` = (views, rows, cols) or (rows, cols) -> lazy dask stack (memory-mapped).

    The file must hold exactly ``header`` bytes followed by the data: a
    size mismatch (truncated file, wrong shape or dtype) is an error that
    gives both sizes.
    """

    path = Path(path)
    dt = raw_dtype(dtype, byte_order)
    shp = raw_shape(shape)
    if not _whole(header) or header < 0:
        raise ValueError(f"header must be a byte count >= 0, got {header!r}")
    size = check_input(path).st_size      # a regular file: a FIFO or /dev/zero is refused, never mapped
    check_frame(path, shp[-2:], dt.itemsize, "a frame")
    need = int(header) + math.prod(shp) * dt.itemsize
    if size < need:
        raise ScanFileError(path, f"is truncated or smaller than described: {shp} {dt.name} after a {header}-byte "
                                  f"header needs {need} bytes, the file has {size}")
    if size > need:
        raise ScanFileError(path, f"is larger than described: {shp} {dt.name} after a {header}-byte header is "
                                  f"{need} bytes, the file has {size} (wrong shape, dtype or header?)")
    mm = np.memmap(path, dtype=dt, mode="r", offset=int(header), shape=shp)
    stack = lazy_stack(mm)
    return stack[None] if stack.ndim == 2 else stack
