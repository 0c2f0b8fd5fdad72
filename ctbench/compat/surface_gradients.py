"""diffct 2.5's ``diffct.surface_gradients``: :func:`surface_batch_vjp`.

A curved detector places pixel ``p`` of view ``k`` at ``center_k + t u_k + w v_k + h n_k``
(:func:`ctbench.compat.surfaces.compose_points`).  Given cotangents of the sources and of those
world points, :func:`surface_batch_vjp` returns the gradients of the frame tensors and of the
surface's own inputs (its raw offsets, or a :class:`~ctbench.compat.surfaces.ParameterizedSurface`'s
parameters) without ever building the whole batch's point graph: it composes one view and one
detector-row segment of at most ``capacity`` pixels at a time, pulls the cotangents back through
that piece, and accumulates.  The offsets' own graph (the sampler) is then pulled back once.
"""

from __future__ import annotations

import operator

import torch

from .surfaces import compose_points, frame_count

__all__ = ["surface_batch_vjp"]


def _capacity(value):
    if isinstance(value, bool):
        raise ValueError(f"surface replay capacity must be a positive integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"surface replay capacity must be a positive integer, got {value!r}") from None
    if value < 1:
        raise ValueError(f"surface replay capacity must be a positive integer, got {value!r}")
    return value


def _work_dtypes(frames, offsets, native_legacy):
    """diffct's arithmetic dtypes: each part at least float32 (``native_legacy``), or all parts
    at their common promoted dtype."""
    common = torch.float32
    for value in (*frames, offsets):
        common = torch.promote_types(common, value.dtype)
    if native_legacy:
        return tuple(torch.promote_types(torch.float32, f.dtype) for f in frames), \
            torch.promote_types(torch.float32, offsets.dtype)
    return (common,) * len(frames), common


def surface_batch_vjp(beam, detector_shape, detector_spacing, inputs, offsets, views, pixels, voxel_spacing,
                      device, weights, capacity, *, native_legacy):
    """Pull ``weights = (source cotangent (n, r), point cotangent (n, *pixels, r))`` back to ``inputs``.

    ``inputs`` are the frame tensors (source, centre, u[, v]) of the ``n`` views of ``views``,
    followed by the surface's inputs; ``offsets`` are the local ``(t, w, h)`` offsets of the
    selected ``pixels`` (shared ``(*pixels, 3)`` or per view ``(n, *pixels, 3)``), carrying their
    graph to the surface's inputs.  Returns one gradient per input, on the CPU in the input's
    dtype (None for a surface input that nothing depends on).  ``detector_shape``,
    ``detector_spacing``, ``voxel_spacing`` and ``device`` describe the batch (the offsets are
    already sampled, so the composition needs none of them)."""
    capacity = _capacity(capacity)
    if not isinstance(inputs, (tuple, list)):
        raise TypeError(f"inputs must be a tuple of tensors, got {type(inputs).__name__}")
    nf = frame_count(beam)
    if len(inputs) < nf:
        raise ValueError(f"inputs must start with the {nf} frame tensors of a {beam!r} beam, got {len(inputs)} tensors")
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(f"offsets must be a tensor, got {type(offsets).__name__}")
    frames = tuple(inputs[:nf])
    dims = len(detector_shape)
    pixel_shape = tuple(len(range(*s.indices(n))) for s, n in zip(pixels, detector_shape))
    per_view = offsets.ndim == dims + 2
    frame_dtypes, offset_dtype = _work_dtypes(frames, offsets, native_legacy)
    n_views = frames[0].shape[0]
    frame_grads = [torch.zeros(f.shape, dtype=d) for f, d in zip(frames, frame_dtypes)]
    offset_grad = torch.zeros(offsets.shape, dtype=offset_dtype)
    source_w, point_w = weights
    rows = range(pixel_shape[0]) if dims == 2 else (None,)
    width = pixel_shape[-1]

    with torch.enable_grad():
        for k in range(n_views):
            for row in rows:
                for start in range(0, width, capacity):
                    cols = slice(start, min(start + capacity, width))
                    local = (slice(row, row + 1), cols) if dims == 2 else (cols,)
                    part = offsets[(slice(k, k + 1), *local) if per_view else local]
                    leaf_frames = [f[k:k + 1].detach().to(dtype=d).requires_grad_()
                                   for f, d in zip(frames, frame_dtypes)]
                    leaf_off = part.detach().to(device="cpu", dtype=offset_dtype).requires_grad_()
                    points = compose_points(leaf_frames[1], leaf_frames[2], leaf_frames[3] if nf == 4 else None,
                                            leaf_off, dims)
                    pw = point_w[(slice(k, k + 1), *local)].detach().to(dtype=points.dtype)
                    if start == 0 and row in (0, None):
                        # the source's cotangent joins the view's first segment only
                        src = leaf_frames[0]
                        outs, cots = (src, points), (source_w[k:k + 1].detach().to(dtype=src.dtype), pw)
                    else:
                        outs, cots = (points,), (pw,)
                    grads = torch.autograd.grad(outs, (*leaf_frames, leaf_off), cots, allow_unused=True)
                    for acc, g in zip(frame_grads, grads[:nf]):
                        if g is not None:
                            acc[k:k + 1] += g.to(acc.dtype)
                    if grads[-1] is not None:
                        offset_grad[(slice(k, k + 1), *local) if per_view else local] += grads[-1]
                    del points, grads, outs, cots, leaf_frames, leaf_off

        if offsets.requires_grad:
            through_sampler = torch.autograd.grad(offsets, tuple(inputs),
                                                  offset_grad.to(device=offsets.device, dtype=offsets.dtype),
                                                  allow_unused=True)
        else:
            through_sampler = (None,) * len(inputs)

    result = []
    for i, (value, g) in enumerate(zip(inputs, through_sampler)):
        if i < nf:
            acc = frame_grads[i]
            if g is not None:
                acc += g.detach().to(device="cpu", dtype=acc.dtype)
            result.append(acc.to(value.dtype))
        else:
            result.append(None if g is None else g.detach().to(device="cpu", dtype=value.dtype))
    return tuple(result)
