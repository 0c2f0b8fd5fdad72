"""The voxel-driven weighted backprojection (FDK/FBP's gather) as a differentiable operation.

The forward pass is :func:`ctbench.engine.fdk_kernels.weighted_backproject` (the CPU or CUDA
kernel); backward is its exact transpose, computed view by view from the same bilinear stencil with
the pure-torch formulas in float64 (slower than the forward pass, but exact).  Used by the
analytic solvers when the sinogram requires grad, and by the diffct face's weighted
backprojections.
"""

from __future__ import annotations

import torch

from .fdk_kernels import _bilinear_zero, detector_coordinates, voxel_centres, weighted_backproject

__all__ = ["WeightedBackproject"]

_F64 = torch.float64


def _plane_views(w: torch.Tensor):
    nz = (w != 0).nonzero()[:, 0]
    return (int(nz.min()), int(nz.max()) + 1) if nz.numel() else None


def _forward(q, rays, grid, weights):
    if weights.ndim == 1:
        return weighted_backproject(q, rays, grid, weights)
    out = torch.zeros(grid.shape, dtype=q.dtype, device=q.device)
    for z in range(grid.D):
        span = _plane_views(weights[z])
        if span is not None:
            weighted_backproject(q, rays, grid, weights[z], z0=z, z1=z + 1, views=span, out=out[z:z + 1])
    return out


class WeightedBackproject(torch.autograd.Function):
    """``WeightedBackproject.apply(q, weights, rays, grid)``: the voxel-driven weighted backprojection
    ``sum_k weights[(z,) k] * m_k(x)^p * q_k(pixel(x))`` of the whole grid (``weights`` per view
    ``(n,)`` or per plane and view ``(D, n)``), with gradients for ``q`` and ``weights``."""

    @staticmethod
    def forward(ctx, q, weights, rays, grid):
        ctx.save_for_backward(q, weights)
        ctx.rays, ctx.grid = rays, grid
        return _forward(q.detach(), rays, grid, weights.detach())

    @staticmethod
    def backward(ctx, grad):
        q, weights = ctx.saved_tensors
        rays, grid = ctx.rays, ctx.grid
        D = grid.D
        pts = voxel_centres(grid, 0, D, q.device)
        g = grad.detach().to(_F64).reshape(D, -1)
        w = weights.detach().to(_F64)
        w2 = w[None, :].expand(D, -1) if w.ndim == 1 else w
        grad_q = torch.zeros(q.shape, dtype=_F64, device=q.device) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(w2) if ctx.needs_input_grad[1] else None
        for k in range(q.shape[0]):
            fi, fj, mag, front = detector_coordinates(rays, k, pts)
            with torch.enable_grad():
                qk = q[k].detach().to(_F64).requires_grad_(grad_q is not None)
                val = _bilinear_zero(qk, fi, fj)
                basis = torch.where(front, (mag * mag if rays.cone else mag) * val, torch.zeros_like(val))
                basis = basis.reshape(D, -1)
                if grad_w is not None:
                    grad_w[:, k] = (g * basis.detach()).sum(1)
                if grad_q is not None:
                    (gk,) = torch.autograd.grad(basis, qk, g * w2[:, k:k + 1])
                    grad_q[k] = gk
        if grad_w is not None and w.ndim == 1:
            grad_w = grad_w.sum(0)
        return (None if grad_q is None else grad_q.to(q.dtype),
                None if grad_w is None else grad_w.to(weights.dtype), None, None)
