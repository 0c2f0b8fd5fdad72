"""diffct's ``backend="auto"`` choice and its fallback warning, for the diffct face.

diffct 2.5 picks its native CUDA backend (``"numba"``) for ``backend="auto"`` only where it can
run it: NVIDIA CUDA (not ROCm), ``precision="fast"``, a ``views`` or ``space`` partition, a beam
other than ``parallel3d`` and per-axis voxel pitches inside the native range.  Otherwise
``"auto"`` is the portable backend (``"torch"``), and on an NVIDIA CUDA machine it says so once
per projector with a ``UserWarning`` naming each reason (the portable backend can be much slower
there); elsewhere the portable backend is the only choice and nothing is said.  The label is
what ``Projector.backend`` shows; ctbench still runs its own backend for the data's device.
"""

from __future__ import annotations

import warnings

import torch

__all__ = ["nvidia_cuda", "native_fallback_reasons", "auto_label", "warn_auto_fallback"]

_NATIVE_PITCH = (1e-6, 1e6)  # diffct's native voxel_spacing range per axis
_NATIVE_RATIO = 1e4  # and its largest pitch ratio


def nvidia_cuda() -> bool:
    return bool(torch.cuda.is_available()) and torch.version.hip is None


def _spacing_reason(voxel_spacing):
    if not isinstance(voxel_spacing, (tuple, list)):
        return None
    try:
        pitches = tuple(float(v) for v in voxel_spacing)
    except (TypeError, ValueError):
        return None  # the projector's own check names the argument
    if not pitches:
        return None
    if any(not _NATIVE_PITCH[0] <= p <= _NATIVE_PITCH[1] for p in pitches):
        return "voxel_spacing outside the native range [1e-6, 1e6] on some axis"
    if max(pitches) / min(pitches) > _NATIVE_RATIO:
        return "a voxel_spacing pitch ratio above 1e4"
    return None


def native_fallback_reasons(precision, options) -> list[str]:
    """Why diffct's native backend cannot run this configuration (empty: it can)."""
    partition = options.get("partition", "views")
    beam = options.get("beam", "cone")
    reasons = [reason for applies, reason in (
        (precision not in (None, "fast"), f"precision={precision!r}"),
        (partition == "hybrid", "partition='hybrid'"),
        (beam == "parallel3d", "beam='parallel3d'"),
    ) if applies]
    spacing = _spacing_reason(options.get("voxel_spacing"))
    if spacing is not None:
        reasons.append(spacing)
    return reasons


def auto_label(precision, options) -> str:
    """diffct's label of ``backend="auto"``: ``"numba"`` where its native backend would run."""
    return "numba" if nvidia_cuda() and not native_fallback_reasons(precision, options) else "torch"


def warn_auto_fallback(precision, options, stacklevel: int = 3) -> None:
    """diffct's once-per-projector warning when ``"auto"`` falls back on an NVIDIA CUDA machine."""
    if not nvidia_cuda():
        return
    reasons = native_fallback_reasons(precision, options)
    if reasons:
        warnings.warn(f"backend='auto' chose the portable backend ('torch'), not diffct's native CUDA backend "
                      f"('numba'), because of {', '.join(reasons)}; on large problems it may be much slower. Pass "
                      "backend='torch' to choose it explicitly without this warning.", UserWarning,
                      stacklevel=stacklevel)
