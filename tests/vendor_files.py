"""Vendor files written the way the scanners and beamlines write them (for the reader tests).

Each writer follows the vendor's layout as the vendor's documentation and the
open readers (dxchange, CIL's cil.io, TIGRE's dataloaders) describe it; the
readers under test are in ctbench/io/.  Written independently of the readers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctbench.io.orientation import Orientation

_RESOLUTION = "measurement/instrument/detection_system/objective/resolution"
_MAGNIFICATION = "measurement/instrument/detection_system/objective/magnification"
_DETECTOR = "measurement/instrument/detector"


def write_dxchange(path, projections, flats, darks, theta_deg, *, resolution_um: float | None = None,
                   pixel_size_um: float | None = None, magnification: float = 1.0, binning: int = 1,
                   orientation: Orientation | None = None) -> Path:
    """Write a DXchange file the way the beamline software lays it out (for tests and examples).

    Either ``resolution_um`` (effective pixel) or ``pixel_size_um`` (sensor,
    with ``magnification`` and ``binning``).  ``orientation``: ctbench's
    attributes on ``/exchange`` (None writes none, as beamlines do).
    """
    import h5py

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with h5py.File(tmp, "w") as f:
        ex = f.create_group("exchange")
        ex.create_dataset("data", data=np.asarray(projections), chunks=(1, *np.shape(projections)[1:]))
        ex["data"].attrs["units"] = "counts"
        ex.create_dataset("data_white", data=np.asarray(flats))
        ex.create_dataset("data_dark", data=np.asarray(darks))
        ex.create_dataset("theta", data=np.asarray(theta_deg, dtype=np.float64))
        ex["theta"].attrs["units"] = "degrees"
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
                binning: int = 1, extra: dict | None = None) -> Path:
    """A Nikon XT H folder: ``<name>.xtekct`` (INI, [XTekCT]), ``<name>_0001.tif`` ... (uint16, shading
    corrected, open beam at ``white_level``) and, when given, ``_ctdata.txt`` with the measured angles."""
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
    (folder / f"{name}.xtekct").write_text("[XTekCT]\r\n" + "".join(f"{k}={v}\r\n" for k, v in keys.items()))
    for i, img in enumerate(projections):
        tifffile.imwrite(folder / f"{name}_{i + 1:04d}.tif", np.asarray(img, np.uint16))
    if ctdata_deg is not None:
        lines = ["Inspect-X CT data", "Projection\tAngle(deg)\tTime(s)", ""]
        lines += [f"{i + 1}\t{a:.6f}\t{0.5 * i:.2f}" for i, a in enumerate(ctdata_deg)]
        (folder / "_ctdata.txt").write_text("\n".join(lines) + "\n")
    return folder / f"{name}.xtekct"


def write_bruker(folder, prefix, projections, *, sid, sdd, pitch, step_deg, direction=None, optical_axis=None,
                 binning: int = 1) -> Path:
    """A SkyScan folder: ``<prefix>.log`` ([System], [Acquisition], [Reconstruction]; spaces around values as
    the scanner writes them) and flat-field corrected 16-bit projections ``<prefix>0000.tif`` ..."""
    import tifffile

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n, rows, cols = projections.shape
    acq = [("Data Directory", str(folder)), ("Filename Prefix", prefix), ("Number of Files", f"{n:6d}"),
           ("Source Voltage (kV)", " 80"), ("Source Current (uA)", "100"), ("Number of Rows", f"{rows:5d}"),
           ("Number of Columns", f"{cols:5d}"), ("Camera binning", f"{binning}x{binning}"),
           ("Image Pixel Size (um)", f"{pitch * 1e3 * sid / sdd:.6f}"),
           ("Object to Source (mm)", f"{sid:.3f}"), ("Camera to Source (mm)", f"{sdd:.5f}"),
           ("Image Format", "TIFF"), ("Depth (bits)", "16"), ("Exposure (ms)", "  400"),
           ("Rotation Step (deg)", f"{step_deg:.3f}"), ("Frame Averaging", "ON (2)"),
           ("Random Movement", "OFF (10)"), ("Use 360 Rotation", "YES"), ("Geometrical Correction", "ON"),
           ("Flat Field Correction", "ON"), ("Type of Detector Motion", "STEP AND SHOOT")]
    if optical_axis is not None:
        acq.insert(8, ("Optical Axis (line)", f"{optical_axis:g}"))
    if direction is not None:
        acq.append(("Rotation Direction", direction))
    text = ["[System]", "Scanner=SkyScan1272", "Instrument S/N=ctbench-test", "Software=Version 1. 1 (build 18)",
            f"Camera Pixel Size (um)=   {pitch * 1e3 / binning:.2f}", "CameraXYRatio=1.0000", "[Acquisition]"]
    text += [f"{k}={v}" for k, v in acq]
    text += ["[Reconstruction]", "Reconstruction Program=NRecon", "Postalignment=0.00"]
    (folder / f"{prefix}.log").write_text("\r\n".join(text) + "\r\n")
    for i, img in enumerate(projections):
        tifffile.imwrite(folder / f"{prefix}{i:04d}.tif", np.asarray(img, np.uint16))
    return folder / f"{prefix}.log"
