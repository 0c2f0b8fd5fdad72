"""Scan design: a trajectory together with its detector and volume grid.

A :class:`~ctbench.geometry.Trajectory` is pure per-view geometry; to project
or reconstruct one also needs the detector (pixels and pitch) and the volume
grid (voxels and pitch).  :class:`ScanGeometry` bundles the four and
round-trips through JSON, so the same record travels in napari layer
metadata, in dataset attributes and in job specifications.

:class:`TrajectoryDesign` is the form behind the GUI's trajectory designer:
one flat set of named parameters for every generator (circular, short scan,
half-fan, cylindrical detector, laminography, helical, saddle, sinusoidal,
parallel, fan, parallel 2D) that builds a ScanGeometry and explains bad values
in words (no tracebacks in a form).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from ..geometry import (
    Trajectory,
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    half_fan_trajectory_3d,
    laminography_trajectory_3d,
    saddle_trajectory_3d,
    sinusoidal_trajectory_3d,
    spiral_trajectory_3d,
)

SCAN_FORMAT = "ctbench.scan"


def _ints(value, name: str, n: int) -> tuple[int, ...]:
    vals = value if isinstance(value, (tuple, list, torch.Size)) else (value,)
    try:
        out = tuple(int(v) for v in vals)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {n} positive integers, got {value!r}") from None
    if len(out) != n or any(v <= 0 for v in out) or any(float(a) != float(b) for a, b in zip(vals, out)):
        raise ValueError(f"{name} must be {n} positive integers, got {value!r}")
    return out


def _floats(value, name: str, n: int) -> tuple[float, ...]:
    if isinstance(value, (int, float)):
        out = (float(value),) * n
    else:
        try:
            out = tuple(float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a positive number or {n} of them (mm), got {value!r}") from None
    if len(out) != n or any(not math.isfinite(v) or v <= 0 for v in out):
        raise ValueError(f"{name} must be a positive number or {n} of them (mm), got {value!r}")
    return out


@dataclass(frozen=True, eq=False)
class ScanGeometry:
    """Trajectory + detector + volume grid: everything a projector needs.

    3D scans: ``detector_shape`` (U, V), ``detector_spacing`` (du, dv),
    ``volume_shape`` (D, H, W), ``voxel_spacing`` (dz, dy, dx).
    2D scans (``trajectory.ndim == 2``): ``detector_shape`` (U,),
    ``detector_spacing`` (du,), ``volume_shape`` (H, W), ``voxel_spacing``
    (dy, dx).  Scalars are accepted for the spacings.  Lengths in mm.
    ``detector_kind``: ``"flat"`` or ``"cylinder"`` (a cylindrical detector
    centred on the source, ``du`` along the arc: :class:`ctbench.solvers.CylindricalProjector`).
    """

    trajectory: Trajectory
    detector_shape: tuple[int, ...]
    detector_spacing: tuple[float, ...]
    volume_shape: tuple[int, ...]
    voxel_spacing: tuple[float, ...]
    detector_kind: str = "flat"

    def __post_init__(self) -> None:
        if not isinstance(self.trajectory, Trajectory):
            raise TypeError(f"trajectory must be a ctbench Trajectory, got {type(self.trajectory).__name__}")
        two_d = self.trajectory.ndim == 2
        nd, nv = (1, 2) if two_d else (2, 3)
        ds = self.detector_shape
        if two_d and isinstance(ds, (tuple, list)) and len(ds) == 2 and int(ds[1]) == 1:
            ds = ds[:1]  # (U, 1) is the projector's spelling of a one-row detector
        dsp = self.detector_spacing
        if two_d and isinstance(dsp, (tuple, list)) and len(dsp) == 2:
            dsp = dsp[:1]
        object.__setattr__(self, "detector_shape", _ints(ds, "detector_shape", nd))
        object.__setattr__(self, "detector_spacing", _floats(dsp, "detector_spacing", nd))
        object.__setattr__(self, "volume_shape", _ints(self.volume_shape, "volume_shape", nv))
        object.__setattr__(self, "voxel_spacing", _floats(self.voxel_spacing, "voxel_spacing", nv))
        if self.detector_kind not in DETECTOR_KINDS:
            raise ValueError(f"detector_kind must be one of {DETECTOR_KINDS}, got {self.detector_kind!r}")
        if self.detector_kind == "cylinder" and self.trajectory.beam != "cone":
            raise ValueError("a cylindrical detector needs a cone or fan beam")

    # ----------------------------------------------------------------- basics
    @property
    def is_2d(self) -> bool:
        return self.trajectory.ndim == 2

    @property
    def n_views(self) -> int:
        return self.trajectory.n_views

    @property
    def beam(self) -> str:
        return self.trajectory.beam

    @property
    def kind(self) -> str:
        return str(self.trajectory.meta.get("kind", "custom"))

    @property
    def sinogram_shape(self) -> tuple[int, ...]:
        return (self.n_views, *self.detector_shape)

    def volume_extent(self) -> tuple[float, ...]:
        """Physical size of the volume box along each axis, in tensor order (mm)."""
        return tuple(n * d for n, d in zip(self.volume_shape, self.voxel_spacing))

    def with_volume(self, volume_shape=None, voxel_spacing=None) -> "ScanGeometry":
        """The same scan reconstructed on another grid."""
        return replace(self, volume_shape=self.volume_shape if volume_shape is None else volume_shape,
                       voxel_spacing=self.voxel_spacing if voxel_spacing is None else voxel_spacing)

    def projector(self, backend: str = "auto", **options):
        """A :class:`~ctbench.projector.Projector` for this scan (a
        :class:`~ctbench.solvers.CylindricalProjector` for a cylindrical detector)."""
        if self.detector_kind == "cylinder":
            from ..solvers.cylindrical import CylindricalProjector
            return CylindricalProjector(self.trajectory, self.volume_shape, self.detector_shape,
                                        detector_spacing=self.detector_spacing, voxel_spacing=self.voxel_spacing,
                                        backend=backend, **options)
        from ..projector import Projector
        return Projector(self.trajectory, self.volume_shape, self.detector_shape,
                         detector_spacing=self.detector_spacing, voxel_spacing=self.voxel_spacing,
                         backend=backend, **options)

    def describe(self) -> str:
        """A few words for titles and layer names, e.g. ``circular cone beam, 120 views``."""
        design = self.trajectory.meta.get("design")
        kind = design.get("kind") if isinstance(design, dict) else None
        label = _DESIGN_LABELS.get(kind) or _GENERATOR_LABELS.get(self.kind, f"{self.kind} {self.beam} beam")
        return f"{label}, {self.n_views} views"

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        d = {
            "format": SCAN_FORMAT,
            "version": 1,
            "units": "mm",
            "trajectory": self.trajectory.to_dict(),
            "detector_shape": list(self.detector_shape),
            "detector_spacing": list(self.detector_spacing),
            "volume_shape": list(self.volume_shape),
            "voxel_spacing": list(self.voxel_spacing),
        }
        if self.detector_kind != "flat":  # (older readers: a flat detector has no such field)
            d["detector_kind"] = self.detector_kind
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ScanGeometry":
        if not isinstance(d, dict) or d.get("format") != SCAN_FORMAT:
            raise ValueError(f"not a ctbench scan geometry: expected a dict with format={SCAN_FORMAT!r}")
        missing = [k for k in ("trajectory", "detector_shape", "detector_spacing", "volume_shape", "voxel_spacing")
                   if k not in d]
        if missing:
            raise ValueError(f"scan geometry lacks the fields {missing}")
        if d.get("units", "mm") != "mm":
            raise ValueError(f"scan geometry units must be 'mm', got {d.get('units')!r}")
        return cls(Trajectory.from_dict(d["trajectory"]), tuple(d["detector_shape"]), tuple(d["detector_spacing"]),
                   tuple(d["volume_shape"]), tuple(d["voxel_spacing"]), d.get("detector_kind", "flat"))


DETECTOR_KINDS = ("flat", "cylinder")

# --------------------------------------------------------------- the designer
# trajectory.meta["kind"] of the generators -> words
_GENERATOR_LABELS = {
    "circular": "circular cone beam", "spiral": "helical cone beam", "saddle": "saddle cone beam",
    "sinusoidal": "sinusoidal cone beam", "parallel3d": "parallel beam 3D", "fan2d": "fan beam 2D",
    "parallel2d": "parallel beam 2D", "custom": "custom trajectory", "half_fan": "half-fan cone beam",
    "laminography": "cone-beam laminography", "laminography_parallel": "parallel-beam laminography",
}
_DESIGN_LABELS = {
    "circular": "circular cone beam", "short_scan": "short-scan cone beam", "helical": "helical cone beam",
    "saddle": "saddle cone beam", "sinusoidal": "sinusoidal cone beam", "parallel": "parallel beam 3D",
    "fan": "fan beam 2D", "parallel_2d": "parallel beam 2D", "half_fan": "half-fan cone beam (offset detector)",
    "cylindrical": "cone beam, cylindrical detector", "laminography": "cone-beam laminography",
}

# kind -> (label, beam, ndim); the order is the order of the designer's menu.
TRAJECTORY_KINDS: dict[str, tuple[str, str, int]] = {
    "circular": ("Circular cone beam", "cone", 3),
    "short_scan": ("Short scan (180° + fan)", "cone", 3),
    "half_fan": ("Half-fan (offset detector, 360°)", "cone", 3),
    "cylindrical": ("Cylindrical detector (medical CT)", "cone", 3),
    "laminography": ("Laminography (tilted axis)", "cone", 3),
    "helical": ("Helical / spiral", "cone", 3),
    "saddle": ("Saddle", "cone", 3),
    "sinusoidal": ("Sinusoidal", "cone", 3),
    "parallel": ("Parallel beam 3D", "parallel", 3),
    "fan": ("Fan beam 2D", "cone", 2),
    "parallel_2d": ("Parallel beam 2D", "parallel", 2),
}


@dataclass(frozen=True)
class DesignParameter:
    """How the designer form shows one parameter."""

    name: str
    label: str
    kind: type          # int or float
    minimum: float
    maximum: float
    step: float
    unit: str = ""
    kinds: tuple[str, ...] = tuple(TRAJECTORY_KINDS)   # generators that use it
    help: str = ""


_CONE = ("circular", "short_scan", "half_fan", "cylindrical", "laminography", "helical", "saddle", "sinusoidal", "fan")
_ORBIT_Z = ("saddle", "sinusoidal")
_HAS_V = ("circular", "short_scan", "half_fan", "cylindrical", "laminography", "helical", "saddle", "sinusoidal",
          "parallel")

DESIGN_PARAMETERS: tuple[DesignParameter, ...] = (
    DesignParameter("n_views", "Views", int, 0, 100000, 1, "", help="number of projections"),
    DesignParameter("sid", "SID", float, 0.0, 1e5, 10.0, "mm", _CONE, "source to isocentre distance"),
    DesignParameter("sdd", "SDD", float, 0.0, 1e5, 10.0, "mm", _CONE, "source to detector distance"),
    DesignParameter("angle_range", "Angular range", float, 0.0, 3600.0, 10.0, "°",
                    ("circular", "cylindrical", "parallel", "fan", "parallel_2d"), "total rotation"),
    DesignParameter("overlap", "Overlap", float, 0.0, 1e5, 1.0, "mm", ("half_fan",),
                    "how far the detector reaches past the central ray (both halves of the turn see this band)"),
    DesignParameter("tilt", "Axis tilt", float, -89.0, 89.0, 5.0, "°", ("laminography",),
                    "rotation axis tilted towards the beam; the missing cone of frequencies has this half-angle"),
    DesignParameter("start_angle", "Start angle", float, -3600.0, 3600.0, 10.0, "°", help="angle of the first view"),
    DesignParameter("z_range", "z range", float, -1e5, 1e5, 5.0, "mm", ("helical",),
                    "rise of the source over the whole scan"),
    DesignParameter("n_turns", "Turns", float, 0.0, 1000.0, 0.5, "", ("helical",), "number of helix turns"),
    DesignParameter("amplitude", "Amplitude", float, -1e5, 1e5, 5.0, "mm", _ORBIT_Z,
                    "saddle: height of the z excursion; sinusoidal: swing of the source distance (diffct's orbits)"),
    DesignParameter("frequency", "Frequency", float, 0.0, 100.0, 1.0, "", ("sinusoidal",),
                    "oscillations of the source distance per turn"),
    DesignParameter("detector_u", "Detector columns (U)", int, 0, 100000, 8, "px"),
    DesignParameter("detector_v", "Detector rows (V)", int, 0, 100000, 8, "px", _HAS_V),
    DesignParameter("pixel_u", "Pixel pitch u", float, 0.0, 1e4, 0.1, "mm"),
    DesignParameter("pixel_v", "Pixel pitch v", float, 0.0, 1e4, 0.1, "mm", _HAS_V),
    DesignParameter("volume_d", "Volume depth (D, z)", int, 0, 100000, 8, "vox", _HAS_V),
    DesignParameter("volume_h", "Volume height (H, y)", int, 0, 100000, 8, "vox"),
    DesignParameter("volume_w", "Volume width (W, x)", int, 0, 100000, 8, "vox"),
    DesignParameter("voxel_size", "Voxel pitch", float, 0.0, 1e4, 0.1, "mm"),
)


class DesignError(ValueError):
    """A designer parameter has a value that cannot make a scan; the message says which and why."""


@dataclass(frozen=True)
class TrajectoryDesign:
    """The designer's parameters; :meth:`build` turns them into a :class:`ScanGeometry`.

    Angles are in degrees (forms speak degrees; generators take radians).
    ``angle_range`` applies to circular, cylindrical, parallel and fan kinds; a
    short scan spans 180° plus the full fan angle of its detector; half-fan and
    laminography scans turn once.  ``overlap`` (mm at the detector): how far a
    half-fan detector reaches past the central ray; ``tilt``: the laminography
    axis tilt.  ``pixel_u`` of a cylindrical detector is the pitch along its arc.
    """

    kind: str = "circular"
    n_views: int = 120
    sid: float = 200.0
    sdd: float = 400.0
    angle_range: float = 360.0
    start_angle: float = 0.0
    z_range: float = 40.0
    n_turns: float = 2.0
    amplitude: float = 20.0
    frequency: float = 2.0
    overlap: float = 12.0
    tilt: float = 30.0
    detector_u: int = 96
    detector_v: int = 96
    pixel_u: float = 1.5
    pixel_v: float = 1.5
    volume_d: int = 64
    volume_h: int = 64
    volume_w: int = 64
    voxel_size: float = 1.0

    @property
    def beam(self) -> str:
        return TRAJECTORY_KINDS[self.kind][1] if self.kind in TRAJECTORY_KINDS else "cone"

    @property
    def ndim(self) -> int:
        return TRAJECTORY_KINDS[self.kind][2] if self.kind in TRAJECTORY_KINDS else 3

    def uses(self, name: str) -> bool:
        """Whether parameter ``name`` matters for this kind (the form hides the others)."""
        for p in DESIGN_PARAMETERS:
            if p.name == name:
                return self.kind in p.kinds
        return name == "kind"

    def replace(self, **changes: Any) -> "TrajectoryDesign":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrajectoryDesign":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise DesignError(f"unknown designer parameters {sorted(unknown)}")
        return cls(**d)

    def short_scan_range(self) -> float:
        """180° plus the full fan angle of the detector (degrees)."""
        half_width = self.detector_u * self.pixel_u / 2
        return 180.0 + 2 * math.degrees(math.atan2(half_width, self.sdd))

    def check(self) -> None:
        """Raise :class:`DesignError` naming the first bad parameter."""
        if self.kind not in TRAJECTORY_KINDS:
            raise DesignError(f"trajectory kind must be one of {list(TRAJECTORY_KINDS)}, got {self.kind!r}")
        if isinstance(self.n_views, bool) or int(self.n_views) != self.n_views or self.n_views < 1:
            raise DesignError(f"Views must be at least 1 (got {self.n_views})")
        for p in DESIGN_PARAMETERS:
            if not self.uses(p.name):
                continue
            v = getattr(self, p.name)
            if not math.isfinite(float(v)):
                raise DesignError(f"{p.label} must be a finite number (got {v})")
            if p.name in ("detector_u", "detector_v", "volume_d", "volume_h", "volume_w") and v < 1:
                raise DesignError(f"{p.label} must be at least 1 (got {v})")
            if p.name in ("pixel_u", "pixel_v", "voxel_size", "sid", "sdd") and v <= 0:
                raise DesignError(f"{p.label} must be positive (got {v} {p.unit})")
            if p.name in ("angle_range", "n_turns", "frequency") and v <= 0:
                raise DesignError(f"{p.label} must be positive (got {v})")
            if p.name == "overlap" and not 0 <= v <= self.detector_u * self.pixel_u / 2:
                raise DesignError(f"Overlap must be between 0 and half the detector width "
                                  f"({self.detector_u * self.pixel_u / 2:g} mm), got {v:g} mm")
            if p.name == "tilt" and not abs(v) < 89.0 + 1e-9:
                raise DesignError(f"Axis tilt must be within ±89° (0 is ordinary CT), got {v:g}°")
        if self.beam == "cone" and self.sdd < self.sid:
            raise DesignError(f"SDD ({self.sdd:g} mm) must be at least SID ({self.sid:g} mm): "
                              "the detector sits beyond the rotation axis")
        if self.beam == "cone":
            half = [self.volume_w * self.voxel_size / 2, self.volume_h * self.voxel_size / 2]
            reach = math.hypot(*half)
            if self.kind == "sinusoidal" and self.sid - abs(self.amplitude) <= reach:
                raise DesignError(f"SID - |amplitude| ({self.sid - abs(self.amplitude):g} mm) must exceed the "
                                  f"volume's half-diagonal in the rotation plane ({reach:.4g} mm): the sinusoidal "
                                  "orbit's source would pass through the volume")
            if self.sid <= reach:
                raise DesignError(f"SID ({self.sid:g} mm) must exceed the volume's half-diagonal in the "
                                  f"rotation plane ({reach:.4g} mm): the source would pass through the volume")

    def build(self, dtype=torch.float32) -> ScanGeometry:
        """The scan this form describes; :class:`DesignError` explains bad values."""
        self.check()
        rad = math.radians
        k, n = self.kind, int(self.n_views)
        start = rad(self.start_angle)
        common = dict(dtype=dtype)
        if k == "circular":
            t = circular_trajectory_3d(n, self.sid, self.sdd, start_angle=start, angle_range=rad(self.angle_range),
                                       **common)
        elif k == "short_scan":
            t = circular_trajectory_3d(n, self.sid, self.sdd, start_angle=start,
                                       angle_range=rad(self.short_scan_range()), **common)
        elif k == "half_fan":
            t = half_fan_trajectory_3d(n, self.sid, self.sdd, self.detector_u * self.pixel_u, self.overlap,
                                       start_angle=start, **common)
        elif k == "cylindrical":
            t = circular_trajectory_3d(n, self.sid, self.sdd, start_angle=start, angle_range=rad(self.angle_range),
                                       **common)
        elif k == "laminography":
            t = laminography_trajectory_3d(n, self.sid, self.sdd, rad(self.tilt), start_angle=start,
                                           angle_range=2 * math.pi, **common)
        elif k == "helical":
            t = spiral_trajectory_3d(n, self.sid, self.sdd, self.z_range, self.n_turns, start, **common)
        elif k == "saddle":
            # a pure saddle (constant source distance): diffct's radial swing is left at zero
            t = saddle_trajectory_3d(n, self.sid, self.sdd, z_amplitude=self.amplitude, radial_amplitude=0.0,
                                     start_angle=start, **common)
        elif k == "sinusoidal":
            t = sinusoidal_trajectory_3d(n, self.sid, self.sdd, self.amplitude, self.frequency,
                                         start_angle=start, **common)
        elif k == "parallel":
            t = circular_trajectory_3d_parallel(n, start_angle=start, angle_range=rad(self.angle_range), **common)
        elif k == "fan":
            t = circular_trajectory_2d_fan(n, self.sid, self.sdd, start_angle=start,
                                           angle_range=rad(self.angle_range), **common)
        else:
            t = circular_trajectory_2d_parallel(n, start_angle=start, angle_range=rad(self.angle_range), **common)
        # The design rides along in the trajectory's meta, so a saved trajectory
        # JSON reopens in the designer with every field as it was.
        t = t.replace(meta={**t.meta, "design": self.to_dict()})
        if self.ndim == 2:
            return ScanGeometry(t, (self.detector_u,), (self.pixel_u,), (self.volume_h, self.volume_w),
                                (self.voxel_size, self.voxel_size))
        return ScanGeometry(t, (self.detector_u, self.detector_v), (self.pixel_u, self.pixel_v),
                            (self.volume_d, self.volume_h, self.volume_w), (self.voxel_size,) * 3,
                            "cylinder" if k == "cylindrical" else "flat")


def design_of(trajectory: Trajectory) -> TrajectoryDesign | None:
    """The designer form saved in a trajectory's meta, or None for other trajectories."""
    d = trajectory.meta.get("design")
    if not isinstance(d, dict):
        return None
    try:
        return TrajectoryDesign.from_dict(d)
    except (DesignError, TypeError):
        return None


def scan_from_trajectory(trajectory: Trajectory, detector_shape=None, detector_spacing=None,
                         volume_shape=None, voxel_spacing=None) -> ScanGeometry:
    """A ScanGeometry for a bare trajectory: the saved design fills in what is not given,
    then defaults (a 64-pixel detector of 1 mm pixels, a 64-voxel grid of 1 mm voxels)."""
    design = design_of(trajectory)
    two_d = trajectory.ndim == 2
    kind = "flat"
    if design is not None and design.ndim == trajectory.ndim:
        g = design.build(dtype=trajectory.dtype)
        base = (g.detector_shape, g.detector_spacing, g.volume_shape, g.voxel_spacing)
        kind = g.detector_kind
    else:
        base = (((64,), (1.0,), (64, 64), (1.0, 1.0)) if two_d
                else ((64, 64), (1.0, 1.0), (64, 64, 64), (1.0, 1.0, 1.0)))
    given = (detector_shape, detector_spacing, volume_shape, voxel_spacing)
    vals = [b if g is None else g for b, g in zip(base, given)]
    return ScanGeometry(trajectory, *vals, kind)
