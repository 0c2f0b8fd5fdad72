"""A scan geometry's alignment in the numbers a calibration talks about, measured from its trajectory.

A calibration reports *changes* relative to the geometry it started from (``offset_u`` 0.09 px on a
geometry whose centre was already found).  To compare geometries (nominal, calibrated, exact) they are
measured here in the scan's own frame instead:

- ``offset_u`` / ``offset_v`` [px]: where the detector centre sits relative to the ray through the rotation
  axis (cone beam: the ray from the source through the axis at the source's height; parallel beam: the ray
  through the origin), along the detector's own u and v axes, averaged over the views;
- ``roll`` [deg]: the detector's in-plane rotation, the angle of its u axis out of the plane normal to the
  rotation axis (z), averaged over the views.

``exact_trajectory`` builds the geometry a scan's ``truth.json`` describes (ctbench's simulated
self-calibration sample writes one) on top of a geometry measured this way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..geometry import Trajectory

ALIGNMENT_NAMES = ("offset_u", "offset_v", "roll")
UNITS = {"offset_u": "px", "offset_v": "px", "roll": "deg"}


@dataclass(frozen=True)
class Alignment:
    """Detector offsets (px) and roll (degrees) of a trajectory, in the scan's frame."""

    offset_u: float
    offset_v: float
    roll: float

    def as_dict(self) -> dict:
        return {"offset_u": self.offset_u, "offset_v": self.offset_v, "roll": self.roll}


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t / t.norm(dim=1, keepdim=True).clamp_min(1e-300)


def alignment_of(trajectory: Trajectory, pitch) -> Alignment:
    """Measure the detector offsets and roll of ``trajectory`` (pitch ``(du, dv)`` in mm, full resolution)."""
    du, dv = float(pitch[0]), float(pitch[-1])
    src, ctr, u, v = (t.detach().to(torch.float64).cpu() for t in trajectory.tensors())
    if src.shape[1] == 2:      # a 2D scan: (x, y) only, no rows and no roll
        src, ctr, u = (torch.nn.functional.pad(x, (0, 1)) for x in (src, ctr, u))
        v = torch.zeros_like(u)
        v[:, 2] = 1.0
    uh, vh = _unit(u), _unit(v)
    n = _unit(torch.linalg.cross(uh, vh, dim=1))
    if trajectory.beam == "cone":
        axis_point = torch.zeros_like(src)
        axis_point[:, 2] = src[:, 2]
        d = axis_point - src
        origin = src
    else:
        d = _unit(src)
        origin = torch.zeros_like(src)
    # The ray origin + t d meets the detector plane (p - ctr) . n = 0.
    t = ((ctr - origin) * n).sum(1) / (d * n).sum(1)
    p = origin + t[:, None] * d
    off_u = float((((ctr - p) * uh).sum(1) / du).mean())
    off_v = float((((ctr - p) * vh).sum(1) / dv).mean())
    roll = float(torch.rad2deg(torch.asin(uh[:, 2].clamp(-1, 1))).mean())
    return Alignment(off_u, off_v, roll)


def truth_of(path) -> dict | None:
    """The ``truth.json`` beside a scan (its folder, or the folder of a scan file), when there is one:
    ``{"parameters": {name: value}, "shifts_px": {"shift_u": [...], ...}}``; None otherwise or if unreadable."""
    from .. import guarded_open

    if not path:
        return None
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    f = folder / "truth.json"
    if not f.is_file():
        return None
    try:
        d = guarded_open.read_json(f)
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("parameters"), dict):
        return None
    return d


def exact_trajectory(trajectory: Trajectory, pitch, truth: dict) -> Trajectory:
    """The trajectory ``truth`` describes (offsets and roll in the scan's frame, per-view shifts in px), made
    from ``trajectory`` by the calibration's own geometry model: the change from what ``trajectory`` measures
    to what the truth states, plus the truth's per-view shifts."""
    from ..calibration.model import GeometryModel

    now = alignment_of(trajectory, pitch).as_dict()
    values = {k: float(v) for k, v in truth.get("parameters", {}).items()}
    g = {k: torch.tensor(values[k] - now.get(k, 0.0), dtype=torch.float64) if k in now
         else torch.tensor(values[k], dtype=torch.float64) for k in values}
    shifts = truth.get("shifts_px") or {}
    n = trajectory.n_views
    su, sv = (torch.tensor(shifts[k], dtype=torch.float64) if isinstance(shifts.get(k), list) and
              len(shifts[k]) == n else None for k in ("shift_u", "shift_v"))
    return GeometryModel(trajectory, pitch).apply(g, su, sv, dtype=trajectory.dtype)


def describe(alignment: Alignment) -> str:
    return ", ".join(f"{k} {v:+.3g} {UNITS[k]}" for k, v in alignment.as_dict().items() if math.isfinite(v))
