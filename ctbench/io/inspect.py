"""``ctbench inspect SCAN``: what a reader found in a scan and where each value came from.

:func:`inspect_scan` opens a scan as ``ctbench recon`` would and returns a
JSON-able report: the detector and its pixel size, the distances, the
angles, the orientation, the stated offsets and roll, the binning, the flats
and darks, the values, the reader's warnings, and the provenance of each
(a named field of the file, a reader's default and whose reading it follows,
a value derived from fields, or the input given).  With ``check=True`` it
also reads a thin band of mid-plane rows and lets the data speak: the
handedness class and the centre of rotation as the pipeline would find them
(:func:`ctbench.io.handedness.resolve_orientation`), marked ``"check"``.
:func:`format_inspection` renders the report as text.  Qt-free: the napari
Scan import widget shows the same report.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from .fields import angles_summary

_LABELS = (("format", "format"), ("shape", "views x rows x columns"), ("dtype", "stored type"),
           ("values", "values"), ("pixel_size_mm", "pixel size (du, dv) mm"), ("sid_mm", "source-object mm"),
           ("sdd_mm", "source-detector mm"), ("beam", "beam"), ("angles", "angles"),
           ("orientation", "orientation"), ("detector_offset_u_mm", "offset u mm"),
           ("detector_offset_v_mm", "offset v mm"), ("detector_roll_deg", "detector roll deg"),
           ("binning", "binning"), ("flat", "flat field"), ("dark", "dark field"), ("view_shifts", "per-view shifts"))


def inspect_scan(path, *, format: str = "auto", flats=None, darks=None, raw: dict | None = None,
                 check: bool = False) -> dict:
    """What the reader of ``path`` found, with the provenance of each value (module doc); ``check``: the data's
    own evidence on orientation and centre from a band of mid-plane rows."""
    from .readers import read_scan

    scan = read_scan(path, format=format, flats=flats, darks=darks, raw=raw)
    s = scan.scanner
    beam = "parallel" if s.get("beam") == "parallel" else "cone"
    sid = s.get("source_object_distance_mm") or s.get("source_sample_distance_mm")
    sdd = s.get("source_detector_distance_mm")
    if sdd is None and sid and s.get("sample_detector_distance_mm"):
        sdd = sid + s["sample_detector_distance_mm"]
    shifts = s.get("view_shifts_px")
    report = {
        "source": scan.source, "format": scan.format, "shape": [int(v) for v in scan.projections.shape],
        "dtype": str(scan.projections.dtype), "values": scan.values,
        "n_flats": 0 if scan.flats is None else int(scan.flats.shape[0]),
        "n_darks": 0 if scan.darks is None else int(scan.darks.shape[0]),
        "pixel_size_mm": None if scan.pixel_size is None else list(scan.pixel_size),
        "sid_mm": sid, "sdd_mm": sdd, "beam": beam, "angles": angles_summary(scan.angles),
        "orientation": scan.orientation.to_dict(),
        "detector_offset_u_mm": s.get("detector_offset_u_mm"), "detector_offset_v_mm": s.get("detector_offset_v_mm"),
        "detector_roll_deg": s.get("detector_roll_deg"), "binning": s.get("binning"),
        "view_shifts": None if not shifts else {
            "source": shifts.get("source"), "max_abs_x_px": float(np.abs(shifts["x"]).max()),
            "max_abs_y_px": float(np.abs(shifts["y"]).max())},
        "warnings": list(s.get("warnings", [])), "provenance": dict(scan.provenance)}
    if check:
        report["check"] = _check(scan, sid if beam == "cone" else None, sdd if beam == "cone" else None)
        report["warnings"] += report["check"].get("warnings", [])
    return report


def _band(scan, half: int = 2):
    """Line integrals of the mid-plane rows ``(view, k, col)`` in ctbench's row order (file's columns), the
    band's vertical offset for :func:`resolve_orientation`, and the pitch."""
    from ..preprocessing import average_frames, flat_dark_correct
    from .view_shifts import shift_images

    n, rows, cols = (int(v) for v in scan.projections.shape)
    du, dv = scan.pixel_size
    off = float(scan.scanner.get("detector_offset_v_mm", 0.0) or 0.0)
    mid = (rows - 1) / 2 + off / dv                      # the mid-plane's row, counted from the top (ctbench's)
    shifts = scan.scanner.get("view_shifts_px")
    margin = 0 if not shifts else int(np.ceil(np.abs(shifts["y"]).max())) + 1
    c0 = int(np.clip(np.floor(mid) - half - margin, 0, rows - 1))
    c1 = int(np.clip(np.ceil(mid) + half + margin + 1, c0 + 1, rows))
    flip = scan.orientation.flip_rows
    f0, f1 = (rows - c1, rows - c0) if flip else (c0, c1)    # the same rows in the file's order

    def rows_of(a):
        return None if a is None else np.asarray(a[:, f0:f1, :], dtype=np.float64)
    band = rows_of(scan.projections)
    if scan.values == "counts":
        flat = None if scan.flats is None else average_frames(rows_of(scan.flats), "flats")
        dark = None if scan.darks is None else average_frames(rows_of(scan.darks), "darks")
        band = -np.log(flat_dark_correct(band, flat, dark))
    elif scan.values == "transmission":
        band = -np.log(np.clip(band, 1e-4, None))
    if shifts:
        # y is rows down the file's image: the band's rows were cut from the file at f0, so a file shift applies
        band = shift_images(band, np.asarray(shifts["x"]), np.asarray(shifts["y"]))
    if flip:
        band = band[:, ::-1, :]
    k = c1 - c0
    return np.ascontiguousarray(band, dtype=np.float32), (mid - c0 - (k - 1) / 2) * dv, du, dv


def _check(scan, sid, sdd) -> dict:
    from .handedness import resolve_orientation

    if scan.angles is None or scan.pixel_size is None:
        return {"done": False, "why": "the file gives no angles or no pixel size: nothing to check"}
    try:
        band, offset_v, du, dv = _band(scan)
        res = resolve_orientation(band, scan.angles, scan.orientation, scan.orientation.rotation, pitch=du,
                                  pitch_v=dv, sid=sid, sdd=sdd, offset_v_mm=offset_v)
    except ValueError as e:
        return {"done": False, "why": str(e)}
    c = res.centre
    ratio = None
    if len(res.readings) >= 2:
        m = sorted(r.mismatch for r in res.readings[:2])
        ratio = m[1] / m[0] if m[0] > 0 else None
    return {"done": True, "orientation": res.orientation.to_dict(), "decided_by": res.decided_by,
            "class_ratio": ratio, "evidence": res.evidence, "offset_px": c.offset_px, "offset_mm": c.offset_mm,
            "cross_check_px": c.cross_check_px, "confidence": c.confidence, "notes": list(res.notes),
            "warnings": list(res.warnings), "band_rows": int(band.shape[1])}


def _shown(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_shown(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_shown(x) for x in v) + "]"
    return str(v)


def _whence(entry: dict | None) -> str:
    if not entry:
        return ""
    how = entry.get("from")
    if how == "field":
        return f"field {entry.get('field')}" + (f" of {entry['file']}" if entry.get("file") else "")
    if how == "derived":
        return f"from {entry.get('field')}"
    if how == "default":
        return "default"
    if how == "input":
        return "given as input"
    return str(how)


def format_inspection(report: dict) -> str:
    """The report of :func:`inspect_scan` as readable text: one line per value with where it came from."""
    prov = report.get("provenance", {})
    out = [f"scan {report['source']}"]
    width = max(len(label) for _, label in _LABELS)
    for key, label in _LABELS:
        value = report.get(key)
        entry = prov.get(key)
        if key == "flat":
            value = entry.get("value") if entry else (report["n_flats"] or None)
        elif key == "dark":
            value = entry.get("value") if entry else (report["n_darks"] or None)
        elif value is None and entry is not None:
            value = entry.get("value")
        if value is None and entry is None:
            continue
        line = f"  {label:<{width}}  {_shown(value)}"
        whence = _whence(entry)
        if whence:
            line += f"   [{whence}]"
        out.append(line)
        if entry and entry.get("note"):
            out.append(f"  {'':<{width}}    ({entry['note']})")
    chk = report.get("check")
    if chk is not None:
        out.append("consistency check of the data (mid-plane rows):")
        if not chk.get("done"):
            out.append(f"  not done: {chk.get('why')}")
        else:
            o = chk["orientation"]
            out.append(f"  orientation   {_shown(o)}   [decided by the {chk['decided_by']}]")
            if chk.get("class_ratio"):
                out.append(f"  handedness    the other class fits {chk['class_ratio']:.1f}x worse")
            cc = chk.get("cross_check_px")
            out.append(f"  centre        {chk['offset_px']:+.2f} px ({chk['offset_mm']:+.4g} mm), cross-check "
                       f"{'n/a' if cc is None else f'{cc:+.2f} px'}, confidence {chk['confidence']:.2f}")
            for note in chk.get("notes", []):
                out.append(f"  note: {note}")
    for w in report.get("warnings", []):
        out.append(f"warning: {w}")
    return "\n".join(out)


def register_inspect(subparsers) -> None:
    """Add ``ctbench inspect SCAN`` to the ``ctbench`` command's subparsers."""
    from .readers import FORMATS

    p = subparsers.add_parser("inspect", help="what a scan file states, and where each value came from "
                                              "(docs/SCANS.md)")
    p.add_argument("scan", help="the scan: a file or folder, as input.path of a recon config")
    p.add_argument("--format", default="auto", choices=FORMATS, help="the reader (default: auto)")
    p.add_argument("--flats", help="flat fields (a TIFF folder or file), as input.flats")
    p.add_argument("--darks", help="dark fields, as input.darks")
    p.add_argument("--check", action="store_true", help="also read the mid-plane rows and check the orientation and "
                                                        "the centre against the data")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    try:
        report = inspect_scan(args.scan, format=args.format, flats=args.flats, darks=args.darks, check=args.check)
    except (ValueError, OSError, RecursionError, MemoryError) as e:
        print(f"ctbench inspect: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, default=str) if args.json else format_inspection(report))
    return 0
