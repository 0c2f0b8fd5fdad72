"""Beam-hardening linearisation: a polynomial that maps measured line integrals to ones linear in thickness.

With a polychromatic beam the measured ``p = -ln(I/I0)`` of one material
grows more slowly than its thickness (soft photons are absorbed first): a
reconstruction shows cupping and streaks between dense parts.  For one
dominant material, ``p`` is a monotone function of the thickness ``t``; a
step wedge of that material (known thicknesses, measured line integrals)
gives it.  :func:`fit_linearisation` fits ``mu0 * t = sum_k c_k p^k``
(``k = 1..degree``, no constant: zero thickness stays zero) by least
squares, with ``mu0`` the attenuation the thin steps show (so that thin
parts keep their values and ``c_1 = 1``) unless a target ``mu`` is given;
:func:`linearise` applies coefficients, fitted or given.
"""

from __future__ import annotations

import numpy as np

from ._arrays import finite_stack, int_at_least, positive_number


def _coefficients(c, name: str = "coefficients") -> np.ndarray:
    try:
        a = np.asarray(c, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of numbers [c1, c2, ...] (c_k multiplies p**k)") from None
    if a.size == 0 or not np.isfinite(a).all():
        raise ValueError(f"{name} must be a non-empty list of finite numbers [c1, c2, ...], got {c!r}")
    return a


def fit_linearisation(thickness_mm, line_integrals, degree: int = 3, *, mu: float | None = None) -> np.ndarray:
    """Coefficients ``[c1, ..., c_degree]`` with ``sum_k c_k p^k ~ mu * thickness`` over a step wedge.

    ``thickness_mm`` and ``line_integrals``: one value per step (zero steps
    may be included).  ``mu`` (1/mm) is the attenuation the corrected data
    should show; by default the slope of the fit at ``p = 0`` (thin
    material), which makes ``c1 = 1``.  The fitted map must increase over
    the wedge's range (else the wedge and the degree do not fit together).
    """
    t = np.asarray(thickness_mm, dtype=np.float64).ravel()
    p = np.asarray(line_integrals, dtype=np.float64).ravel()
    deg = int_at_least(degree, "degree", 1)
    if t.size != p.size:
        raise ValueError(f"thickness_mm has {t.size} steps but line_integrals has {p.size}")
    if not (np.isfinite(t).all() and np.isfinite(p).all()):
        raise ValueError("thickness_mm and line_integrals must be finite numbers")
    if (t < 0).any():
        raise ValueError("thickness_mm must not be negative")
    nonzero = t > 0
    if int(nonzero.sum()) < deg:
        raise ValueError(f"a degree-{deg} fit needs at least {deg} steps of non-zero thickness, got {int(nonzero.sum())}")
    if (p[nonzero] <= 0).any():
        raise ValueError("line_integrals must be positive where the thickness is (a wedge attenuates)")
    # least squares of t = sum_k a_k p^k, columns scaled for conditioning
    scale = float(p.max())
    A = np.stack([(p / scale) ** k for k in range(1, deg + 1)], axis=1)
    a, *_ = np.linalg.lstsq(A, t, rcond=None)
    a = a / scale ** np.arange(1, deg + 1)
    if a[0] <= 0:
        raise ValueError("the fitted wedge has no positive slope at zero thickness; check the wedge data")
    target = (1.0 / a[0]) if mu is None else positive_number(mu, "mu")
    c = target * a
    grid = np.linspace(0, p.max(), 256)
    if (np.diff(_poly(grid, c)) <= 0).any():
        raise ValueError(f"the degree-{deg} fit is not increasing over the wedge's range; use a lower degree "
                         "or more steps")
    return c


def _poly(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    out = np.zeros_like(p)
    for ck in c[::-1]:                 # Horner: ((c_d p + c_{d-1}) p + ...) p
        out = (out + ck) * p
    return out


def linearise(images, coefficients) -> np.ndarray:
    """``sum_k c_k p^k`` of line integrals ``p`` (any shape), float32; coefficients ``[c1, c2, ...]``."""
    c = _coefficients(coefficients)
    p = finite_stack(images, "images", ndims=(1, 2, 3))
    out = _poly(p.astype(np.float64), c)
    if not np.isfinite(out).all():
        raise ValueError("the beam-hardening polynomial overflows on these line integrals; check the coefficients")
    return out.astype(np.float32)

