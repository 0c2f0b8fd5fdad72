"""The trajectory type: per-view source (or ray direction), detector centre and axes.

A trajectory is pure geometry: four ``(n_views, 3)`` tensors in world
coordinates ``(x, y, z)`` (mm) plus the beam type.  Detector pixel pitch and
shape belong to the :class:`~ctbench.projector.Projector`; ``detector_u`` and
``detector_v`` are the (normally unit) directions of the detector axes.
Every tensor may ``requires_grad``: the projector differentiates through them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

BEAMS = ("cone", "parallel")
_FIELDS = ("source", "detector_center", "detector_u", "detector_v")
# The kernels compute in float32 or float64; a half-precision trajectory would
# be widened silently from coordinates already rounded to ~0.1% (a mm at 1 m).
GEOMETRY_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True, eq=False)
class Trajectory:
    """Per-view scan geometry.

    ``source`` holds source positions for ``beam="cone"`` and ray directions
    for ``beam="parallel"`` (then :attr:`direction` is an alias).
    ``ndim`` is 2 for fan/parallel 2D scans (one detector row in the plane
    z=0, volumes of depth 1). ``meta`` records the generator and its
    parameters (used by FDK and by the GUI); it never affects projection.
    """

    source: torch.Tensor
    detector_center: torch.Tensor
    detector_u: torch.Tensor
    detector_v: torch.Tensor
    beam: str = "cone"
    ndim: int = 3
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.beam not in BEAMS:
            raise ValueError(f"beam must be one of {BEAMS}, got {self.beam!r}")
        if self.ndim not in (2, 3):
            raise ValueError(f"ndim must be 2 or 3, got {self.ndim!r}")
        n = None
        ref = None
        for name in _FIELDS:
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"trajectory {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.ndim != 2 or t.shape[1] != 3:
                raise ValueError(f"trajectory {name} must have shape (n_views, 3), got {tuple(t.shape)}")
            if t.dtype not in GEOMETRY_DTYPES:
                raise TypeError(f"trajectory {name} must be float32 or float64, got {t.dtype}")
            if n is None:
                n, ref = t.shape[0], t
            elif t.shape[0] != n:
                raise ValueError(
                    f"trajectory {name} has {t.shape[0]} views but source has {n}")
            elif t.device != ref.device or t.dtype != ref.dtype:
                raise ValueError(
                    f"trajectory {name} is {t.dtype} on {t.device} but source is "
                    f"{ref.dtype} on {ref.device}; all four tensors must match")
        if not isinstance(self.meta, dict):
            raise TypeError(f"trajectory meta must be a dict, got {type(self.meta).__name__}")

    # ------------------------------------------------------------------ basics
    @property
    def n_views(self) -> int:
        return int(self.source.shape[0])

    def __len__(self) -> int:
        return self.n_views

    @property
    def direction(self) -> torch.Tensor:
        """Ray directions of a parallel beam (alias of ``source``)."""
        if self.beam != "parallel":
            raise AttributeError("direction is defined for parallel beams; cone beams have source")
        return self.source

    @property
    def device(self) -> torch.device:
        return self.source.device

    @property
    def dtype(self) -> torch.dtype:
        return self.source.dtype

    @property
    def requires_grad(self) -> bool:
        return any(getattr(self, f).requires_grad for f in _FIELDS)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(getattr(self, f) for f in _FIELDS)  # type: ignore[return-value]

    # ------------------------------------------------------------ diffct
    @property
    def diffct_beam(self) -> str:
        """diffct's name for this beam: "cone", "fan", "parallel" (2D) or "parallel3d"."""
        if self.beam == "cone":
            return "cone" if self.ndim == 3 else "fan"
        return "parallel3d" if self.ndim == 3 else "parallel"

    def to_diffct(self) -> tuple[torch.Tensor, ...]:
        """diffct 2.5's tuple: ``(src, det_center, det_u, det_v)`` of (n, 3) tensors in 3D, or
        ``(src, det_center, det_u)`` (fan) / ``(ray_dir, det_origin, det_u)`` (parallel) of (n, 2)
        in 2D.  The parts are views of this trajectory's tensors (autograd flows through them)."""
        if self.ndim == 3:
            return self.tensors()
        return tuple(t[:, :2] for t in self.tensors()[:3])

    as_tuple = to_diffct

    def __iter__(self):
        # Unpacks like diffct's tuple: ``src, det_center, det_u, det_v = circular_trajectory_3d(...)``.
        return iter(self.to_diffct())

    @classmethod
    def from_diffct(cls, parts, beam: str | None = None) -> "Trajectory":
        """A Trajectory from diffct's tuple; ``beam`` ("cone", "fan", "parallel", "parallel3d")
        is needed for 2D tuples, whose three (n, 2) parts are fan or parallel."""
        return from_diffct(parts, beam)

    def replace(self, **changes: Any) -> "Trajectory":
        kw = {f: getattr(self, f) for f in (*_FIELDS, "beam", "ndim", "meta")}
        kw.update(changes)
        return Trajectory(**kw)

    def to(self, device=None, dtype=None) -> "Trajectory":
        return self.replace(**{f: getattr(self, f).to(device=device, dtype=dtype) for f in _FIELDS})

    def detach(self) -> "Trajectory":
        return self.replace(**{f: getattr(self, f).detach() for f in _FIELDS})

    def __getitem__(self, index) -> "Trajectory":
        """Select views: an int, a slice, an index tensor/list or a boolean mask."""
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        meta = dict(self.meta)
        if "angles" in meta:
            meta["angles"] = [float(a) for a in torch.as_tensor(meta["angles"], dtype=torch.float64)[index].reshape(-1)]
        return self.replace(**{f: getattr(self, f)[index] for f in _FIELDS}, meta=meta)

    def cat(self, other: "Trajectory") -> "Trajectory":
        if other.beam != self.beam or other.ndim != self.ndim:
            raise ValueError("can only concatenate trajectories of the same beam and ndim")
        return self.replace(**{f: torch.cat([getattr(self, f), getattr(other, f)]) for f in _FIELDS}, meta={})

    def validate_finite(self) -> None:
        """Raise ValueError naming the tensor and the views that hold NaN or inf."""
        check_finite(self.tensors(), _FIELDS)

    # ------------------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        return {
            "format": "ctbench.trajectory",
            "version": 1,
            "beam": self.beam,
            "ndim": self.ndim,
            "dtype": str(self.dtype).replace("torch.", ""),
            # Python's float repr round-trips float64 exactly; float32 widens exactly.
            **{f: getattr(self, f).detach().cpu().to(torch.float64).tolist() for f in _FIELDS},
            "meta": _jsonable(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict, device=None) -> "Trajectory":
        """The trajectory a :meth:`to_dict` document describes; ValueError naming the field and what it must be
        (nothing in the document can make this raise anything else)."""
        return cls(**parse_document(d, device=device))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str, device=None) -> "Trajectory":
        try:
            d = json.loads(text)
        except RecursionError:
            raise ValueError("trajectory JSON is malformed: nested too deeply") from None
        except ValueError as e:          # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"trajectory JSON is malformed: {e}") from None
        return cls.from_dict(d, device=device)

    def save(self, path: str | Path, *, overwrite: bool = True, force: bool = False, inputs=()) -> Path:
        """Write the trajectory as JSON at ``path``, crash-safe and under the output policy
        (:func:`ctbench.output_policy.write_file`): the old file or the new one is there whatever happens,
        never a mixture; the temporary file is created exclusively (a planted link is never followed).

        An existing file is replaced when ``overwrite`` (the default) and it is a JSON output of ctbench (a
        trajectory, a report); anything else there only with ``force``; a folder or FIFO never.  ``inputs``:
        paths the file may not be (the scan or config it was made from).
        """
        from ..output_policy import write_file

        return write_file(path, self.to_json().encode(), inputs, overwrite=overwrite, force=force,
                          what="trajectory file")

    @classmethod
    def load(cls, path: str | Path, device=None) -> "Trajectory":
        """Read a trajectory JSON file through the guarded opener (a regular file of at most
        ``CTBENCH_READER_MAX_BYTES``, 64 MiB by default: a FIFO or device is refused without blocking);
        every problem is an :class:`~ctbench.guarded_open.InputError` (a ValueError) naming the file.  A path
        that a killed :meth:`save` left missing (between the two renames of a replace) is put back first."""
        import os

        from .. import guarded_open
        from ..output_policy import recover_interrupted_replace

        if not os.path.lexists(path):       # a save killed between the two renames of a replace: put it back
            recover_interrupted_replace(path)
        raw = guarded_open.read_bytes(path)
        try:
            return cls.from_json(raw.decode("utf-8"), device=device)
        except UnicodeDecodeError as e:
            raise guarded_open.InputError(path, f"is not a trajectory JSON file (not UTF-8 text: {e})") from None
        except (ValueError, TypeError) as e:
            raise guarded_open.InputError(path, str(e)) from None

    def __repr__(self) -> str:
        kind = self.meta.get("kind", "custom")
        return (f"Trajectory({kind}, beam={self.beam!r}, ndim={self.ndim}, n_views={self.n_views}, "
                f"dtype={self.dtype}, device={self.device})")


# ------------------------------------------------------------- reading
def _is_number(x) -> bool:
    return type(x) in (int, float)          # JSON numbers only: not bool, not str


def _json_type(x) -> str:
    """What a JSON value is, in JSON's words (null, true/false, a number, a string, an array, an object)."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true/false"
    return {int: "a number", float: "a number", str: "a string", list: "an array", tuple: "an array",
            dict: "an object"}.get(type(x), type(x).__name__)


def _vectors(value, name: str) -> list:
    """A JSON field of per-view 3-vectors, checked to be a list of [x, y, z] numbers (first bad view named)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"trajectory JSON field {name!r} must be a list of [x, y, z] per view, got "
                         f"{_json_type(value)}")
    for i, row in enumerate(value):
        if not (isinstance(row, (list, tuple)) and len(row) == 3 and all(_is_number(c) for c in row)):
            raise ValueError(f"trajectory JSON field {name!r}: view {i} must be [x, y, z] (three numbers), got "
                             f"{json.dumps(row)[:80] if _jsonable_row(row) else _json_type(row)}")
    return value


def _jsonable_row(row) -> bool:
    try:
        json.dumps(row)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def parse_document(d, device=None) -> dict:
    """The keyword arguments of :class:`Trajectory` from a trajectory JSON document, every field checked:
    ``format``, ``version`` 1, ``beam``, ``ndim`` (2 or 3), ``dtype`` (float32 or float64), the four per-view
    fields (lists of [x, y, z] numbers, one per view, the same number of views, finite in ``dtype``) and
    ``meta`` (an object; its ``angles``, when present, one finite number per view).  ValueError otherwise."""
    if not isinstance(d, dict) or d.get("format") != "ctbench.trajectory":
        raise ValueError("not a ctbench trajectory: expected a JSON object with \"format\": \"ctbench.trajectory\"")
    version = d.get("version", 1)
    if type(version) is not int or version != 1:
        raise ValueError(f"trajectory JSON field 'version' must be 1, got {version!r:.40}")
    dtype_name = d.get("dtype", "float64")
    names = {str(t).replace("torch.", ""): t for t in GEOMETRY_DTYPES}
    if not isinstance(dtype_name, str) or dtype_name not in names:
        raise ValueError(f"trajectory JSON field 'dtype' must be one of {sorted(names)} (the kernels compute in "
                         f"these), got {dtype_name!r:.40}")
    beam = d.get("beam", "cone")
    if not isinstance(beam, str) or beam not in BEAMS:
        raise ValueError(f"trajectory JSON field 'beam' must be one of {BEAMS}, got {beam!r:.40}")
    ndim = d.get("ndim", 3)
    if type(ndim) is not int or ndim not in (2, 3):
        raise ValueError(f"trajectory JSON field 'ndim' must be 2 or 3, got {ndim!r:.40}")
    meta = d.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError(f"trajectory JSON field 'meta' must be an object, got {_json_type(meta)}")
    dtype = names[dtype_name]
    tensors = {}
    n = None
    for f in _FIELDS:
        if f not in d:
            raise ValueError(f"trajectory JSON lacks the field {f!r}")
        rows = _vectors(d[f], f)
        if n is None:
            n = len(rows)
        elif len(rows) != n:
            raise ValueError(f"trajectory JSON field {f!r} has {len(rows)} views but 'source' has {n}")
        try:
            t = torch.tensor(rows, dtype=torch.float64).reshape(len(rows), 3).to(dtype=dtype)
        except (OverflowError, RuntimeError):      # an integer of hundreds of digits
            raise ValueError(f"trajectory JSON field {f!r} holds numbers beyond the range of float64") from None
        bad = (~torch.isfinite(t)).any(dim=1)
        if bad.any():
            why = "NaN or infinite" if dtype == torch.float64 else "NaN, infinite or beyond float32's range"
            raise ValueError(f"trajectory JSON field {f!r} holds values that are {why} at views {_views(bad)}")
        tensors[f] = t.to(device=device)
    angles = meta.get("angles")
    if angles is not None and not (isinstance(angles, (list, tuple)) and len(angles) == n
                                   and all(_is_number(a) and abs(a) < 1e300 and math.isfinite(a) for a in angles)):
        raise ValueError(f"trajectory JSON field 'meta.angles' must be {n} finite numbers (one per view)")
    if "kind" in meta and not isinstance(meta["kind"], str):
        raise ValueError(f"trajectory JSON field 'meta.kind' must be a string, got {_json_type(meta['kind'])}")
    return {**tensors, "beam": beam, "ndim": ndim, "meta": meta}


# ------------------------------------------------------------- validation
def check_finite(tensors, names=_FIELDS) -> None:
    """Raise ValueError for the first ``(n_views, 3)`` tensor holding NaN or inf.

    The message names the tensor and (up to ten of) its views, e.g.
    ``trajectory.source has non-finite values at views [3]``.  One fused
    reduction over all tensors keeps the common (all finite) case cheap.
    """
    tensors = tuple(t.detach() for t in tensors)
    if all(bool(torch.isfinite(t).all()) for t in tensors):
        return
    for name, t in zip(names, tensors):
        bad = (~torch.isfinite(t)).reshape(t.shape[0], -1).any(dim=1).nonzero()[:, 0].tolist()
        if bad:
            more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
            raise ValueError(f"trajectory.{name} has non-finite values at views {bad[:10]}{more}")


def _views(mask: torch.Tensor) -> str:
    bad = mask.nonzero()[:, 0].tolist()
    return f"{bad[:10]}" + (f" (and {len(bad) - 10} more)" if len(bad) > 10 else "")


# Largest ratio of a geometry coordinate to a voxel size that the kernels'
# double-precision ray set-up resolves to ~1e-4 voxel (double has 16 digits).
MAX_COORDINATE_TO_VOXEL = 1e12


def check_geometry(trajectory: "Trajectory", beam: str, box_half, voxel: float) -> None:
    """Raise ValueError for geometry whose projections would be meaningless.

    ``box_half`` is the volume's half extent ``(x, y, z)`` in mm (the grid is
    centred on the origin), ``voxel`` its smallest voxel spacing.  Checked per view, in float64:

    - the detector axes are not parallel (the detector spans a plane);
    - parallel beams: the ray direction is not parallel to the detector plane;
    - cone beams: the source is not on the detector plane, the volume is not
      entirely behind the source (detector behind the source), and no part of
      the volume reaches the detector plane (detector cutting through the
      volume, or between source and volume).  The kernels integrate the full
      line through the volume, so these give meaningless values and FDK
      weights vanish.  (A volume reaching behind the source plane is refused
      by the projector's "source inside the volume" check only when the source
      lies inside the box.)
    - every coordinate is within ``MAX_COORDINATE_TO_VOXEL`` voxels of the origin.
    """
    src, ctr, u, v = (t.detach().to(device="cpu", dtype=torch.float64) for t in trajectory.tensors())
    half = torch.as_tensor(box_half, dtype=torch.float64)
    points = (ctr, src) if beam == "cone" else (ctr,)
    reach = max(float(p.abs().max()) for p in points) if src.numel() else 0.0
    if reach > MAX_COORDINATE_TO_VOXEL * float(voxel):
        raise ValueError(f"the geometry reaches {reach:.3g} mm from the volume centre, more than "
                         f"{MAX_COORDINATE_TO_VOXEL:.0e} voxels of {voxel:.3g} mm: rays cannot be set up to a "
                         "fraction of a voxel there")
    n = torch.linalg.cross(u, v)
    nn = n.norm(dim=1)
    flat = nn <= 1e-6 * u.norm(dim=1) * v.norm(dim=1)
    if flat.any():
        raise ValueError(f"trajectory.detector_u is parallel to trajectory.detector_v in views {_views(flat)}; "
                         "the detector axes must span a plane")
    nh = n / nn[:, None]
    if beam == "parallel":
        dn = (src * nh).sum(dim=1).abs()
        grazing = dn <= 1e-6 * src.norm(dim=1)
        if grazing.any():
            raise ValueError(f"parallel-beam ray directions (trajectory.source) lie in the detector plane in views "
                             f"{_views(grazing)}; they must cross it")
        return
    depth = ((ctr - src) * nh).sum(dim=1)  # signed source-to-detector distance along the normal
    on_plane = depth.abs() <= 1e-9 * (ctr - src).norm(dim=1).clamp_min(1e-300)
    if on_plane.any():
        raise ValueError(f"the source lies on the detector plane in views {_views(on_plane)}")
    signs = torch.tensor([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=torch.float64)
    corners = signs * half  # (8, 3)
    # Position of each corner between the source plane (0) and the detector plane (1).
    t = ((corners[None, :, :] - src[:, None, :]) * nh[:, None, :]).sum(dim=2) / depth[:, None]
    behind = (t < 0).all(dim=1)
    if behind.any():
        raise ValueError(f"the detector is behind the source in views {_views(behind)}: the volume must lie "
                         "between the source and the detector")
    cut = (t >= 1).any(dim=1)
    if cut.any():
        raise ValueError(f"the detector plane cuts through (or lies in front of) the volume in views {_views(cut)}: "
                         "the volume must lie between the source and the detector (larger sdd - sid or a "
                         "smaller volume)")


def _jsonable(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().to(torch.float64).tolist()
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def load_trajectory(path: str | Path, device=None) -> Trajectory:
    return Trajectory.load(path, device=device)


def save_trajectory(trajectory: Trajectory, path: str | Path, **options) -> Path:
    """:meth:`Trajectory.save` (``overwrite``, ``force``, ``inputs``)."""
    return trajectory.save(path, **options)


# diffct's tuple form lives beside the class (with to_diffct), so that convert.py (anything -> a
# Trajectory) imports this module and not the other way round.
DIFFCT_BEAMS = {"cone": "cone", "fan": "cone", "parallel": "parallel", "parallel3d": "parallel"}


def ctbench_beam(beam: str | None) -> str | None:
    """ctbench's name for a diffct (or ctbench) beam name; None stays None."""
    if beam is None:
        return None
    if beam not in DIFFCT_BEAMS:
        raise ValueError(f"beam must be one of 'cone', 'parallel' (ctbench) or 'fan', 'parallel3d' (diffct), "
                         f"got {beam!r}")
    return DIFFCT_BEAMS[beam]


def from_diffct(parts, beam: str | None = None) -> Trajectory:
    """A Trajectory from a diffct tuple (see the module docstring)."""
    if not isinstance(parts, (tuple, list)) or len(parts) not in (3, 4):
        raise TypeError("trajectory must be a ctbench Trajectory or a diffct tuple: (src, det_center, det_u, det_v) "
                        "of (n_views, 3) tensors, or (src, det_center, det_u) of (n_views, 2) tensors; got "
                        f"{type(parts).__name__}" + (f" of length {len(parts)}" if isinstance(parts, (tuple, list)) else ""))
    names = ("src", "det_center", "det_u", "det_v")[:len(parts)]
    tensors = []
    for name, p in zip(names, parts):
        if not isinstance(p, torch.Tensor):
            try:
                p = torch.as_tensor(p, dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"trajectory part {name} must be a tensor, got {type(p).__name__}") from None
        tensors.append(p)
    dims = 3 if len(parts) == 4 else 2
    for name, t in zip(names, tensors):
        if t.ndim != 2 or t.shape[1] != dims:
            raise ValueError(f"a {len(parts)}-part diffct trajectory has ({'n_views'}, {dims}) parts; "
                             f"{name} has shape {tuple(t.shape)}")
    kind = ctbench_beam(beam)
    if dims == 3:
        if beam == "fan":
            raise ValueError("beam='fan' takes a 2D trajectory (src, det_center, det_u) of (n_views, 2) tensors; "
                             "got 4 parts of (n_views, 3)")
        return Trajectory(*tensors, beam=kind or "cone", ndim=3, meta={"kind": "diffct"})
    if kind is None:
        raise ValueError("a 2D diffct trajectory (3 parts of (n_views, 2)) is a fan or a parallel beam: "
                         "pass beam='fan' or beam='parallel'")
    if beam == "parallel3d":
        raise ValueError("beam='parallel3d' takes (ray_dir, det_center, det_u, det_v) of (n_views, 3) tensors")

    def lift(t):
        return torch.cat([t, torch.zeros_like(t[:, :1])], dim=1)

    src, ctr, u = (lift(t) for t in tensors)
    v = torch.zeros_like(src.detach())
    v[:, 2] = 1.0
    return Trajectory(src, ctr, u, v, beam=kind, ndim=2, meta={"kind": "diffct"})
