"""Nikon XT H scans: a ``.xtekct`` parameter file beside TIFF projections; lazy.

The ``.xtekct`` file is INI text with one ``[XTekCT]`` section.  The keys
used (lengths in mm, angles in degrees; docs/SCANS.md has the table with the
source of each rule):

- ``Name`` and ``InputSeparator`` (default ``_``): the projections are
  ``<Name><sep>0001.tif`` ... (matched exactly: glob characters in the name
  are literal, and a file that only looks like a projection is never a view),
  in ``InputFolderName`` relative to the file (default: its folder; a Windows
  path that is not there falls back to the files beside the ``.xtekct``);
- ``Projections``, ``DetectorPixelsX`` / ``Y`` (whole numbers),
  ``DetectorPixelSizeX`` / ``Y``, ``SrcToObject``, ``SrcToDetector``,
  ``InitialAngle``, ``AngularStep``, ``WhiteLevel`` (the open-beam level of the
  already shading-corrected projections: their flat field);
- ``DetectorOffsetX`` / ``Y``, ``ObjectOffsetX`` or ``CentreOfRotationTop`` /
  ``Bottom``: the stated offsets, placed as CIL's NikonDataReader places them
  (``scanner["detector_offset_u_mm"]`` / ``["detector_offset_v_mm"]``);
- ``ObjectRoll`` (or the roll CIL derives from ``CentreOfRotationTop`` unlike
  ``Bottom``): ``scanner["detector_roll_deg"] = -roll``, at most 45 degrees;
- ``ObjectTilt``: a warning, not applied;
- ``DetectorBinning`` (or ``Binning``) when present: the pixel size keys give
  the unbinned pitch, which is multiplied by it.

Angles: from ``_ctdata.txt`` (or ``<Name>_ctdata.txt``) where present
(three header lines, then one line per projection: number, angle in
degrees, ...), else ``InitialAngle + AngularStep * i``; taken as ctbench's
angles (CIL's reading, its ``-angle - InitialAngle + 180`` in its own frame).

Orientation: CIL puts pixel 0 of a Nikon image at the *top right* of the
panel seen from the source: ``image_seen_from="source", image_columns="left",
image_rows="down"``, which is ctbench's own image order; the rotation is the
sense of the angles.  The pipeline checks it against the data.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import numpy as np

from .errors import ScanFileError, read_text
from .fields import Provenance, count, max_views, number, roll, rotation_of
from .orientation import Orientation
from .scan import RawScan

NIKON_ORIENTATION = Orientation("source", "left", "down", "ccw")
_OPTIONAL = ("DetectorOffsetX", "DetectorOffsetY", "ObjectOffsetX", "CentreOfRotationTop", "CentreOfRotationBottom",
             "ObjectRoll", "ObjectTilt")


def find_xtekct(path) -> Path | None:
    """``path`` itself if it is a ``.xtekct`` file, or the only one in folder ``path``; else None.

    A folder with several is an error naming them (which one to read cannot be guessed)."""
    p = Path(path)
    if p.is_file():
        return p if p.suffix.lower() == ".xtekct" else None
    if p.is_dir():
        found = sorted(q for q in p.iterdir() if q.suffix.lower() == ".xtekct")
        if len(found) > 1:
            raise ScanFileError(p, f"holds {len(found)} .xtekct files ({', '.join(q.name for q in found)}): give "
                                   "the one to read as the input path")
        return found[0] if found else None
    return None


def read_xtekct(path) -> dict:
    """The ``[XTekCT]`` section as a dict of strings (keys as written); the file read through the guarded opener."""
    path = Path(path)
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str                      # keep the keys' case
    try:
        parser.read_string(read_text(path))
    except configparser.Error as e:
        raise ScanFileError(path, f"is not a readable .xtekct file ({str(e).splitlines()[0]})") from None
    if "XTekCT" not in parser:
        raise ScanFileError(path, "has no [XTekCT] section")
    return dict(parser["XTekCT"])


def _value(params: dict, key: str) -> str | None:
    raw = params.get(key)
    return raw.strip() if raw is not None and raw.strip() else None


def _num(params: dict, key: str, path: Path, prov: Provenance | None = None, *, default=None, note="", **kw):
    raw = _value(params, key)
    if raw is None:
        if default is None:
            raise ScanFileError(path, f"lacks {key}")
        if prov is not None:
            prov.default(key, default, note)
        return float(default)
    return number(raw, key, path, **kw)


def _ctdata_angles(folder: Path, name: str, n: int) -> tuple[np.ndarray, Path] | None:
    for cand in (folder / "_ctdata.txt", folder / f"{name}_ctdata.txt"):
        if not cand.exists():
            continue
        rows = []
        for line in read_text(cand).splitlines()[3:]:
            parts = line.split()
            if len(parts) < 2:
                continue
            try:
                k = int(parts[0])
            except ValueError:
                raise ScanFileError(cand, f"has a line that is not 'number angle ...': {line.strip()!r}") from None
            rows.append((k, number(parts[1], f"the angle of projection {k}", cand)))
        if len(rows) != n:
            raise ScanFileError(cand, f"lists {len(rows)} angles for {n} projections (Projections={n})")
        numbers = sorted(k for k, _ in rows)
        if numbers != list(range(numbers[0], numbers[0] + n)):
            raise ScanFileError(cand, "numbers its projections with gaps or repeats; expected 1 ... "
                                      f"{n} once each")
        return np.array([a for _, a in sorted(rows)], dtype=np.float64), cand
    return None


def _projection_folder(xt: Path, p: dict, name: str, sep: str, prov: Provenance) -> tuple[Path, list[Path]]:
    """The folder holding the projections and the files named ``<Name><sep>NNNN.tif``, sorted by number."""
    named = _value(p, "InputFolderName")
    beside = xt.parent
    cands = []
    if named:
        rel = named.replace("\\", "/")
        if not (re.match(r"^[A-Za-z]:", rel) or rel.startswith("/")):     # a path on the scanner PC is not here
            cands.append(beside / rel)
    cands.append(beside)
    pattern = re.compile(rf"^{re.escape(name)}{re.escape(sep)}(\d+)\.tiff?$", re.IGNORECASE)
    for folder in cands:
        if not folder.is_dir():
            continue
        hits = sorted(((int(m.group(1)), q) for q in folder.iterdir() if (m := pattern.match(q.name))),
                      key=lambda t: t[0])
        if hits:
            if not named:
                prov.default("projection_folder", str(folder), "the .xtekct's folder (no InputFolderName)")
            elif folder == cands[0]:
                prov.field("projection_folder", str(folder), "InputFolderName")
            else:
                prov.field("projection_folder", str(folder), "InputFolderName",
                           note=f"{named!r} holds no projections here; the ones beside the .xtekct are read")
            return folder, [q for _, q in hits]
    where = " or ".join(str(c) for c in cands)
    raise ScanFileError(xt, f"names projections {name}{sep}0001.tif ... (Name, InputFolderName) but {where} has none")


def read_nikon(path) -> RawScan:
    """A Nikon ``.xtekct`` file (or its folder) -> :class:`RawScan` (counts, cone beam), lazy."""
    import dask.array as da

    from .tiff import read_tiff_files

    xt = find_xtekct(path)
    if xt is None:
        raise ScanFileError(path, "is not a .xtekct file or a folder with exactly one")
    p = read_xtekct(xt)
    prov = Provenance(xt)
    name = _value(p, "Name")
    if not name:
        raise ScanFileError(xt, "lacks Name (the projections are <Name>_0001.tif, ...)")
    sep = p.get("InputSeparator", "_").strip() if "InputSeparator" in p else "_"
    n = count(_value(p, "Projections") or _missing(xt, "Projections"), "Projections", xt, limit=max_views())
    cols = count(_value(p, "DetectorPixelsX") or _missing(xt, "DetectorPixelsX"), "DetectorPixelsX", xt)
    rows = count(_value(p, "DetectorPixelsY") or _missing(xt, "DetectorPixelsY"), "DetectorPixelsY", xt)
    bkey = "DetectorBinning" if _value(p, "DetectorBinning") else "Binning"
    binning = _num(p, bkey, xt, prov, default=1.0, note="no DetectorBinning key: the pixel size keys are the "
                   "stored images' pitch (CIL, TIGRE)", positive=True, whole=True)
    if _value(p, bkey):
        prov.field("binning", binning, bkey)
    pitch = (_num(p, "DetectorPixelSizeX", xt, positive=True) * binning,
             _num(p, "DetectorPixelSizeY", xt, positive=True) * binning)
    prov.derived("pixel_size_mm", pitch, "DetectorPixelSizeX, DetectorPixelSizeY" +
                 (f" x {bkey}" if binning != 1 else ""))
    sid, sdd = _num(p, "SrcToObject", xt, positive=True), _num(p, "SrcToDetector", xt, positive=True)
    if sdd < sid:
        raise ScanFileError(xt, f"SrcToDetector ({sdd}) is smaller than SrcToObject ({sid})")
    prov.field("sid_mm", sid, "SrcToObject")
    prov.field("sdd_mm", sdd, "SrcToDetector")
    folder, files = _projection_folder(xt, p, name, sep, prov)
    if len(files) != n:
        numbers = [int(re.search(r"(\d+)\.tiff?$", q.name, re.I).group(1)) for q in files]
        extra = [q.name for q, k in zip(files, numbers) if not 1 <= k <= n]
        detail = f"; beyond Projections={n}: {', '.join(extra[:5])}" if extra else ""
        raise ScanFileError(xt, f"announces {n} projections (Projections) but {folder} holds {len(files)} "
                                f"{name}{sep}NNNN.tif files{detail}")
    proj = read_tiff_files(files)
    if tuple(proj.shape[1:]) != (rows, cols):
        raise ScanFileError(xt, f"announces {cols} x {rows} pixels (DetectorPixelsX x Y) but the projections are "
                                f"{proj.shape[2]} x {proj.shape[1]}")
    measured = _ctdata_angles(xt.parent, name, n)
    if measured is not None:
        deg, ctdata = measured
        prov.field("angles", f"{n} angles", ctdata.name, file=ctdata,
                   note="measured angles, as ctbench angles (TIGRE reads them; CIL ignores them)")
    else:
        init = _num(p, "InitialAngle", xt, prov, default=0.0, note="no InitialAngle: 0")
        step = _num(p, "AngularStep", xt)
        deg = init + step * np.arange(n)
        prov.derived("angles", f"{n} angles", "InitialAngle + AngularStep x i",
                     note="as ctbench angles (CIL's reading: its -angle - InitialAngle + 180 in its frame)")
    white = _num(p, "WhiteLevel", xt, prov, default=float(np.iinfo(np.uint16).max),
                 note="no WhiteLevel: the 16-bit full scale", positive=True)
    if _value(p, "WhiteLevel"):
        prov.field("flat", white, "WhiteLevel", note="the shading-corrected images' open-beam level (CIL, TIGRE)")
    flats = da.full((1, rows, cols), white, dtype=np.float32)
    extra = {k: number(_value(p, k), k, xt) for k in _OPTIONAL if _value(p, k) is not None}
    scanner = {"source_object_distance_mm": sid, "source_detector_distance_mm": sdd, "format": "Nikon XT H",
               "xtekct": str(xt), "white_level": white, "binning": binning, "nikon": extra}
    scanner.update(_stated_offsets(extra, sid, sdd, prov))
    top, bottom = extra.get("CentreOfRotationTop"), extra.get("CentreOfRotationBottom")
    r = None
    if "ObjectRoll" in extra:
        r = roll(_value(p, "ObjectRoll"), "ObjectRoll", xt)
        how = "ObjectRoll"
    elif top is not None and bottom is not None:
        # CIL's axis roll when the file has no ObjectRoll: -atan2(Top - Bottom, panel height)
        r = roll(float(-np.degrees(np.arctan2(top - bottom, rows * pitch[1]))),
                 "the axis roll of CentreOfRotationTop/Bottom", xt)
        how = "CentreOfRotationTop, CentreOfRotationBottom"
    if r:      # an axis rolled about the central ray is the panel rolled the other way
        scanner["detector_roll_deg"] = -float(r)
        prov.derived("detector_roll_deg", -float(r), how, note="minus the axis roll (CIL turns its axis by it)")
    tilted = {k: extra[k] for k in ("ObjectTilt",) if extra.get(k)}
    if tilted:      # CIL leans its rotation axis by it; ctbench's circular orbit cannot: say so
        scanner["warnings"] = [f"{xt.name}: " + ", ".join(f"{k}={v:g} deg" for k, v in tilted.items()) +
                               " is not applied (the axis is taken as vertical); state geometry.detector_roll_deg "
                               "or calibrate the tilt (ctbench calibrate)"]
    angles = np.radians(deg)
    orientation = NIKON_ORIENTATION.replace(rotation=rotation_of(angles))
    prov.default("orientation", orientation.to_dict(), "CIL's NikonDataReader: pixel 0 at the top right of the "
                                                       "panel seen from the source; the rotation is the angles' sense")
    prov.default("values", "counts", "shading-corrected counts, flat field WhiteLevel")
    try:
        return RawScan(proj, flats, None, angles=angles, pixel_size=pitch, scanner=scanner,
                       source=str(xt), format="nikon", orientation=orientation, provenance=prov.as_dict())
    except ValueError as e:
        raise ScanFileError(xt, str(e)) from None


def _missing(path: Path, key: str):
    raise ScanFileError(path, f"lacks {key}")


def _stated_offsets(extra: dict, sid: float, sdd: float, prov: Provenance) -> dict:
    """The file's detector offsets (mm) in ctbench's frame: u = detector offset - axis offset x magnification.

    ctbench's offset is the panel centre's position along its columns from the ray through the axis; Nikon's
    images are ctbench's (no flip), so DetectorOffsetX adds and the axis offset (at the object, ObjectOffsetX,
    or the mean of the CentreOfRotation values, already at the detector) subtracts.
    """
    if not any(k in extra for k in ("DetectorOffsetX", "DetectorOffsetY", "ObjectOffsetX", "CentreOfRotationTop")):
        return {}
    if "ObjectOffsetX" in extra:
        axis_at_detector = extra["ObjectOffsetX"] * sdd / sid
        how = "DetectorOffsetX - ObjectOffsetX x SrcToDetector / SrcToObject"
    else:
        top = extra.get("CentreOfRotationTop", 0.0)
        axis_at_detector = 0.5 * (top + extra.get("CentreOfRotationBottom", top))
        how = "DetectorOffsetX - (CentreOfRotationTop + CentreOfRotationBottom) / 2"
    u, v = extra.get("DetectorOffsetX", 0.0) - axis_at_detector, extra.get("DetectorOffsetY", 0.0)
    prov.derived("detector_offset_u_mm", u, how, note="used with geometry.detector_offset_u_mm 'file'")
    prov.derived("detector_offset_v_mm", v, "DetectorOffsetY")
    return {"detector_offset_u_mm": u, "detector_offset_v_mm": v}
