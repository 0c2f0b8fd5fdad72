"""Single-material phase retrieval for parallel-beam propagation images (Paganin et al., J. Microsc. 206, 33, 2002).

For a homogeneous object with refractive index ``n = 1 - delta + i beta``
imaged at distance ``z`` behind it, the transport-of-intensity equation
gives the projected thickness ``T`` from one flat-corrected image
``I / I0``::

    mu T = -ln( F^-1[ F[I / I0] / (1 + z delta / mu |k|^2) ] ),   mu = 4 pi beta / lambda

with ``k`` the angular spatial frequency (rad/mm).  Only ``delta / beta``
enters (``z delta / mu = z lambda (delta/beta) / (4 pi)``).  The result,
``mu T``, is a line integral of the attenuation coefficient like ``-ln(I/I0)``,
so the rest of the pipeline is unchanged.  Each image is padded (edge values)
before the Fourier transform so that the low-pass does not wrap one edge into
the other.  For a cone beam, use the distance and pixel size at the object
(``z / M`` and ``pixel / M`` with ``M = SDD / SID``) as an approximation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._arrays import finite_result, finite_stack, int_in_range, positive_number

HC_KEV_MM = 12.398419843320026e-7         # h c in keV mm: lambda [mm] = HC_KEV_MM / E [keV]


def wavelength_mm(energy_kev: float) -> float:
    """X-ray wavelength in mm at ``energy_kev``."""
    return HC_KEV_MM / positive_number(energy_kev, "energy_kev")


def paganin_filter(shape, pixel_size_mm, *, delta_beta: float, energy_kev: float, distance_mm: float) -> np.ndarray:
    """The Fourier-space divisor ``1 + z lambda (delta/beta) / (4 pi) |k|^2`` for images of ``shape`` (rows, cols)."""
    rows, cols = (int(s) for s in shape)
    dv, du = _pitch(pixel_size_mm)
    a = positive_number(distance_mm, "distance_mm") * wavelength_mm(energy_kev) \
        * positive_number(delta_beta, "delta_beta") / (4 * np.pi)
    kv = 2 * np.pi * np.fft.fftfreq(rows, d=dv)
    ku = 2 * np.pi * np.fft.fftfreq(cols, d=du)
    with np.errstate(over="ignore", invalid="ignore"):
        filt = 1.0 + a * (kv[:, None] ** 2 + ku[None, :] ** 2)
    # 1e300-sized parameters overflow a (inf * 0 = NaN at k = 0): refused here, not returned as NaN images
    if not (np.isfinite(a) and np.isfinite(filt).all()):
        raise ValueError(f"the Paganin filter overflows for distance_mm={distance_mm!r}, energy_kev={energy_kev!r}, "
                         f"delta_beta={delta_beta!r} and pixel_size_mm={pixel_size_mm!r}: "
                         "distance x wavelength x delta/beta / pixel^2 must be a finite number")
    return filt


def _pitch(pixel_size_mm) -> tuple[float, float]:
    """(row pitch, column pitch) from a scalar or ``(du, dv)`` as elsewhere in ctbench."""
    if np.ndim(pixel_size_mm) == 0:
        p = positive_number(pixel_size_mm, "pixel_size_mm")
        return p, p
    try:
        du, dv = pixel_size_mm
    except (TypeError, ValueError):
        raise ValueError(f"pixel_size_mm must be a number or (du, dv), got {pixel_size_mm!r}") from None
    return positive_number(dv, "pixel_size_mm[1] (dv)"), positive_number(du, "pixel_size_mm[0] (du)")


@dataclass
class PhaseReport:
    """Values of the filtered transmission that were not positive (clipped before the log), counted."""

    n_values: int = 0
    n_clipped: int = 0

    def to_dict(self) -> dict:
        return {"n_values": self.n_values, "n_clipped": self.n_clipped}


def paganin(transmission, pixel_size_mm, *, delta_beta: float, energy_kev: float, distance_mm: float,
            pad: int | None = None, min_transmission: float = 1e-6, report: PhaseReport | None = None) -> np.ndarray:
    """Line integrals ``mu T`` of ``(view, row, col)`` (or one ``(row, col)``) flat-corrected transmission images.

    ``pixel_size_mm`` is a number or ``(du, dv)``; ``distance_mm`` the
    sample-to-detector distance; ``energy_kev`` the (mean) photon energy;
    ``pad`` the edge padding in pixels on each side (default: half the
    image size, at least 8; at most the larger image side, a wider pad only
    allocates: ``pad=10**6`` asked for 29 TiB).  Transmission must be positive where it is
    measured; filtered values at or below ``min_transmission`` are clipped to
    it and counted in ``report``.
    """
    t = finite_stack(transmission, "transmission")
    if (t <= 0).any():
        raise ValueError(f"transmission has {int((t <= 0).sum())} non-positive values; Paganin retrieval needs "
                         "flat-corrected intensities I/I0 > 0 (flat/dark-correct with clipping first)")
    one = t.ndim == 2
    stack = t[None] if one else t
    rows, cols = stack.shape[1:]
    if pad is None:
        pr, pc = max(8, rows // 2), max(8, cols // 2)
    else:
        pr = pc = int_in_range(pad, "pad", 0, max(8, rows, cols), "pixels: at most the larger image side")
    filt = paganin_filter((rows + 2 * pr, cols + 2 * pc), pixel_size_mm, delta_beta=delta_beta,
                          energy_kev=energy_kev, distance_mm=distance_mm)
    floor = positive_number(min_transmission, "min_transmission")
    out = np.empty(stack.shape, np.float32)
    for i, img in enumerate(stack):
        x = np.pad(img.astype(np.float64), ((pr, pr), (pc, pc)), mode="edge")
        y = np.real(np.fft.ifft2(np.fft.fft2(x) / filt))[pr:pr + rows, pc:pc + cols]
        low = y <= floor
        if report is not None:
            report.n_values += y.size
            report.n_clipped += int(low.sum())
        out[i] = -np.log(np.where(low, floor, y))
    finite_result(out, "Paganin's retrieval", f"check delta_beta={delta_beta!r}, energy_kev={energy_kev!r}, "
                                              f"distance_mm={distance_mm!r}, pixel_size_mm={pixel_size_mm!r}")
    return out[0] if one else out
