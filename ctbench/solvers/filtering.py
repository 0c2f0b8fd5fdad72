"""The ramp filter of FBP/FDK: physical sample spacing, apodisation windows, zero padding.

The filter is the band-limited ramp of Kak & Slaney (ch. 3): its samples at
spacing ``tau`` (mm) are ``h[0] = 1/(4 tau^2)``, ``h[n] = -1/(n pi tau)^2`` for
odd ``n`` and 0 for even ``n != 0``; the discrete convolution is multiplied
by ``tau``.  Sampling the kernel in space (rather than taking ``|f|`` on the
FFT grid) gets the DC term right, so a flat object keeps its level.  The
convolution runs as an FFT product on rows zero-padded to at least twice
their length, so nothing wraps around.

Windows multiply the kernel's spectrum; ``f`` is the frequency in cycles per
sample (Nyquist 0.5) divided by ``cutoff``, and the spectrum is zero above
``cutoff * Nyquist``:

=============  ===========================
ram-lak        1
shepp-logan    sin(pi f) / (pi f)
cosine         cos(pi f)
hamming        0.54 + 0.46 cos(2 pi f)
hann           0.5 + 0.5 cos(2 pi f)
=============  ===========================

Units: projections in (attenuation x mm) filtered with ``tau`` in mm come out
in attenuation per mm; a backprojection summed with angular weights (rad)
then gives attenuation in the units of the data per mm.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

FILTERS = ("ram-lak", "shepp-logan", "cosine", "hamming", "hann")
_ALIASES = {"ramlak": "ram-lak", "ram_lak": "ram-lak", "ramp": "ram-lak", "shepp_logan": "shepp-logan",
            "shepplogan": "shepp-logan", "hanning": "hann"}


def check_filter(name) -> str:
    if not isinstance(name, str):
        raise ValueError(f"filter must be one of {FILTERS}, got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in FILTERS:
        raise ValueError(f"filter must be one of {FILTERS}, got {name!r}")
    return key


def _check_cutoff(cutoff) -> float:
    try:
        c = float(cutoff)
    except (TypeError, ValueError):
        raise ValueError(f"cutoff must be a number in (0, 1], got {cutoff!r}") from None
    if not (0 < c <= 1):
        raise ValueError(f"cutoff must be in (0, 1] (fraction of the Nyquist frequency), got {cutoff!r}")
    return c


# Upper bound of the padding factor: checked before any work, so that a typo
# (padding=1e7) fails at once instead of after minutes of spectrum set-up.
MAX_PADDING = 64.0


def check_padding(padding) -> float:
    try:
        p = float(padding)
    except (TypeError, ValueError):
        raise ValueError(f"padding must be a number >= 1, got {padding!r}") from None
    if not (p >= 1) or not math.isfinite(p):
        raise ValueError(f"padding must be >= 1 (padded length / row length; 2 avoids wrap-around), got {padding!r}")
    if p > MAX_PADDING:
        raise ValueError(f"padding must be at most {MAX_PADDING:g} (2 already avoids wrap-around; the padded rows "
                         f"take padding times the memory of the data), got {padding!r}")
    return p


def padded_length(n: int, padding: float = 2.0) -> int:
    """FFT length for rows of ``n`` samples: at least ``padding * n`` (and 2n-1 for
    ``padding >= 2``), rounded up to a power of two."""
    want = max(int(math.ceil(padding * n)), 2 * n - 1 if padding >= 2 else n, 2)
    return 1 << (want - 1).bit_length()


def window(name: str, f: torch.Tensor, cutoff: float = 1.0) -> torch.Tensor:
    """Apodisation window at frequencies ``f`` (cycles/sample, 0..0.5)."""
    name = check_filter(name)
    cutoff = _check_cutoff(cutoff)
    g = f / cutoff  # in units of the cut-off; Nyquist = 0.5
    if name == "ram-lak":
        w = torch.ones_like(g)
    elif name == "shepp-logan":
        w = torch.sinc(g)  # sin(pi g)/(pi g)
    elif name == "cosine":
        w = torch.cos(math.pi * g)
    elif name == "hamming":
        w = 0.54 + 0.46 * torch.cos(2 * math.pi * g)
    else:
        w = 0.5 + 0.5 * torch.cos(2 * math.pi * g)
    return torch.where(g <= 0.5 + 1e-12, w, torch.zeros_like(w))


@lru_cache(maxsize=32)
def _spectrum_cached(n_fft: int, spacing: float, name: str, cutoff: float, curvature: float = 0.0) -> torch.Tensor:
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.where(n <= n_fft // 2, n, n - n_fft)  # circular lag
    h = torch.zeros(n_fft, dtype=torch.float64)
    h[0] = 1.0 / (4.0 * spacing * spacing)
    odd = (k.abs() % 2) == 1
    h[odd] = -1.0 / (math.pi * k[odd] * spacing) ** 2
    if curvature:
        # equiangular samples (a cylinder of radius 1/curvature centred on the source): the ramp of the fan
        # angle, (a / sin a)^2 h at the lag's angle a (Kak & Slaney, eq. 3.96); the argument is held below pi
        # for lags no detector row reaches
        a = (k * spacing * curvature).abs().clamp(max=0.95 * math.pi)
        h[odd] = h[odd] * (a[odd] / torch.sin(a[odd])) ** 2
    spec = torch.fft.rfft(h).real * spacing  # the kernel is even: its spectrum is real
    f = torch.arange(spec.shape[0], dtype=torch.float64) / n_fft
    return spec * window(name, f, cutoff)


@lru_cache(maxsize=32)
def _spectrum_for(n_fft: int, spacing: float, name: str, cutoff: float, dtype: torch.dtype,
                  device: torch.device, curvature: float = 0.0) -> torch.Tensor:
    """The spectrum in the data's dtype and device, built once per (length, spacing, window, dtype,
    device, curvature); callers only read it."""
    return _spectrum_cached(n_fft, spacing, name, cutoff, curvature).to(device=device, dtype=dtype)


def _check_curvature(curvature) -> float:
    try:
        c = float(curvature)
    except (TypeError, ValueError):
        raise ValueError(f"curvature must be a number >= 0 (1/mm), got {curvature!r}") from None
    if not (c >= 0 and math.isfinite(c)):
        raise ValueError(f"curvature must be a number >= 0 (1/mm: 1 / the radius of a cylindrical detector), "
                         f"got {curvature!r}")
    return c


def ramp_spectrum(n_fft: int, spacing: float, filter: str = "ram-lak", cutoff: float = 1.0,
                  curvature: float = 0.0) -> torch.Tensor:
    """The filter's rfft spectrum (n_fft//2 + 1,), float64, including the ``spacing`` factor."""
    if not (spacing > 0 and math.isfinite(spacing)):
        raise ValueError(f"spacing must be a positive number of mm, got {spacing!r}")
    return _spectrum_cached(int(n_fft), float(spacing), check_filter(filter), _check_cutoff(cutoff),
                            _check_curvature(curvature)).clone()


def check_oversample(oversample) -> int:
    if isinstance(oversample, bool) or not isinstance(oversample, int) or oversample < 1:
        raise ValueError(f"oversample must be a positive integer, got {oversample!r}")
    return oversample


def ramp_filter(projections: torch.Tensor, spacing: float, *, dim: int = -1, filter: str = "ram-lak",
                cutoff: float = 1.0, padding: float = 2.0, oversample: int = 1, curvature: float = 0.0) -> torch.Tensor:
    """Filter ``projections`` along ``dim`` with the windowed ramp for sample ``spacing`` (mm).

    ``curvature`` (1/mm) > 0: the samples lie on an arc of radius ``1/curvature`` centred on the
    source (a cylindrical detector), ``spacing`` apart along the arc; the kernel is then the ramp of
    the fan angle (Kak & Slaney's equiangular kernel, in units of the arc length).

    Rows are zero-padded to :func:`padded_length` before the FFT.  With
    ``oversample = m > 1`` the filtered rows are returned at ``m`` times the
    sampling rate (``(n - 1) * m + 1`` samples from the first to the last
    input sample, spacing ``spacing / m``) by band-limited interpolation
    (zero-padding the spectrum), so a later linear interpolation blurs less.
    Otherwise the result has the input's shape; dtype and device are kept.
    """
    if not isinstance(projections, torch.Tensor) or not projections.is_floating_point():
        raise TypeError("projections must be a floating-point torch.Tensor")
    padding = check_padding(padding)
    m = check_oversample(oversample)
    dim = dim % projections.ndim if projections.ndim else dim
    n = projections.shape[dim]
    n_fft = padded_length(n, padding)
    if not (spacing > 0 and math.isfinite(spacing)):
        raise ValueError(f"spacing must be a positive number of mm, got {spacing!r}")
    spec = _spectrum_for(n_fft, float(spacing), check_filter(filter), _check_cutoff(cutoff), projections.dtype,
                         projections.device, _check_curvature(curvature))
    if projections.numel() == 0:  # e.g. a distributed rank with zero views: some FFT backends reject empty batches
        shape = list(projections.shape)
        shape[dim] = (n - 1) * m + 1 if m > 1 else n
        return projections.new_zeros(shape)
    # Real FFTs along ``dim`` itself: no transposed copy of the data before or after.
    spec = spec.reshape(-1, *([1] * (projections.ndim - 1 - dim)))
    X = torch.fft.rfft(projections, n=n_fft, dim=dim)
    X *= spec
    if m == 1:
        out = torch.fft.irfft(X, n=n_fft, dim=dim).narrow(dim, 0, n)
    else:
        # Trigonometric interpolation: the spectrum zero-padded to m * n_fft; the
        # Nyquist bin is split between +/- Nyquist, hence halved.
        shape = list(X.shape)
        shape[dim] = m * n_fft // 2 + 1
        Xp = X.new_zeros(shape)
        Xp.narrow(dim, 0, X.shape[dim]).copy_(X)
        Xp.narrow(dim, X.shape[dim] - 1, 1).mul_(0.5)
        out = torch.fft.irfft(Xp, n=m * n_fft, dim=dim).narrow(dim, 0, (n - 1) * m + 1) * m
    return out.contiguous()
