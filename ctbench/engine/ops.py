"""Autograd functions of the windowed Joseph pair.

``project_op`` and ``backproject_op`` run on one device through an executor
(which may split the call into windows) and are each other's adjoint in
backward, so double backward works.  Gradients with respect to the ray
geometry (source, detector centre, pixel steps) come from the executor's
``geometry_vjp``.
"""

from __future__ import annotations

import torch

from .base import Rays


class _Project(torch.autograd.Function):
    @staticmethod
    def forward(ctx, volume, source, center, ustep, vstep, executor, z0, cone, detector_shape):
        rays = Rays(source, center, ustep, vstep, cone, detector_shape)
        ctx.executor, ctx.z0, ctx.cone, ctx.detector_shape = executor, z0, cone, detector_shape
        ctx.nz = volume.shape[1]
        ctx.save_for_backward(volume, source, center, ustep, vstep)
        return executor.project(volume.detach(), z0, rays.detach())

    @staticmethod
    def backward(ctx, grad):
        volume, source, center, ustep, vstep = ctx.saved_tensors
        ex, z0 = ctx.executor, ctx.z0
        gvol = None
        if ctx.needs_input_grad[0]:
            gvol = backproject_op(grad, source, center, ustep, vstep, ex, z0, z0 + ctx.nz, ctx.cone,
                                  ctx.detector_shape)
        ggeo = [None] * 4
        if any(ctx.needs_input_grad[1:5]):
            rays = Rays(source, center, ustep, vstep, ctx.cone, ctx.detector_shape).detach()
            ggeo = list(ex.geometry_vjp(volume.detach(), z0, grad.detach(), rays))
        return (gvol, *ggeo, None, None, None, None)


class _Backproject(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sinogram, source, center, ustep, vstep, executor, z0, z1, cone, detector_shape):
        rays = Rays(source, center, ustep, vstep, cone, detector_shape)
        ctx.executor, ctx.z0, ctx.z1, ctx.cone, ctx.detector_shape = executor, z0, z1, cone, detector_shape
        ctx.save_for_backward(sinogram, source, center, ustep, vstep)
        return executor.backproject(sinogram.detach(), z0, z1, rays.detach())

    @staticmethod
    def backward(ctx, grad):
        sinogram, source, center, ustep, vstep = ctx.saved_tensors
        ex = ctx.executor
        gsino = None
        if ctx.needs_input_grad[0]:
            gsino = project_op(grad, source, center, ustep, vstep, ex, ctx.z0, ctx.cone, ctx.detector_shape)
        ggeo = [None] * 4
        if any(ctx.needs_input_grad[1:5]):
            # <B(g) y, w> = <y, A(g) w>: the geometry VJP of the forward model at
            # volume w with cotangent y.
            rays = Rays(source, center, ustep, vstep, ctx.cone, ctx.detector_shape).detach()
            ggeo = list(ex.geometry_vjp(grad.detach(), ctx.z0, sinogram.detach(), rays))
        return (gsino, *ggeo, None, None, None, None, None)


def project_op(volume, source, center, ustep, vstep, executor, z0, cone, detector_shape):
    """Differentiable projection of a (B, nz, H, W) slab starting at global plane z0."""
    return _Project.apply(volume, source, center, ustep, vstep, executor, z0, cone, tuple(detector_shape))


def backproject_op(sinogram, source, center, ustep, vstep, executor, z0, z1, cone, detector_shape):
    """Differentiable backprojection of a (B, n_views, U, V) block into the slab [z0, z1)."""
    return _Backproject.apply(sinogram, source, center, ustep, vstep, executor, z0, z1, cone,
                              tuple(detector_shape))
