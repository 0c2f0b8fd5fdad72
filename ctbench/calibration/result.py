"""What a calibration returns: the calibrated trajectory, a parameter table and the loss history."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..geometry import Trajectory

__all__ = ["CalibrationResult", "ParameterEstimate"]


@dataclass
class ParameterEstimate:
    """One row of the parameter table.

    ``value`` is None when the parameter is not identifiable (it was held at
    ``start``, not guessed).  Per-view rows give the RMS of the shifts over the
    views in ``value`` and the RMS standard deviation in ``uncertainty``.
    ``identifiability`` in [0, 1]: the fraction of the parameter's effect on the
    data that neither a changed object nor the other parameters explain.
    """

    name: str
    unit: str
    value: float | None
    start: float
    bounds: tuple[float, float]
    uncertainty: float | None
    identifiability: float | None
    status: str                      # "estimated", "at bound", "not identifiable", "not reached" (cancelled)
    meaning: str = ""
    per_view: bool = False

    def to_dict(self) -> dict:
        return {"name": self.name, "unit": self.unit, "value": self.value, "start": self.start,
                "bounds": list(self.bounds), "uncertainty": self.uncertainty,
                "identifiability": self.identifiability, "status": self.status, "per_view": self.per_view,
                "meaning": self.meaning}


def _fmt(v, digits=4):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}g}"


@dataclass
class CalibrationResult:
    trajectory: Trajectory                 # the calibrated geometry (full resolution, the projector's dtype)
    parameters: list[ParameterEstimate]
    shifts: dict                           # per-view shifts (px), lists of n_views
    shift_sigma: dict | None               # their standard deviations (px)
    loss_history: list[float]              # relative misfit after every outer iteration
    history: list[dict]
    volume: torch.Tensor                   # the last reconstruction (grid binned by volume_binning)
    volume_binning: int
    stopped: str                           # "completed", "cancelled" or "callback"
    notes: list[str] = field(default_factory=list)
    final_loss: float = float("nan")       # relative misfit of the final geometry at full resolution
    levels: list = field(default_factory=list)
    correlations: dict = field(default_factory=dict)   # {"a/b": r} between global parameters (linearised)

    def value(self, name: str):
        for p in self.parameters:
            if p.name == name:
                return p.value
        raise KeyError(f"{name!r} was not calibrated; calibrated: {[p.name for p in self.parameters]}")

    def table(self) -> str:
        """The parameter table as aligned text."""
        rows = [("parameter", "unit", "value", "+/- (1 sd)", "identifiability", "status")]
        for p in self.parameters:
            name = f"{p.name} (rms)" if p.per_view else p.name
            rows.append((name, p.unit, _fmt(p.value), _fmt(p.uncertainty, 2), _fmt(p.identifiability, 2),
                         p.status))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    def to_dict(self) -> dict:
        """A JSON-able report (without the volume and the trajectory tensors)."""
        return {"format": "ctbench.calibration-report", "version": 1, "stopped": self.stopped,
                "parameters": [p.to_dict() for p in self.parameters], "shifts_px": self.shifts,
                "shift_sigma_px": self.shift_sigma, "loss_history": self.loss_history,
                "final_loss": self.final_loss, "levels": self.levels, "correlations": self.correlations,
                "notes": self.notes,
                "history": self.history}
