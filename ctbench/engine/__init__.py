"""Backends that run the kernels (cpu, cuda, reference) and the plumbing they share."""

from __future__ import annotations

import torch

from .base import Backend, Rays, Tile, VolumeGrid

BACKENDS = ("auto", "cpu", "cuda", "reference", "cuda-emulated")
_INSTANCES: dict[str, Backend] = {}


def get_backend(name: str, device: torch.device | str | None = None) -> Backend:
    """The backend called ``name``; ``"auto"`` picks cuda for CUDA tensors and cpu otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        dev = torch.device(device) if device is not None else torch.device("cpu")
        name = "cuda" if dev.type == "cuda" else "cpu"
    if name not in _INSTANCES:
        if name == "cpu":
            from .cpu import CpuBackend
            _INSTANCES[name] = CpuBackend()
        elif name in ("cuda", "cuda-emulated"):
            from .cuda import CudaBackend, runtime_for
            _INSTANCES[name] = CudaBackend(runtime_for(name))
        else:
            from .reference import ReferenceBackend
            _INSTANCES[name] = ReferenceBackend()
    return _INSTANCES[name]


__all__ = ["Backend", "Rays", "Tile", "VolumeGrid", "get_backend", "BACKENDS"]
