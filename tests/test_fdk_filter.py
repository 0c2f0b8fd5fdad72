"""The ramp filter's real FFTs along any axis and its cached spectrum, against numpy.

The reference is written independently with numpy: Kak & Slaney's sampled
kernel, its spectrum by ``numpy.fft.rfft``, the window, and the product
taken on the rows moved to the last axis (the way the filter ran before it
filtered along the axis in place), including the band-limited oversampling.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ctbench.solvers import ramp_filter
from ctbench.solvers import filtering
from ctbench.solvers.filtering import padded_length

WINDOWS = {
    "ram-lak": lambda g: np.ones_like(g),
    "shepp-logan": lambda g: np.sinc(g),
    "hann": lambda g: 0.5 + 0.5 * np.cos(2 * np.pi * g),
}


def _numpy_filter(x: np.ndarray, tau: float, axis: int, name: str, cutoff: float, padding: float, m: int):
    n = x.shape[axis]
    n_fft = padded_length(n, padding)
    lag = np.arange(n_fft)
    lag = np.where(lag <= n_fft // 2, lag, lag - n_fft)
    h = np.zeros(n_fft)
    h[0] = 1 / (4 * tau * tau)
    odd = np.abs(lag) % 2 == 1
    h[odd] = -1 / (np.pi * lag[odd] * tau) ** 2
    spec = np.fft.rfft(h).real * tau
    g = np.arange(spec.size) / n_fft / cutoff
    spec = spec * np.where(g <= 0.5 + 1e-12, WINDOWS[name](g), 0.0)
    rows = np.moveaxis(x, axis, -1)
    X = np.fft.rfft(rows, n=n_fft, axis=-1) * spec
    if m == 1:
        out = np.fft.irfft(X, n=n_fft, axis=-1)[..., :n]
    else:
        Xp = np.zeros((*X.shape[:-1], m * n_fft // 2 + 1), dtype=complex)
        Xp[..., :X.shape[-1]] = X
        Xp[..., X.shape[-1] - 1] *= 0.5
        out = np.fft.irfft(Xp, n=m * n_fft, axis=-1)[..., :(n - 1) * m + 1] * m
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("dim", [0, 1, -2, -1])
@pytest.mark.parametrize("name,cutoff,padding,m", [("ram-lak", 1.0, 2.0, 1), ("shepp-logan", 0.8, 3.0, 1),
                                                   ("hann", 1.0, 2.0, 2), ("ram-lak", 1.0, 1.0, 3)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_filter_along_any_axis_equals_numpy(dim, name, cutoff, padding, m, dtype):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 23, 9, generator=g, dtype=torch.float64)
    got = ramp_filter(x.to(dtype), 0.9, dim=dim, filter=name, cutoff=cutoff, padding=padding, oversample=m)
    want = _numpy_filter(x.numpy(), 0.9, dim % 3, name, cutoff, padding, m)
    assert got.dtype == dtype and got.is_contiguous() and tuple(got.shape) == want.shape
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=tol * np.abs(want).max())


def test_spectrum_is_built_once_per_key_and_not_changed_by_use():
    x = torch.randn(3, 40, 7, dtype=torch.float32)
    filtering._spectrum_for.cache_clear()
    first = ramp_filter(x, 1.1, dim=1, filter="cosine")
    info = filtering._spectrum_for.cache_info()
    again = ramp_filter(x, 1.1, dim=1, filter="cosine")
    assert filtering._spectrum_for.cache_info().hits == info.hits + 1
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    # another dtype is another entry; the cached float64 spectrum is what ramp_spectrum returns
    ramp_filter(x.double(), 1.1, dim=1, filter="cosine")
    assert filtering._spectrum_for.cache_info().misses == info.misses + 1
    n_fft = padded_length(40, 2.0)
    cached = filtering._spectrum_for(n_fft, 1.1, "cosine", 1.0, torch.float64, torch.device("cpu"))
    torch.testing.assert_close(cached, filtering.ramp_spectrum(n_fft, 1.1, "cosine"), rtol=0, atol=0)


def test_filter_keeps_gradients_and_empty_batches():
    x = torch.randn(4, 16, 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: ramp_filter(t, 1.0, dim=1, filter="hann", oversample=2), (x,))
    empty = ramp_filter(torch.zeros(0, 16, 3), 1.0, dim=1, oversample=2)
    assert empty.shape == (0, 31, 3)


def test_filter_bad_spacing_is_a_clear_error():
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="spacing"):
            ramp_filter(torch.ones(2, 8), bad)


def test_cosine_weights_of_a_view_range_are_that_range_of_the_whole():
    from ctbench import Projector, circular_trajectory_3d
    from ctbench.solvers.weights import cosine_weights, orbit_of

    p = Projector(circular_trajectory_3d(12, 50.0, 90.0, detector_offset=(1.2, -0.4)), (6, 8, 8), (9, 7),
                  detector_spacing=1.5)
    orbit = orbit_of(p, require="circular", who="test")
    whole = cosine_weights(orbit)
    assert whole.shape == (12, 9, 7) and float(whole.max()) <= 1.0 and float(whole.min()) > 0.9
    # independent: Dsd / distance from the source to each pixel centre
    s, c = p.trajectory.source[3].double(), p.trajectory.detector_center[3].double()
    u, v = p.trajectory.detector_u[3].double() * 1.5, p.trajectory.detector_v[3].double() * 1.5
    n = torch.linalg.cross(u, v)
    n = n / n.norm()
    dsd = float((c - s) @ n)
    i, j = 2, 5
    pix = c + (i - 4) * u + (j - 3) * v
    assert float(whole[3, i, j]) == pytest.approx(dsd / float((pix - s).norm()), rel=1e-12)
    for k0, k1 in [(0, 12), (3, 7), (11, 12), (5, 5)]:
        torch.testing.assert_close(cosine_weights(orbit, (k0, k1)), whole[k0:k1], rtol=0, atol=0)
