"""Bruker SkyScan scans: a ``<prefix>.log`` parameter file beside TIFF projections ``<prefix>0000.tif`` ...; lazy.

The ``.log`` file is INI-like text (``[System]``, ``[Acquisition]``,
``[Reconstruction]``, ``key=value`` with spaces around values, a Windows code
page).  The keys used, read as TIGRE's BrukerDataLoader reads them where it
reads them (docs/SCANS.md has the table with the source of each rule):

- ``Filename Prefix``, ``Number of Files``, ``Number of Rows`` / ``Columns``
  (whole numbers); the projections are ``<prefix><digits>.tif`` beside the log
  (matched exactly; the log's ``Data Directory`` is the scanner PC's);
- ``Object to Source (mm)`` (SID), ``Camera to Source (mm)`` (SDD);
- ``Image Pixel Size (um)``: the pixel at the *object* (binning included),
  so the detector pitch is it times SDD / SID; without it,
  ``Camera Pixel Size (um)`` times ``Camera binning`` (``2x2``);
- ``CameraXYRatio`` (``Camera X/Y Ratio``): the row pitch is the column pitch
  times it;
- ``Rotation Step (deg)`` and ``Rotation Direction``: TIGRE takes the angles
  ``step * i`` in its frame, which is ctbench's ``"ccw"`` for the camera
  images below, and reads no direction; ctbench reads ``CC`` (what the
  scanners write) and no field as that, and ``CW`` as the reverse;
- ``Optical Axis (line)``: the row the central ray hits, counted from the top
  edge as TIGRE counts it: the vertical detector offset is
  ``(line - rows / 2) * dv`` (``scanner["detector_offset_v_mm"]``);
- ``Reference Intensity``: the open-beam level of the flat-field corrected
  projections, their flat field (without it, the full scale ``2^Depth (bits)``
  as TIGRE takes it; 1.0 for floating-point images);
- ``Image Rotation`` (degrees): the panel's roll in the stored images,
  ``scanner["detector_roll_deg"] = -Image Rotation`` (a warning: Bruker does
  not document its sign), at most 45 degrees;
- ``[Reconstruction] Postalignment`` (pixels): the axis at stored column
  ``(cols - 1) / 2 + Postalignment``: ``scanner["detector_offset_u_mm"]``,
  used with ``detector_offset_u_mm: "file"``;
- ``<prefix>_TS.csv`` (or the file ``TS modified according to`` names): the
  per-view shifts, read as TIGRE reads them
  (:func:`ctbench.io.view_shifts.read_skyscan_shift_list`); ``Random
  Movement`` ON without a list is a warning.

The images are in the camera convention (seen from the source, columns to
the right, rows down), as TIGRE uses them; the pipeline checks the handedness
against the data.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .errors import ScanFileError, read_head, read_text
from .fields import Provenance, count, max_views, number, roll
from .orientation import Orientation
from .scan import RawScan
from .view_shifts import KEY as VIEW_SHIFTS
from .view_shifts import read_skyscan_shift_list, shifts_entry

_HEAD = 16384


def _looks_like_log(q: Path) -> bool:
    """Whether ``q`` is a readable ``.log`` whose start reads like a SkyScan acquisition log (a FIFO, device or
    unreadable file is not, and is never read)."""
    if q.suffix.lower() != ".log":
        return False
    try:
        head = read_head(q, _HEAD).decode("latin-1")
    except ScanFileError:
        return False
    return "[Acquisition]" in head and "Filename Prefix" in head.replace("Filename prefix", "Filename Prefix")


def find_skyscan_log(path) -> Path | None:
    """``path`` if it is a SkyScan ``.log`` file, or the only one in folder ``path`` that is; else None.

    Of several logs in a folder, the one whose prefix names projections there is taken; when that is still
    more than one, the error names them (TIGRE asks for a dataset number in the same case)."""
    p = Path(path)
    if p.is_file():
        return p if _looks_like_log(p) else None
    if not p.is_dir():
        return None
    found = [q for q in sorted(p.glob("*.log")) if _looks_like_log(q)]
    if len(found) > 1:
        with_images = [q for q in found if _projection_files(q.parent, _prefix_of(q))]
        found = with_images or found
    if len(found) > 1:
        raise ScanFileError(p, f"holds {len(found)} SkyScan logs ({', '.join(q.name for q in found)}): give the one "
                               "to read as the input path")
    return found[0] if found else None


def read_skyscan_log(path) -> dict:
    """``{"Section/Key": "value"}`` and ``{"Key": "value"}`` (keys as written, values stripped); the file read
    through the guarded opener within the whole-read bound."""
    out: dict = {}
    section = ""
    for line in read_text(path).splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif "=" in line:
            k, v = line.split("=", 1)
            out[f"{section}/{k.strip()}"] = v.strip()
            out.setdefault(k.strip(), v.strip())
    return out


def _prefix_of(log: Path) -> str:
    try:
        return (_get(read_skyscan_log(log), "Filename Prefix") or "").strip()
    except ScanFileError:
        return ""


def _key(d: dict, key: str) -> str | None:
    """The key as the log writes it (SkyScan versions differ in capitals: "Number Of Files")."""
    for k in d:
        if k.lower() == key.lower():
            return k
    return None


def _get(d: dict, key: str):
    k = _key(d, key)
    return None if k is None else d[k]


def _num(d: dict, key: str, path: Path, *, default=None, **kw) -> float:
    raw = _get(d, key)
    if raw is None or not raw.strip():
        if default is None:
            raise ScanFileError(path, f"lacks '{key}'")
        return float(default)
    return number(raw, f"'{_key(d, key)}'", path, **kw)


def _projection_files(folder: Path, prefix: str) -> list[Path]:
    """``<prefix><digits>.tif`` files in ``folder`` sorted by their number (the prefix taken literally)."""
    if not prefix:
        return []
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)\.tiff?$", re.IGNORECASE)
    hits = [(int(m.group(1)), q) for q in folder.iterdir() if (m := pattern.match(q.name))]
    return [q for _, q in sorted(hits, key=lambda t: t[0])]


def _binning(d: dict, log: Path) -> tuple[int, int]:
    raw = (_get(d, "Camera binning") or "1x1").strip()
    m = re.fullmatch(r"(\d+)\s*[xX*]\s*(\d+)", raw) or re.fullmatch(r"(\d+)", raw)
    if m is None:
        raise ScanFileError(log, f"'Camera binning' must be like 2x2, got {raw!r}")
    bu = int(m.group(1))
    bv = int(m.group(2)) if m.lastindex == 2 else bu
    if bu < 1 or bv < 1:
        raise ScanFileError(log, f"'Camera binning' must be at least 1x1, got {raw!r}")
    return bu, bv


def read_bruker(path, *, flats=None) -> RawScan:
    """A SkyScan ``.log`` (or its folder) -> :class:`RawScan` (counts, cone beam), lazy."""
    import dask.array as da

    from .tiff import read_tiff_files

    log = find_skyscan_log(path)
    if log is None:
        raise ScanFileError(path, "is not a SkyScan .log file (with [Acquisition] and 'Filename Prefix') or a "
                                  "folder with exactly one")
    d = read_skyscan_log(log)
    prov = Provenance(log)
    prefix = (_get(d, "Filename Prefix") or "").strip()
    if not prefix:
        raise ScanFileError(log, "lacks 'Filename Prefix'")
    n = count(_get(d, "Number of Files") or _lacks(log, "Number of Files"), "'Number of Files'", log,
              limit=max_views())
    rows = count(_get(d, "Number of Rows") or _lacks(log, "Number of Rows"), "'Number of Rows'", log)
    cols = count(_get(d, "Number of Columns") or _lacks(log, "Number of Columns"), "'Number of Columns'", log)
    sid = _num(d, "Object to Source (mm)", log, positive=True)
    sdd = _num(d, "Camera to Source (mm)", log, positive=True)
    if sdd < sid:
        raise ScanFileError(log, f"'Camera to Source (mm)' ({sdd}) is smaller than 'Object to Source (mm)' ({sid})")
    prov.field("sid_mm", sid, "Object to Source (mm)")
    prov.field("sdd_mm", sdd, "Camera to Source (mm)")
    bu, bv = _binning(d, log)
    if _get(d, "Camera binning"):
        prov.field("binning", [bu, bv], "Camera binning")
    else:
        prov.default("binning", [1, 1], "no 'Camera binning'")
    if _get(d, "Image Pixel Size (um)") is not None:
        pitch_mm = _num(d, "Image Pixel Size (um)", log, positive=True) * 1e-3 * sdd / sid
        prov.derived("pixel_size_mm", pitch_mm, "Image Pixel Size (um) x Camera to Source / Object to Source",
                     note="the pixel at the object, binning included")
    else:
        pitch_mm = _num(d, "Camera Pixel Size (um)", log, positive=True) * 1e-3 * bu
        prov.derived("pixel_size_mm", pitch_mm, "Camera Pixel Size (um) x Camera binning (TIGRE)")
    # The pixel's height over its width: dv = du x ratio (TIGRE computes this, then sets the ratio to 1).
    xy = "CameraXYRatio" if _get(d, "CameraXYRatio") is not None else "Camera X/Y Ratio"
    ratio = _num(d, xy, log, default=1.0, positive=True)
    step = _num(d, "Rotation Step (deg)", log)
    if step == 0:
        raise ScanFileError(log, "'Rotation Step (deg)' is 0: the views would all be at one angle")
    direction = (_get(d, "Rotation Direction") or "").strip().upper()
    if direction and direction not in ("CC", "CCW", "CW"):
        raise ScanFileError(log, f"'Rotation Direction' must be CC or CW, got {direction!r}")
    rotation = "cw" if direction == "CW" else "ccw"
    if direction:
        prov.field("rotation_direction", rotation, "Rotation Direction",
                   note="CC as TIGRE's angles step x i (its frame), CW the reverse")
    else:
        prov.default("rotation_direction", rotation, "no 'Rotation Direction': TIGRE's angles step x i")
    files = _projection_files(log.parent, prefix)
    if len(files) != n:
        numbers = [int(re.search(r"(\d+)\.tiff?$", q.name, re.I).group(1)) for q in files]
        first = min(numbers) if numbers else 0
        extra = [q.name for q, k in zip(files, numbers) if k - first >= n]
        detail = f"; beyond Number of Files={n}: {', '.join(extra[:5])}" if extra else ""
        raise ScanFileError(log, f"announces {n} files ('Number of Files') but {log.parent} holds {len(files)} "
                                 f"{prefix}NNNN.tif files{detail}")
    proj = read_tiff_files(files)
    if tuple(proj.shape[1:]) != (rows, cols):
        raise ScanFileError(log, f"announces {cols} x {rows} pixels (Number of Columns x Rows) but the projections "
                                 f"are {proj.shape[2]} x {proj.shape[1]}")
    scanner = {"source_object_distance_mm": sid, "source_detector_distance_mm": sdd, "format": "Bruker SkyScan",
               "log": str(log), "rotation_step_deg": step, "binning": [bu, bv]}
    if flats is None:
        flats = da.full((1, rows, cols), _full_scale(d, log, proj.dtype, prov, scanner), dtype=np.float32)
    _per_view_shifts(d, log, prefix, n, (rows, cols), (bu, bv), scanner, prov)
    if "postalignment_px" in scanner:
        # axis at stored column centre + P; the "right" columns flip into ctbench's, where that is offset +P
        scanner["detector_offset_u_mm"] = scanner["postalignment_px"] * pitch_mm
        prov.derived("detector_offset_u_mm", scanner["detector_offset_u_mm"], "Postalignment x pitch",
                     note="ctbench's reading (the sign is not documented); used with detector_offset_u_mm 'file'")
    if _get(d, "Image Rotation") is not None:
        turned = roll(_get(d, "Image Rotation"), "'Image Rotation'", log)
        if turned:
            # NRecon turns the images by it (degrees); the stored columns flip into ctbench's, reversing its sense
            scanner["image_rotation_deg"] = turned
            scanner["detector_roll_deg"] = -turned
            prov.derived("detector_roll_deg", -turned, "Image Rotation", note="minus it: the columns flip into "
                         "ctbench's frame; ctbench's reading (Bruker does not document the sign)")
            scanner.setdefault("warnings", []).append(
                f"{log.name}: Image Rotation={turned:g} deg is applied as detector roll {-turned:g} deg; Bruker "
                "does not document its sign: if the slices blur, state geometry.detector_roll_deg (0 ignores it) or "
                "calibrate the roll")
    if _get(d, "Optical Axis (line)") is not None:
        line = _num(d, "Optical Axis (line)", log)
        if abs(line - rows / 2) > rows:
            raise ScanFileError(log, f"'Optical Axis (line)'={line:g} lies more than a detector height ({rows} rows) "
                                     "from the detector's centre")
        scanner["detector_offset_v_mm"] = (line - rows / 2) * pitch_mm * ratio
        prov.derived("detector_offset_v_mm", scanner["detector_offset_v_mm"], "Optical Axis (line)",
                     note="(line - rows / 2) x dv, the line counted from the top edge (TIGRE)")
    if (_get(d, "Flat Field Correction") or "ON").strip().upper().startswith("OFF") and flats is not None \
            and "flat" in prov.items:
        scanner.setdefault("warnings", []).append(
            f"{log.name}: Flat Field Correction=OFF: the projections are raw counts, but no flat field was given "
            "(input.flats); the full scale stands in for it and rings will show")
    sign = -1.0 if rotation == "cw" else 1.0
    angles = np.radians(sign * step * np.arange(n))
    prov.derived("angles", f"{n} angles", "Rotation Step (deg) x i" + (", reversed (CW)" if sign < 0 else ""))
    orientation = Orientation("source", "right", "down", rotation)
    prov.default("orientation", orientation.to_dict(), "TIGRE's BrukerDataLoader: the stored images as a camera at "
                                                       "the source sees them, rows down")
    try:
        # RawScan angles are ctbench's for the stated rotation: decreasing for "cw".
        return RawScan(proj, flats, None, angles=angles, pixel_size=(pitch_mm, pitch_mm * ratio),
                       scanner=scanner, source=str(log), format="bruker", orientation=orientation,
                       provenance=prov.as_dict())
    except ValueError as e:
        raise ScanFileError(log, str(e)) from None


def _lacks(log: Path, key: str):
    raise ScanFileError(log, f"lacks '{key}'")


def _full_scale(d: dict, log: Path, dtype, prov: Provenance, scanner: dict) -> float:
    """The flat field of the scanner's flat-field corrected images: Reference Intensity, else the full scale."""
    if _get(d, "Reference Intensity") is not None:
        ref = _num(d, "Reference Intensity", log, positive=True)
        prov.field("flat", ref, "Reference Intensity", note="the open-beam level of the corrected projections")
    elif np.issubdtype(np.dtype(dtype), np.integer):
        bits = int(np.iinfo(dtype).bits)
        if _get(d, "Depth (bits)") is not None:
            bits = int(_num(d, "Depth (bits)", log, positive=True, whole=True, bound=64))
        ref = float(2 ** bits)
        prov.derived("flat", ref, "Depth (bits)", note="2^bits, TIGRE's white level (no 'Reference Intensity')")
    else:
        ref = 1.0
        prov.default("flat", ref, "floating-point images without 'Reference Intensity': taken as transmission")
    scanner["flat_level"] = ref
    return ref


def _per_view_shifts(d: dict, log: Path, prefix: str, n: int, shape, binning, scanner: dict,
                     prov: Provenance) -> None:
    """Random movement, post-alignment and the per-view shift list of a SkyScan log into ``scanner``."""
    moved = re.match(r"\s*(ON|OFF)\s*(?:\((\d+(?:\.\d+)?)\))?", (_get(d, "Random Movement") or "").upper())
    if moved:
        scanner["random_movement"] = {"on": moved.group(1) == "ON",
                                      "max_px": None if moved.group(2) is None else float(moved.group(2))}
    post = _get(d, "Postalignment")
    if post is not None and post.strip():
        scanner["postalignment_px"] = number(post, "'Postalignment'", log, bound=shape[1])
    named = (_get(d, "TS modified according to") or "").strip()
    # The log names the list by the scanner PC's (Windows) path: look for its file name beside the log.
    cands = ([log.parent / re.split(r"[\\/]", named)[-1]] if named else []) + [log.parent / f"{prefix}_TS.csv"]
    found = next((q for q in cands if q.exists()), None)
    if found is not None:
        bu, bv = binning
        x, y = read_skyscan_shift_list(found, n)
        x, y = x / bu, y / bv                           # camera pixels to the stored (binned) images' pixels
        scanner[VIEW_SHIFTS] = shifts_entry(x, y, n, found.name, log, shape=shape)
        prov.field("view_shifts", f"{n} views", found.name, file=found,
                   note="TIGRE's reading: x = Y1 / binning, y = -Y2 / binning (the detector moved)")
    elif scanner.get("random_movement", {}).get("on"):
        scanner.setdefault("warnings", []).append(
            f"{log.name}: Random Movement is ON but no per-view shift list ({prefix}_TS.csv) is beside it: the "
            "views cannot be aligned and the reconstruction will be blurred; copy the list from the scanner")
