"""Ring (stripe) removal by combined wavelet and Fourier filtering (after Münch et al., Opt. Express 17, 8567, 2009).

In a ``(view, col)`` sinogram a stripe is constant along the views and
narrow along u.  A 2D wavelet decomposition gathers it, level by level, in
the *vertical* detail coefficients (high-pass across columns, low-pass over
views); there, a Fourier transform along the views puts it at the lowest
view frequencies, which a Gaussian notch ``1 - exp(-k^2 / (2 sigma^2))``
damps.  Recombining the levels gives the sinogram without the stripes.  The
wavelets are the Daubechies filters of :mod:`.wavelets`; the sinogram is
padded by mirroring so that the periodised transform sees no jump at its
edges.  Each detector row is its own sinogram.
"""

from __future__ import annotations

import numpy as np

from ._arrays import finite_result, finite_stack, int_in_range, positive_number
from .wavelets import daubechies, dwt2, idwt2


def _damp_sinograms(s: np.ndarray, level: int, order: int, sigma: float) -> np.ndarray:
    """``(view, rows, col)`` block, each row its own sinogram."""
    n_views, _, n_cols = s.shape
    step = 2 ** level
    taps = daubechies(order)[0].size
    margin = min(n_cols, taps * 2 ** (level - 1))                # mirror enough columns to hide the wrap-around
    pv = (-n_views) % step
    pc = (-(n_cols + 2 * margin)) % step
    x = np.pad(s.astype(np.float64), ((0, pv), (0, 0), (margin, margin + pc)), mode="symmetric")
    details = []
    for _ in range(level):
        x, d = dwt2(x, order)
        vert = np.fft.fft(d[0], axis=0)
        k = np.fft.fftfreq(vert.shape[0]) * vert.shape[0]        # view frequency in cycles per turn
        # (k / sigma) first: sigma ** 2 underflows for sigma = 1e-200 (0/0 = NaN) and overflows for 1e200
        with np.errstate(over="ignore"):      # (k / sigma)^2 = inf is the notch's limit, exp(-inf) = 0
            vert *= (1.0 - np.exp(-0.5 * np.square(k / sigma)))[:, None, None]
        details.append((np.real(np.fft.ifft(vert, axis=0)), d[1], d[2]))
    for d in reversed(details):
        x = idwt2(x, d, order)
    return x[:n_views, :, margin:margin + n_cols]


def remove_stripes_wavelet(images, level: int = 3, sigma: float = 1.0, wavelet: str = "db5") -> np.ndarray:
    """Stripe-corrected copy of ``(view, row, col)`` line integrals (or one ``(view, col)`` sinogram).

    ``level``: wavelet levels (wider stripes need more; ``2**level`` must
    not exceed the number of views or columns); ``sigma``: width of the
    Gaussian notch in view-frequency bins (larger removes more, and more of
    the object's slowly varying content); ``wavelet``: ``"db1"`` (Haar) to
    ``"db12"``.
    """
    p = finite_stack(images, "images")
    lev = int_in_range(level, "level", 1, 30, "wavelet levels")
    sig = positive_number(sigma, "sigma")
    if not isinstance(wavelet, str) or not wavelet.startswith("db") or not wavelet[2:].isdigit():
        raise ValueError(f"wavelet must be a Daubechies name 'db1' .. 'db12', got {wavelet!r}")
    order = int(wavelet[2:])
    daubechies(order)                                            # checks the order
    one = p.ndim == 2
    stack = p[:, None, :] if one else p
    n_views, n_rows, n_cols = stack.shape
    if 2 ** lev > min(n_views, n_cols):
        raise ValueError(f"level {lev} needs at least {2 ** lev} views and columns, "
                         f"the data has {n_views} views of {n_cols} columns")
    out = np.empty_like(stack)
    block = max(1, int(2 ** 24 // max(1, n_views * n_cols)))     # rows per batch: ~128 MiB of float64 each
    for r in range(0, n_rows, block):
        out[:, r:r + block, :] = _damp_sinograms(stack[:, r:r + block, :], lev, order, sig)
    finite_result(out, "remove_stripes_wavelet's result", f"level={lev}, sigma={sig!r}; use a sigma of order 1")
    return out[:, 0, :] if one else out
