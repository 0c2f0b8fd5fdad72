"""The parameters self-calibration can free, their units, default bounds and finite-difference steps.

Global parameters change every view the same way (in each view's own detector
frame); per-view parameters are one value per view.  Units are the ones a user
reads off a detector image: pixels of the full-resolution detector and degrees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GLOBAL", "PER_VIEW", "ALL", "STAGE", "WHY_WEAK", "NEEDS_KNOWN_OBJECT", "ParameterSpec", "SPECS",
           "check_free", "check_bounds", "check_start",
           "MIN_VIEWS"]


@dataclass(frozen=True)
class ParameterSpec:
    name: str
    unit: str
    bound: float          # default symmetric bound |value| <= bound
    step: float           # central finite-difference step (in the parameter's unit)
    meaning: str
    resolution: float = math.inf   # a 1-sd uncertainty above this: the scan does not determine it


SPECS = {s.name: s for s in (
    ParameterSpec("offset_u", "px", 20.0, 0.1, "detector shift along its u axis (rows), full-resolution pixels", 0.5),
    ParameterSpec("offset_v", "px", 20.0, 0.1, "detector shift along its v axis (columns), full-resolution pixels",
                  0.5),
    ParameterSpec("roll", "deg", 5.0, 0.05, "detector rotation about its normal, u turning towards v", 0.1),
    ParameterSpec("pitch", "deg", 10.0, 0.25, "detector rotation about its u axis, v turning towards the normal", 0.5),
    ParameterSpec("yaw", "deg", 10.0, 0.25, "detector rotation about its v axis, u turning towards the normal", 0.5),
    ParameterSpec("axis_tilt", "deg", 5.0, 0.1,
                  "rotation axis tilted towards the beam (about each view's lateral axis through the isocentre)", 0.5),
    ParameterSpec("sdd", "mm", 50.0, 1.0, "change of the source-detector distance (cone beam)", 5.0),
    ParameterSpec("shift_u", "px", 20.0, 0.1,
                  "per-view object translation along the detector u axis, in detector pixels at the isocentre"),
    ParameterSpec("shift_v", "px", 20.0, 0.1,
                  "per-view object translation along the detector v axis, in detector pixels at the isocentre"),
)}
GLOBAL = ("offset_u", "offset_v", "roll", "pitch", "yaw", "axis_tilt", "sdd")
PER_VIEW = ("shift_u", "shift_v")
ALL = GLOBAL + PER_VIEW
# Coarse to fine in the parameters too: offsets, roll and shifts first (strong, nearly independent
# signatures), then the tilts, then the source-detector distance (weak signatures that a wrong offset
# would otherwise pull on).  A parameter joins when the stages before it have run at the coarsest level.
STAGE = {"pitch": 1, "yaw": 1, "axis_tilt": 1, "sdd": 2}
# Parameters an unknown object mimics to first order (a larger object, an object that flares with height):
# what is left of their signature is the cone-angle effects, smaller than the discretisation error of the
# calibration volume (simulated scans put sdd 33-56 mm off and pitch 3.5-12 degrees off, each with a small noise
# figure).  Without a known object they are held and reported "not identifiable".
# offset_v joined them: an unknown object explains 80% of its signature by a shift along the axis, and the rest (the
# magnification's change with depth) is what the coarse volume's model error imitates: three simulated objects put
# it 0.2-0.7 px off (truth 0) with robust uncertainties of 0.02-0.04 px, and more outer iterations moved it further.
NEEDS_KNOWN_OBJECT = ("offset_v", "pitch", "sdd")
# Why a parameter can come out "not identifiable" (the report's note).
WHY_WEAK = {
    "sdd": "a changed source-detector distance is a changed magnification, which an unknown object of another "
           "size explains; only the cone-angle effects remain (a known object fixes the absolute scale)",
    "pitch": "a detector pitch looks like an object that flares with height (each slice magnified a little "
             "more than the one below); only higher-order cone effects remain",
    "yaw": "a detector yaw mostly looks like a radial bulge of the object",
    "offset_v": "a vertical detector shift looks like the object moved along the axis",
}
# Fewest views for which a parameter is worth estimating: per-view translations lose 3-5 gauge
# directions (object position, mean shift) and need neighbours for the smoothness prior.
MIN_VIEWS = {"shift_u": 12, "shift_v": 12, "axis_tilt": 4, "pitch": 4, "yaw": 4, "sdd": 4,
             "offset_u": 2, "offset_v": 2, "roll": 1}


def check_free(free, *, beam: str, n_views: int) -> tuple[str, ...]:
    """The free parameters in canonical order; ValueError naming a bad or unsupported one."""
    if isinstance(free, str):
        free = (free,)
    try:
        names = list(free)
    except TypeError:
        raise TypeError(f"free must be a list of parameter names from {ALL}, got {type(free).__name__}") from None
    expanded = []
    for n in names:
        if n == "shift":  # shorthand for both translation components
            expanded += ["shift_u", "shift_v"]
        elif n not in SPECS:
            raise ValueError(f"free: unknown parameter {n!r}; choose from {ALL} (or 'shift' for both shifts)")
        else:
            expanded.append(n)
    if not expanded:
        raise ValueError(f"free: name at least one parameter to calibrate from {ALL}")
    if beam != "cone" and "sdd" in expanded:
        raise ValueError("free: 'sdd' has no meaning for a parallel beam (rays do not converge)")
    for n in expanded:
        if n_views < MIN_VIEWS[n]:
            raise ValueError(f"free: {n!r} needs at least {MIN_VIEWS[n]} views to be estimated; "
                             f"this scan has {n_views}")
    return tuple(n for n in ALL if n in expanded)


def check_bounds(bounds, free) -> dict[str, tuple[float, float]]:
    """Bounds per free parameter: the default symmetric bound unless ``bounds[name] = (lo, hi)``."""
    bounds = {} if bounds is None else bounds
    if not isinstance(bounds, dict):
        raise TypeError(f"bounds must be a dict {{name: (low, high)}}, got {type(bounds).__name__}")
    out = {}
    for name, b in bounds.items():
        if name not in SPECS:
            raise ValueError(f"bounds: unknown parameter {name!r}; choose from {ALL}")
        try:
            lo, hi = (float(x) for x in b)
        except (TypeError, ValueError):
            raise ValueError(f"bounds[{name!r}] must be a pair (low, high) of numbers, got {b!r}") from None
        if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
            raise ValueError(f"bounds[{name!r}] must be finite with low < high, got ({lo}, {hi})")
        out[name] = (lo, hi)
    for name in free:
        out.setdefault(name, (-SPECS[name].bound, SPECS[name].bound))
    return {n: out[n] for n in free}


def check_start(start, free, bounds, n_views: int) -> dict:
    """Starting values (0 = nominal geometry); per-view ones as lists of n_views numbers."""
    start = {} if start is None else start
    if not isinstance(start, dict):
        raise TypeError(f"start must be a dict {{name: value}}, got {type(start).__name__}")
    out = {}
    for name, val in start.items():
        if name not in free:
            raise ValueError(f"start: {name!r} is not a free parameter (free: {list(free)})")
        lo, hi = bounds[name]
        vals = [val] if name in GLOBAL else list(val) if hasattr(val, "__len__") else None
        if vals is None or (name in PER_VIEW and len(vals) != n_views):
            raise ValueError(f"start[{name!r}] must be a list of {n_views} numbers (one per view)")
        vals = [float(v) for v in vals]
        bad = [v for v in vals if not (math.isfinite(v) and lo <= v <= hi)]
        if bad:
            raise ValueError(f"start[{name!r}] = {bad[0]} lies outside its bounds [{lo}, {hi}]: "
                             "widen the bounds or start inside them")
        out[name] = vals[0] if name in GLOBAL else vals
    for name in free:
        lo, hi = bounds[name]
        if name not in out and not lo <= 0.0 <= hi:
            raise ValueError(f"bounds[{name!r}] = ({lo}, {hi}) exclude the nominal start 0; "
                             f"give start[{name!r}] inside the bounds or include 0")
    return out
