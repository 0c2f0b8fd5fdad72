"""Image-quality numbers for comparing reconstructions (numpy only, no Qt).

Every metric compares an ``image`` with a ``reference`` of the same shape,
optionally inside a boolean ``mask`` (e.g. the support of the phantom, or a
cylinder that every view sees), so that empty corners do not dilute the
figures.  Used by the comparison panel of the napari workbench and usable
from scripts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.ndimage import uniform_filter


def _pair(image, reference, mask=None):
    a = np.asarray(image, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"image has shape {a.shape} but the reference has {b.shape}; compare results on the same grid")
    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        if m.shape != a.shape:
            raise ValueError(f"mask has shape {m.shape} but the images have {a.shape}")
        if not m.any():
            raise ValueError("mask selects no voxel")
    else:
        m = None
    return a, b, m


def rmse(image, reference, mask=None) -> float:
    """Root-mean-square difference (inside ``mask``)."""
    a, b, m = _pair(image, reference, mask)
    d = (a - b) if m is None else (a - b)[m]
    return float(np.sqrt(np.mean(d * d)))


def data_range(reference, mask=None) -> float:
    """Max minus min of the reference (inside ``mask``): the PSNR/SSIM peak."""
    b = np.asarray(reference, dtype=np.float64)
    v = b if mask is None else b[np.asarray(mask, dtype=bool)]
    r = float(v.max() - v.min())
    if r <= 0:
        raise ValueError("the reference is constant; PSNR and SSIM need a reference with contrast")
    return r


def psnr(image, reference, mask=None, *, peak: float | None = None) -> float:
    """Peak signal-to-noise ratio in dB; ``peak`` defaults to the reference's range. inf for identical images."""
    e = rmse(image, reference, mask)
    p = data_range(reference, mask) if peak is None else float(peak)
    return float("inf") if e == 0 else float(20 * np.log10(p / e))


def ssim(image, reference, mask=None, *, peak: float | None = None, window: int = 7) -> float:
    """Mean structural similarity (Wang et al. 2004) with a uniform ``window``, averaged inside ``mask``.

    Same definition as ``skimage.metrics.structural_similarity`` with its
    defaults (K1=0.01, K2=0.03, sample covariance), for 2D or 3D images.
    """
    a, b, m = _pair(image, reference, mask)
    if min(a.shape) < window:
        raise ValueError(f"SSIM needs at least {window} pixels along every axis; the image is {a.shape}")
    L = data_range(reference, mask) if peak is None else float(peak)
    c1, c2 = (0.01 * L) ** 2, (0.03 * L) ** 2
    n = window ** a.ndim
    cov = n / (n - 1)

    def mean(x):
        return uniform_filter(x, size=window, mode="reflect")

    ma, mb = mean(a), mean(b)
    va = cov * (mean(a * a) - ma * ma)
    vb = cov * (mean(b * b) - mb * mb)
    vab = cov * (mean(a * b) - ma * mb)
    s = ((2 * ma * mb + c1) * (2 * vab + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))
    # Like skimage, drop the border where the window leaves the image.
    pad = (window - 1) // 2
    inner = tuple(slice(pad, n_ - pad) for n_ in a.shape)
    if m is None:
        return float(s[inner].mean())
    mi = m[inner]
    if not mi.any():
        raise ValueError("the mask selects only border voxels, where SSIM is not defined")
    return float(s[inner][mi].mean())


@dataclass(frozen=True)
class Metrics:
    rmse: float
    psnr: float
    ssim: float
    n_voxels: int

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        return f"RMSE {self.rmse:.3g}, PSNR {self.psnr:.2f} dB, SSIM {self.ssim:.3f}"


def compare(image, reference, mask=None) -> Metrics:
    """RMSE, PSNR and SSIM of ``image`` against ``reference`` (inside ``mask``), peak = the reference's range."""
    a, b, m = _pair(image, reference, mask)
    peak = data_range(b, m)
    n = int(a.size if m is None else m.sum())
    return Metrics(rmse(a, b, m), psnr(a, b, m, peak=peak), ssim(a, b, m, peak=peak), n)


def support_mask(reference, fraction: float = 0.0) -> np.ndarray:
    """Voxels of the reference above ``fraction`` of its range above its minimum (its support, for phantoms)."""
    b = np.asarray(reference, dtype=np.float64)
    lo, hi = float(b.min()), float(b.max())
    return b > lo + fraction * (hi - lo)


def cylinder_mask(shape, radius_fraction: float = 1.0) -> np.ndarray:
    """The inscribed cylinder (about the first axis) of a (z, y, x) or (y, x) grid, scaled by ``radius_fraction``."""
    shape = tuple(int(s) for s in shape)
    h, w = shape[-2:]
    y = np.arange(h) - (h - 1) / 2
    x = np.arange(w) - (w - 1) / 2
    r = min(h, w) / 2 * radius_fraction
    disc = (y[:, None] ** 2 + x[None, :] ** 2) <= r * r
    return np.broadcast_to(disc, shape).copy()


def line_profile(image, start, end, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Values of a 2D ``image`` along the segment start -> end (pixel (row, col)), bilinear; (distance, values)."""
    from scipy.ndimage import map_coordinates

    img = np.asarray(image, dtype=np.float64)
    if img.ndim != 2:
        raise ValueError(f"a line profile needs a 2D image, got {img.ndim} dimensions")
    p0, p1 = np.asarray(start, float), np.asarray(end, float)
    length = float(np.linalg.norm(p1 - p0))
    n = int(n or max(2, round(length) + 1))
    t = np.linspace(0.0, 1.0, n)
    pts = p0[:, None] + (p1 - p0)[:, None] * t[None, :]
    return t * length, map_coordinates(img, pts, order=1, mode="nearest")


def histogram(image, bins: int = 64, value_range=None, mask=None) -> tuple[np.ndarray, np.ndarray]:
    """Counts and bin edges of the finite values (inside ``mask``)."""
    a = np.asarray(image, dtype=np.float64)
    if mask is not None:
        a = a[np.asarray(mask, dtype=bool)]
    a = a[np.isfinite(a)]
    return np.histogram(a, bins=bins, range=value_range)


def percentile_window(data, lo: float = 0.5, hi: float = 99.5, max_samples: int = 200_000) -> tuple[float, float]:
    """Contrast limits from percentiles of the finite values (a few hot voxels do not wash out the image)."""
    a = np.asarray(data)
    finite = a[np.isfinite(a)]
    if finite.size == 0:
        return (0.0, 1.0)
    sample = finite.ravel()[:: max(1, finite.size // max_samples)]
    a_lo, a_hi = (float(x) for x in np.percentile(sample, [lo, hi]))
    if a_hi <= a_lo:
        a_hi = a_lo + max(abs(a_lo) * 1e-6, 1e-12)
    return a_lo, a_hi
