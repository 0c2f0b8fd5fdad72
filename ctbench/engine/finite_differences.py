"""Forward differences and their negative adjoint: the operators of total variation.

They live below both users, the TV solver (:mod:`ctbench.solvers.tv`) and the
space partition's halo exchange (:mod:`ctbench.distributed.halo`), so neither
imports the other.
"""

from __future__ import annotations

import torch


def gradient(x: torch.Tensor, ndim: int) -> torch.Tensor:
    """Forward differences along the last ``ndim`` axes, zero on each axis's last plane:
    shape ``(ndim, *x.shape)``."""
    parts = []
    for a in range(x.ndim - ndim, x.ndim):
        d = torch.diff(x, dim=a)
        pad = [0, 0] * (x.ndim - 1 - a) + [0, 1]
        parts.append(torch.nn.functional.pad(d, pad))
    return torch.stack(parts)


def divergence(q: torch.Tensor) -> torch.Tensor:
    """Minus the adjoint of :func:`gradient`: ``<gradient(x), q> = -<x, divergence(q)>``."""
    ndim = q.shape[0]
    shape = q.shape[1:]
    out = torch.zeros(shape, dtype=q.dtype, device=q.device)
    for i, a in enumerate(range(len(shape) - ndim, len(shape))):
        qa = q[i]
        n = shape[a]
        if n < 2:
            continue  # a single plane has no differences along this axis
        # adjoint of forward differences with a zero last row: (q[v-1] - q[v]), q[-1] treated as 0,
        # and the last plane of q (whose difference is zero) never contributes.
        qa = qa.narrow(a, 0, n - 1)
        zero = torch.zeros_like(qa.narrow(a, 0, 1))
        out = out + torch.cat([qa, zero], dim=a) - torch.cat([zero, qa], dim=a)
    return out
