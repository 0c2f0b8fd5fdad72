"""One entry point for every scan format: :func:`read_scan`.

Formats: a lab-scanner folder (TIFF projections, flats and darks plus a JSON
of the scanner's parameters, see :mod:`ctbench.io.scanner`), a folder of
TIFF files or one multi-page TIFF, an HDF5/NeXus NXtomo file, a raw binary
file (shape, dtype, byte order and header given), the ctbench zarr
dataset (already line integrals, with its geometry), and the vendors'
formats (:mod:`ctbench.io.dxchange`, ...).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ScanFileError
from .nexus import NEXUS_SUFFIXES, read_nexus
from .raw import read_raw
from .scan import RawScan, sinogram_to_images
from .scanner import find_scanner_json, read_scanner_folder
from .tiff import TIFF_SUFFIXES, read_tiff

FORMATS = ("auto", "scanner", "tiff", "nexus", "raw", "zarr", "dxchange", "nikon", "bruker", "zeiss")


def detect_format(path) -> str:
    """The format :func:`read_scan` would use for ``path`` ("auto" is resolved); ScanFileError if none fits."""
    path = Path(path)
    if not path.exists():
        raise ScanFileError(path, "does not exist")
    if path.is_dir():
        from ..workbench.dataset import is_dataset  # only folders can be datasets: files need no engine

        if is_dataset(path):
            return "zarr"
        if find_scanner_json(path) is not None:
            return "scanner"
        from .nikon import find_xtekct

        if find_xtekct(path) is not None:
            return "nikon"
        from .bruker import find_skyscan_log

        if find_skyscan_log(path) is not None:
            return "bruker"
        return "tiff"
    suffix = path.suffix.lower()
    if suffix in TIFF_SUFFIXES:
        return "tiff"
    if suffix in NEXUS_SUFFIXES:
        from .dxchange import is_dxchange

        return "dxchange" if is_dxchange(path) else "nexus"
    if suffix == ".xtekct":
        return "nikon"
    if suffix == ".log":
        return "bruker"
    if suffix in (".txrm", ".txm"):
        return "zeiss"
    if suffix in (".raw", ".bin", ".dat", ".img"):
        return "raw"
    raise ScanFileError(path, f"has an unknown format (suffix {suffix!r}); give format= one of {FORMATS[1:]}")


def read_ctbench_dataset(path) -> RawScan:
    """A ctbench zarr dataset's sinogram as a (lazy) image stack of line integrals, geometry in ``scanner``."""
    import dask.array as da

    from ..workbench.dataset import load_dataset

    try:
        ds = load_dataset(path, lazy=True)
    except (ValueError, FileNotFoundError) as e:
        raise ScanFileError(path, str(e)) from None
    if ds.sinogram is None:
        raise ScanFileError(path, "holds no sinogram (a volume-only dataset has nothing to reconstruct)")
    sino = da.from_zarr(ds.sinogram)
    if sino.ndim != 3:
        raise ScanFileError(path, f"holds a 2D sinogram {tuple(sino.shape)}; scans are read as (view, row, col)")
    images = sino.transpose(0, 2, 1)[:, ::-1, :]
    scanner = {"geometry": ds.geometry.to_dict()} if ds.geometry is not None else {}
    pixel = None
    if ds.geometry is not None:
        pixel = tuple(ds.geometry.detector_spacing)
    from .orientation import CTBENCH   # written by ctbench: its own frame

    return RawScan(images, values="line_integrals", pixel_size=pixel, scanner=scanner, source=str(path),
                   format="zarr", orientation=CTBENCH)


def _read_images(path, format: str, raw: dict | None):
    if format == "raw":
        return read_raw(path, **(raw or {}))
    return read_tiff(path)


def read_scan(path, *, format: str = "auto", flats=None, darks=None, raw: dict | None = None,
              pixel_size=None, angles_deg=None) -> RawScan:
    """Open a scan lazily and return a :class:`RawScan`.

    ``flats`` / ``darks``: paths of flat and dark images (a TIFF folder or
    file, or raw with the same ``raw`` options) for formats that do not
    carry them.  ``raw``: ``{"shape": (views, rows, cols), "dtype": "uint16",
    "byte_order": "little", "header": 0}`` for raw files.  ``pixel_size``
    (mm) and ``angles_deg`` override what the file says.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}, got {format!r}")
    path = Path(path)
    fmt = detect_format(path) if format == "auto" else format
    if fmt != "raw" and raw:
        raise ValueError("raw options (shape, dtype, byte order, header) apply only to format='raw'")
    if fmt == "raw" and not raw:
        raise ValueError(f"{path}: a raw file needs raw={{'shape': (views, rows, cols), 'dtype': ...}}")
    if not path.exists():
        raise ScanFileError(path, "does not exist")
    if fmt == "scanner":
        scan = read_scanner_folder(path)
    elif fmt == "nexus":
        scan = read_nexus(path, require_angles=angles_deg is None)
    elif fmt == "nikon":
        from .nikon import read_nikon

        scan = read_nikon(path)
    elif fmt == "zeiss":
        from .zeiss import read_zeiss

        scan = read_zeiss(path)
    elif fmt == "bruker":
        from .bruker import read_bruker

        scan = read_bruker(path)
    elif fmt == "dxchange":
        from .dxchange import read_dxchange

        scan = read_dxchange(path)
    elif fmt == "zarr":
        scan = read_ctbench_dataset(path)
    else:
        scan = RawScan(_read_images(path, fmt, raw), source=str(path), format=fmt)
    changes: dict = {}
    for name, extra in (("flats", flats), ("darks", darks)):
        if extra is not None:
            changes[name] = _read_images(extra, "raw" if fmt == "raw" else "tiff", _extra_raw(raw, scan, extra, fmt))
    if pixel_size is not None:
        changes["pixel_size"] = pixel_size
    if angles_deg is not None:
        changes["angles"] = np.radians(np.asarray(angles_deg, dtype=np.float64))
    if changes:
        prov = dict(scan.provenance)
        for name in changes:
            given = {"flats": flats, "darks": darks}.get(name)
            prov[{"pixel_size": "pixel_size_mm", "flats": "flat", "darks": "dark"}.get(name, name)] = {
                "value": str(given) if given is not None else _plain(changes[name]), "from": "input",
                "note": "given to read_scan (the recon config's input / geometry)"}
        scan = RawScan(**{**scan.__dict__, **changes, "provenance": prov})
    return scan


def _plain(v):
    if isinstance(v, np.ndarray):
        return f"{v.size} values"
    return list(v) if isinstance(v, tuple) else v


def _extra_raw(raw: dict | None, scan: RawScan, path, fmt: str) -> dict | None:
    """Raw options for a flats/darks file: the scan's detector size, as many frames as the file holds."""
    if fmt != "raw":
        return None
    from .raw import raw_dtype

    rows, cols = scan.projections.shape[1:]
    dt = raw_dtype(raw.get("dtype", "uint16"), raw.get("byte_order", "little"))
    header = int(raw.get("header", 0))
    size = Path(path).stat().st_size if Path(path).is_file() else 0
    frame = rows * cols * dt.itemsize
    n = max(1, (size - header) // frame)
    return {**raw, "shape": (n, rows, cols)}


__all__ = ["read_scan", "detect_format", "read_ctbench_dataset", "sinogram_to_images", "FORMATS"]
