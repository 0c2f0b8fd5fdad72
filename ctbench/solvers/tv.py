"""Total variation: the regulariser as a differentiable function, and TV-regularised reconstruction.

Definition (isotropic TV on the voxel grid, shared with
:func:`ctbench.distributed.halo.total_variation_distributed`):

    TV_eps(x) = sum over voxels v of sqrt( sum over axes a of (D_a x)[v]^2 + eps )

with forward differences ``(D_a x)[v] = x[v + e_a] - x[v]`` along each of
the spatial axes, and ``(D_a x)[v] = 0`` on the last plane of axis ``a``
(Neumann boundary).  Differences are per voxel (not divided by the voxel
spacing).  ``eps > 0`` makes the value differentiable everywhere (gradient
bounded by ``1/sqrt(eps)`` per voxel); ``eps = 0`` is the exact TV.

:func:`tv_reconstruction` minimises

    1/2 ||A x - b||^2 + lam * TV_0(x)      (subject to x >= 0 if nonneg)

with the primal-dual method of Chambolle & Pock and the diagonal
preconditioning of Pock & Chambolle (2011): per-ray dual steps
``1/(A 1)``, dual steps 1/2 on the gradient, per-voxel primal steps
``1/(A^T 1 + 2 ndim)``, which are convergent without estimating ``||A||``.
One projection and one backprojection per iteration.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_flag, check_projector, check_run, check_sinogram, initial_volume
from .sirt import path_eps, safe_reciprocal
from ..engine.finite_differences import divergence, gradient
from .state import IterationState, ReconResult, iterate, run_to_end

__all__ = ["total_variation", "gradient", "divergence", "tv_reconstruction", "tv_iterations"]


def _spatial_ndim(volume: torch.Tensor, projector, ndim) -> int:
    if ndim is None:
        if projector is not None:
            ndim = len(projector.volume_shape)
        else:
            ndim = min(volume.ndim, 3)
    if isinstance(ndim, bool) or not isinstance(ndim, int) or not 1 <= ndim <= volume.ndim:
        raise ValueError(f"ndim must be an integer between 1 and volume.ndim={volume.ndim}, got {ndim!r}")
    return ndim


def total_variation(volume: torch.Tensor, *, projector=None, eps: float = 1e-8, ndim: int | None = None
                    ) -> torch.Tensor:
    """Isotropic total variation ``TV_eps`` of ``volume`` (see the module docstring), differentiable.

    Spatial axes are the last ``ndim`` ones: by default the projector's
    volume dimensionality, or ``min(volume.ndim, 3)``; leading axes are a
    batch and are summed.  With a ``projector`` whose ``partition`` is
    "space" or "hybrid", ``volume`` is this rank's slab and the global value
    is computed with a halo exchange (every rank must call it).
    """
    if not isinstance(volume, torch.Tensor) or not volume.is_floating_point():
        raise TypeError("volume must be a floating-point torch.Tensor")
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"eps must be a non-negative number, got {eps!r}") from None
    if not eps >= 0 or not math.isfinite(eps):
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    if projector is not None:
        check_projector(projector)
        if getattr(projector, "partition", None) in ("space", "hybrid"):
            from ..distributed.halo import total_variation_distributed
            return total_variation_distributed(volume, projector, eps=eps)
    n = _spatial_ndim(volume, projector, ndim)
    g = gradient(volume, n)
    return torch.sqrt(g.square().sum(0) + eps).sum()


def _project_ball(q: torch.Tensor, radius: float) -> torch.Tensor:
    """Project each voxel's gradient vector q[:, v] onto the ball of the given radius."""
    norm = q.square().sum(0).sqrt()
    scale = torch.clamp(norm / radius, min=1.0) if radius > 0 else torch.full_like(norm, float("inf"))
    return q / scale


def _check_lam(lam) -> float:
    try:
        v = float(lam)
    except (TypeError, ValueError):
        raise ValueError(f"lam must be a non-negative number, got {lam!r}") from None
    if not (v >= 0) or not math.isfinite(v):
        raise ValueError(f"lam must be a non-negative finite number, got {lam!r}")
    return v


def tv_iterations(projector, sinogram: torch.Tensor, n_iter: int = 100, *, lam: float = 1e-3, nonneg: bool = True,
                  x0=None, tol=None, callback=None, cancel=None):
    """Generator of Chambolle-Pock iterations for TV-regularised least squares.

    ``lam`` weighs the TV term against ``1/2 ||A x - b||^2`` (data in
    line-integral units, TV in attenuation/mm per voxel step, so ``lam``
    scales like a line integral squared per attenuation).  ``tol``: stop once
    the relative update ``||x_k - x_{k-1}|| / ||x_k||`` falls to ``tol``.
    ``extra`` holds ``objective``, ``tv``, ``relative_residual`` and ``relative_change``.
    """
    return _prepare(projector, sinogram, n_iter, lam, nonneg, x0, tol, callback, cancel)[1]


def _prepare(projector, sinogram, n_iter, lam, nonneg, x0, tol, callback, cancel):
    b = check_sinogram(projector, sinogram)
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    lam = _check_lam(lam)
    nonneg = check_flag(nonneg, "nonneg")
    x = initial_volume(projector, b, x0)
    if nonneg:
        x = x.clamp(min=0)
    return x, _tv_gen(projector, b, x, n_iter, lam, nonneg, tol, callback, cancel)


def _tv_gen(P, b, x, n_iter, lam, nonneg, tol, callback, cancel):
    with torch.no_grad():
        ndim = len(P.volume_shape)
        # Slabs of a space/hybrid partition take their neighbour planes by halo exchange.
        from ..distributed.halo import divergence_distributed, gradient_distributed
        sigma = safe_reciprocal(P.project(torch.ones_like(x)), path_eps(P))
        tau = 1.0 / (P.backproject(torch.ones_like(b)) + 2.0 * ndim)
        b_norm = math.sqrt(float(P.inner_projection(b, b))) or 1.0
        Ax = P.project(x)
        st = {"x": x, "xbar": x, "Ax": Ax, "Axbar": Ax, "p": torch.zeros_like(b),
              "q": torch.zeros((ndim, *x.shape), dtype=x.dtype, device=x.device)}

        def step():
            p = (st["p"] + sigma * (st["Axbar"] - b)) / (1.0 + sigma)
            q = _project_ball(st["q"] + 0.5 * gradient_distributed(st["xbar"], P, ndim), lam)
            x_old = st["x"]
            x_new = x_old - tau * (P.backproject(p) - divergence_distributed(q, P))
            if nonneg:
                x_new = x_new.clamp(min=0)
            Ax_new = P.project(x_new)
            st.update(p=p, q=q, x=x_new, xbar=2 * x_new - x_old, Axbar=2 * Ax_new - st["Ax"], Ax=Ax_new)
            r = Ax_new - b
            rr = float(P.inner_projection(r, r))
            tv = float(total_variation(x_new, projector=P, eps=0.0, ndim=ndim))
            dx = x_new - x_old
            change = math.sqrt(float(P.inner_volume(dx, dx)) / max(float(P.inner_volume(x_new, x_new)), 1e-300))
            res = math.sqrt(rr)
            return res, x_new, {"objective": 0.5 * rr + lam * tv, "tv": tv, "relative_residual": res / b_norm,
                                "relative_change": change}

        def converged(s: IterationState) -> bool:
            return tol is not None and s.extra["relative_change"] <= tol

        return (yield from iterate(step, n_iter, converged=converged, callback=callback, cancel=cancel))


def tv_reconstruction(projector, sinogram: torch.Tensor, n_iter: int = 100, *, lam: float = 1e-3,
                      nonneg: bool = True, x0=None, tol=None, callback=None, cancel=None) -> ReconResult:
    """TV-regularised reconstruction (Chambolle-Pock); see :func:`tv_iterations`.

    Returns a :class:`ReconResult`; ``history[i]["objective"]`` is the
    objective after iteration ``i + 1``.
    """
    x_start, gen = _prepare(projector, sinogram, n_iter, lam, nonneg, x0, tol, callback, cancel)
    return run_to_end(gen, x_start)
