"""Autograd functions of the windowed Joseph pair.

``project_op`` and ``backproject_op`` run on one device through an executor
(which may split the call into windows) and are each other's adjoint in
backward, so double backward (Hessian-vector products for the volume) works.
Gradients with respect to the ray geometry (source, detector centre, pixel
steps) come from the executor's ``geometry_vjp``; they are first-order only:
differentiating a geometry gradient again raises a clear error instead of
silently returning zero.

The functions use the ``setup_context`` form so that torch.func transforms
apply: ``grad``/``vjp`` (reverse mode), ``jvp``/``jacfwd`` for the volume or
sinogram argument (the operator is linear in it, so its tangent is the operator
applied to the tangent) and ``vmap``, which folds the mapped dimension into
the batch dimension (one kernel launch) when only the volume/sinogram is
mapped, and loops over the mapped items when the geometry is mapped.
"""

from __future__ import annotations

import torch

from .base import Rays

_NO_GEOMETRY_JVP = ("forward-mode derivatives (jvp/jacfwd) with respect to the scan geometry are not "
                    "implemented; differentiate the geometry in reverse mode (backward, torch.func.grad/vjp)")


def _geometry_vjp(volume, grad, geo, ctx_like):
    """The four geometry cotangents d<A(g) volume, grad>/d(source, center, ustep, vstep)."""
    return _GeometryVJP.apply(volume, grad, *geo, ctx_like.executor, ctx_like.z0, ctx_like.cone,
                              ctx_like.detector_shape)


def _check_no_geometry_tangent(*tangents):
    # torch.func.jvp passes zero tangents for inputs it does not perturb.
    if any(t is not None and bool(torch.any(t != 0)) for t in tangents):
        raise NotImplementedError(_NO_GEOMETRY_JVP)


class _GeometryVJP(torch.autograd.Function):
    """d<A(g) volume, grad>/d(g) through the executor's kernel; not differentiable again."""

    @staticmethod
    def forward(volume, grad, source, center, ustep, vstep, executor, z0, cone, detector_shape):
        rays = Rays(source, center, ustep, vstep, cone, detector_shape).detach()
        return tuple(executor.geometry_vjp(volume.detach(), z0, grad.detach(), rays))

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            "second derivatives through the scan geometry are not implemented: a geometry gradient of the "
            "projector cannot be differentiated again (volume Hessian-vector products work)")

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(_NO_GEOMETRY_JVP)

    @staticmethod
    def vmap(info, in_dims, volume, grad, source, center, ustep, vstep, executor, z0, cone, detector_shape):
        tensors = (volume, grad, source, center, ustep, vstep)
        outs = []
        for i in range(info.batch_size):
            args = [t if d is None else t.select(d, i) for t, d in zip(tensors, in_dims[:6])]
            outs.append(_GeometryVJP.apply(*args, executor, z0, cone, detector_shape))
        return tuple(torch.stack(o) for o in zip(*outs)), (0, 0, 0, 0)


def _vmap_fold(info, in_dims, data, geo, apply):
    """vmap rule shared by both operators.

    ``data`` (volume or sinogram) has a batch axis at position 0 of its
    unmapped shape; with the geometry unmapped the mapped axis is folded into
    that batch axis, so one call (one kernel launch per window) serves all
    items.  A mapped geometry needs one call per mapped item.
    """
    data_dim, geo_dims = in_dims[0], in_dims[1:5]
    if all(d is None for d in geo_dims):
        x = data.movedim(data_dim, 0)
        n, b = x.shape[:2]
        y = apply(x.reshape(n * b, *x.shape[2:]), geo)
        return y.reshape(n, b, *y.shape[1:]), 0
    outs = []
    for i in range(info.batch_size):
        xi = data if data_dim is None else data.select(data_dim, i)
        gi = [t if d is None else t.select(d, i) for t, d in zip(geo, geo_dims)]
        outs.append(apply(xi, gi))
    return torch.stack(outs), 0


class _Project(torch.autograd.Function):
    @staticmethod
    def forward(volume, source, center, ustep, vstep, executor, z0, cone, detector_shape):
        rays = Rays(source, center, ustep, vstep, cone, detector_shape)
        return executor.project(volume.detach(), z0, rays.detach())

    @staticmethod
    def setup_context(ctx, inputs, output):
        volume, source, center, ustep, vstep, executor, z0, cone, detector_shape = inputs
        ctx.executor, ctx.z0, ctx.cone, ctx.detector_shape = executor, z0, cone, detector_shape
        ctx.nz = volume.shape[1]
        # The volume is needed only for geometry gradients.
        ctx.keep_volume = any(ctx.needs_input_grad[1:5])
        ctx.save_for_backward(volume if ctx.keep_volume else None, source, center, ustep, vstep)
        ctx.save_for_forward(source, center, ustep, vstep)

    @staticmethod
    def backward(ctx, grad):
        volume, *geo = ctx.saved_tensors
        gvol = None
        if ctx.needs_input_grad[0]:
            gvol = backproject_op(grad, *geo, ctx.executor, ctx.z0, ctx.z0 + ctx.nz, ctx.cone, ctx.detector_shape)
        ggeo = [None] * 4
        if any(ctx.needs_input_grad[1:5]):
            ggeo = list(_geometry_vjp(volume, grad, geo, ctx))
        return (gvol, *ggeo, None, None, None, None)

    @staticmethod
    def jvp(ctx, t_volume, t_source, t_center, t_ustep, t_vstep, *_):
        _check_no_geometry_tangent(t_source, t_center, t_ustep, t_vstep)
        geo = ctx.saved_tensors
        # Linear in the volume: the tangent of A x is A applied to the tangent of x.
        return project_op(t_volume, *geo, ctx.executor, ctx.z0, ctx.cone, ctx.detector_shape)

    @staticmethod
    def vmap(info, in_dims, volume, source, center, ustep, vstep, executor, z0, cone, detector_shape):
        def apply(x, geo):
            return _Project.apply(x, *geo, executor, z0, cone, detector_shape)
        return _vmap_fold(info, in_dims, volume, (source, center, ustep, vstep), apply)


class _Backproject(torch.autograd.Function):
    @staticmethod
    def forward(sinogram, source, center, ustep, vstep, executor, z0, z1, cone, detector_shape):
        rays = Rays(source, center, ustep, vstep, cone, detector_shape)
        return executor.backproject(sinogram.detach(), z0, z1, rays.detach())

    @staticmethod
    def setup_context(ctx, inputs, output):
        sinogram, source, center, ustep, vstep, executor, z0, z1, cone, detector_shape = inputs
        ctx.executor, ctx.z0, ctx.z1, ctx.cone, ctx.detector_shape = executor, z0, z1, cone, detector_shape
        keep = any(ctx.needs_input_grad[1:5])
        ctx.save_for_backward(sinogram if keep else None, source, center, ustep, vstep)
        ctx.save_for_forward(source, center, ustep, vstep)

    @staticmethod
    def backward(ctx, grad):
        sinogram, *geo = ctx.saved_tensors
        gsino = None
        if ctx.needs_input_grad[0]:
            gsino = project_op(grad, *geo, ctx.executor, ctx.z0, ctx.cone, ctx.detector_shape)
        ggeo = [None] * 4
        if any(ctx.needs_input_grad[1:5]):
            # <B(g) y, w> = <y, A(g) w>: the geometry VJP of the forward model
            # at volume w (the cotangent) with ray cotangent y (the sinogram).
            ggeo = list(_geometry_vjp(grad, sinogram, geo, ctx))
        return (gsino, *ggeo, None, None, None, None, None)

    @staticmethod
    def jvp(ctx, t_sinogram, t_source, t_center, t_ustep, t_vstep, *_):
        _check_no_geometry_tangent(t_source, t_center, t_ustep, t_vstep)
        geo = ctx.saved_tensors
        return backproject_op(t_sinogram, *geo, ctx.executor, ctx.z0, ctx.z1, ctx.cone, ctx.detector_shape)

    @staticmethod
    def vmap(info, in_dims, sinogram, source, center, ustep, vstep, executor, z0, z1, cone, detector_shape):
        def apply(x, geo):
            return _Backproject.apply(x, *geo, executor, z0, z1, cone, detector_shape)
        return _vmap_fold(info, in_dims, sinogram, (source, center, ustep, vstep), apply)


def project_op(volume, source, center, ustep, vstep, executor, z0, cone, detector_shape):
    """Differentiable projection of a (B, nz, H, W) slab starting at global plane z0."""
    return _Project.apply(volume, source, center, ustep, vstep, executor, z0, cone, tuple(detector_shape))


def backproject_op(sinogram, source, center, ustep, vstep, executor, z0, z1, cone, detector_shape):
    """Differentiable backprojection of a (B, n_views, U, V) block into the slab [z0, z1)."""
    return _Backproject.apply(sinogram, source, center, ustep, vstep, executor, z0, z1, cone,
                              tuple(detector_shape))
