"""Orthogonal Daubechies wavelets and a periodised 2D discrete wavelet transform (numpy only).

The filters come from the spectral factorisation of Daubechies' polynomial
(minimum phase: the classic ``dbN``, ``2N`` taps, ``N`` vanishing moments).
The periodised transform of an even-length signal is an orthogonal matrix,
so the inverse is its transpose and reconstruction is exact to round-off.
Used by the wavelet-Fourier ring filter (:mod:`.rings_wavelet`).
"""

from __future__ import annotations

from functools import lru_cache
from math import comb

import numpy as np


@lru_cache(maxsize=None)
def daubechies(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Low-pass and high-pass analysis filters ``(h, g)`` of ``dbN`` (``2n`` taps, ``sum(h) = sqrt(2)``)."""
    if isinstance(n, bool) or int(n) != n or not 1 <= n <= 12:
        raise ValueError(f"Daubechies order must be an integer in 1..12 (db1 = Haar), got {n!r}")
    n = int(n)
    # |H(w)|^2 = cos^2n(w/2) P(sin^2(w/2)) with P(y) = sum_k C(n-1+k, k) y^k; each root y of P gives a
    # pair z, 1/z of z + 1/z = 2 - 4y: the roots inside the unit circle make the minimum-phase filter.
    zeros = [-1.0] * n
    if n > 1:
        y = np.roots([comb(n - 1 + k, k) for k in range(n - 1, -1, -1)])
        for yi in y:
            b = 2 - 4 * yi
            z = np.roots([1, -b, 1])
            zeros.append(z[np.argmin(np.abs(z))])
    h = np.real(np.poly(zeros))
    h = h * (np.sqrt(2) / h.sum())
    g = h[::-1] * (-1.0) ** np.arange(h.size)          # quadrature mirror
    h.setflags(write=False)
    g.setflags(write=False)
    return h, g


def _analyse(x: np.ndarray, f: np.ndarray, axis: int) -> np.ndarray:
    # a[m] = sum_k f[k] x[(2m + k) mod N]
    x = np.moveaxis(x, axis, -1)
    out = np.zeros(x.shape[:-1] + (x.shape[-1] // 2,), dtype=np.float64)
    for k, c in enumerate(f):
        out += c * np.roll(x, -k, axis=-1)[..., ::2]
    return np.moveaxis(out, -1, axis)


def _synthesise(a: np.ndarray, f: np.ndarray, axis: int) -> np.ndarray:
    # the transpose of _analyse: x[(2m + k) mod N] += f[k] a[m]
    a = np.moveaxis(a, axis, -1)
    up = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=np.float64)
    up[..., ::2] = a
    out = np.zeros_like(up)
    for k, c in enumerate(f):
        out += c * np.roll(up, k, axis=-1)
    return np.moveaxis(out, -1, axis)


def dwt2(x, n: int):
    """One level of the periodised 2D DWT of ``x`` over its first and last axes (even sizes there):
    ``(approx, (vertical, horizontal, diagonal))``; middle axes are a batch (rows of a stack).

    "vertical" details are high-pass along the last axis and low-pass along
    the first: they hold features that are constant along the first axis,
    such as the stripes of a ``(view, col)`` sinogram.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 2 or x.shape[0] % 2 or x.shape[-1] % 2:
        raise ValueError(f"dwt2 needs an array of even sizes along its first and last axes, got shape {x.shape}")
    h, g = daubechies(n)
    lo, hi = _analyse(x, h, -1), _analyse(x, g, -1)
    return _analyse(lo, h, 0), (_analyse(hi, h, 0), _analyse(lo, g, 0), _analyse(hi, g, 0))


def idwt2(approx, details, n: int) -> np.ndarray:
    """Inverse of :func:`dwt2`."""
    h, g = daubechies(n)
    vert, horiz, diag = details
    lo = _synthesise(approx, h, 0) + _synthesise(horiz, g, 0)
    hi = _synthesise(vert, h, 0) + _synthesise(diag, g, 0)
    return _synthesise(lo, h, -1) + _synthesise(hi, g, -1)
