"""Ordered subsets: OS-SIRT (OS-SART) and OS-TV, iterations that converge faster per second.

The views are split into ``S`` interleaved subsets (subset ``s`` holds views
``s, s + S, s + 2S, ...``), visited in an order that keeps consecutive
subsets far apart in angle.  One *iteration* (one :class:`IterationState`)
is one pass over all subsets, which costs about one projection and one
backprojection of the whole data, like one SIRT iteration, but updates the
volume ``S`` times:

    for each subset s:   x <- clip(x + relax * C_s A_s^T R_s (b_s - A_s x))
                         R_s = 1 / (A_s 1),  C_s = 1 / (A_s^T 1)

With ``n_subsets=1`` this is SIRT exactly (same operations, same order).
Early passes gain about a factor ``S`` over SIRT; with inconsistent
(noisy) data OS methods settle into a limit cycle instead of converging, so
use a few passes (or fewer subsets) for a final image.

OS-TV adds a total-variation proximal (denoising) step after each pass:
``x <- argmin_z 1/2 ||z - x||^2 + g lam TV(z)`` solved by a few projected
gradient steps on its dual (warm-started from the previous pass), with
``g = relax * S * median(1 / (A^T 1))``, the step size of the pass; so the
pass is a proximal-gradient step on ``1/2 ||A x - b||_R^2 + lam TV(x)``
(``R = 1 / (A 1)``: rays weighted by their inverse path length), with the
column weights approximated by their median.

The reported ``residual`` is the *pass* residual: ``sqrt(sum_s ||A_s x - b_s||^2)``
with each subset measured just before its own update (no extra projection);
with one subset it is the residual before the pass, i.e. SIRT's residual of
the previous iteration.  Subset projectors are built from the projector's
trajectory, so distributed projectors are not supported.
"""

from __future__ import annotations

import math
import numbers

import torch

from ._checks import check_bounds, check_flag, check_run, check_sinogram, initial_volume
from ..engine.finite_differences import divergence, gradient
from .sirt import path_eps, safe_reciprocal
from .state import IterationState, ReconResult, iterate, run_to_end

__all__ = ["os_sirt", "os_sirt_iterations", "os_tv_reconstruction", "os_tv_iterations", "auto_subsets",
           "subset_order"]

# Per-subset column weights are kept when they fit in this many bytes, else
# recomputed (one backprojection of ones) at every visit of the subset.
_WEIGHT_BUDGET = 1 << 30


def auto_subsets(n_views: int) -> int:
    """A subset count that pays off on most scans: about one subset per 8 views, between 1 and 16.

    Fewer than ~6 views per subset makes each update noisy and the per-call
    overhead visible; beyond ~16 subsets a pass gains little more (measured on
    the 64^3 phantom and on HTC2022, benchmarks/bench_os.py).
    """
    return max(1, min(16, n_views // 8))


def subset_order(n_subsets: int) -> list[int]:
    """Visit order of the interleaved subsets: bit-reversed indices, so that
    consecutive subsets are far apart in angle (0, S/2, S/4, 3S/4, ... for S a power of 2)."""
    bits = max(1, (n_subsets - 1).bit_length())

    def rev(i: int) -> int:
        return int(format(i, f"0{bits}b")[::-1], 2)

    return sorted(range(n_subsets), key=rev)


def _check_subsets(n_subsets, n_views: int) -> int:
    if n_subsets is None:
        return auto_subsets(n_views)
    if isinstance(n_subsets, bool) or not isinstance(n_subsets, numbers.Integral) or n_subsets < 0:
        raise ValueError(f"n_subsets must be a positive integer or None/0 (automatic), got {n_subsets!r}")
    n = int(n_subsets)
    if n == 0:
        return auto_subsets(n_views)
    if n > n_views:
        raise ValueError(f"n_subsets ({n}) must not exceed the number of views ({n_views})")
    return n


def _check_relax(relax) -> float:
    try:
        v = float(relax)
    except (TypeError, ValueError):
        raise ValueError(f"relax must be a number in (0, 2), got {relax!r}") from None
    if isinstance(relax, bool) or not 0.0 < v < 2.0:
        raise ValueError(f"relax must be a number in (0, 2), got {relax!r}")
    return v


def _subset_projector(P, index: torch.Tensor):
    """A projector over the views ``index`` of P, with P's grid, detector and options."""
    from ..projector import Projector

    traj = P.trajectory[index].detach()
    if P.is_2d:
        vol, det, vs, ds = P.volume_shape, P.detector_shape[0], P.voxel_spacing[1:], P.detector_spacing[0]
    else:
        vol, det, vs, ds = P.volume_shape, P.detector_shape, P.voxel_spacing, P.detector_spacing
    return Projector(traj, vol, det, beam=P.beam, detector_spacing=ds, voxel_spacing=vs, backend=P.backend_name,
                     **P.options)


def _subsets(P, n_subsets):
    """[(projector, view index)] in visit order; the projector itself for one subset."""
    from ..projector import Projector

    if not isinstance(P, Projector):
        raise TypeError(f"ordered subsets need a ctbench Projector, got {type(P).__name__}")
    if P.world_size > 1 or P.options.get("distributed"):  # (the diffct face names a partition on one process too)
        raise ValueError("ordered-subset solvers do not support distributed projectors; use sirt / tv_iterations")
    S = _check_subsets(n_subsets, P.n_views)
    if S == 1:
        return [(P, None)]
    out = []
    for s in subset_order(S):
        idx = torch.arange(s, P.n_views, S)
        out.append((_subset_projector(P, idx), idx))
    return out


class _Weights:
    """Row weights R_s (sliced from the full ones) and column weights C_s of every subset."""

    def __init__(self, P, parts, like_x: torch.Tensor, b: torch.Tensor):
        eps = path_eps(P)
        self.eps = eps
        R = safe_reciprocal(P.project(torch.ones_like(like_x)), eps)
        self.R = [R if idx is None else R[idx] for _, idx in parts]
        keep = len(parts) * like_x.numel() * like_x.element_size() <= _WEIGHT_BUDGET
        self.C: list[torch.Tensor | None] = []
        colsum = torch.zeros_like(like_x)
        for (Ps, idx), Rs in zip(parts, self.R):
            cs = Ps.backproject(torch.ones_like(Rs))
            colsum += cs
            self.C.append(safe_reciprocal(cs, eps) if keep else None)
        seen = colsum[colsum > eps]
        # median column weight of the full data: the scalar step of a pass (OS-TV)
        self.c_median = float((1.0 / seen).median()) if seen.numel() else 0.0

    def column(self, i: int, Ps, Rs: torch.Tensor) -> torch.Tensor:
        c = self.C[i]
        return c if c is not None else safe_reciprocal(Ps.backproject(torch.ones_like(Rs)), self.eps)


def _clip(x: torch.Tensor, bounds) -> torch.Tensor:
    if bounds is None:
        return x
    return x.clamp(min=bounds[0], max=bounds[1])


def _os_pass(parts, W: _Weights, b, x, relax, bounds, on_subset=None):
    """One pass over the subsets; returns a new volume (x itself is not modified) and the
    squared pass residual.  ``on_subset(k, S)`` is called after the k-th (1-based) of S subset updates.  Updates run in place on one copy per pass: each whole-volume
    operation costs a parallel region and fresh buffers cost page faults, which add up
    over many small subset calls.  The arithmetic is SIRT's, operation for operation."""
    x = x.clone()
    rr = 0.0
    for i, ((Ps, idx), Rs) in enumerate(zip(parts, W.R)):
        bs = b if idx is None else b[idx]
        r = torch.sub(bs, Ps.project(x))
        rr += float(Ps.inner_projection(r, r))
        C = W.column(i, Ps, Rs)
        if relax != 1.0:
            C = relax * C
        step = Ps.backproject(r.mul_(Rs)).mul_(C)
        x.add_(step)
        if bounds is not None:
            x.clamp_(min=bounds[0], max=bounds[1])
        if on_subset is not None:
            on_subset(i + 1, len(parts))
    return x, rr


# ------------------------------------------------------------------ OS-SIRT
def os_sirt_iterations(projector, sinogram: torch.Tensor, n_iter: int = 10, *, n_subsets: int | None = None,
                       relax: float = 1.0, x0=None, bounds=None, tol=None, callback=None, cancel=None,
                       on_subset=None):
    """Generator of OS-SIRT passes; yields an :class:`IterationState` after each pass over all subsets.

    ``n_subsets``: number of interleaved view subsets (None or 0: :func:`auto_subsets`);
    ``relax`` in (0, 2) scales every subset update; ``bounds`` as in
    :func:`ctbench.solvers.sirt`; ``tol``: stop once the pass residual
    relative to ``||b||`` falls to ``tol``.  ``extra`` holds
    ``relative_residual`` and ``n_subsets``.  ``on_subset(k, S)``, when given, is
    called after each of the S subset updates of a pass (progress inside a pass).
    Arguments are checked when this function is called.
    """
    return _prepare_sirt(projector, sinogram, n_iter, n_subsets, relax, x0, bounds, tol, callback, cancel,
                         on_subset)[1]


def _prepare_sirt(projector, sinogram, n_iter, n_subsets, relax, x0, bounds, tol, callback, cancel, on_subset=None):
    b = check_sinogram(projector, sinogram)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    bounds = check_bounds(bounds)
    relax = _check_relax(relax)
    parts = _subsets(projector, n_subsets)
    x = _clip(initial_volume(projector, b, x0), bounds)
    on_subset = _check_hook(on_subset)
    return x, _os_sirt_gen(projector, parts, b, x, n_iter, relax, bounds, tol, callback, cancel, on_subset)


def _check_hook(on_subset):
    if on_subset is not None and not callable(on_subset):
        raise TypeError(f"on_subset must be a callable (k, n_subsets) or None, got {type(on_subset).__name__}")
    return on_subset


def _os_sirt_gen(P, parts, b, x, n_iter, relax, bounds, tol, callback, cancel, on_subset=None):
    with torch.no_grad():
        W = _Weights(P, parts, x, b)
        b_norm = math.sqrt(float(P.inner_projection(b, b))) or 1.0
        st = {"x": x}

        def step():
            st["x"], rr = _os_pass(parts, W, b, st["x"], relax, bounds, on_subset)
            res = math.sqrt(rr)
            return res, st["x"], {"relative_residual": res / b_norm, "n_subsets": len(parts)}

        def converged(s: IterationState) -> bool:
            return tol is not None and s.extra["relative_residual"] <= tol

        return (yield from iterate(step, n_iter, converged=converged, callback=callback, cancel=cancel))


def os_sirt(projector, sinogram: torch.Tensor, n_iter: int = 10, *, n_subsets: int | None = None,
            relax: float = 1.0, x0=None, bounds=None, tol=None, callback=None, cancel=None) -> ReconResult:
    """Run OS-SIRT for up to ``n_iter`` passes; see :func:`os_sirt_iterations`."""
    x_start, gen = _prepare_sirt(projector, sinogram, n_iter, n_subsets, relax, x0, bounds, tol, callback, cancel)
    return run_to_end(gen, x_start)


# ------------------------------------------------------------------ OS-TV
def _project_unit_ball(q: torch.Tensor) -> torch.Tensor:
    return q / torch.clamp(q.square().sum(0).sqrt(), min=1.0)


def tv_prox(v: torch.Tensor, gamma: float, ndim: int, n_iter: int, p: torch.Tensor | None = None):
    """``argmin_z 1/2 ||z - v||^2 + gamma TV_0(z)`` by projected gradient on the dual.

    The dual variable ``p`` (|p| <= 1 per voxel) is returned for a warm start:
    ``z = v + gamma div(p)``.  The step ``1 / (4 ndim gamma)`` is below
    ``1 / L`` (``||grad||^2 <= 4 ndim``), so each step decreases the dual.
    """
    if p is None:
        p = torch.zeros((ndim, *v.shape), dtype=v.dtype, device=v.device)
    if gamma <= 0:
        return v, p
    t = 1.0 / (4.0 * ndim * gamma)
    for _ in range(n_iter):
        z = v + gamma * divergence(p)
        p = _project_unit_ball(p + t * gradient(z, ndim))
    return v + gamma * divergence(p), p


def _check_lam(lam) -> float:
    try:
        v = float(lam)
    except (TypeError, ValueError):
        raise ValueError(f"lam must be a non-negative number, got {lam!r}") from None
    if isinstance(lam, bool) or not (v >= 0) or not math.isfinite(v):
        raise ValueError(f"lam must be a non-negative finite number, got {lam!r}")
    return v


def os_tv_iterations(projector, sinogram: torch.Tensor, n_iter: int = 20, *, n_subsets: int | None = None,
                     lam: float = 1e-3, nonneg: bool = True, relax: float = 1.0, tv_iter: int = 10, x0=None,
                     tol=None, callback=None, cancel=None, on_subset=None):
    """Generator of OS-TV passes: an OS-SIRT pass, then a TV proximal step (module docstring).

    ``lam`` weighs TV against ``1/2 ||A x - b||_R^2`` (rays weighted by their
    inverse path length in mm, so ``lam`` is roughly the :func:`tv_iterations`
    weight divided by a typical path length).  ``tv_iter``: dual steps of the
    proximal step per pass.  ``tol``: stop once ``||x_k - x_{k-1}|| / ||x_k||``
    falls to ``tol``.  ``extra`` holds ``relative_residual`` (pass residual),
    ``tv``, ``relative_change`` and ``n_subsets``.  ``on_subset`` as in :func:`os_sirt_iterations`.
    """
    return _prepare_tv(projector, sinogram, n_iter, n_subsets, lam, nonneg, relax, tv_iter, x0, tol, callback,
                       cancel, on_subset)[1]


def _prepare_tv(projector, sinogram, n_iter, n_subsets, lam, nonneg, relax, tv_iter, x0, tol, callback, cancel,
                on_subset=None):
    b = check_sinogram(projector, sinogram)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    lam = _check_lam(lam)
    relax = _check_relax(relax)
    nonneg = check_flag(nonneg, "nonneg")
    if isinstance(tv_iter, bool) or not isinstance(tv_iter, numbers.Integral) or tv_iter < 1:
        raise ValueError(f"tv_iter must be a positive integer, got {tv_iter!r}")
    parts = _subsets(projector, n_subsets)
    x = initial_volume(projector, b, x0)
    if nonneg:
        x = x.clamp(min=0)
    on_subset = _check_hook(on_subset)
    return x, _os_tv_gen(projector, parts, b, x, n_iter, lam, nonneg, relax, int(tv_iter), tol, callback, cancel,
                         on_subset)


def _os_tv_gen(P, parts, b, x, n_iter, lam, nonneg, relax, tv_iter, tol, callback, cancel, on_subset=None):
    with torch.no_grad():
        ndim = len(P.volume_shape)
        W = _Weights(P, parts, x, b)
        gamma = relax * len(parts) * W.c_median * lam
        b_norm = math.sqrt(float(P.inner_projection(b, b))) or 1.0
        bounds = (0.0, None) if nonneg else None
        st = {"x": x, "p": None}

        def step():
            x_old = st["x"]
            v, rr = _os_pass(parts, W, b, x_old, relax, bounds, on_subset)
            z, st["p"] = tv_prox(v, gamma, ndim, tv_iter, st["p"])
            x_new = _clip(z, bounds)
            st["x"] = x_new
            dx = x_new - x_old
            change = math.sqrt(float(P.inner_volume(dx, dx)) / max(float(P.inner_volume(x_new, x_new)), 1e-300))
            tv = float(torch.sqrt(gradient(x_new, ndim).square().sum(0)).sum())
            res = math.sqrt(rr)
            return res, x_new, {"relative_residual": res / b_norm, "tv": tv, "relative_change": change,
                                "n_subsets": len(parts)}

        def converged(s: IterationState) -> bool:
            return tol is not None and s.extra["relative_change"] <= tol

        return (yield from iterate(step, n_iter, converged=converged, callback=callback, cancel=cancel))


def os_tv_reconstruction(projector, sinogram: torch.Tensor, n_iter: int = 20, *, n_subsets: int | None = None,
                         lam: float = 1e-3, nonneg: bool = True, relax: float = 1.0, tv_iter: int = 10, x0=None,
                         tol=None, callback=None, cancel=None) -> ReconResult:
    """Run OS-TV for up to ``n_iter`` passes; see :func:`os_tv_iterations`."""
    x_start, gen = _prepare_tv(projector, sinogram, n_iter, n_subsets, lam, nonneg, relax, tv_iter, x0, tol,
                               callback, cancel)
    return run_to_end(gen, x_start)
