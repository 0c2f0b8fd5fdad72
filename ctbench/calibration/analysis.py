"""Identifiability, uncertainty and correlations of calibration parameters from the reduced Gauss-Newton matrix.

With an unknown object, a geometry change that a changed volume can mimic is
invisible in the data.  For each global parameter's Jacobian column ``j_k`` the
volume change that best explains it is removed: first the projections of the
object's smooth deformations (:func:`deformation_directions`: a magnification
change looks like a larger object, a detector pitch like an object that flares
with height; a short CGLS solve finds such directions only slowly), then by a
short CGLS solve; the remainder ``r_k`` is what only the geometry can produce.  With a
*known* object (``obj`` given) nothing is removed.  The reduced matrix ``H``
over ``[r_k..., shift columns]`` (plus the shift prior) then gives

- identifiability ``1 / sqrt(|j_k|^2 (H^-1)_kk)`` in [0, 1]: the fraction of the
  parameter's data signature that neither the object nor the other parameters
  explain (0: not identifiable);
- standard deviation ``sigma_k``: the robust (sandwich) covariance over blocks of
  neighbouring views (:func:`sandwich`), never below the white-noise figure
  ``sqrt(s2 (H^-1)_kk)`` (``s2`` the residual variance per pixel; kept as
  ``noise_sigma``): the residual is mostly model error, correlated within a view
  and between neighbouring views, which the white-noise figure ignores; with
  ``discretisation`` (the final analysis, on a coarser grid than the estimate's)
  the Gauss-Newton step that grid would still take is added in quadrature: how
  far the answer moves with the discretisation;
- correlations ``(H^-1)_ab / sqrt((H^-1)_aa (H^-1)_bb)`` between global parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..solvers import cgls
from .normal import normal_matrix

__all__ = ["Analysis", "analyse", "deformation_directions", "reduce_columns"]

F64 = torch.float64
N_ITER = 15   # CGLS iterations per column: fewer leave part of what the volume can absorb unexplained
N_BLOCKS = 12  # view blocks of the robust covariance: 30 degrees of a full orbit each


@dataclass
class Analysis:
    names: tuple
    identifiability: dict = field(default_factory=dict)
    sigma: dict = field(default_factory=dict)
    shift_sigma: dict = field(default_factory=dict)       # per view, px
    shift_rms_sigma: dict = field(default_factory=dict)
    residual_sigma: float = 0.0
    correlation: dict = field(default_factory=dict)       # {(a, b): corr} between global parameters
    noise_sigma: dict = field(default_factory=dict)       # s2 (H^-1)_kk alone: white, independent residuals
    robust_sigma: dict = field(default_factory=dict)      # the sandwich over view blocks (at least noise_sigma)
    step: dict = field(default_factory=dict)              # the Gauss-Newton step this grid would still take


def deformation_directions(x: torch.Tensor, spacing):
    """Volume changes ``-(phi . grad) x`` of the object ``x`` under smooth displacement fields ``phi``: each
    component a monomial of degree <= 2 in the (box-normalised) coordinates, 30 fields in all.

    They hold the object's translations, rotations, scaling (what a magnification change looks like), shears,
    a flare with height (a detector pitch) and radial bulges: what an unknown object can do to mimic a geometry
    error, and what a short CGLS solve would find only slowly."""
    D, H, W = x.shape
    sp = [float(d) for d in spacing]
    coords = torch.meshgrid(*[(torch.arange(n, dtype=x.dtype) - (n - 1) / 2) / max(1.0, (n - 1) / 2)
                              for n in (D, H, W)], indexing="ij")
    grads = [torch.gradient(x, spacing=sp[i], dim=i)[0] if x.shape[i] > 1 else torch.zeros_like(x)
             for i in range(3)]
    z, y, xx = coords
    one = torch.ones_like(x)
    monomials = [one, z, y, xx, z * z, y * y, xx * xx, z * y, z * xx, y * xx]
    return [-m * g for g in grads for m in monomials]


def deformation_basis(P, x) -> torch.Tensor | None:
    """The projections of the object's smooth deformations as unit columns (n_pix, k); None when the object
    has no structure to deform."""
    M = torch.stack([P.project(d).reshape(-1).to(F64) for d in deformation_directions(x, P.voxel_spacing)], 1)
    norms = M.norm(dim=0)
    if float(norms.max()) <= 0:
        return None
    keep = norms > 1e-9 * float(norms.max())
    return M[:, keep] / norms[keep]


def _absorb(P, j, basis):
    """The part of a Jacobian column that no changed volume explains (smooth deformations, then CGLS)."""
    if basis is not None:
        a = torch.linalg.lstsq(basis, j.reshape(-1, 1).to(F64)).solution
        j = (j.reshape(-1).to(F64) - (basis @ a)[:, 0]).reshape(j.shape).to(j.dtype)
    return j - P.project(cgls(P, j, N_ITER).volume)


def reduce_columns(P, x, cols):
    """The reduced Jacobian columns ``(I - P (P^T P)^+ P^T) j``: each column less the part that a changed volume
    explains (the object's smooth deformations, then a short CGLS solve).  The identifiability analysis and the
    variable-projection geometry step (:mod:`ctbench.calibration.varpro`) share it."""
    if not cols:
        return []
    with torch.no_grad():
        basis = deformation_basis(P, x)
        return [_absorb(P, j, basis) for j in cols]


def view_scores(r: torch.Tensor, cols_g, cols_s, B) -> torch.Tensor:
    """Each view's contribution to the gradient, ``J_v^T r_v``, in the reduced coordinates ``z = [global, q]``
    (shifts ``s = B q``): an (n_views, dim z) matrix whose rows sum to the gradient."""
    rv = r.to(F64)
    n = r.shape[0]
    per_view = lambda c: (c.to(F64) * rv).sum(dim=tuple(range(1, rv.ndim)))  # noqa: E731
    parts = [torch.stack([per_view(j) for j in cols_g], 1) if cols_g else torch.zeros(n, 0, dtype=F64)]
    if cols_s and B is not None:
        a_s = torch.stack([per_view(c) for c in cols_s], 1)
        # view v's shift score sits at position i*n+v of the full shift vector; B^T maps it to q
        parts.append(sum(a_s[:, i:i + 1] * B[i * n:(i + 1) * n, :] for i in range(len(cols_s))))
    return torch.cat(parts, 1)


def sandwich(Hinv: torch.Tensor, scores: torch.Tensor, n_blocks: int = N_BLOCKS) -> torch.Tensor:
    """Robust (sandwich) covariance ``G/(G-1) H^-1 (sum_b g_b g_b^T) H^-1`` over ``G`` blocks of neighbouring
    views, ``g_b = J_b^T r_b`` the block's part of the gradient.

    The residuals of a calibration are mostly model error (the coarse volume), not noise: smooth within a
    view and alike in neighbouring views.  A white-noise figure ``s2 H^-1`` counts every pixel as an
    independent measurement and understated the real errors 2-4 times; the spread of the blocks' gradients
    measures how much the parts of the orbit really disagree about each parameter (a bootstrap of the final
    linearised step over blocks of views, in closed form).  Blocks, not single views: the model error of
    neighbouring views is alike, and single-view blocks still understated it by about 1.5-2x."""
    n = scores.shape[0]
    G = max(2, min(n_blocks, n))
    edges = [round(i * n / G) for i in range(G + 1)]
    g = torch.stack([scores[edges[i]:edges[i + 1]].sum(0) for i in range(G)])
    return (G / (G - 1)) * (Hinv @ (g.T @ g) @ Hinv)


def analyse(P, x, y, est, cols_g, cols_s, B, smoothness: float, Dm, *, known_object: bool = False,
            discretisation: bool = False) -> Analysis:
    """``discretisation``: the estimate came from a finer grid than ``P``'s; add the step this grid would still
    take to the uncertainty (in quadrature)."""
    names = est.active
    with torch.no_grad():
        r = P.project(x) - y
        n_pix = r.numel()
        s2 = float(r.to(F64).square().sum()) / max(1, n_pix)
        raw = [float(j.to(F64).square().sum()) for j in cols_g]
        if known_object:
            reduced = list(cols_g)
        else:
            reduced = reduce_columns(P, x, list(cols_g))
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
    scores = view_scores(r, reduced, cols_s, B if est.s.numel() else None)
    cov = sandwich(Hinv, scores) if Hz.numel() else Hz
    # Where this grid's minimum lies: the linearised step from the estimate.  Analysed on another grid than the
    # one that made the estimate, it is how far the answer moves with the discretisation (model error that the
    # residuals' spread cannot show when it is alike in every view).
    grad = scores.sum(0)
    if est.s.numel():
        grad[kg:] += lam * (B.T @ (Dm.T @ (Dm @ est.s)))
    step = -(Hinv @ grad) if Hz.numel() else grad
    out = Analysis(names, residual_sigma=math.sqrt(s2))
    for i, k in enumerate(names):
        hk = float(Hinv[i, i])
        if raw[i] <= 0 or hk <= 0 or not math.isfinite(hk):
            out.identifiability[k] = 0.0
            out.sigma[k] = None
            out.noise_sigma[k] = None
            continue
        out.identifiability[k] = min(1.0, 1.0 / math.sqrt(raw[i] * hk))
        out.noise_sigma[k] = math.sqrt(s2 * hk)
        out.robust_sigma[k] = max(out.noise_sigma[k], math.sqrt(max(float(cov[i, i]), 0.0)))
        out.step[k] = float(step[i])
        out.sigma[k] = math.hypot(out.robust_sigma[k], out.step[k] if discretisation else 0.0)
    for a in range(kg):
        for b in range(a + 1, kg):
            den = math.sqrt(max(float(Hinv[a, a]) * float(Hinv[b, b]), 0.0))
            if den > 0:
                out.correlation[names[a], names[b]] = float(Hinv[a, b]) / den
    if est.s.numel():
        cov = B @ Hinv[kg:, kg:] @ B.T
        n = est.n
        for i, k in enumerate(est.shift_names):
            part = (s2 * torch.diagonal(cov)[i * n:(i + 1) * n].clamp_min(0)).sqrt()
            out.shift_sigma[k] = part.tolist()
            out.shift_rms_sigma[k] = float(part.square().mean().sqrt())
    return out

