"""The recon config's correction keys (``preprocess.zingers``, ``rings``, ``phase``, ``beam_hardening``) and
the steps of :func:`ctbench.pipeline.steps.prepare` that apply them.

Kept apart from the pipeline so that each correction's parameters are
validated in one place and the pipeline only calls three functions:
:func:`clean_outliers` (on transmission, or on line integrals for scans
stored that way, before binning), :func:`to_line_integrals` (``-log`` or
Paganin) and :func:`correct_line_integrals` (beam hardening, then rings).
docs/CORRECTIONS.md describes the keys.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Upper bounds of the keys (issue 47): beyond them a key asks for an allocation or a run time out of all
# proportion (zingers.size 10^5: a 9 GiB mask; phase.pad 10^6: 29 TiB), never for a better correction.
# The library functions bound the same values against the data's own sizes.
MAX_ZINGER_SIZE = 31
MAX_SORTING_SIZE = 1001
MAX_PHASE_PAD = 16384
MAX_WEDGE_STEPS = 1000
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ZingerConfig(_Model):
    """Outliers: values further than ``threshold`` from their ``size x size`` median (transmission units)."""

    threshold: float = Field(..., gt=0, allow_inf_nan=False)
    size: int = Field(3, ge=3, le=MAX_ZINGER_SIZE, strict=True)
    sign: Literal["bright", "dark", "both"] = "bright"      # as seen in transmission: gamma hits are bright


class SortingRings(_Model):
    method: Literal["sorting"]
    size: int = Field(21, ge=3, le=MAX_SORTING_SIZE, strict=True,
                      description="median width across columns of the sorted sinogram (at most the detector width)")


class WaveletRings(_Model):
    method: Literal["wavelet"]
    level: int = Field(3, ge=1, le=12, strict=True)
    sigma: float = Field(1.0, gt=0, le=1e6, allow_inf_nan=False)
    wavelet: str = "db5"

    @field_validator("wavelet")
    @classmethod
    def _db(cls, v):
        if not (v.startswith("db") and v[2:].isdigit() and 1 <= int(v[2:]) <= 12):
            raise ValueError("wavelet must be 'db1' .. 'db12'")
        return v


class PaganinConfig(_Model):
    """Single-material phase retrieval (parallel beam; for a cone beam give the object-plane values)."""

    method: Literal["paganin"] = "paganin"
    # Physical ranges, wide: delta/beta of light elements to heavy ones, soft X-rays to gamma, a film's
    # distance to a beamline's; a 1e300 value overflows the filter and gave NaN images.
    delta_beta: float = Field(..., gt=0, le=1e8, allow_inf_nan=False)
    energy_kev: float = Field(..., ge=0.1, le=1e4, allow_inf_nan=False)
    distance_mm: float = Field(..., gt=0, le=1e6, allow_inf_nan=False)
    pixel_size_mm: Optional[tuple[float, float]] = None      # (du, dv); null = the detector pitch after binning
    pad: Optional[int] = Field(None, ge=0, le=MAX_PHASE_PAD, strict=True)

    @field_validator("pixel_size_mm")
    @classmethod
    def _pitch(cls, v):
        if v is not None and not all(np.isfinite(x) and 1e-9 <= x <= 1e3 for x in v):
            raise ValueError("pixel_size_mm must be two finite numbers in [1e-9, 1000] mm (du, dv)")
        return v


class HardeningConfig(_Model):
    """Beam-hardening linearisation: given ``coefficients`` [c1, c2, ...] or a step wedge to fit them from."""

    coefficients: Optional[list[Finite]] = Field(None, max_length=8)
    wedge_thickness_mm: Optional[list[Finite]] = Field(None, max_length=MAX_WEDGE_STEPS)
    wedge_line_integrals: Optional[list[Finite]] = Field(None, max_length=MAX_WEDGE_STEPS)
    degree: int = Field(3, ge=1, le=8, strict=True)
    mu: Optional[float] = Field(None, gt=0, le=1e6, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_source(self):
        wedge = self.wedge_thickness_mm is not None or self.wedge_line_integrals is not None
        if (self.coefficients is None) == (not wedge):
            raise ValueError("give either coefficients or wedge_thickness_mm with wedge_line_integrals")
        if wedge and (self.wedge_thickness_mm is None or self.wedge_line_integrals is None):
            raise ValueError("a step wedge needs both wedge_thickness_mm and wedge_line_integrals")
        if self.coefficients is not None:
            from ..preprocessing.hardening import _coefficients
            _coefficients(self.coefficients)        # non-empty, finite, c1 > 0 (all zero refused)
        if wedge:
            # the wedge is fitted (and refused with its reason) here, when the config is read, not mid-run
            self.resolved()
        return self

    def resolved(self) -> list[float]:
        from ..preprocessing import fit_linearisation

        if self.coefficients is not None:
            return list(self.coefficients)
        return fit_linearisation(self.wedge_thickness_mm, self.wedge_line_integrals, self.degree, mu=self.mu).tolist()


RingsConfig = Union[SortingRings, WaveletRings]


class CorrectionKeys(_Model):
    """The four keys as the pipeline's PreprocessConfig holds them (mixed into it)."""

    zingers: Optional[ZingerConfig] = None
    rings: Optional[RingsConfig] = Field(None, discriminator="method")
    phase: Optional[PaganinConfig] = None
    beam_hardening: Optional[HardeningConfig] = None


# ------------------------------------------------------------------ the steps
def clean_outliers(data: np.ndarray, pre, report: dict, *, line_integrals: bool = False) -> np.ndarray:
    """Zinger removal on transmission (or on line integrals, where bright hits are dips); counts in ``report``."""
    z = pre.zingers
    if z is None:
        return data
    from ..preprocessing import OutlierReport, remove_outliers

    sign = z.sign
    if line_integrals:
        sign = {"bright": "dark", "dark": "bright", "both": "both"}[sign]
    rep = OutlierReport(**report.get("zingers", {}))
    out = remove_outliers(data, z.threshold, z.size, sign=sign, report=rep)
    report["zingers"] = {k: v for k, v in rep.to_dict().items() if k != "replaced_fraction"}
    return out


def to_line_integrals(transmission: np.ndarray, pre, pitch, report: dict) -> np.ndarray:
    """``-log`` of the transmission, or Paganin's retrieval when ``pre.phase`` is set."""
    from ..preprocessing import minus_log

    if pre.phase is None:
        return minus_log(transmission)
    from ..preprocessing import PhaseReport, paganin

    ph = pre.phase
    rep = PhaseReport()
    out = paganin(transmission, ph.pixel_size_mm or tuple(pitch), delta_beta=ph.delta_beta,
                  energy_kev=ph.energy_kev, distance_mm=ph.distance_mm, pad=ph.pad,
                  min_transmission=pre.min_transmission, report=rep)
    report["phase"] = {"method": "paganin", **rep.to_dict()}
    return out


def correct_line_integrals(images: np.ndarray, pre, report: dict) -> np.ndarray:
    """Beam-hardening linearisation, then the ring method of ``pre.rings``."""
    from ..preprocessing import linearise, remove_stripes_sorting, remove_stripes_wavelet

    if pre.beam_hardening is not None:
        c = pre.beam_hardening.resolved()
        images = linearise(images, c)
        report["beam_hardening"] = {"coefficients": c}
    r = pre.rings
    if r is not None:
        if r.method == "sorting":
            images = remove_stripes_sorting(images, r.size)
        else:
            images = remove_stripes_wavelet(images, r.level, r.sigma, r.wavelet)
        report["rings"] = r.model_dump()
    return images
