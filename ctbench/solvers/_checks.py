"""Argument checks shared by the solvers: one clear error per kind of bad input."""

from __future__ import annotations

import math
import numbers

import torch

_DTYPES = (torch.float32, torch.float64)


def check_projector(projector) -> None:
    for attr in ("project", "backproject", "inner_volume", "inner_projection", "projection_shape", "volume_shape"):
        if not hasattr(projector, attr):
            raise TypeError(f"projector must be a ctbench Projector (it lacks {attr!r}), "
                            f"got {type(projector).__name__}")


def check_sinogram(projector, sinogram, *, allow_batch: bool = False) -> torch.Tensor:
    """The sinogram, checked against the projector: shape, dtype and finite values."""
    check_projector(projector)
    if not isinstance(sinogram, torch.Tensor):
        raise TypeError(f"sinogram must be a torch.Tensor, got {type(sinogram).__name__}")
    if sinogram.dtype not in _DTYPES:
        raise TypeError(f"sinogram must be float32 or float64, got {sinogram.dtype}")
    expected = tuple(projector.projection_shape)
    core = tuple(sinogram.shape[max(0, sinogram.ndim - len(expected)):])
    if core != expected or (not allow_batch and sinogram.ndim != len(expected)):
        n_views = getattr(projector, "n_views", "?")
        want = f"(*batch, {', '.join(map(str, expected))})" if allow_batch else str(expected)
        raise ValueError(
            f"sinogram has shape {tuple(sinogram.shape)} but the projector expects {want} "
            f"(n_views={expected[0]} of {n_views} trajectory views, then the detector shape): "
            "the sinogram does not match the trajectory/detector")
    check_finite(sinogram, "sinogram")
    return sinogram.detach()


def check_finite(t: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        n_nan = int(torch.isnan(t).sum())
        n_inf = int(torch.isinf(t).sum())
        raise ValueError(f"{name} contains non-finite values ({n_nan} NaN, {n_inf} inf); "
                         "clean or mask them before reconstructing")


def check_n_iter(n_iter) -> int:
    if isinstance(n_iter, bool) or not isinstance(n_iter, numbers.Integral) or n_iter < 0:
        raise ValueError(f"n_iter must be a non-negative integer, got {n_iter!r}")
    return int(n_iter)


def check_tol(tol) -> float | None:
    if tol is None:
        return None
    try:
        t = float(tol)
    except (TypeError, ValueError):
        raise ValueError(f"tol must be a non-negative number or None, got {tol!r}") from None
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"tol must be a non-negative number or None, got {tol!r}")
    return t


def check_callable(fn, name: str):
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be callable or None, got {type(fn).__name__}")
    return fn


def check_cancel(cancel):
    """``cancel`` may be None, an object with ``is_set()`` (threading.Event) or a callable returning bool."""
    if cancel is None or callable(cancel) or callable(getattr(cancel, "is_set", None)):
        return cancel
    raise TypeError(f"cancel must be None, a threading.Event-like object or a callable, got {type(cancel).__name__}")


def initial_volume(projector, sinogram: torch.Tensor, x0) -> torch.Tensor:
    """A fresh copy of x0 (warm start), or zeros; shaped like the projector's volume."""
    shape = tuple(projector.volume_shape)
    if x0 is None:
        return torch.zeros(shape, dtype=sinogram.dtype, device=sinogram.device)
    if not isinstance(x0, torch.Tensor):
        raise TypeError(f"x0 must be a torch.Tensor or None, got {type(x0).__name__}")
    if tuple(x0.shape) != shape:
        raise ValueError(f"x0 has shape {tuple(x0.shape)} but the projector's volume_shape is {shape}")
    check_finite(x0, "x0")
    return x0.detach().to(device=sinogram.device, dtype=sinogram.dtype).clone()


def check_bounds(bounds) -> tuple[float | None, float | None] | None:
    if bounds is None:
        return None
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be a pair (lower, upper) with None for no bound, got {bounds!r}") from None
    vals = []
    for name, v in (("lower", lo), ("upper", hi)):
        if v is None:
            vals.append(None)
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"bounds {name} must be a number or None, got {v!r}") from None
        if math.isnan(f):
            raise ValueError(f"bounds {name} must not be NaN")
        vals.append(f)
    if vals[0] is not None and vals[1] is not None and vals[0] > vals[1]:
        raise ValueError(f"bounds lower ({vals[0]}) must not exceed upper ({vals[1]})")
    return vals[0], vals[1]


def check_flag(value, name: str) -> bool:
    """A True/False option (not 0/1 or a string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_run(n_iter, tol, callback, cancel):
    """The run controls every iterative solver takes, checked: (n_iter, tol, callback, cancel)."""
    return check_n_iter(n_iter), check_tol(tol), check_callable(callback, "callback"), check_cancel(cancel)
