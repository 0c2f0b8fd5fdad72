"""Lab-scanner folders: TIFF projections, flats and darks beside a small JSON of the scanner's parameters.

This is how lab cone-beam scanners typically deliver a scan (names vary by
vendor; ctbench reads this documented layout, docs/SCANS.md)::

    scan/
      scan.json          {"geometry": {"source_object_distance_mm": 200.0,
                                       "source_detector_distance_mm": 400.0,
                                       "detector_pixel_size_mm": [1.0, 1.0],
                                       "rotation_start_deg": 0.0, "rotation_range_deg": 360.0,
                                       "rotation_direction": "ccw", "image_seen_from": "source"},
                          "acquisition": {"n_projections": 120, ...},
                          "files": {"projections": "projections/*.tif",
                                    "flats": "flats/*.tif", "darks": "darks/*.tif"}}
      projections/proj_0000.tif ...
      flats/flat_00.tif ...
      darks/dark_00.tif ...

The detector offset (centre of rotation) is not part of the file: lab
scanners rarely know it to a fraction of a pixel; the centre finder does.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .errors import ScanFileError, check_input, read_json_any, read_json_object
from .fields import Provenance
from .orientation import CTBENCH, FILE_KEYS, Orientation
from .scan import RawScan
from .tiff import read_tiff_folder

SCANNER_JSON = "scan.json"


def find_scanner_json(folder) -> Path | None:
    """``folder/scan.json``, or the folder's only JSON file that has a "files" section; None if none."""
    folder = Path(folder)
    p = folder / SCANNER_JSON
    if os.path.lexists(p):
        check_input(p)   # a FIFO or device named scan.json is an error, never read (it would block or not end)
        return p
    cands = []
    for q in folder.glob("*.json"):
        try:
            doc = read_json_any(q)    # regular files within the whole-read bound only
        except ScanFileError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("files"), dict):
            cands.append(q)
    return cands[0] if len(cands) == 1 else None


def _whole(v) -> bool:
    """A JSON whole number (not a bool, string, fraction or inf)."""
    return (not isinstance(v, bool) and isinstance(v, (int, float)) and np.isfinite(v) and v == int(v))


def _number(d: dict, key: str, where: Path, *, positive=True, default=None):
    if key not in d:
        if default is not None:
            return default
        raise ScanFileError(where, f"lacks geometry.{key}")
    if isinstance(d[key], bool) or not isinstance(d[key], (int, float)):   # "200" or true is not a length
        raise ScanFileError(where, f"geometry.{key} must be a number, got {d[key]!r}")
    v = float(d[key])
    if not np.isfinite(v) or (positive and v <= 0):
        raise ScanFileError(where, f"geometry.{key} must be a positive number, got {d[key]!r}")
    return v


def read_scanner_folder(folder) -> RawScan:
    """Open a lab-scanner folder (see the module doc) lazily."""
    folder = Path(folder)
    jpath = find_scanner_json(folder)
    if jpath is None:
        raise ScanFileError(folder, f"has no {SCANNER_JSON} (the scanner's parameters)")
    doc = read_json_object(jpath)
    geo = doc.get("geometry", {})
    files = doc.get("files", {})
    if not isinstance(geo, dict) or not isinstance(files, dict):
        raise ScanFileError(jpath, "'geometry' and 'files' must be JSON objects")
    if "projections" not in files:
        raise ScanFileError(jpath, "lacks files.projections (a glob such as 'projections/*.tif')")

    def stack(key):
        pattern = files.get(key)
        if not pattern:
            return None
        if not isinstance(pattern, str):
            raise ScanFileError(jpath, f"files.{key} must be a glob such as '{key}/*.tif', got {pattern!r}")
        sub = Path(pattern)
        # The scan's images are its own files: a glob or link leading out of the folder is refused.
        return read_tiff_folder(folder / sub.parent, sub.name, root=folder)

    proj = stack("projections")
    n = int(proj.shape[0])
    acq = doc.get("acquisition", {})
    if not isinstance(acq, dict):
        raise ScanFileError(jpath, "'acquisition' must be a JSON object")
    n_expected = acq.get("n_projections")
    if n_expected is not None and not _whole(n_expected):
        raise ScanFileError(jpath, f"acquisition.n_projections must be a whole number, got {n_expected!r}")
    if n_expected is not None and int(n_expected) != n:
        raise ScanFileError(jpath, f"announces {n_expected} projections but {files['projections']} matches {n} files")
    pitch = geo.get("detector_pixel_size_mm")
    if pitch is not None:
        if isinstance(pitch, bool) or not isinstance(pitch, (int, float, list)):
            raise ScanFileError(jpath, f"geometry.detector_pixel_size_mm must be a length or [du, dv] in mm, "
                                       f"got {pitch!r}")
        pitch = (pitch, pitch) if isinstance(pitch, (int, float)) else tuple(pitch)
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in pitch):
            raise ScanFileError(jpath, f"geometry.detector_pixel_size_mm must hold numbers, got {pitch!r}")
    start = _number(geo, "rotation_start_deg", jpath, positive=False, default=0.0)
    rng = _number(geo, "rotation_range_deg", jpath, default=360.0)
    try:   # orientation fields: what the file does not state stays "auto" (docs/SCANS.md, "Orientation")
        orientation = Orientation.from_dict({k: geo.get(k) for k in FILE_KEYS.values()}, "geometry")
    except ValueError as e:
        raise ScanFileError(jpath, str(e)) from None
    direction = orientation.rotation
    sign = -1.0 if direction == "cw" else 1.0       # "auto": as ccw until the pipeline decides
    angles = np.radians(start + sign * rng * np.arange(n) / n)
    scanner = {"source_object_distance_mm": _number(geo, "source_object_distance_mm", jpath),
               "source_detector_distance_mm": _number(geo, "source_detector_distance_mm", jpath),
               "rotation_range_deg": rng, "rotation_start_deg": start, "rotation_direction": direction,
               "json": str(jpath), **{k: v for k, v in doc.items() if k not in ("geometry", "files")}}
    if scanner["source_detector_distance_mm"] < scanner["source_object_distance_mm"]:
        raise ScanFileError(jpath, "geometry.source_detector_distance_mm is smaller than "
                                   "source_object_distance_mm")
    prov = Provenance(jpath)
    prov.field("sid_mm", scanner["source_object_distance_mm"], "geometry.source_object_distance_mm")
    prov.field("sdd_mm", scanner["source_detector_distance_mm"], "geometry.source_detector_distance_mm")
    if pitch is not None:
        prov.field("pixel_size_mm", list(pitch), "geometry.detector_pixel_size_mm")
    prov.derived("angles", f"{n} angles", "geometry.rotation_start_deg + rotation_range_deg x i / n"
                 + (" (reversed: cw)" if direction == "cw" else ""))
    stated = [k for k in FILE_KEYS.values() if geo.get(k) is not None]
    if stated:
        prov.field("orientation", orientation.to_dict(), ", ".join(f"geometry.{k}" for k in stated))
    else:
        prov.default("orientation", orientation.to_dict(), "scan.json states none: decided from the data")
    for key in ("flats", "darks"):
        if files.get(key):
            prov.field(key[:-1], files[key], f"files.{key}")
    try:
        return RawScan(proj, stack("flats"), stack("darks"), angles=angles, pixel_size=pitch, scanner=scanner,
                       source=str(folder), format="scanner", orientation=orientation, provenance=prov.as_dict())
    except ValueError as e:
        raise ScanFileError(jpath, str(e)) from None


def scanner_json(*, sid: float, sdd: float, pixel_size, n_projections: int, rotation_range_deg: float = 360.0,
                 rotation_start_deg: float = 0.0, acquisition: dict | None = None, scanner: str = "",
                 orientation: Orientation | None = CTBENCH) -> dict:
    """The JSON document of a lab-scanner folder with the standard file layout.

    ``orientation``: the fields to state (those "auto" are left out; None states none).
    """
    stated = {} if orientation is None else {k: v for k, v in orientation.to_dict().items() if v != "auto"}
    return {"scanner": scanner,
            "geometry": {"source_object_distance_mm": float(sid), "source_detector_distance_mm": float(sdd),
                         "detector_pixel_size_mm": [float(p) for p in pixel_size],
                         "rotation_start_deg": float(rotation_start_deg),
                         "rotation_range_deg": float(rotation_range_deg), **stated},
            "acquisition": {"n_projections": int(n_projections), **(acquisition or {})},
            "files": {"projections": "projections/*.tif", "flats": "flats/*.tif", "darks": "darks/*.tif"}}
