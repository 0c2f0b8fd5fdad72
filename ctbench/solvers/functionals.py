"""Functionals the catalogue solvers compose: data terms, penalties and constraints.

Each functional has ``value(x)``; smooth ones have ``gradient(x)`` and
``lipschitz()`` (a bound on the gradient's Lipschitz constant); proximable
ones have ``prox(v, t) = argmin_z 1/2 ||z - v||^2 + t f(z)``.

Data terms act on the projector ``A`` (``f(x) = h(A x)``).  They also offer
their pieces in sinogram space (``forward``, ``value_at``, ``grad_at``), so
that FISTA can keep the projections of its iterates and form those of the
extrapolated points by linearity (one projection and one backprojection per
iteration instead of two projections):

- :class:`LeastSquares`: ``1/2 sum_i w_i (A x - b)_i^2``, ``w >= 0`` (``w = 1``: unweighted);
- :class:`PoissonTransmission`: the negative log-likelihood of counts
  ``y_i ~ Poisson(I0_i exp(-(A x)_i))``, in the *transmission* form
  ``sum_i [I0_i exp(-l_i) + y_i l_i - y_i + y_i log(y_i / I0_i)]``, ``l = A x``
  (constants chosen so that each ray's term is >= 0 and vanishes at its best
  ``l_i = log(I0_i / y_i)``; ``0 log 0 = 0``, so zero counts are fine).

Penalties on the forward differences ``D`` of :mod:`ctbench.engine.finite_differences`
(per voxel, Neumann boundary, the ``TV`` of :mod:`ctbench.solvers.tv`):

- :class:`TotalVariation`: ``lam sum_v sqrt(|D x|_v^2 + eps)`` (isotropic; ``eps > 0`` for the gradient),
  prox by the fast gradient projection (FGP, Beck & Teboulle 2009) on its dual;
- :class:`Huber`: ``lam sum_v huber_delta(|D x|_v)``, ``huber_delta(r) = r^2 / (2 delta)`` for
  ``r <= delta``, ``r - delta / 2`` above; smooth, and proximable by the same dual iteration;
- :class:`Box`: the indicator of ``lower <= x <= upper`` (:func:`nonnegativity` for ``x >= 0``).

:func:`operator_norm` estimates ``||A||`` by the power method and caches it
per projector geometry (:func:`projector_fingerprint`).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import threading

import torch

from ._checks import check_finite, check_projector
from ..engine.finite_differences import divergence, gradient

__all__ = ["LeastSquares", "PoissonTransmission", "TotalVariation", "Huber", "Box", "nonnegativity",
           "operator_norm", "projector_fingerprint", "optimal_curvature", "check_counts", "check_flat", "check_weights"]


# ------------------------------------------------------------------ checks
def _positive(value, name: str, *, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, "
                         f"got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} finite number, "
                         f"got {value!r}")
    return v


def _count(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_weights(weights, like: torch.Tensor, name: str = "weights") -> torch.Tensor | None:
    """Per-ray weights shaped like the sinogram (or broadcastable to it), finite and >= 0."""
    if weights is None:
        return None
    w = torch.as_tensor(weights, dtype=like.dtype, device=like.device)
    try:
        w = torch.broadcast_to(w, like.shape)
    except RuntimeError:
        raise ValueError(f"{name} has shape {tuple(w.shape)}, which does not broadcast to the sinogram's "
                         f"{tuple(like.shape)}") from None
    check_finite(w, name)
    if bool((w < 0).any()):
        raise ValueError(f"{name} must be non-negative ({int((w < 0).sum())} negative values)")
    return w


def check_counts(counts, projector, *, allow_zero: bool = True) -> torch.Tensor:
    """Photon counts shaped like the projector's sinogram: finite, >= 0 (> 0 unless ``allow_zero``)."""
    check_projector(projector)
    if not isinstance(counts, torch.Tensor):
        raise TypeError(f"counts must be a torch.Tensor, got {type(counts).__name__}")
    if counts.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"counts must be float32 or float64, got {counts.dtype}")
    if tuple(counts.shape) != tuple(projector.projection_shape):
        raise ValueError(f"counts has shape {tuple(counts.shape)} but the projector expects "
                         f"{tuple(projector.projection_shape)}")
    check_finite(counts, "counts")
    if bool((counts < 0).any()):
        raise ValueError(f"counts must be non-negative photon counts ({int((counts < 0).sum())} negative values)")
    if not allow_zero and bool((counts <= 0).any()):
        raise ValueError(f"counts must be positive here ({int((counts <= 0).sum())} pixels count no photon, "
                         "so their line integral is infinite): clamp them (e.g. counts.clamp(min=1)) or use "
                         "mlem/osem, whose likelihood takes zero counts")
    return counts.detach()


def check_flat(flat, counts: torch.Tensor) -> torch.Tensor:
    """The flat field ``I0``: a positive number or a positive tensor broadcastable to the counts."""
    if isinstance(flat, torch.Tensor):
        f = flat.detach().to(dtype=counts.dtype, device=counts.device)
        try:
            f = torch.broadcast_to(f, counts.shape)
        except RuntimeError:
            raise ValueError(f"flat has shape {tuple(flat.shape)}, which does not broadcast to the counts' "
                             f"{tuple(counts.shape)}") from None
        check_finite(f, "flat")
        if bool((f <= 0).any()):
            raise ValueError(f"flat (unattenuated counts I0) must be positive ({int((f <= 0).sum())} values <= 0)")
        return f
    return torch.full_like(counts, _positive(flat, "flat (unattenuated counts I0)"))


# -------------------------------------------------------------- data terms
class _DataTerm:
    """``f(x) = h(A x)`` with ``h`` separable over rays: the pieces FISTA keeps in sinogram space."""

    smooth = True

    def __init__(self, projector):
        check_projector(projector)
        self.projector = projector

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector.project(x)

    def value(self, x: torch.Tensor) -> float:
        return self.value_at(self.forward(x))

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector.backproject(self.grad_at(self.forward(x)))

    def _sum(self, t: torch.Tensor) -> float:
        return float(self.projector.inner_projection(t, torch.ones_like(t)))


class LeastSquares(_DataTerm):
    """``1/2 sum_i w_i ((A x)_i - b_i)^2``; ``weights=None`` is ``w = 1``.

    Its gradient ``A^T W (A x - b)`` is Lipschitz with constant ``||W^(1/2) A||^2``
    (:meth:`lipschitz`: the cached :func:`operator_norm` when unweighted, a power
    method on ``A^T W A`` otherwise).
    """

    def __init__(self, projector, data: torch.Tensor, weights=None):
        super().__init__(projector)
        self.data = data
        self.weights = check_weights(weights, data)
        self._lipschitz = None

    def value_at(self, l: torch.Tensor) -> float:
        r = l - self.data
        wr = r if self.weights is None else self.weights * r
        return 0.5 * float(self.projector.inner_projection(r, wr))

    def grad_at(self, l: torch.Tensor) -> torch.Tensor:
        r = l - self.data
        return r if self.weights is None else self.weights * r

    def residual_at(self, l: torch.Tensor) -> float:
        r = l - self.data
        return math.sqrt(float(self.projector.inner_projection(r, r)))

    def lipschitz(self) -> float:
        if self._lipschitz is None:
            if self.weights is None:
                self._lipschitz = operator_norm(self.projector, dtype=self.data.dtype,
                                                device=self.data.device) ** 2
            else:
                self._lipschitz = _power_method(self.projector, self.data.dtype, self.data.device,
                                                weights=self.weights)
        return self._lipschitz


class PoissonTransmission(_DataTerm):
    """Negative log-likelihood of transmission counts (module docstring); ``flat`` is ``I0``.

    Convex in ``l = A x``; its curvature ``I0 exp(-l)`` is at most ``I0`` where
    ``l >= 0``, so on non-negative volumes (a non-negative projector gives
    ``l >= 0``) the gradient is Lipschitz with ``max(I0) ||A||^2`` (:meth:`lipschitz`).
    """

    def __init__(self, projector, counts: torch.Tensor, flat):
        super().__init__(projector)
        self.counts = check_counts(counts, projector)
        self.flat = check_flat(flat, self.counts)
        y, f = self.counts, self.flat
        # per-ray constant making each term >= 0: y - y log(y / I0), with 0 log 0 = 0
        self._const = self._sum(torch.where(y > 0, y - y * torch.log(torch.where(y > 0, y, f) / f),
                                            torch.zeros_like(y)))
        # the line integrals the counts say, for reporting residuals (a ray counting nothing reads as one photon)
        self.data = -torch.log(y.clamp(min=1.0) / f)

    def value_at(self, l: torch.Tensor) -> float:
        return self._sum(self.flat * torch.exp(-l) + self.counts * l) - self._const

    def grad_at(self, l: torch.Tensor) -> torch.Tensor:
        return self.counts - self.flat * torch.exp(-l)

    def residual_at(self, l: torch.Tensor) -> float:
        r = l - self.data
        return math.sqrt(float(self.projector.inner_projection(r, r)))

    def curvature_at(self, l: torch.Tensor) -> torch.Tensor:
        """The :func:`optimal_curvature` of every ray at ``l``."""
        return optimal_curvature(l, self.flat)

    def lipschitz(self) -> float:
        x = self.counts
        return float(self.flat.max()) * operator_norm(self.projector, dtype=x.dtype, device=x.device) ** 2


def optimal_curvature(l: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Erdogan & Fessler's optimal curvature of ``h(l) = I0 exp(-l) + y l``: the smallest parabola tangent
    at ``l >= 0`` that lies above ``h`` on ``[0, inf)``: ``2 I0 (1 - exp(-l) (1 + l)) / l^2`` (``I0`` at 0).
    It does not depend on ``y``."""
    l = l.clamp(min=0.0)
    small = l < 1e-3
    ls = torch.where(small, torch.ones_like(l), l)
    exact = 2.0 * (-torch.expm1(-ls) - ls * torch.exp(-ls)) / ls.square()
    series = 1.0 - 2.0 * l / 3.0 + l.square() / 4.0
    return flat * torch.where(small, series, exact)


# --------------------------------------------------------------- penalties
def _spatial_ndim(projector, x: torch.Tensor, ndim) -> int:
    if ndim is not None:
        return ndim
    return len(projector.volume_shape) if projector is not None else min(x.ndim, 3)


class _DifferencePenalty:
    """``lam sum_v phi(|D x|_v)`` with the prox of ``t`` times it by FGP on the dual (optionally within a box)."""

    def __init__(self, lam, *, ndim=None, prox_iter=20, bounds=None):
        self.lam = _positive(lam, "lam", allow_zero=True)
        if ndim is not None and (isinstance(ndim, bool) or ndim not in (1, 2, 3)):
            raise ValueError(f"ndim must be 1, 2 or 3 (spatial axes), got {ndim!r}")
        self.ndim = ndim
        self.prox_iter = _count(prox_iter, "prox_iter")
        from ._checks import check_bounds
        self.bounds = check_bounds(bounds)
        self._dual = None   # warm start of the dual variable between prox calls

    def _grad_field(self, x):
        return gradient(x, _spatial_ndim(None, x, self.ndim))

    def prox(self, v: torch.Tensor, t: float) -> torch.Tensor:
        """``argmin_z 1/2 ||z - v||^2 + t f(z)`` (within ``bounds``), by ``prox_iter`` FGP steps on the dual.

        The dual of ``phi`` is the unit ball (plus ``delta/2 |q|^2`` for Huber); the dual
        objective's gradient is Lipschitz with ``(t lam)^2 4 ndim + t lam delta``, its step.
        """
        t = _positive(t, "t (prox step)", allow_zero=True)
        g = t * self.lam
        if g == 0:
            return self._clip(v)
        ndim = _spatial_ndim(None, v, self.ndim)
        delta = self._delta()
        step = 1.0 / (g * g * 4.0 * ndim + g * delta)
        q = self._dual if self._dual is not None and self._dual.shape == (ndim, *v.shape) else \
            torch.zeros((ndim, *v.shape), dtype=v.dtype, device=v.device)
        r, tk = q, 1.0
        for _ in range(self.prox_iter):
            z = self._clip(v + g * divergence(r))
            q_new = _unit_ball(r + step * g * (gradient(z, ndim) - delta * r))
            t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * tk * tk))
            r = q_new + ((tk - 1.0) / t_new) * (q_new - q)
            q, tk = q_new, t_new
        self._dual = q
        return self._clip(v + g * divergence(q))

    def _clip(self, x):
        if self.bounds is None:
            return x
        return x.clamp(min=self.bounds[0], max=self.bounds[1])

    def reset(self) -> None:
        """Forget the prox's warm start (a new problem)."""
        self._dual = None


def _unit_ball(q: torch.Tensor) -> torch.Tensor:
    return q / torch.clamp(q.square().sum(0).sqrt(), min=1.0)


class TotalVariation(_DifferencePenalty):
    """``lam sum_v sqrt(|D x|_v^2 + eps)``: isotropic TV (``eps = 0``) or its smoothed form.

    :meth:`gradient` needs ``eps > 0`` (Lipschitz ``lam 4 ndim / sqrt(eps)``);
    :meth:`prox` is the exact TV's (``eps`` is ignored there), restricted to ``bounds`` when given.
    """

    def __init__(self, lam, *, eps: float = 0.0, ndim=None, prox_iter=20, bounds=None):
        super().__init__(lam, ndim=ndim, prox_iter=prox_iter, bounds=bounds)
        self.eps = _positive(eps, "eps", allow_zero=True)
        self.smooth = self.eps > 0

    def _delta(self) -> float:
        return 0.0

    def value(self, x: torch.Tensor) -> float:
        return self.lam * float(torch.sqrt(self._grad_field(x).square().sum(0) + self.eps).sum())

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        if self.eps <= 0:
            raise ValueError("TotalVariation.gradient needs eps > 0 (the exact TV is not differentiable); "
                             "use its prox, or TotalVariation(lam, eps=...)")
        g = self._grad_field(x)
        return -self.lam * divergence(g / torch.sqrt(g.square().sum(0) + self.eps))

    def lipschitz(self) -> float:
        if self.eps <= 0:
            return math.inf
        return self.lam * 4.0 * (self.ndim or 3) / math.sqrt(self.eps)


class Huber(_DifferencePenalty):
    """``lam sum_v huber_delta(|D x|_v)``: quadratic below ``delta``, linear (TV-like) above; smooth."""

    smooth = True

    def __init__(self, lam, delta, *, ndim=None, prox_iter=20, bounds=None):
        super().__init__(lam, ndim=ndim, prox_iter=prox_iter, bounds=bounds)
        self.delta = _positive(delta, "delta")

    def _delta(self) -> float:
        return self.delta

    def value(self, x: torch.Tensor) -> float:
        r = self._grad_field(x).square().sum(0).sqrt()
        d = self.delta
        return self.lam * float(torch.where(r <= d, r.square() / (2 * d), r - d / 2).sum())

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        g = self._grad_field(x)
        r = g.square().sum(0).sqrt()
        return -self.lam * divergence(g / torch.clamp(r, min=self.delta))

    def lipschitz(self) -> float:
        return self.lam * 4.0 * (self.ndim or 3) / self.delta


class Box:
    """The indicator of ``lower <= x <= upper`` (None: open side); its prox is the clip."""

    smooth = False

    def __init__(self, lower=None, upper=None):
        from ._checks import check_bounds
        self.bounds = check_bounds((lower, upper))

    def value(self, x: torch.Tensor) -> float:
        lo, hi = self.bounds
        out = (lo is not None and bool((x < lo).any())) or (hi is not None and bool((x > hi).any()))
        return math.inf if out else 0.0

    def prox(self, v: torch.Tensor, t: float = 1.0) -> torch.Tensor:
        return v.clamp(min=self.bounds[0], max=self.bounds[1])


def nonnegativity() -> Box:
    """The indicator of ``x >= 0``."""
    return Box(0.0, None)


# ---------------------------------------------------------- operator norm
_norms: dict = {}
_norms_lock = threading.Lock()


def projector_fingerprint(projector) -> str:
    """A digest of what fixes the operator: grid, detector, beam, options and every view's vectors."""
    check_projector(projector)
    h = hashlib.sha256()
    h.update(repr((type(projector).__name__, getattr(projector, "beam", None), tuple(projector.volume_shape),
                   tuple(getattr(projector, "voxel_spacing", ())), tuple(projector.projection_shape),
                   tuple(getattr(projector, "detector_spacing", ())),
                   sorted((k, repr(v)) for k, v in getattr(projector, "options", {}).items()))).encode())
    traj = getattr(projector, "trajectory", None)
    if traj is not None:
        for name in ("source", "detector_center", "detector_u", "detector_v"):
            t = getattr(traj, name, None)
            if isinstance(t, torch.Tensor):
                h.update(t.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
    else:  # not a ctbench Projector: its identity is all we know
        h.update(str(id(projector)).encode())
    return h.hexdigest()


def operator_norm(projector, *, n_iter: int = 30, dtype=torch.float64, device="cpu") -> float:
    """``||A||`` (largest singular value) by the power method on ``A^T A``; cached per projector geometry.

    The power method approaches the top eigenvalue from below; the estimate is
    raised by 1 % so that steps ``1 / L`` built on it stay safe.
    """
    n_iter = _count(n_iter, "n_iter")
    key = (projector_fingerprint(projector), n_iter)
    with _norms_lock:
        if key in _norms:
            return _norms[key]
    value = math.sqrt(_power_method(projector, dtype, device, n_iter=n_iter))
    with _norms_lock:
        _norms[key] = value
    return value


def _power_method(projector, dtype, device, *, weights=None, n_iter: int = 30) -> float:
    """The top eigenvalue of ``A^T W A`` (times 1.01), from a fixed positive start."""
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        v = (torch.rand(tuple(projector.volume_shape), generator=gen, dtype=torch.float64) + 0.5)
        v = v.to(device=device, dtype=dtype)
        lam = 0.0
        for _ in range(n_iter):
            nv = math.sqrt(float(projector.inner_volume(v, v)))
            if nv == 0:
                return 0.0
            v = v / nv
            Av = projector.project(v)
            if weights is not None:
                Av = weights * Av
            w = projector.backproject(Av)
            lam = float(projector.inner_volume(v, w))
            v = w
        return 1.01 * lam
