"""Bruker SkyScan scans: a ``<prefix>.log`` parameter file beside TIFF projections ``<prefix>0000.tif`` ...; lazy.

The ``.log`` file is INI-like text (``[System]``, ``[Acquisition]``,
``[Reconstruction]``, ``key=value`` with spaces around values).  The keys used:

- ``Filename Prefix``, ``Number of Files`` (a scan of ``range`` degrees in
  steps of ``step`` has ``range / step + 1`` files: both end views),
  ``Number of Rows`` / ``Columns``;
- ``Object to Source (mm)`` (SID), ``Camera to Source (mm)`` (SDD);
- ``Image Pixel Size (um)``: the pixel at the *object* (binning included),
  so the detector pitch is it times SDD / SID; without it,
  ``Camera Pixel Size (um)`` (``[System]``) times ``Camera binning`` (``2x2``);
- ``CameraXYRatio`` (``Camera X/Y Ratio`` in newer logs): the row pitch is
  the column pitch times it, as TIGRE's BrukerDataLoader reads it;
- ``Rotation Step (deg)``; angles ``step * i`` (negated for a ``"cw"`` scan: ctbench's angles);
- ``Optical Axis (line)``: the detector row the central ray hits, giving the
  vertical detector offset ``(line - (rows - 1) / 2) * dv`` (``scanner["detector_offset_v_mm"]``, used
  when the recon config leaves ``detector_offset_v_mm`` null);
- ``Rotation Direction`` (``CC`` / ``CW``, the stage turning the object seen
  from above): the source turns the other way about the object, so ``CC`` is
  ctbench's ``"cw"``; absent: ``"auto"``.

Per-view shifts: the scanner's list of per-projection shifts (thermal
drift and stage movement measured against a reference scan, the "TS"
correction NRecon applies), ``<prefix>_TS.csv`` beside the log (or the file
named by ``TS modified according to``), is read with
:func:`ctbench.io.view_shifts.read_skyscan_shift_list` and applied by the
pipeline as the shifts that align each view (:mod:`ctbench.io.view_shifts`).
``Random Movement`` (``ON (n)``: the stage moved by up to ``n`` pixels
between views against ring artefacts) is read; when it is ON and no list
is found the scan carries a warning (its views cannot be aligned).
``Image Rotation`` (degrees, the in-plane turn NRecon applies) is kept in
``scanner["image_rotation_deg"]`` and read as the panel's roll in the stored
images' own sense (u towards v); the columns flip into ctbench's frame, which
reverses the sense: ``scanner["detector_roll_deg"] = -Image Rotation``, used
when ``geometry.detector_roll_deg`` is null (the default).  Bruker does not
document its sign: the scan carries a warning saying so.
``[Reconstruction] Postalignment`` (NRecon's whole-scan horizontal shift,
pixels) is kept in ``scanner["postalignment_px"]`` and, read as the rotation
axis imaged at column ``(cols - 1) / 2 + Postalignment`` of the stored images
(its sign is not documented by Bruker nor read by the open readers), gives
``scanner["detector_offset_u_mm"]`` in ctbench's frame (the images' columns
are flipped into it, so ``+Postalignment x pitch``), used with
``detector_offset_u_mm: "file"`` (the default ``"auto"`` measures the centre).

The projections are flat-field corrected by the scanner (``Flat Field
Correction=ON``), so their flat field is the full scale of their type (65535
for 16-bit files) unless ``flats=`` gives one.  The images are taken to be
in the camera convention (seen from the source, columns right, rows down);
the pipeline checks that against the data.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .errors import ScanFileError
from .orientation import Orientation
from .scan import RawScan
from .view_shifts import KEY as VIEW_SHIFTS
from .view_shifts import read_skyscan_shift_list, shifts_entry


def find_skyscan_log(path) -> Path | None:
    """``path`` if it is a SkyScan ``.log`` file, or the only one in folder ``path`` that is; else None."""
    p = Path(path)
    cands = [p] if p.is_file() else (sorted(p.glob("*.log")) if p.is_dir() else [])
    found = []
    for q in cands:
        try:
            head = q.read_text(errors="replace")[:4096]
        except OSError:
            continue
        if q.suffix.lower() == ".log" and "[Acquisition]" in head and "Filename Prefix" in head:
            found.append(q)
    return found[0] if len(found) == 1 else None


def read_skyscan_log(path) -> dict:
    """``{"Section/Key": "value"}`` and ``{"Key": "value"}`` (keys as written, values stripped)."""
    out: dict = {}
    section = ""
    for line in Path(path).read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif "=" in line:
            k, v = line.split("=", 1)
            out[f"{section}/{k.strip()}"] = v.strip()
            out.setdefault(k.strip(), v.strip())
    return out


def _get(d: dict, key: str):
    for k, v in d.items():            # SkyScan versions differ in capitals ("Number Of Files")
        if k.lower() == key.lower():
            return v
    return None


def _num(d: dict, key: str, path: Path, *, default=None, positive=True) -> float:
    raw = _get(d, key)
    if raw is None or not raw.strip():
        if default is None:
            raise ScanFileError(path, f"lacks '{key}'")
        return float(default)
    m = re.match(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)", raw)
    if m is None:
        raise ScanFileError(path, f"'{key}' must be a number, got {raw!r}")
    v = float(m.group(1))
    if positive and not v > 0:
        raise ScanFileError(path, f"'{key}' must be a positive number, got {raw!r}")
    return v


def read_bruker(path, *, flats=None) -> RawScan:
    """A SkyScan ``.log`` (or its folder) -> :class:`RawScan` (counts, cone beam), lazy."""
    import dask.array as da

    from .tiff import read_tiff_folder

    log = find_skyscan_log(path)
    if log is None:
        raise ScanFileError(path, "is not a SkyScan .log file (with [Acquisition] and 'Filename Prefix') or a "
                                  "folder with exactly one")
    d = read_skyscan_log(log)
    prefix = (_get(d, "Filename Prefix") or "").strip()
    if not prefix:
        raise ScanFileError(log, "lacks 'Filename Prefix'")
    n = int(_num(d, "Number of Files", log))
    rows, cols = int(_num(d, "Number of Rows", log)), int(_num(d, "Number of Columns", log))
    sid, sdd = _num(d, "Object to Source (mm)", log), _num(d, "Camera to Source (mm)", log)
    if sdd < sid:
        raise ScanFileError(log, f"'Camera to Source (mm)' ({sdd}) is smaller than 'Object to Source (mm)' ({sid})")
    img_um = _get(d, "Image Pixel Size (um)")
    if img_um is not None:
        pitch_mm = _num(d, "Image Pixel Size (um)", log) * 1e-3 * sdd / sid
    else:
        b = re.match(r"\s*(\d+)", _get(d, "Camera binning") or "1")
        pitch_mm = _num(d, "Camera Pixel Size (um)", log) * 1e-3 * (int(b.group(1)) if b else 1)
    # The pixel's height over its width (TIGRE's reading: dv = du x ratio); newer logs write "Camera X/Y Ratio".
    xy = "CameraXYRatio" if _get(d, "CameraXYRatio") is not None else "Camera X/Y Ratio"
    ratio = _num(d, xy, log, default=1.0)
    step = _num(d, "Rotation Step (deg)", log)
    direction = (_get(d, "Rotation Direction") or "").strip().upper()
    rotation = {"CC": "cw", "CCW": "cw", "CW": "ccw"}.get(direction, "auto")
    files = [q for q in log.parent.iterdir() if re.fullmatch(rf"{re.escape(prefix)}\d+\.tiff?", q.name, re.I)]
    if len(files) != n:
        raise ScanFileError(log, f"announces {n} files but {log.parent} holds {len(files)} {prefix}NNNN.tif files")
    proj = read_tiff_folder(log.parent, f"{prefix}[0-9]*.tif*")
    if tuple(proj.shape[1:]) != (rows, cols):
        raise ScanFileError(log, f"announces {cols} x {rows} pixels but the projections are "
                                 f"{proj.shape[2]} x {proj.shape[1]}")
    if flats is None:
        full = float(np.iinfo(proj.dtype).max) if np.issubdtype(proj.dtype, np.integer) else 1.0
        flats = da.full((1, rows, cols), full, dtype=np.float32)
    scanner = {"source_object_distance_mm": sid, "source_detector_distance_mm": sdd, "format": "Bruker SkyScan",
               "log": str(log), "rotation_step_deg": step}
    _per_view_shifts(d, log, prefix, n, scanner)
    if "postalignment_px" in scanner:
        # axis at stored column centre + P; the "right" columns flip into ctbench's, where that is offset +P
        scanner["detector_offset_u_mm"] = scanner["postalignment_px"] * pitch_mm
    turned = _get(d, "Image Rotation")
    if turned is not None and _num(d, "Image Rotation", log, positive=False):
        # NRecon turns the images by it (degrees); the stored columns flip into ctbench's, reversing its sense
        scanner["image_rotation_deg"] = _num(d, "Image Rotation", log, positive=False)
        scanner["detector_roll_deg"] = -scanner["image_rotation_deg"]
        scanner.setdefault("warnings", []).append(
            f"{log.name}: Image Rotation={scanner['image_rotation_deg']:g} deg is applied as detector roll "
            f"{scanner['detector_roll_deg']:g} deg; Bruker does not document its sign: if the slices blur, state "
            "geometry.detector_roll_deg (0 ignores it) or calibrate the roll")
    axis = _get(d, "Optical Axis (line)")
    if axis is not None:
        scanner["detector_offset_v_mm"] = (_num(d, "Optical Axis (line)", log, positive=False)
                                           - (rows - 1) / 2) * pitch_mm * ratio
    try:
        # RawScan angles are ctbench's for the stated rotation: decreasing for "cw".
        sign = -1.0 if rotation == "cw" else 1.0
        return RawScan(proj, flats, None, angles=np.radians(sign * step * np.arange(n)),
                       pixel_size=(pitch_mm, pitch_mm * ratio),
                       scanner=scanner, source=str(log), format="bruker",
                       orientation=Orientation("source", "right", "down", rotation))
    except ValueError as e:
        raise ScanFileError(log, str(e)) from None


def _per_view_shifts(d: dict, log: Path, prefix: str, n: int, scanner: dict) -> None:
    """Random movement, post-alignment and the per-view shift list of a SkyScan log into ``scanner``."""
    moved = re.match(r"\s*(ON|OFF)\s*(?:\((\d+(?:\.\d+)?)\))?", (_get(d, "Random Movement") or "").upper())
    if moved:
        scanner["random_movement"] = {"on": moved.group(1) == "ON",
                                      "max_px": None if moved.group(2) is None else float(moved.group(2))}
    post = _get(d, "Postalignment")
    if post is not None and post.strip():
        scanner["postalignment_px"] = _num(d, "Postalignment", log, positive=False)
    named = (_get(d, "TS modified according to") or "").strip()
    # The log names the list by the scanner PC's (Windows) path: look for its file name beside the log.
    cands = ([log.parent / re.split(r"[\\/]", named)[-1]] if named else []) + [log.parent / f"{prefix}_TS.csv"]
    found = next((q for q in cands if q.is_file()), None)
    if found is not None:
        x, y = read_skyscan_shift_list(found, n)
        scanner[VIEW_SHIFTS] = shifts_entry(x, y, n, found.name, log)
    elif scanner.get("random_movement", {}).get("on"):
        scanner.setdefault("warnings", []).append(
            f"{log.name}: Random Movement is ON but no per-view shift list ({prefix}_TS.csv) is beside it: the "
            "views cannot be aligned and the reconstruction will be blurred; copy the list from the scanner")
