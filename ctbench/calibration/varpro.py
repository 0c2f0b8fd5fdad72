"""The variable-projection (reduced Gauss-Newton) geometry step for the weak global parameters.

With the volume held, a geometry step for a parameter that the object largely
mimics (``axis_tilt``) is tiny: the curvature ``j^T j`` counts the
part of the parameter's signature that the next reconstruction takes back, so
the alternation crawls and stops short.  The step on the reduced problem
``min_p |A(p) x*(p) - y|^2`` (``x*`` the volume for that geometry) uses the
reduced column ``(I - P (P^T P)^+ P^T) j`` instead, for the curvature and the
gradient (the part of the residual that the volume can still fit says nothing
about the geometry), and judges a trial step by the misfit after the volume
has followed it (a few warm-started CGLS iterations), not with the volume held.
The reduction is the identifiability analysis's (:func:`~ctbench.calibration.analysis.reduce_columns`).
It is one joint step with the other parameters (their columns stay as they are); while a parameter of
:data:`VARPRO` is active the whole trial is judged with the volume followed, and that volume is kept.
"""

from __future__ import annotations

import torch

from ..solvers import cgls
from .analysis import reduce_columns

__all__ = ["VARPRO", "varpro_indices", "reduced_step_columns", "followed_volume"]

F64 = torch.float64
# Weak parameters whose step is taken on the reduced problem (an unknown object absorbs most of their signature).
# Not yaw: stepped so on the wide-cone scan of tests/test_selfcal_globals.py it went from 2.381 +/- 0.57 deg to
# 3.563 +/- 1.7 deg (truth 3.0; offset_u 1.265 for 1.3): no closer, and the two grids then disagree by far more.
VARPRO = ("axis_tilt",)


def varpro_indices(active, known_object: bool) -> list[int]:
    """Positions in ``active`` of the parameters stepped on the reduced problem (none with a known object:
    nothing absorbs a geometry change then, and the plain step is the reduced one)."""
    return [] if known_object else [i for i, k in enumerate(active) if k in VARPRO]


def reduced_step_columns(P, x, residual, cols_g, idx):
    """The Jacobian columns with those at ``idx`` reduced, and the reduced gradient entries ``j_red . r``."""
    red = reduce_columns(P, x, [cols_g[i] for i in idx])
    cols = list(cols_g)
    for i, c in zip(idx, red):
        cols[i] = c
    rv = residual.to(F64)
    return cols, [float((c.to(F64) * rv).sum()) for c in red]


def followed_volume(P, y, x, n_inner: int) -> torch.Tensor:
    """The volume after following a geometry: ``n_inner`` CGLS iterations warm-started from ``x``."""
    return cgls(P, y, n_inner, x0=x).volume
