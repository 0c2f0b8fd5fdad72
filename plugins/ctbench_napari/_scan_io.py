"""Reader contribution for measured scans: TIFF stacks, NeXus NXtomo and DXchange files, lab-scanner folders and
the vendors' formats (Nikon, Zeiss, Bruker) (no Qt).

A scan opens as one lazy image layer of raw projections ``(view, row, col)``
(only the displayed view is read) with ``metadata["ctbench"]`` =
``{"kind": "projections", "source": {"path", "format"}, "scan": {...}}``;
the Scan import widget reopens the file from ``source`` to reach the flats,
darks and angles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from ctbench import guarded_open
from ctbench.io import ScanFileError, detect_format, read_scan
from ctbench.io.bruker import find_skyscan_log
from ctbench.io.nexus import NEXUS_SUFFIXES
from ctbench.io.tiff import TIFF_SUFFIXES

from ._layers import KEY, UNITS, LayerData

VENDOR_SUFFIXES = (".xtekct", ".txrm", ".log")     # Nikon, Zeiss, Bruker SkyScan (DXchange is .h5)


def scan_layer(path, *, format: str = "auto", raw: dict | None = None, name: str | None = None) -> LayerData:
    """The projections layer of a scan file (lazy), with where it came from in its metadata."""
    scan = read_scan(path, format=format, raw=raw)
    first = np.asarray(scan.projections[0].compute() if hasattr(scan.projections, "compute") else scan.projections[0])
    lo, hi = float(first.min()), float(first.max())
    meta = {"kind": "projections", "values": scan.values,
            "source": {"path": str(path), "format": scan.format, "raw": raw},
            "scan": {k: v for k, v in scan.describe().items() if k != "angles_deg"}}
    label = name or f"{Path(path).name} ({scan.values})"
    return scan.projections, {"name": label, "metadata": {KEY: meta}, "colormap": "gray", "units": UNITS,
                              "contrast_limits": (lo, hi if hi > lo else lo + 1)}, "image"


def get_scan_reader(path) -> Callable | None:
    """Reader for TIFF files/folders, NeXus files and lab-scanner folders; None for anything else."""
    if isinstance(path, (list, tuple)):
        if len(path) != 1:
            return None
        path = path[0]
    p = Path(str(path))
    if p.suffix.lower() == ".zarr":
        return None                       # ctbench datasets have their own reader
    if not p.is_dir():
        if p.suffix.lower() not in TIFF_SUFFIXES + NEXUS_SUFFIXES + VENDOR_SUFFIXES:
            return None
        try:
            guarded_open.check_regular(p)  # a FIFO or device named scan.tif is declined, never opened
        except guarded_open.InputError:
            return None
        if p.suffix.lower() == ".log" and find_skyscan_log(p) is None:
            return None                   # a .log that is not a SkyScan scan
    try:
        fmt = detect_format(p)
    except ScanFileError:
        return None
    if fmt not in ("tiff", "nexus", "scanner", "dxchange", "nikon", "bruker", "zeiss"):
        return None

    def reader(path_arg) -> list[LayerData]:
        return [scan_layer(p)]

    return reader
