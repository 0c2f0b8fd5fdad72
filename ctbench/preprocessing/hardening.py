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

Both refuse what would silently give a wrong volume: coefficients with
``c1 <= 0`` (all zero included: a zero volume), a polynomial that is not
increasing over the data's range (more material must give a larger line
integral), and a wedge that is not one (a thicker step that attenuates no
more than a thinner one, two steps of one thickness, a fit that misses its
steps by more than ``MAX_FIT_MISFIT`` of the largest thickness).
"""

from __future__ import annotations

import numpy as np

from ._arrays import finite_stack, int_in_range, positive_number

MAX_DEGREE = 8
MAX_FIT_MISFIT = 0.05       # the fit may miss a step by at most 5% of the thickest step


def _coefficients(c, name: str = "coefficients") -> np.ndarray:
    if isinstance(c, (str, bytes)):
        raise ValueError(f"{name} must be a list of numbers [c1, c2, ...] (c_k multiplies p**k), got {c!r:.60}")
    try:
        a = np.asarray(c, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of numbers [c1, c2, ...] (c_k multiplies p**k)") from None
    if a.size == 0 or a.size > MAX_DEGREE or not np.isfinite(a).all():
        raise ValueError(f"{name} must be 1 to {MAX_DEGREE} finite numbers [c1, c2, ...], got {c!r:.200}")
    if a[0] <= 0:
        raise ValueError(f"{name}: c1 (the slope at zero thickness) must be > 0, got {float(a[0])!r}"
                         + (" (all coefficients are zero: every line integral would become 0)" if not a.any() else "")
                         + "; a linearisation keeps thin material's values (c1 = 1 by default)")
    return a


def check_increasing(c: np.ndarray, lo: float, hi: float, name: str = "coefficients") -> None:
    """Refuse coefficients whose polynomial does not increase over line integrals ``[lo, hi]``."""
    c = np.asarray(c, dtype=np.float64)
    grid = np.linspace(min(lo, 0.0), max(hi, 0.0), 1025)
    slope = np.zeros_like(grid)
    for k in range(c.size, 0, -1):                 # d/dp sum_k c_k p^k = sum_k k c_k p^(k-1), by Horner
        slope = slope * grid + k * c[k - 1]
    falling = slope <= 0
    if falling.any():
        at = grid[np.argmax(falling)]
        raise ValueError(f"{name} {c.tolist()} do not give an increasing map over the line integrals "
                         f"[{grid[0]:.4g}, {grid[-1]:.4g}]: the slope is <= 0 from p = {at:.4g} on (more material "
                         "would read as less); use coefficients fitted to a step wedge over this range")


def fit_linearisation(thickness_mm, line_integrals, degree: int = 3, *, mu: float | None = None) -> np.ndarray:
    """Coefficients ``[c1, ..., c_degree]`` with ``sum_k c_k p^k ~ mu * thickness`` over a step wedge.

    ``thickness_mm`` and ``line_integrals``: one value per step (zero steps
    may be included).  ``mu`` (1/mm) is the attenuation the corrected data
    should show; by default the slope of the fit at ``p = 0`` (thin
    material), which makes ``c1 = 1``.  The fitted map must increase over
    the wedge's range (else the wedge and the degree do not fit together).
    """
    try:
        t = np.asarray(thickness_mm, dtype=np.float64).ravel()
        p = np.asarray(line_integrals, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValueError("thickness_mm and line_integrals must be lists of numbers (one per step)") from None
    deg = int_in_range(degree, "degree", 1, MAX_DEGREE, "polynomial degree")
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
    order = np.argsort(t, kind="stable")
    ts, ps = t[order], p[order]
    if (np.diff(ts) <= 0).any():
        dup = ts[1:][np.diff(ts) <= 0][0]
        raise ValueError(f"thickness_mm lists the step {dup:g} mm twice; give each step once (average repeated "
                         "measurements)")
    if (np.diff(ps) <= 0).any():
        i = int(np.argmax(np.diff(ps) <= 0))
        raise ValueError(f"the wedge is not monotone: the {ts[i + 1]:g} mm step attenuates no more than the "
                         f"{ts[i]:g} mm step (line integrals {ps[i + 1]:.4g} <= {ps[i]:.4g}); check the wedge data")
    # least squares of t = sum_k a_k p^k, columns scaled for conditioning
    scale = float(p.max())
    A = np.stack([(p / scale) ** k for k in range(1, deg + 1)], axis=1)
    a, *_ = np.linalg.lstsq(A, t, rcond=None)
    a = a / scale ** np.arange(1, deg + 1)
    if a[0] <= 0:
        raise ValueError("the fitted wedge has no positive slope at zero thickness; check the wedge data")
    misfit = float(np.abs(_poly(p, a) - t).max()) / float(t.max())
    if misfit > MAX_FIT_MISFIT:
        raise ValueError(f"the degree-{deg} fit misses the wedge's steps by up to {100 * misfit:.3g}% of the "
                         f"thickest step (at most {100 * MAX_FIT_MISFIT:g}%): the wedge data do not follow one "
                         "material's hardening curve; check them or raise the degree")
    target = (1.0 / a[0]) if mu is None else positive_number(mu, "mu")
    c = target * a
    try:
        check_increasing(c, 0.0, float(p.max()), f"the degree-{deg} fit's coefficients")
    except ValueError as e:
        raise ValueError(f"{e} (the wedge and the degree do not fit together: use a lower degree or more "
                         "steps)") from None
    return c


def _poly(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    out = np.zeros_like(p)
    for ck in c[::-1]:                 # Horner: ((c_d p + c_{d-1}) p + ...) p
        out = (out + ck) * p
    return out


def linearise(images, coefficients) -> np.ndarray:
    """``sum_k c_k p^k`` of line integrals ``p`` (any shape), float32; coefficients ``[c1, c2, ...]`` with c1 > 0
    whose polynomial increases over the data's range (else ValueError, see the module doc)."""
    c = _coefficients(coefficients)
    p = finite_stack(images, "images", ndims=(1, 2, 3))
    check_increasing(c, float(p.min()), float(p.max()))
    out = _poly(p.astype(np.float64), c)
    if not np.isfinite(out).all():
        raise ValueError("the beam-hardening polynomial overflows on these line integrals; check the coefficients")
    return out.astype(np.float32)

