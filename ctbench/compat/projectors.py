"""diffct 2.5's autograd function classes, on ctbench's Joseph projector (docs/FROM_DIFFCT.md).

``ConeProjectorFunction.apply(volume, src, det_center, det_u, det_v, U, V, du, dv, voxel_spacing)``
and its five siblings take diffct's arguments in diffct's order.  Each is a
:class:`torch.autograd.Function`: the forward pass is :meth:`ctbench.Projector.project` (or
``backproject``) on the given vectors; backward gives

- the data gradient by the sibling class (the exact adjoint), itself differentiable, so
  second derivatives of the data work as in diffct;
- first-order gradients of the geometry tensors from ctbench's own geometry gradients
  (the projector's autograd graph, rebuilt in backward on detached copies).

Unlike diffct, the computation runs in the input's dtype (float32 or float64; other dtypes are
computed in float32) on any device ctbench's backends support, the CPU included.
"""

from __future__ import annotations

import torch

__all__ = ["ParallelProjectorFunction", "ParallelBackprojectorFunction", "FanProjectorFunction",
           "FanBackprojectorFunction", "ConeProjectorFunction", "ConeBackprojectorFunction"]


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32


def _projector(beam, geometry, volume_shape, detector_shape, detector_spacing, voxel_spacing, dtype, device):
    from ..projector import Projector

    frames = tuple(torch.as_tensor(g).to(device=device, dtype=dtype) for g in geometry)
    return Projector(frames, volume_shape, detector_shape, beam=beam, detector_spacing=detector_spacing,
                     voxel_spacing=voxel_spacing)


def _check_data(x, name, ndim):
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a real floating-point tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")


def _geometry_grads(needs, direction, beam, data, grad_out, geometry, shapes):
    """First-order gradients of the geometry of ``<grad_out, op(data; geometry)>`` (op = project or
    backproject), from ctbench's projector graph."""
    if not any(needs):
        return (None,) * len(geometry)
    volume_shape, detector_shape, detector_spacing, voxel_spacing = shapes
    dtype = _work_dtype(data)
    with torch.enable_grad():
        leaves = [g.detach().to(device=data.device, dtype=dtype).requires_grad_(bool(n))
                  for g, n in zip(geometry, needs)]
        P = _projector(beam, leaves, volume_shape, detector_shape, detector_spacing, voxel_spacing, dtype,
                       data.device)
        d = data.detach().to(dtype)
        out = P.project(d) if direction == "project" else P.backproject(d)
        wanted = [leaf for leaf, n in zip(leaves, needs) if n]
        grads = iter(torch.autograd.grad(out, wanted, grad_out.detach().to(out.dtype), allow_unused=True))
    result = []
    for g, n in zip(geometry, needs):
        if not n:
            result.append(None)
            continue
        grad = next(grads)
        result.append(torch.zeros_like(g) if grad is None else grad.to(dtype=g.dtype, device=g.device))
    return tuple(result)


class _Base(torch.autograd.Function):
    beam = ""
    n_geometry = 0

    @classmethod
    def _run(cls, ctx, data, geometry, shapes, direction):
        # Backward rebuilds the projector graph from the inputs; the data only for geometry gradients.
        ctx.save_for_backward(data if any(ctx.needs_input_grad[1:1 + len(geometry)]) else None, *geometry)
        ctx.shapes = shapes
        dtype = _work_dtype(data)
        P = _projector(cls.beam, geometry, *shapes[:2], shapes[2], shapes[3], dtype, data.device)
        d = data.detach().to(dtype)
        return P.project(d) if direction == "project" else P.backproject(d)


def _projector_backward(cls, sibling, ctx, grad_out, n_tail):
    data, *geometry = ctx.saved_tensors
    grad_data = None
    if ctx.needs_input_grad[0]:
        grad_data = sibling._adjoint(grad_out, geometry, ctx.shapes)
    geo = _geometry_grads(ctx.needs_input_grad[1:1 + len(geometry)], "project", cls.beam, data, grad_out,
                          geometry, ctx.shapes)
    return (grad_data, *geo, *([None] * n_tail))


def _backprojector_backward(cls, sibling, ctx, grad_out, n_tail):
    data, *geometry = ctx.saved_tensors
    grad_data = None
    if ctx.needs_input_grad[0]:
        grad_data = sibling._adjoint(grad_out, geometry, ctx.shapes)
    geo = _geometry_grads(ctx.needs_input_grad[1:1 + len(geometry)], "backproject", cls.beam, data, grad_out,
                          geometry, ctx.shapes)
    return (grad_data, *geo, *([None] * n_tail))


# ------------------------------------------------------------------ parallel 2D
class ParallelProjectorFunction(_Base):
    """2D parallel-beam projection: ``apply(image, ray_dir, det_origin, det_u_vec, num_detectors,
    detector_spacing=1.0, voxel_spacing=1.0)`` -> ``(n_views, num_detectors)``."""

    beam = "parallel"

    @staticmethod
    def forward(ctx, image, ray_dir, det_origin, det_u_vec, num_detectors, detector_spacing=1.0, voxel_spacing=1.0):
        _check_data(image, "image", 2)
        shapes = (tuple(image.shape), int(num_detectors), detector_spacing, voxel_spacing)
        return ParallelProjectorFunction._run(ctx, image, (ray_dir, det_origin, det_u_vec), shapes, "project")

    @staticmethod
    def backward(ctx, grad_sinogram):
        return _projector_backward(ParallelProjectorFunction, ParallelBackprojectorFunction, ctx, grad_sinogram, 3)

    @staticmethod
    def _adjoint(image, geometry, shapes):  # this class's operation, as the sibling's adjoint
        return ParallelProjectorFunction.apply(image, *geometry, shapes[1], shapes[2], shapes[3])


class ParallelBackprojectorFunction(_Base):
    """Adjoint of :class:`ParallelProjectorFunction`: ``apply(sinogram, ray_dir, det_origin, det_u_vec,
    detector_spacing=1.0, H=128, W=128, voxel_spacing=1.0)`` -> ``(H, W)``."""

    beam = "parallel"

    @staticmethod
    def forward(ctx, sinogram, ray_dir, det_origin, det_u_vec, detector_spacing=1.0, H=128, W=128, voxel_spacing=1.0):
        _check_data(sinogram, "sinogram", 2)
        shapes = ((int(H), int(W)), int(sinogram.shape[1]), detector_spacing, voxel_spacing)
        return ParallelBackprojectorFunction._run(ctx, sinogram, (ray_dir, det_origin, det_u_vec), shapes,
                                                  "backproject")

    @staticmethod
    def backward(ctx, grad_image):
        return _backprojector_backward(ParallelBackprojectorFunction, ParallelProjectorFunction, ctx, grad_image, 4)

    @staticmethod
    def _adjoint(sinogram, geometry, shapes):
        (H, W), _, ds, vs = shapes
        return ParallelBackprojectorFunction.apply(sinogram, *geometry, ds, H, W, vs)


# ------------------------------------------------------------------ fan 2D
class FanProjectorFunction(_Base):
    """2D fan-beam projection: ``apply(image, src_pos, det_center, det_u_vec, num_detectors,
    detector_spacing, voxel_spacing=1.0)`` -> ``(n_views, num_detectors)``."""

    beam = "fan"

    @staticmethod
    def forward(ctx, image, src_pos, det_center, det_u_vec, num_detectors, detector_spacing, voxel_spacing=1.0):
        _check_data(image, "image", 2)
        shapes = (tuple(image.shape), int(num_detectors), detector_spacing, voxel_spacing)
        return FanProjectorFunction._run(ctx, image, (src_pos, det_center, det_u_vec), shapes, "project")

    @staticmethod
    def backward(ctx, grad_sinogram):
        return _projector_backward(FanProjectorFunction, FanBackprojectorFunction, ctx, grad_sinogram, 3)

    @staticmethod
    def _adjoint(image, geometry, shapes):
        return FanProjectorFunction.apply(image, *geometry, shapes[1], shapes[2], shapes[3])


class FanBackprojectorFunction(_Base):
    """Adjoint of :class:`FanProjectorFunction`: ``apply(sinogram, src_pos, det_center, det_u_vec,
    detector_spacing, H, W, voxel_spacing=1.0)`` -> ``(H, W)``."""

    beam = "fan"

    @staticmethod
    def forward(ctx, sinogram, src_pos, det_center, det_u_vec, detector_spacing, H, W, voxel_spacing=1.0):
        _check_data(sinogram, "sinogram", 2)
        shapes = ((int(H), int(W)), int(sinogram.shape[1]), detector_spacing, voxel_spacing)
        return FanBackprojectorFunction._run(ctx, sinogram, (src_pos, det_center, det_u_vec), shapes, "backproject")

    @staticmethod
    def backward(ctx, grad_image):
        return _backprojector_backward(FanBackprojectorFunction, FanProjectorFunction, ctx, grad_image, 4)

    @staticmethod
    def _adjoint(sinogram, geometry, shapes):
        (H, W), _, ds, vs = shapes
        return FanBackprojectorFunction.apply(sinogram, *geometry, ds, H, W, vs)


# ------------------------------------------------------------------ cone 3D
class ConeProjectorFunction(_Base):
    """3D cone-beam projection: ``apply(volume, src_pos, det_center, det_u_vec, det_v_vec, det_u, det_v,
    du, dv, voxel_spacing=1.0)`` -> ``(n_views, det_u, det_v)``."""

    beam = "cone"

    @staticmethod
    def forward(ctx, volume, src_pos, det_center, det_u_vec, det_v_vec, det_u, det_v, du, dv, voxel_spacing=1.0):
        _check_data(volume, "volume", 3)
        shapes = (tuple(volume.shape), (int(det_u), int(det_v)), (du, dv), voxel_spacing)
        return ConeProjectorFunction._run(ctx, volume, (src_pos, det_center, det_u_vec, det_v_vec), shapes,
                                          "project")

    @staticmethod
    def backward(ctx, grad_sinogram):
        return _projector_backward(ConeProjectorFunction, ConeBackprojectorFunction, ctx, grad_sinogram, 5)

    @staticmethod
    def _adjoint(volume, geometry, shapes):
        (U, V), (du, dv), vs = shapes[1], shapes[2], shapes[3]
        return ConeProjectorFunction.apply(volume, *geometry, U, V, du, dv, vs)


class ConeBackprojectorFunction(_Base):
    """Adjoint of :class:`ConeProjectorFunction`: ``apply(sinogram, src_pos, det_center, det_u_vec,
    det_v_vec, D, H, W, du, dv, voxel_spacing=1.0, native_layout=False)`` -> ``(D, H, W)``
    (``native_layout`` is accepted; the result is always a contiguous tensor)."""

    beam = "cone"

    @staticmethod
    def forward(ctx, sinogram, src_pos, det_center, det_u_vec, det_v_vec, D, H, W, du, dv, voxel_spacing=1.0,
                native_layout=False):
        _check_data(sinogram, "sinogram", 3)
        shapes = ((int(D), int(H), int(W)), tuple(int(n) for n in sinogram.shape[1:]), (du, dv), voxel_spacing)
        return ConeBackprojectorFunction._run(ctx, sinogram, (src_pos, det_center, det_u_vec, det_v_vec), shapes,
                                              "backproject")

    @staticmethod
    def backward(ctx, grad_volume):
        return _backprojector_backward(ConeBackprojectorFunction, ConeProjectorFunction, ctx, grad_volume, 7)

    @staticmethod
    def _adjoint(sinogram, geometry, shapes):
        (D, H, W), _, (du, dv), vs = shapes
        return ConeBackprojectorFunction.apply(sinogram, *geometry, D, H, W, du, dv, vs)
