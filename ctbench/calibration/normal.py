"""The Gauss-Newton matrix of the calibration and the first-difference prior on per-view shifts."""

from __future__ import annotations

import torch

__all__ = ["difference_operator", "normal_matrix"]

F64 = torch.float64


def difference_operator(n: int, k: int) -> torch.Tensor:
    """First differences between neighbouring views, for each of k shift components."""
    D = torch.zeros(n - 1, n, dtype=F64)
    idx = torch.arange(n - 1)
    D[idx, idx], D[idx, idx + 1] = -1.0, 1.0
    return torch.block_diag(*([D] * k)) if k else torch.zeros(0, 0, dtype=F64)


def normal_matrix(cols_g, cols_s, n: int) -> torch.Tensor:
    """Gauss-Newton matrix over [global..., shift components per view...] from the Jacobian columns."""
    kg, ks = len(cols_g), len(cols_s)
    m = kg + ks * n
    H = torch.zeros(m, m, dtype=F64)
    for a in range(kg):
        for b in range(a, kg):
            H[a, b] = H[b, a] = float((cols_g[a].to(F64) * cols_g[b].to(F64)).sum())
    per_view = lambda p, q: (p.to(F64) * q.to(F64)).sum(dim=tuple(range(1, p.ndim)))  # noqa: E731
    for i in range(ks):
        si = slice(kg + i * n, kg + (i + 1) * n)
        for a in range(kg):
            c = per_view(cols_g[a], cols_s[i])
            H[a, si] = c
            H[si, a] = c
        for j in range(i, ks):
            sj = slice(kg + j * n, kg + (j + 1) * n)
            d = per_view(cols_s[i], cols_s[j])
            H[si, sj] = torch.diag(d)
            H[sj, si] = torch.diag(d)
    return H
