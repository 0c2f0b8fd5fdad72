"""Vendor files written the way the scanners and beamlines write them (for the reader tests).

Each writer follows the vendor's layout as the vendor's documentation and the
open readers (dxchange, CIL's cil.io, TIGRE's dataloaders) describe it; the
readers under test are in ctbench/io/.  Written independently of the readers.

The ``*_images`` / ``*_angles`` helpers turn a scan simulated in ctbench's own
frame (images ``(view, row, col)`` with columns along +u and rows along -v,
angles of the source turning anticlockwise seen from above) into what each
vendor stores, following the reference reader's reading of that vendor's files
(worked out from the readers' code, docs/SCANS.md):

- Nikon, CIL's NikonDataReader: pixel 0 at the top right seen from the source, which is ctbench's image order;
  ``InitialAngle + AngularStep * i`` are ctbench's angles.
- SkyScan, TIGRE's BrukerDataLoader: a camera image (seen from the source, columns to the right: ctbench's
  columns reversed), rows down; TIGRE's angles ``step * i`` turn the source anticlockwise (``CC``); the optical
  axis is counted from the top edge (``rows / 2 + offset``); a ``_TS.csv`` row is the detector moved by ``Y1``
  camera pixels along the columns and ``Y2`` up.
- Zeiss, CIL's ZEISSDataReader: pixel 0 at the bottom left seen from the source (both axes reversed against
  ctbench's); the stored angles turn the other way in CIL's frame (ctbench's angles negated).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctbench.io.orientation import Orientation

def nikon_images(images):
    return np.asarray(images)


def skyscan_images(images):
    return np.ascontiguousarray(np.asarray(images)[:, :, ::-1])


def zeiss_images(images):
    return np.ascontiguousarray(np.asarray(images)[:, ::-1, ::-1])


def zeiss_angles_deg(angles_rad):
    """The stored ``ImageInfo/Angles`` of ctbench angles (CIL's reading: the sense reversed)."""
    return -np.degrees(np.asarray(angles_rad, dtype=np.float64))


def skyscan_optical_axis(rows: int, offset_v_px: float) -> float:
    """The log's ``Optical Axis (line)`` of a detector whose centre sits ``offset_v_px`` rows above the central ray
    (TIGRE: the line counted from the top edge, ``offDetector`` = (line - rows / 2) rows)."""
    return rows / 2 + offset_v_px


def skyscan_shift_columns(x, y, binning: int = 1):
    """The ``_TS.csv`` columns (Y1, Y2) of per-view aligning shifts ``x`` columns / ``y`` rows of the stored images
    (TIGRE adds (Y2, Y1) unbinned camera pixels to its detector offsets, v up and u along the columns)."""
    return np.asarray(x, np.float64) * binning, -np.asarray(y, np.float64) * binning


_RESOLUTION = "measurement/instrument/detection_system/objective/resolution"
_MAGNIFICATION = "measurement/instrument/detection_system/objective/magnification"
_DETECTOR = "measurement/instrument/detector"


def write_dxchange(path, projections, flats, darks, theta_deg, *, resolution_um: float | None = None,
                   pixel_size_um: float | None = None, magnification: float = 1.0, binning: int = 1,
                   orientation: Orientation | None = None, theta: str = "degrees",
                   flat_field_value: float | None = None) -> Path:
    """Write a DXchange file the way the beamline software lays it out (for tests and examples).

    Either ``resolution_um`` (effective pixel) or ``pixel_size_um`` (sensor,
    with ``magnification`` and ``binning``).  ``orientation``: ctbench's
    attributes on ``/exchange`` (None writes none, as beamlines do).  ``theta``: "degrees" (tomoscan's
    ``/exchange/theta`` with units), "radians-no-units" (APS 7-BM's radians without a units attribute) or
    "rotation" (no theta: ``/process/acquisition/rotation/rotation_start``, ``rotation_step``, ``num_angles``, in
    degrees, as dxchange falls back to); ``flat_field_value``: no ``data_white``, the scalar stand-in instead.
    """
    import h5py

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with h5py.File(tmp, "w") as f:
        ex = f.create_group("exchange")
        ex.create_dataset("data", data=np.asarray(projections), chunks=(1, *np.shape(projections)[1:]))
        ex["data"].attrs["units"] = "counts"
        if flat_field_value is None:
            ex.create_dataset("data_white", data=np.asarray(flats))
        else:
            f.create_dataset("process/acquisition/flat_fields/flat_field_value", data=[float(flat_field_value)])
        ex.create_dataset("data_dark", data=np.asarray(darks))
        deg = np.asarray(theta_deg, dtype=np.float64)
        if theta == "degrees":
            ex.create_dataset("theta", data=deg)
            ex["theta"].attrs["units"] = "degrees"
        elif theta == "radians-no-units":
            ex.create_dataset("theta", data=np.radians(deg))
        else:
            rot = f.create_group("process/acquisition/rotation")
            rot.create_dataset("rotation_start", data=[deg[0]])
            rot.create_dataset("rotation_step", data=[deg[1] - deg[0]])
            rot.create_dataset("num_angles", data=[deg.size])
        if orientation is not None:
            for k, v in orientation.to_dict().items():
                ex.attrs[k] = v
        det = f.create_group(_DETECTOR)
        if resolution_um is not None:
            f.create_dataset(_RESOLUTION, data=float(resolution_um))
        if pixel_size_um is not None:
            for axis in ("x", "y"):
                det.create_dataset(f"pixel_size_{axis}", data=float(pixel_size_um))
                det.create_dataset(f"binning_{axis}", data=int(binning))
            f.create_dataset(_MAGNIFICATION, data=float(magnification))
    tmp.replace(path)
    return path


def write_nikon(folder, name, projections, *, pitch, sid, sdd, angles_deg, white_level, ctdata_deg=None,
                binning: int = 1, extra: dict | None = None, subfolder: bool = False) -> Path:
    """A Nikon XT H folder: ``<name>.xtekct`` (INI, [XTekCT]), ``<name>_0001.tif`` ... (uint16, shading
    corrected, open beam at ``white_level``; float32 arrays are written as float32) and, when given,
    ``_ctdata.txt`` with the measured angles.  ``subfolder``: the images go into ``InputFolderName`` (from
    ``extra``), the scanner's folder relative to the file."""
    import tifffile

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n, rows, cols = projections.shape
    step = float(angles_deg[1] - angles_deg[0]) if n > 1 else 0.0
    keys = {"Name": name, "InputSeparator": "_", "InputFolderName": "", "OutputFolderName": "",
            "VoxelsX": cols, "VoxelsY": cols, "VoxelsZ": rows,
            "DetectorPixelsX": cols * binning, "DetectorPixelsY": rows * binning,
            "DetectorPixelSizeX": pitch / binning, "DetectorPixelSizeY": pitch / binning,
            "DetectorOffsetX": 0.0, "DetectorOffsetY": 0.0, "SrcToObject": sid, "SrcToDetector": sdd,
            "MaskRadius": 0.0, "InitialAngle": float(angles_deg[0]), "AngularStep": step, "Projections": n,
            "WhiteLevel": white_level, "Scattering": 0.0, "CoefX4": 0.0, "Scaling": 1000.0,
            "ObjectOffsetX": 0.0, "ObjectRoll": 0.0, "ObjectTilt": 0.0, "XraykV": 90, "XrayuA": 100}
    if binning != 1:
        keys["DetectorBinning"] = binning
        keys["DetectorPixelsX"], keys["DetectorPixelsY"] = cols, rows
    keys.update(extra or {})
    keys = {k: v for k, v in keys.items() if v is not None}        # None: a key older files do not write
    (folder / f"{name}.xtekct").write_text("[XTekCT]\r\n" + "".join(f"{k}={v}\r\n" for k, v in keys.items()))
    images = folder / str(keys.get("InputFolderName") or "").replace("\\", "/") if subfolder else folder
    images.mkdir(parents=True, exist_ok=True)
    for i, img in enumerate(projections):
        img = np.asarray(img)
        tifffile.imwrite(images / f"{name}_{i + 1:04d}.tif",
                         img.astype(np.float32) if img.dtype.kind == "f" else img.astype(np.uint16))
    if ctdata_deg is not None:
        lines = ["Inspect-X CT data", "Projection\tAngle(deg)\tTime(s)", ""]
        lines += [f"{i + 1}\t{a:.6f}\t{0.5 * i:.2f}" for i, a in enumerate(ctdata_deg)]
        (folder / "_ctdata.txt").write_text("\n".join(lines) + "\n")
    return folder / f"{name}.xtekct"


def write_bruker(folder, prefix, projections, *, sid, sdd, pitch, step_deg, direction=None, optical_axis=None,
                 binning: int = 1, shifts=None, random_movement: str = "OFF (10)", postalignment: float = 0.0,
                 short_list: bool = False, xy_ratio: float = 1.0, image_rotation: float | None = None,
                 reference_intensity: float | None = None, extra: dict | None = None, index_digits: int = 4) -> Path:
    """A SkyScan folder: ``<prefix>.log`` ([System], [Acquisition], [Reconstruction]; spaces around values as
    the scanner writes them) and flat-field corrected projections ``<prefix>0000.tif`` ... as stored (16-bit, or
    float32 for float arrays).

    ``shifts=(x, y)``: per-view aligning shifts of the stored images, written as the scanner's ``<prefix>_TS.csv``
    (a ``Format`` line, a ``Property of the curves`` line, ``CURVE, Y1, Y2``, then ``index, Y1, Y2`` with
    :func:`skyscan_shift_columns`), named in the log by the scanner PC's Windows path; ``short_list``: one view
    short, as the scanner lists them.  ``extra``: more ``[Acquisition]`` keys (None drops a key)."""
    import tifffile

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n, rows, cols = projections.shape
    bits = 32 if np.asarray(projections).dtype.kind == "f" else 16
    acq = [("Data Directory", str(folder)), ("Filename Prefix", prefix), ("Number of Files", f"{n:6d}"),
           ("Source Voltage (kV)", " 80"), ("Source Current (uA)", "100"), ("Number of Rows", f"{rows:5d}"),
           ("Number of Columns", f"{cols:5d}"), ("Camera binning", f"{binning}x{binning}"),
           ("Image Pixel Size (um)", f"{pitch * 1e3 * sid / sdd:.6f}"),
           ("Object to Source (mm)", f"{sid:.3f}"), ("Camera to Source (mm)", f"{sdd:.5f}"),
           ("Image Format", "TIFF"), ("Depth (bits)", f"{bits}"), ("Exposure (ms)", "  400"),
           ("Rotation Step (deg)", f"{step_deg:.3f}"), ("Frame Averaging", "ON (2)"),
           ("Random Movement", random_movement), ("Use 360 Rotation", "YES"), ("Geometrical Correction", "ON"),
           ("Flat Field Correction", "ON"), ("Type of Detector Motion", "STEP AND SHOOT")]
    if optical_axis is not None:
        acq.insert(8, ("Optical Axis (line)", f"{optical_axis:g}"))
    if direction is not None:
        acq.append(("Rotation Direction", direction))
    if image_rotation is not None:
        acq.insert(8, ("Image Rotation", f"{image_rotation:.4f}"))
    if reference_intensity is not None:
        acq.insert(12, ("Reference Intensity", f"{reference_intensity:g}"))
    if shifts is not None:
        x, y = skyscan_shift_columns(*shifts, binning)
        m = n - 1 if short_list else n
        acq += [("Maximum vertical TS", f"{np.abs(y).max():.1f}"), ("Maximum horizontal TS", f"{np.abs(x).max():.1f}"),
                ("TS modified at", f"December1,10:00:34 ---  {m} of {m} projections"),
                ("TS modified according to", f"D:\\Results\\{prefix}\\proj\\{prefix}_TS.csv"),
                ("TS modified at level", "0")]
        lines = ["Format,  CSV", f"Property of the curves, 2 {m} 1.000000 1.000000 ", "CURVE, Y1, Y2"]
        lines += [f"{k:.6f}, {x[k]:.6f}, {y[k]:.6f}" for k in range(m)]
        (folder / f"{prefix}_TS.csv").write_text("\r\n".join(lines) + "\r\n\r\n")
    for k, v in (extra or {}).items():
        acq = [(a, b) for a, b in acq if a != k] + ([(k, v)] if v is not None else [])
    text = ["[System]", "Scanner=SkyScan1272", "Instrument S/N=ctbench-test", "Software=Version 1. 1 (build 18)",
            f"Camera Pixel Size (um)=   {pitch * 1e3 / binning:.2f}", f"CameraXYRatio={xy_ratio:.4f}", "[Acquisition]"]
    text += [f"{k}={v}" for k, v in acq]
    text += ["[Reconstruction]", "Reconstruction Program=NRecon", f"Postalignment={postalignment:.2f}"]
    (folder / f"{prefix}.log").write_text("\r\n".join(text) + "\r\n")
    for i, img in enumerate(projections):
        img = np.asarray(img)
        tifffile.imwrite(folder / f"{prefix}{i:0{index_digits}d}.tif",
                         img.astype(np.float32) if img.dtype.kind == "f" else img.astype(np.uint16))
    return folder / f"{prefix}.log"


# ------------------------------------------------------------------ Zeiss Xradia (.txrm, an OLE2 compound file)
def _write_cfb(path, streams: dict) -> Path:
    """A minimal OLE2 compound file (version 3, 512-byte sectors) holding ``{"Storage/Stream": bytes}``.

    Written from the compound-file layout (header, FAT, directory of 128-byte entries, streams under
    4096 bytes in 64-byte mini sectors of the root's mini stream), so that any OLE reader opens it.
    """
    import struct

    SS, MSS, CUT = 512, 64, 4096
    FREE, END, FATSECT = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD
    # directory tree: root -> storages -> streams (siblings chained through "right")
    nodes = [{"name": "Root Entry", "type": 5, "kids": []}]
    index = {"": 0}
    for full in streams:
        parts = full.split("/")
        parent = ""
        for depth, part in enumerate(parts):
            key = "/".join(parts[:depth + 1])
            if key not in index:
                index[key] = len(nodes)
                nodes.append({"name": part, "type": 2 if depth == len(parts) - 1 else 1, "kids": [],
                              "data": streams[full] if depth == len(parts) - 1 else None})
                nodes[index[parent]]["kids"].append(index[key])
            parent = key
    sectors: list[bytes] = []
    fat: list[int] = []

    def put(data: bytes) -> int:
        n = max(1, -(-len(data) // SS))
        start = len(sectors)
        for k in range(n):
            sectors.append(data[k * SS:(k + 1) * SS].ljust(SS, b"\0"))
            fat.append(start + k + 1 if k < n - 1 else END)
        return start

    mini, minifat = bytearray(), []
    for node in nodes[1:]:
        data = node.get("data")
        if data is None:
            node["start"], node["size"] = 0, 0
        elif len(data) < CUT:
            n = max(1, -(-len(data) // MSS))
            start = len(mini) // MSS
            mini += data.ljust(n * MSS, b"\0")
            minifat += [start + k + 1 if k < n - 1 else END for k in range(n)]
            node["start"], node["size"] = start, len(data)
        else:
            node["start"], node["size"] = put(data), len(data)
    root = nodes[0]
    root["start"], root["size"] = (put(bytes(mini)), len(mini)) if mini else (END, 0)
    minifat_start = put(b"".join(struct.pack("<I", x) for x in minifat)) if minifat else END
    n_minifat = -(-len(minifat) * 4 // SS) if minifat else 0

    def entry(i: int) -> bytes:
        node = nodes[i]
        name = node["name"].encode("utf-16-le") + b"\0\0"
        kids = node["kids"]
        right = FREE
        for parent in nodes:                       # the next sibling in the parent's chain
            if i in parent["kids"]:
                pos = parent["kids"].index(i)
                right = parent["kids"][pos + 1] if pos + 1 < len(parent["kids"]) else FREE
        return (name.ljust(64, b"\0") + struct.pack("<HBB", len(name), node["type"], 1)
                + struct.pack("<III", FREE, right, kids[0] if kids else FREE) + b"\0" * 16 + b"\0" * 4
                + b"\0" * 16 + struct.pack("<IIi", node["start"], node["size"], 0))

    dir_bytes = b"".join(entry(i) for i in range(len(nodes)))
    dir_bytes = dir_bytes.ljust(-(-len(dir_bytes) // SS) * SS, b"\0")
    dir_start = put(dir_bytes)
    n_fat = 1
    while (len(sectors) + n_fat) * 4 > n_fat * SS:
        n_fat += 1
    fat_start = len(sectors)
    fat += [FATSECT] * n_fat
    fat += [FREE] * (n_fat * SS // 4 - len(fat))
    fat_bytes = b"".join(struct.pack("<I", x) for x in fat)
    for k in range(n_fat):
        sectors.append(fat_bytes[k * SS:(k + 1) * SS])
    assert n_fat <= 109
    difat = [fat_start + k for k in range(n_fat)] + [FREE] * (109 - n_fat)
    header = (bytes.fromhex("D0CF11E0A1B11AE1") + b"\0" * 16 + struct.pack("<HHHHH", 0x3E, 3, 0xFFFE, 9, 6)
              + b"\0" * 6 + struct.pack("<IIIIIIIII", 0, n_fat, dir_start, 0, CUT, minifat_start, n_minifat, END, 0)
              + b"".join(struct.pack("<I", x) for x in difat))
    assert len(header) == SS
    Path(path).write_bytes(header + b"".join(sectors))
    return Path(path)


def write_txrm(path, projections, reference, *, angles_deg, sid, sdd, pixel_um, binning: int = 1,
               x_shifts=None, y_shifts=None, xray_geometry: int = 1, acquisition_mode: int = 0,
               reference_dtype: str = "<f4", streams: dict | None = None) -> Path:
    """A Zeiss Xradia ``.txrm``: ImageInfo streams (little-endian int32/float32; the source and detector distances
    negative for the source side, as Xradia writes them), images as stored (``ImageData<k>/Image<i>``, 100 per
    storage, 1-based; uint16, or float32 with DataType 10 for float arrays), the reference (flat) as
    ``ReferenceData/Image`` in ``reference_dtype`` (with its ReferenceData/DataType), per-view alignment shifts.
    ``streams``: streams to replace or add (None removes one), for damaged or unusual files."""
    import struct

    n, rows, cols = projections.shape
    floats = np.asarray(projections).dtype.kind == "f"
    f32 = lambda a: np.asarray(a, "<f4").tobytes()            # noqa: E731
    i32 = lambda v: struct.pack("<i", int(v))                 # noqa: E731
    s = {"ImageInfo/ImageWidth": i32(cols), "ImageInfo/ImageHeight": i32(rows), "ImageInfo/ImagesTaken": i32(n),
         "ImageInfo/NoOfImages": i32(n), "ImageInfo/DataType": i32(10 if floats else 5),
         "ImageInfo/PixelSize": f32([pixel_um]),
         "ImageInfo/Angles": f32(angles_deg), "ImageInfo/StoRADistance": f32(np.full(n, -sid)),
         "ImageInfo/DtoRADistance": f32(np.full(n, sdd - sid)), "ImageInfo/CameraBinning": i32(binning),
         "ImageInfo/XrayMagnification": f32(np.full(n, sdd / sid)),
         "ReferenceData/Image": np.asarray(reference, reference_dtype).tobytes(),
         "ReferenceData/DataType": i32(5 if np.dtype(reference_dtype).kind == "u" else 10),
         "ImageInfo/XrayGeometry": i32(xray_geometry), "ImageInfo/AcquisitionMode": i32(acquisition_mode)}
    if x_shifts is not None:
        s["Alignment/X-Shifts"] = f32(x_shifts)
        s["Alignment/Y-Shifts"] = f32(np.zeros(n) if y_shifts is None else y_shifts)
    for i, img in enumerate(projections):
        s[f"ImageData{i // 100 + 1}/Image{i + 1}"] = np.asarray(img, "<f4" if floats else "<u2").tobytes()
    for k, v in (streams or {}).items():
        if v is None:
            s.pop(k, None)
        else:
            s[k] = v
    return _write_cfb(path, s)
