"""Identifiability and uncertainty of calibration parameters from the reduced Gauss-Newton matrix.

With an unknown object, a geometry change that a changed volume can mimic is
invisible in the data.  For each global parameter's Jacobian column ``j_k`` a
short CGLS solve finds the volume change ``dx_k`` that best explains it; the
remainder ``r_k = j_k - A dx_k`` is what only the geometry can produce.  The
reduced matrix ``H`` over ``[r_k..., shift columns]`` (plus the shift prior)
then gives

- identifiability ``1 / sqrt(|j_k|^2 (H^-1)_kk)`` in [0, 1]: the fraction of the
  parameter's data signature that neither the object nor the other parameters
  explain (0: not identifiable);
- standard deviation ``sigma_k = sqrt(s2 (H^-1)_kk)`` with ``s2`` the residual
  variance per detector pixel: the spread of the estimate under noise like the
  residual's, a local (linearised) figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..solvers import cgls
from .normal import normal_matrix

__all__ = ["Analysis", "analyse"]

F64 = torch.float64
N_ITER = 15   # CGLS iterations per column: fewer leave part of what the volume can absorb unexplained


@dataclass
class Analysis:
    names: tuple
    identifiability: dict = field(default_factory=dict)
    sigma: dict = field(default_factory=dict)
    shift_sigma: dict = field(default_factory=dict)       # per view, px
    shift_rms_sigma: dict = field(default_factory=dict)
    residual_sigma: float = 0.0


def analyse(P, x, y, est, cols_g, cols_s, B, smoothness: float, Dm) -> Analysis:
    names = est.active
    with torch.no_grad():
        r = P.project(x) - y
        n_pix = r.numel()
        s2 = float(r.to(F64).square().sum()) / max(1, n_pix)
        reduced, raw = [], []
        for j in cols_g:
            raw.append(float(j.to(F64).square().sum()))
            dx = cgls(P, j, N_ITER).volume
            reduced.append(j - P.project(dx))
    H = normal_matrix(reduced, cols_s, est.n)
    kg = len(names)
    if est.s.numel():
        T = torch.block_diag(torch.eye(kg, dtype=F64), B)
        Hz = T.T @ H @ T
        hs = torch.diagonal(H)[kg:]
        lam = smoothness * float(hs.mean()) if float(hs.mean()) > 0 else 0.0
        Hz[kg:, kg:] += lam * (B.T @ (Dm.T @ Dm) @ B)
    else:
        Hz = H
    Hinv = torch.linalg.pinv(Hz, hermitian=True, rtol=1e-12) if Hz.numel() else Hz
    out = Analysis(names, residual_sigma=math.sqrt(s2))
    for i, k in enumerate(names):
        hk = float(Hinv[i, i])
        if raw[i] <= 0 or hk <= 0 or not math.isfinite(hk):
            out.identifiability[k] = 0.0
            out.sigma[k] = None
            continue
        out.identifiability[k] = min(1.0, 1.0 / math.sqrt(raw[i] * hk))
        out.sigma[k] = math.sqrt(s2 * hk)
    if est.s.numel():
        cov = B @ Hinv[kg:, kg:] @ B.T
        sd = (s2 * torch.diagonal(cov).clamp_min(0)).sqrt()
        n = est.n
        for i, k in enumerate(est.shift_names):
            part = sd[i * n:(i + 1) * n]
            out.shift_sigma[k] = part.tolist()
            out.shift_rms_sigma[k] = float(part.square().mean().sqrt())
    return out
