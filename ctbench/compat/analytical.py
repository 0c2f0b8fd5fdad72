"""diffct 2.5's weights, filters and weighted backprojections (``diffct.analytical``)."""

from __future__ import annotations

import math

import torch

from ._common import _filter_name

from .weighted import (  # noqa: F401  (diffct.analytical holds them)
    cone_weighted_backproject, fan_weighted_backproject, parallel_weighted_backproject)

__all__ = ["detector_coordinates_1d", "angular_integration_weights", "fan_cosine_weights", "cone_cosine_weights",
           "parker_weights", "ramp_filter_1d", "parallel_weighted_backproject", "fan_weighted_backproject",
           "cone_weighted_backproject"]

# ------------------------------------------------------- weights and filters


def detector_coordinates_1d(num_detectors, detector_spacing, detector_offset=0.0, device=None, dtype=torch.float32):
    """Centres of ``num_detectors`` cells: ``(k - (n - 1)/2) * spacing + offset`` (ctbench's and diffct's)."""
    k = torch.arange(int(num_detectors), device=device, dtype=dtype)
    return (k - 0.5 * (int(num_detectors) - 1)) * detector_spacing + detector_offset


def _scan_period(span: float, step: float):
    """pi or 2 pi when the sorted angles close that circle within about one step (diffct's rule)."""
    tol = max(1e-4, 0.05 * step)
    for period in (math.pi, 2 * math.pi):
        if -tol <= period - span <= 1.5 * step + tol:
            return period
    return None


def angular_integration_weights(angles, redundant_full_scan=True):
    """Per-view arc weights: half the gaps to the neighbours (periodic when the scan closes a
    half or full circle, open trapezoid otherwise), halved on a full turn when
    ``redundant_full_scan`` (each ray measured twice).  Input order is kept."""
    a = angles if angles.dtype in (torch.float32, torch.float64) else angles.float()
    n = a.shape[0]
    if n == 0:
        return torch.zeros_like(a)
    if n == 1:
        return torch.full_like(a, math.pi if redundant_full_scan else 1.0)
    s, order = torch.sort(a)
    gaps = s[1:] - s[:-1]
    step = float(gaps.median().abs())
    span = float(s[-1] - s[0])
    period = _scan_period(span, step)
    end = max(period - span, 0.0) if period is not None else 0.0
    w = torch.empty_like(s)
    w[0] = 0.5 * (gaps[0] + end)
    w[-1] = 0.5 * (gaps[-1] + end)
    if n > 2:
        w[1:-1] = 0.5 * (gaps[:-1] + gaps[1:])
    if redundant_full_scan and period == 2 * math.pi:
        w = 0.5 * w
    out = torch.empty_like(w)
    out[order] = w
    return out


def fan_cosine_weights(num_detectors, detector_spacing, sdd, detector_offset=0.0, device=None, dtype=torch.float32):
    """``sdd / sqrt(sdd^2 + u^2)`` per detector cell (fan-beam pre-weights)."""
    u = detector_coordinates_1d(num_detectors, detector_spacing, detector_offset, device, dtype)
    return sdd / torch.sqrt(sdd * sdd + u * u)


def cone_cosine_weights(det_u, det_v, du, dv, sdd, detector_offset_u=0.0, detector_offset_v=0.0, device=None,
                        dtype=torch.float32):
    """``sdd / sqrt(sdd^2 + u^2 + v^2)`` as a (det_u, det_v) tensor (cone-beam pre-weights)."""
    u = detector_coordinates_1d(det_u, du, detector_offset_u, device, dtype)[:, None]
    v = detector_coordinates_1d(det_v, dv, detector_offset_v, device, dtype)[None, :]
    return sdd / torch.sqrt(sdd * sdd + u * u + v * v)


def parker_weights(angles, num_detectors, detector_spacing, sdd, detector_offset=0.0):
    """Parker's short-scan weights (n_views, num_detectors) for a circular fan scan with
    increasing ``angles`` in this frame (ones for a full turn), with the overscan
    ``delta = max(largest fan angle, (span - pi)/2)``.  ctbench's FDK computes its own from the
    trajectory (:func:`ctbench.solvers.weights.parker_weights`), for either rotation sense."""
    a = angles if angles.dtype in (torch.float32, torch.float64) else angles.float()
    n = a.shape[0]
    u = detector_coordinates_1d(num_detectors, detector_spacing, detector_offset, a.device, a.dtype)
    gamma = torch.atan(u / sdd)[None, :]
    s = torch.sort(a).values
    span = float(s[-1] - s[0])
    step = float((s[1:] - s[:-1]).median().abs()) if n > 1 else 2 * math.pi
    if _scan_period(span, step) == 2 * math.pi:
        return torch.ones((n, int(num_detectors)), device=a.device, dtype=a.dtype)
    delta = max(float(gamma.abs().max()), 0.5 * (span - math.pi))
    beta = (a - a.min())[:, None]
    q = math.pi / 4
    w = torch.ones_like(beta.expand(n, int(num_detectors)))
    w = torch.where(beta < 2 * (delta - gamma), torch.sin(q * beta / (delta - gamma + 1e-12)) ** 2, w)
    w = torch.where(beta > math.pi - 2 * gamma,
                    torch.sin(q * (math.pi + 2 * delta - beta) / (delta + gamma + 1e-12)) ** 2, w)
    return torch.where((beta < 0) | (beta > math.pi + 2 * delta), torch.zeros_like(w), w)


def ramp_filter_1d(sinogram_tensor, dim=-1, sample_spacing=1.0, pad_factor=1, window=None, use_rfft=True):
    """The band-limited ramp filter along ``dim`` with diffct's scaling (an angular-frequency ramp,
    ``2 pi`` times ctbench's :func:`ctbench.solvers.ramp_filter`): the spatial kernel of Kak &
    Slaney (ch. 3, eq. 61), ``h[0] = pi/2``, ``h[k] = -2/(pi k^2)`` for odd ``k``, 0 for even,
    applied by FFT after centred zero-padding to ``pad_factor`` times the length, divided by
    ``sample_spacing``; ``window`` apodises it ("hann", "hamming", "cosine", "shepp-logan")."""
    x = sinogram_tensor
    d = dim % x.ndim
    n = x.shape[d]
    m = max(int(pad_factor or 1), 1) * n
    left = (m - n) // 2
    if m > n:
        pad = [0, 0] * x.ndim
        pad[2 * (x.ndim - 1 - d)] = left
        pad[2 * (x.ndim - 1 - d) + 1] = m - n - left
        x = torch.nn.functional.pad(x, pad)
    lag = torch.arange(m, device=x.device)
    lag = torch.minimum(lag, m - lag)
    h = torch.zeros(m, device=x.device, dtype=x.dtype)
    h[0] = math.pi / 2
    odd = lag % 2 == 1
    h[odd] = -2.0 / (math.pi * lag[odd].to(x.dtype) ** 2)
    f = torch.fft.rfftfreq(m, device=x.device, dtype=x.dtype)
    name = _filter_name(window)
    nf = (2 * f).clamp(max=1.0)
    win = {"ram-lak": torch.ones_like(nf), "hann": 0.5 * (1 + torch.cos(math.pi * nf)),
           "hamming": 0.54 + 0.46 * torch.cos(math.pi * nf), "cosine": torch.cos(0.5 * math.pi * nf),
           "shepp-logan": torch.where(nf > 1e-8, torch.sin(0.5 * math.pi * nf) / (0.5 * math.pi * nf).clamp_min(1e-8),
                                      torch.ones_like(nf))}[name]
    resp = torch.fft.rfft(h).real * win / float(sample_spacing)
    shape = [1] * x.ndim
    shape[d] = resp.shape[0]
    y = torch.fft.irfft(torch.fft.rfft(x, dim=d) * resp.reshape(shape), n=m, dim=d)
    return y.narrow(d, left, n).contiguous() if m > n else y


