"""diffct's derivative contract for geometry on the diffct face: first order only.

diffct 2.5 gives first-order (reverse-mode) gradients with respect to trajectory tensors and
``ParameterizedSurface`` parameters, and raises a clear error for second derivatives and for
forward mode (``torch.func.jvp``/``jacfwd``) with respect to them.  ctbench's cell model
(compat/cells.py) is plain torch code, so it could return the true higher-order values; code
written for diffct may rely on the refusal (a ``try``/``except`` that falls back to a finite
difference, say), so the diffct face refuses the same way.  ctbench's own top-level Projector
keeps the full derivatives (docs/FROM_DIFFCT.md, "Remaining differences: i25num").

:func:`first_order_rays` passes the ray tensors through an identity whose backward result, when
differentiated again, raises, and whose forward-mode rule raises.  Data derivatives are not
touched: the data never passes through it.
"""

from __future__ import annotations

import torch

from ..engine.base import Rays

__all__ = ["first_order_rays", "SECOND_ORDER_ERROR", "FORWARD_MODE_ERROR"]

SECOND_ORDER_ERROR = ("second-order derivatives with respect to the trajectory or detector-surface parameters "
                      "are not supported by diffct's Projector (first order only); use ctbench.Projector for "
                      "higher derivatives of the geometry")
FORWARD_MODE_ERROR = ("forward-mode differentiation (jvp/jacfwd) with respect to the trajectory or "
                      "detector-surface parameters is not supported by diffct's Projector; use reverse mode, "
                      "or ctbench.Projector")


class _NoSecondOrder(torch.autograd.Function):
    """Identity on a first-order geometry gradient; differentiating it again raises."""

    generate_vmap_rule = True

    @staticmethod
    def forward(gradient):
        return gradient.view_as(gradient)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, _):
        raise RuntimeError(SECOND_ORDER_ERROR)

    @staticmethod
    def jvp(ctx, _):
        raise RuntimeError(SECOND_ORDER_ERROR)


class _FirstOrderGeometry(torch.autograd.Function):
    """Identity on the ray tensors: reverse mode passes gradients on (guarded against a second
    differentiation when the graph is kept), forward mode raises."""

    generate_vmap_rule = True

    @staticmethod
    def forward(*tensors):
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        if not torch.is_grad_enabled():  # create_graph=False: nothing can differentiate the result
            return grads
        return tuple(None if g is None else _NoSecondOrder.apply(g) for g in grads)

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(FORWARD_MODE_ERROR)


def _traced(t: torch.Tensor) -> bool:
    # a tensor autograd or torch.func can see: it requires grad, or it is a functorch wrapper
    # (a jvp/vmap level's tensor, whose requires_grad says nothing about its tangent)
    return t.requires_grad or torch._C._functorch.is_functorch_wrapped_tensor(t)


def first_order_rays(rays: Rays) -> Rays:
    """``rays`` with diffct's first-order-only geometry derivatives (module docstring); plain
    tensors (no gradient, no transform) are returned as they are."""
    tensors = rays.tensors()
    if not any(_traced(t) for t in tensors):
        return rays
    return Rays(*_FirstOrderGeometry.apply(*tensors), rays.cone, rays.detector_shape)
