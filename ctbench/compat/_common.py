"""Helpers the diffct-face modules share."""

from __future__ import annotations

import math

import torch


_WINDOWS = {None: "ram-lak", "ram-lak": "ram-lak", "ramlak": "ram-lak", "none": "ram-lak", "hann": "hann",
            "hanning": "hann", "hamming": "hamming", "cosine": "cosine", "shepp-logan": "shepp-logan"}


def _filter_name(window):
    key = window.lower().replace("_", "-") if isinstance(window, str) else window
    if key not in _WINDOWS:
        raise ValueError(f"window must be one of {sorted(k for k in _WINDOWS if k)} or None, got {window!r}")
    return _WINDOWS[key]


def _is_projector(obj) -> bool:
    return hasattr(obj, "project") and hasattr(obj, "backproject") and hasattr(obj, "grid")


def _read_all(source, name, view_chunk_size=None):
    """The whole of ``source`` as a tensor; a store is read ``view_chunk_size`` views at a time."""
    if isinstance(source, torch.Tensor):
        return source.detach()
    if hasattr(source, "read") and hasattr(source, "shape"):
        shape = tuple(source.shape)
        if view_chunk_size is None or not shape or shape[0] <= view_chunk_size:
            return source.read(tuple(slice(0, n) for n in shape))
        rest = tuple(slice(0, n) for n in shape[1:])
        return torch.cat([source.read((slice(a, min(a + view_chunk_size, shape[0])),) + rest)
                          for a in range(0, shape[0], view_chunk_size)])
    raise TypeError(f"{name} must be a tensor or a block store, got {type(source).__name__}")


def _write_blocks(output, value, block_elements):
    if isinstance(output, torch.Tensor):
        with torch.no_grad():
            output.copy_(value)
        return
    per_plane = max(math.prod(value.shape[1:]), 1)
    step = max(1, block_elements // per_plane)
    for z in range(0, value.shape[0], step):
        window = (slice(z, min(z + step, value.shape[0])),) + tuple(slice(0, n) for n in value.shape[1:])
        output.write(window, value[window].to(output.dtype))
    if hasattr(output, "flush"):
        output.flush()

