"""diffct 2.5's functional analytic reconstructions (``diffct.reconstruction``):
``fdk(sinogram, trajectory, volume_shape, angles, ...)``, ``fbp(...)``, ``helical_fdk(...)``,
``fdk_into(source, output, trajectory, ...)``, ``fbp_into``, and the helical weights.  Called with a
:class:`~ctbench.Projector` first they are ctbench's own (:mod:`ctbench.solvers`), so both
spellings work.
"""

from __future__ import annotations

import inspect

import torch

from .. import solvers as _s
from ..geometry import as_trajectory

from ._common import _filter_name, _is_projector, _write_blocks
from .weighted import helical_view_weights, helical_weighted_backproject

__all__ = ["fbp", "fdk", "fbp_into", "fdk_into", "helical_fdk", "helical_view_weights",
           "helical_weighted_backproject"]

def _unsupported(**options):
    for name, value in options.items():
        if value not in (None, False):
            raise NotImplementedError(f"{name}= is not supported by ctbench's diffct spelling; "
                                      "see docs/FROM_DIFFCT.md for the ctbench equivalent")


def _functional_projector(sinogram, trajectory, volume_shape, angles, beam, detector_spacing, voxel_spacing,
                          backend, precision, view_chunk_size=None, volume_chunk_shape=None):
    """The projector of a functional call and the sinogram in the precision's dtype.  ``sinogram``
    is a tensor, or a block store (streamed ``*_into`` calls: only its shape and dtype are read)."""
    from .operators import Projector

    if backend not in ("auto", "torch", "numba"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'numba', got {backend!r}")
    if precision not in ("fast", "float32", "float64"):
        raise ValueError(f"precision must be 'fast', 'float32' or 'float64', got {precision!r}")
    store = not isinstance(sinogram, torch.Tensor)
    if store and not (hasattr(sinogram, "read") and hasattr(sinogram, "shape")):
        raise TypeError(f"source must be a tensor or a block store, got {type(sinogram).__name__}")
    if not store and not sinogram.is_floating_point():
        raise TypeError("sinogram must be a real floating-point tensor")
    traj = as_trajectory(trajectory, beam=beam)
    n = traj.n_views
    if angles is not None:
        a = torch.as_tensor(angles)
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"angles must be a 1D tensor of the {n} view angles, got shape {tuple(a.shape)}")
    dtype = torch.float64 if precision == "float64" else torch.float32
    sino = sinogram if store else sinogram.to(dtype)  # differentiable (diffct's fdk/fbp are)
    device = torch.device("cpu") if store else sino.device
    traj = traj.to(device=device, dtype=dtype).detach()
    shape = tuple(sinogram.shape)
    det = shape[1:] if traj.ndim == 3 else shape[1]
    P = Projector(traj, tuple(volume_shape), det, detector_spacing=detector_spacing, voxel_spacing=voxel_spacing,
                  view_chunk_size=view_chunk_size, volume_chunk_shape=volume_chunk_shape)
    return P, sino


def _analytic(kind, sinogram, trajectory, volume_shape, angles, beam, detector_spacing, voxel_spacing, window,
              pad_factor, short_scan, isocenter, backend, precision, unsupported, view_chunk_size=None,
              volume_chunk_shape=None, output=None):
    learned = any(unsupported.get(k) is not None for k in ("projection_weights", "angular_weights", "filter_response"))
    off_origin = isocenter is not None and any(float(c) != 0.0 for c in torch.as_tensor(isocenter).reshape(-1).tolist())
    if learned or view_chunk_size is not None or off_origin:
        # diffct's batched recipe (learned weights, view batches summed in order, so that fdk and
        # fdk_into agree exactly, an isocenter off the origin): ctbench.compat.analytical_execution
        from .analytical_execution import AnalyticalExecution

        run = AnalyticalExecution(sinogram, trajectory, volume_shape, angles, beam=beam,
                                  detector_spacing=detector_spacing, voxel_spacing=voxel_spacing, window=window,
                                  pad_factor=pad_factor, short_scan=short_scan, isocenter=isocenter, backend=backend,
                                  precision=precision, view_chunk_size=view_chunk_size,
                                  volume_chunk_shape=volume_chunk_shape, **unsupported)
        if output is not None:
            return run.into(output)
        if not isinstance(sinogram, torch.Tensor):
            raise TypeError("fbp/fdk input must be a tensor; use fbp_into/fdk_into for stores")
        return run.tensor_result()
    _unsupported(**unsupported)
    if isocenter is not None and any(float(c) != 0.0 for c in torch.as_tensor(isocenter).reshape(-1).tolist()):
        raise NotImplementedError("isocenter= is not supported; move the scan with transform_trajectory so that "
                                  "the rotation axis passes through the origin")
    streamed = output is not None and (view_chunk_size is not None or volume_chunk_shape is not None
                                       or not isinstance(sinogram, torch.Tensor))
    P, sino = _functional_projector(sinogram, trajectory, volume_shape, angles, beam, detector_spacing,
                                    voxel_spacing, backend, precision,
                                    view_chunk_size if streamed else None, volume_chunk_shape if streamed else None)
    pad = float(pad_factor) if pad_factor and pad_factor >= 1 else 1.0
    options = dict(filter=_filter_name(window), padding=pad, short_scan="auto" if short_scan else False)
    if output is None:
        return {"fdk": _s.fdk, "fbp": _s.fbp}[kind](P, sino, **options)
    if not streamed:  # a tensor source without chunk limits: in memory, as fdk/fbp
        _write_blocks(output, _s.fdk(P, sino, **options) if kind == "fdk" else _s.fbp(P, sino, **options), 1 << 22)
        return output
    # streamed (ctbench.solvers.fdk_into): reads at most view_chunk_size views and writes z-slabs of
    # at most the planes volume_chunk_shape allows (ctbench.compat.operators.slab_planes)
    from ..storage import TensorStore as _Plain

    src = _Plain(sino.detach().to(P.trajectory.source.dtype)) if isinstance(sino, torch.Tensor) else sino
    dst = _Plain(output.detach()) if isinstance(output, torch.Tensor) and output.is_contiguous() else output
    if isinstance(output, torch.Tensor) and dst is output:
        raise ValueError("output must be a contiguous tensor or a block store")
    _s.fdk_into(P, src, dst, **options)
    if hasattr(output, "flush"):
        output.flush()
    return output


def fbp(*args, **kwargs):
    """``fbp(projector, sinogram, ...)`` (ctbench, :func:`ctbench.solvers.fbp`) or diffct's
    ``fbp(sinogram, trajectory, volume_shape, angles, *, beam="parallel", detector_spacing=1.0,
    voxel_spacing=1.0, window="ram-lak", pad_factor=2, short_scan=False, ...)``."""
    if args and _is_projector(args[0]):
        return _s.fbp(*args, **kwargs)
    return _diffct_fbp(*args, **kwargs)


def _diffct_fbp(sinogram, trajectory, volume_shape, angles, *, beam="parallel", detector_spacing=1.0,
                voxel_spacing=1.0, window="ram-lak", pad_factor=2, projection_weights=None, angular_weights=None,
                filter_response=None, short_scan=False, isocenter=None, backend="auto", precision="fast",
                devices=None, view_chunk_size=None, volume_chunk_shape=None, distributed=False,
                process_group=None, partition="views", partition_grid=None, _output=None):
    if beam not in ("parallel", "fan"):
        raise ValueError("fbp beam must be 'parallel' or 'fan'; use fdk for cone data")
    return _analytic("fbp", sinogram, trajectory, volume_shape, angles, beam, detector_spacing, voxel_spacing,
                     window, pad_factor, short_scan, isocenter, backend, precision,
                     dict(projection_weights=projection_weights, angular_weights=angular_weights,
                          filter_response=filter_response, distributed=distributed, process_group=process_group,
                          partition_grid=partition_grid), view_chunk_size, volume_chunk_shape, _output)


def fdk(*args, **kwargs):
    """``fdk(projector, sinogram, ...)`` (ctbench, :func:`ctbench.solvers.fdk`) or diffct's
    ``fdk(sinogram, trajectory, volume_shape, angles, *, detector_spacing=1.0, voxel_spacing=1.0,
    window="ram-lak", pad_factor=2, short_scan=False, ...)``."""
    if args and _is_projector(args[0]):
        return _s.fdk(*args, **kwargs)
    return _diffct_fdk(*args, **kwargs)


def _diffct_fdk(sinogram, trajectory, volume_shape, angles, *, detector_spacing=1.0, voxel_spacing=1.0,
                window="ram-lak", pad_factor=2, projection_weights=None, angular_weights=None, filter_response=None,
                short_scan=False, isocenter=None, backend="auto", precision="fast", devices=None,
                view_chunk_size=None, volume_chunk_shape=None, distributed=False, process_group=None,
                partition="views", partition_grid=None, _output=None):
    return _analytic("fdk", sinogram, trajectory, volume_shape, angles, "cone", detector_spacing, voxel_spacing,
                     window, pad_factor, short_scan, isocenter, backend, precision,
                     dict(projection_weights=projection_weights, angular_weights=angular_weights,
                          filter_response=filter_response, distributed=distributed, process_group=process_group,
                          partition_grid=partition_grid), view_chunk_size, volume_chunk_shape, _output)


def helical_fdk(*args, **kwargs):
    """``helical_fdk(projector, sinogram, ...)`` (ctbench) or diffct's
    ``helical_fdk(sinogram, trajectory, volume_shape, angles, *, isocenter, detector_spacing=1.0,
    voxel_spacing=1.0, window="ram-lak", pad_factor=2, ...)`` (``isocenter`` must be the origin)."""
    if args and _is_projector(args[0]):
        return _s.helical_fdk(*args, **kwargs)
    return _diffct_helical(*args, **kwargs)


def _diffct_helical(sinogram, trajectory, volume_shape, angles, *, isocenter, detector_spacing=1.0,
                    voxel_spacing=1.0, window="ram-lak", pad_factor=2, projection_weights=None, view_weights=None,
                    filter_response=None):
    _unsupported(projection_weights=projection_weights, view_weights=view_weights, filter_response=filter_response)
    if any(float(c) != 0.0 for c in torch.as_tensor(isocenter).reshape(-1).tolist()):
        raise NotImplementedError("isocenter must be the origin; move the scan with transform_trajectory")
    P, sino = _functional_projector(sinogram, trajectory, volume_shape, angles, "cone", detector_spacing,
                                    voxel_spacing, "auto", "fast")
    pad = float(pad_factor) if pad_factor and pad_factor >= 1 else 1.0
    return _s.helical_fdk(P, sino, filter=_filter_name(window), padding=pad)


def fdk_into(*args, **kwargs):
    """``fdk_into(projector, sinogram_store, volume_store, ...)`` (ctbench, streamed,
    :func:`ctbench.solvers.fdk_into`) or diffct's ``fdk_into(source, output, trajectory,
    volume_shape, angles, **fdk_options)`` (returns ``output``)."""
    if args and _is_projector(args[0]):
        return _s.fdk_into(*args, **kwargs)
    return _diffct_into(_diffct_fdk, *args, **kwargs)


def fbp_into(*args, **kwargs):
    """diffct's ``fbp_into(source, output, trajectory, volume_shape, angles, beam="parallel", **options)``
    (returns ``output``); with a Projector first, ctbench's streamed :func:`ctbench.solvers.fdk_into`."""
    if args and _is_projector(args[0]):
        return _s.fdk_into(*args, **kwargs)
    return _diffct_into(_diffct_fbp, *args, **kwargs)


def _diffct_into(fn, source, output, trajectory, volume_shape, angles, **kwargs):
    if "_output" in kwargs:
        raise TypeError("unexpected keyword argument '_output'")
    if not isinstance(output, torch.Tensor) and not hasattr(output, "write"):
        raise TypeError(f"output must be a tensor or a block store, got {type(output).__name__}")
    if tuple(output.shape) != tuple(volume_shape):
        raise ValueError(f"output has shape {tuple(output.shape)}, expected volume_shape {tuple(volume_shape)}")
    return fn(source, trajectory, volume_shape, angles, _output=output, **kwargs)


def _public_signature(fn, impl):
    """Show diffct's signature (``inspect.signature``) on a dispatcher that also takes ctbench's spelling."""
    sig = inspect.signature(impl)
    fn.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if not p.name.startswith("_")])


_public_signature(fbp, _diffct_fbp)
_public_signature(fdk, _diffct_fdk)
_public_signature(helical_fdk, _diffct_helical)
