"""When a Levenberg-Marquardt trial step is better: judged against the loss's own rounding.

The calibration's loss ``|A x - y|^2 / |y|^2`` is summed in float64, but every projected value it sums comes
from a float32 kernel, rounded to within a few ulps of its exact sum.  That moves the loss by up to about
``2 eps sum |r_i| |p_i| / |y|^2`` (:func:`rounding_scale`), and how it moves changes with the geometry and
with the kernel's order of additions: two forward paths that agree to 1e-6 relative gave losses 3e-10 apart
where the scale was 4e-9 (docs/INTERNALS.md, "Determinism and rounding").  Near a minimum a trial
step changes the loss by less than that, so a strict ``trial < current`` is a coin toss on the last float32
bits: a "rejected" step raised the damping five-fold per try, which carried over to the next parameter stage
and level, and the solver stopped moving a parameter that had just joined (a known-object ``sdd`` stayed at
exactly 0 with one forward path and not with another).

:func:`judge` therefore tells three cases apart: clearly better (accept, lower the damping), clearly
worse or short of what the Gauss-Newton model promised (reject, raise it), and level: the loss cannot tell
the two points apart and the model predicts no measurable gain either, so the model's step is taken
(it is the best information there is at that scale) and the damping stays.
"""

from __future__ import annotations

import math

import torch

__all__ = ["BETTER", "LEVEL", "WORSE", "MU0", "judge", "predicted_decrease", "rounding_scale"]

F64 = torch.float64
BETTER, LEVEL, WORSE = "better", "level", "worse"
MU0 = 1e-3   # the damping every new problem (a parameter stage, a level) starts from


def rounding_scale(p: torch.Tensor, r: torch.Tensor, y_norm2: float) -> float:
    """The size of the rounding error in ``|r|^2 / y_norm2`` for residuals ``r = p - y`` of projections ``p``,
    each within about ``eps |p_i|`` of its exact value (``eps`` of p's dtype: float64 projections give a scale
    2^29 times smaller than float32 ones)."""
    if not p.is_floating_point():
        raise TypeError(f"p must be a floating-point tensor (projections), got {p.dtype}")
    if y_norm2 <= 0:
        raise ValueError(f"y_norm2 must be positive (the data's squared norm), got {y_norm2!r}")
    eps = torch.finfo(p.dtype).eps
    return 2.0 * eps * float((r.to(F64).abs() * p.to(F64).abs()).sum()) / y_norm2


def predicted_decrease(grad: torch.Tensor, H: torch.Tensor, delta: torch.Tensor) -> float:
    """What the quadratic model ``0.5 |r + J d|^2`` (gradient ``grad = J^T r``, curvature ``H``) promises a step
    ``delta`` takes off ``0.5 |r|^2``: ``-(grad . d + 0.5 d^T H d)``."""
    return float(-(grad @ delta + 0.5 * delta @ (H @ delta)))


def judge(current: float, trial: float, predicted: float, tolerance: float) -> str:
    """:data:`BETTER`, :data:`LEVEL` or :data:`WORSE` for a trial loss against the current one.

    ``tolerance`` is the rounding of the two losses together (:func:`rounding_scale` of each, summed);
    ``predicted`` the model's decrease in the same units.  A trial whose loss or predicted gain is not finite
    (a step into a geometry the projector cannot trace) is worse."""
    if not math.isfinite(current):
        raise ValueError(f"current must be a finite loss, got {current!r}")
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    if not (math.isfinite(trial) and math.isfinite(predicted)):
        return WORSE
    if trial < current - tolerance:
        return BETTER
    if trial <= current + tolerance and predicted <= tolerance:
        return LEVEL
    return WORSE
