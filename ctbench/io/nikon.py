"""Nikon XT H scans: a ``.xtekct`` parameter file beside TIFF projections; lazy.

The ``.xtekct`` file is INI text with one ``[XTekCT]`` section.  The keys
used (lengths in mm, angles in degrees):

- ``Name`` (the projections are ``<Name>_0001.tif`` ... in
  ``InputFolderName``, relative to the file, default its folder),
  ``Projections``, ``DetectorPixelsX`` / ``Y``, ``DetectorPixelSizeX`` /
  ``Y``, ``SrcToObject``, ``SrcToDetector``, ``InitialAngle``,
  ``AngularStep``, ``WhiteLevel`` (the open-beam level of the already
  shading-corrected projections: it is their flat field);
- ``DetectorOffsetX`` / ``Y`` (mm, the panel's centre from the central ray),
  ``ObjectOffsetX`` (mm, the rotation axis at the object) or, in older files
  without it, ``CentreOfRotationTop`` / ``Bottom`` (mm at the detector): the
  stated offsets, as CIL's NikonDataReader places them (detector at
  ``-DetectorOffsetX``, axis at ``-ObjectOffsetX`` along CIL's x, whose
  columns run along -x): in ctbench's frame the detector offset is
  ``u = DetectorOffsetX - ObjectOffsetX * SDD / SID`` (or
  ``DetectorOffsetX - (Top + Bottom) / 2``) and ``v = DetectorOffsetY``,
  kept in ``scanner["detector_offset_u_mm"]`` / ``["detector_offset_v_mm"]``;
  the pipeline uses them with ``detector_offset_u_mm: "file"`` (the default
  ``"auto"`` measures the centre) and a null ``detector_offset_v_mm``;
- ``ObjectRoll`` (deg; without it, a ``CentreOfRotationTop`` unlike
  ``Bottom``: CIL's roll ``-atan2(Top - Bottom, panel height)``): CIL tilts
  its axis by it towards its +x, which is ctbench's -u: the axis image turns
  anticlockwise (u right, v up), the same as the panel turned the other way
  about the central ray, so ``scanner["detector_roll_deg"] = -roll`` (used
  when ``geometry.detector_roll_deg`` is null);
- ``ObjectTilt`` (the axis leaning along the beam): reported as a warning,
  not applied (ctbench's orbit and detector roll cannot express it);
- ``DetectorBinning`` (or ``Binning``) when present: the pixel size keys
  give the unbinned pitch, which is multiplied by it.

Angles: from ``_ctdata.txt`` (or ``<Name>_ctdata.txt``) where present
(three header lines, then one line per projection: number, angle in
degrees, ...), else ``InitialAngle + AngularStep * i``.

Orientation: CIL's reader (cil.io.NikonDataReader) puts pixel 0 of a Nikon
image at the *top right* of the panel seen from the source and reverses the
sense of Nikon's angles against its own; in ctbench's terms that is
``image_seen_from="source", image_columns="left", image_rows="down",
rotation_direction="ccw"``.  That mapping is read from CIL, not measured on
a scanner: the pipeline checks it against the data and warns when the data
fit the other handedness better.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import numpy as np

from .errors import ScanFileError
from .orientation import Orientation
from .scan import RawScan

NIKON_ORIENTATION = Orientation("source", "left", "down", "ccw")


def find_xtekct(path) -> Path | None:
    """``path`` itself if it is a ``.xtekct`` file, or the only one in folder ``path``; else None."""
    p = Path(path)
    if p.is_file():
        return p if p.suffix.lower() == ".xtekct" else None
    if p.is_dir():
        found = sorted(q for q in p.iterdir() if q.suffix.lower() == ".xtekct" and q.is_file())
        return found[0] if len(found) == 1 else None
    return None


def read_xtekct(path) -> dict:
    """The ``[XTekCT]`` section as a dict of strings (keys as written)."""
    path = Path(path)
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str                      # keep the keys' case
    try:
        parser.read_string(path.read_text(errors="replace"))
    except (configparser.Error, OSError) as e:
        raise ScanFileError(path, f"is not a readable .xtekct file ({e})") from None
    if "XTekCT" not in parser:
        raise ScanFileError(path, "has no [XTekCT] section")
    return dict(parser["XTekCT"])


def _num(params: dict, key: str, path: Path, *, default=None, positive=True) -> float:
    raw = params.get(key)
    if raw is None or not raw.strip():
        if default is None:
            raise ScanFileError(path, f"lacks {key}")
        return float(default)
    try:
        v = float(raw)
    except ValueError:
        raise ScanFileError(path, f"{key} must be a number, got {raw!r}") from None
    if not np.isfinite(v) or (positive and v <= 0):
        raise ScanFileError(path, f"{key} must be a positive number, got {raw!r}")
    return v


def _ctdata_angles(folder: Path, name: str, n: int) -> np.ndarray | None:
    for cand in (folder / "_ctdata.txt", folder / f"{name}_ctdata.txt"):
        if not cand.is_file():
            continue
        rows = []
        for line in cand.read_text(errors="replace").splitlines()[3:]:
            parts = line.split()
            if len(parts) < 2:
                continue
            try:
                rows.append((int(parts[0]), float(parts[1])))
            except ValueError:
                raise ScanFileError(cand, f"has a line that is not 'number angle ...': {line!r}") from None
        if len(rows) != n:
            raise ScanFileError(cand, f"lists {len(rows)} angles for {n} projections")
        return np.array([a for _, a in sorted(rows)], dtype=np.float64)
    return None


def read_nikon(path) -> RawScan:
    """A Nikon ``.xtekct`` file (or its folder) -> :class:`RawScan` (counts, cone beam), lazy."""
    import dask.array as da

    from .tiff import read_tiff_folder

    xt = find_xtekct(path)
    if xt is None:
        raise ScanFileError(path, "is not a .xtekct file or a folder with exactly one")
    p = read_xtekct(xt)
    name = p.get("Name", "").strip()
    if not name:
        raise ScanFileError(xt, "lacks Name (the projections are <Name>_0001.tif, ...)")
    n = int(_num(p, "Projections", xt))
    cols, rows = int(_num(p, "DetectorPixelsX", xt)), int(_num(p, "DetectorPixelsY", xt))
    binning = _num(p, "DetectorBinning", xt, default=p.get("Binning") or 1)
    pitch = (_num(p, "DetectorPixelSizeX", xt) * binning, _num(p, "DetectorPixelSizeY", xt) * binning)
    sid, sdd = _num(p, "SrcToObject", xt), _num(p, "SrcToDetector", xt)
    if sdd < sid:
        raise ScanFileError(xt, f"SrcToDetector ({sdd}) is smaller than SrcToObject ({sid})")
    folder = xt.parent / p.get("InputFolderName", "").strip() if p.get("InputFolderName", "").strip() else xt.parent
    pattern = re.compile(rf"^{re.escape(name)}_\d+\.tiff?$", re.IGNORECASE)
    if not any(pattern.match(q.name) for q in folder.iterdir()):
        raise ScanFileError(xt, f"names projections {name}_0001.tif ... but {folder} has none")
    proj = read_tiff_folder(folder, f"{name}_*.tif*")
    if proj.shape[0] != n:
        raise ScanFileError(xt, f"announces {n} projections but {folder} holds {proj.shape[0]} {name}_*.tif files")
    if tuple(proj.shape[1:]) != (rows, cols):
        raise ScanFileError(xt, f"announces {cols} x {rows} pixels (DetectorPixelsX x Y) but the projections are "
                                f"{proj.shape[2]} x {proj.shape[1]}")
    deg = _ctdata_angles(xt.parent, name, n)
    if deg is None:
        deg = _num(p, "InitialAngle", xt, default=0.0, positive=False) + \
            _num(p, "AngularStep", xt, positive=False) * np.arange(n)
    white = _num(p, "WhiteLevel", xt, default=float(np.iinfo(np.uint16).max))
    flats = da.full((1, rows, cols), white, dtype=np.float32)
    extra = {k: float(p[k]) for k in ("DetectorOffsetX", "DetectorOffsetY", "ObjectOffsetX", "CentreOfRotationTop",
                                       "CentreOfRotationBottom", "ObjectRoll", "ObjectTilt")
             if p.get(k, "").strip() and re.fullmatch(r"[-+0-9.eE]+", p[k].strip())}
    scanner = {"source_object_distance_mm": sid, "source_detector_distance_mm": sdd, "format": "Nikon XT H",
               "xtekct": str(xt), "white_level": white, "binning": binning, "nikon": extra}
    scanner.update(_stated_offsets(extra, sid, sdd))
    top, bottom = extra.get("CentreOfRotationTop"), extra.get("CentreOfRotationBottom")
    roll = extra.get("ObjectRoll")
    if roll is None and top is not None and bottom is not None:
        # CIL's axis roll when the file has no ObjectRoll: -atan2(Top - Bottom, panel height)
        roll = float(-np.degrees(np.arctan2(top - bottom, rows * pitch[1])))
    if roll:      # an axis rolled about the central ray is the panel rolled the other way
        scanner["detector_roll_deg"] = -float(roll)
    tilted = {k: extra[k] for k in ("ObjectTilt",) if extra.get(k)}
    if tilted:      # CIL leans its rotation axis by it; ctbench's circular orbit cannot: say so
        scanner["warnings"] = [f"{xt.name}: " + ", ".join(f"{k}={v:g} deg" for k, v in tilted.items()) +
                               " is not applied (the axis is taken as vertical); state geometry.detector_roll_deg "
                               "or calibrate the tilt (ctbench calibrate)"]
    try:
        return RawScan(proj, flats, None, angles=np.radians(deg), pixel_size=pitch, scanner=scanner,
                       source=str(xt), format="nikon", orientation=NIKON_ORIENTATION)
    except ValueError as e:
        raise ScanFileError(xt, str(e)) from None


def _stated_offsets(extra: dict, sid: float, sdd: float) -> dict:
    """The file's detector offsets (mm) in ctbench's frame: u = detector offset - axis offset x magnification.

    ctbench's offset is the panel centre's position along its columns from the ray through the axis; Nikon's
    images are ctbench's (no flip), so DetectorOffsetX adds and the axis offset (at the object, ObjectOffsetX,
    or the mean of the CentreOfRotation values, already at the detector) subtracts.
    """
    if not any(k in extra for k in ("DetectorOffsetX", "DetectorOffsetY", "ObjectOffsetX", "CentreOfRotationTop")):
        return {}
    if "ObjectOffsetX" in extra:
        axis_at_detector = extra["ObjectOffsetX"] * sdd / sid
    else:
        top = extra.get("CentreOfRotationTop", 0.0)
        axis_at_detector = 0.5 * (top + extra.get("CentreOfRotationBottom", top))
    return {"detector_offset_u_mm": extra.get("DetectorOffsetX", 0.0) - axis_at_detector,
            "detector_offset_v_mm": extra.get("DetectorOffsetY", 0.0)}
