"""Zeiss Xradia ``.txrm`` / ``.txm`` scans: an OLE2 compound file (read with ``olefile``, the ``io`` extra); lazy.

The streams used (little-endian; the open readers dxchange and CIL read
the same ones):

- ``ImageInfo/ImageWidth``, ``ImageHeight`` (int32), ``ImagesTaken`` (or
  ``NoOfImages``), ``DataType`` (5: uint16, 10: float32);
- ``ImageInfo/AcquisitionMode`` (int32; 0: projections, anything else a
  reconstructed volume, refused) and ``ImageInfo/XrayGeometry`` (int32; 1:
  cone beam, otherwise parallel, as CIL's ZEISSDataReader reads them; absent:
  cone beam);
- ``ImageInfo/Angles`` (float32 per image, degrees);
- ``ImageInfo/StoRADistance`` / ``DtoRADistance`` (float32 per image, mm:
  source and detector distances to the rotation axis, the source's written
  negative): SID = |mean StoRA|, SDD = SID + |mean DtoRA|;
- ``ImageInfo/PixelSize`` (micrometres, the pixel at the object, binning
  included): the detector pitch is it times SDD / SID;
- the images ``ImageData<k>/Image<i>`` (``i`` from 1, 100 per storage);
  the reference (flat field) ``ReferenceData/Image`` (float32), when present;
- ``Alignment/X-Shifts`` / ``Y-Shifts`` (float32 pixels per image, the
  alignment Xradia's reconstructor applies: image ``k`` moved by ``x_k``
  columns and ``y_k`` rows, as txrm2tiff applies them): the scan's per-view
  shifts (:mod:`ctbench.io.view_shifts`), applied by the pipeline.  A
  ``Y-Shifts`` stream missing beside ``X-Shifts`` counts as zeros.

``.txm`` files (reconstructed volumes) have the same container; only
projection files (``.txrm``) are scans.  Orientation: the sense of the
angles is taken as written (``rotation_direction="ccw"`` in ctbench's
sense); the image view is not documented, so it is "auto" (decided from the
data, mirror reported).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from .errors import ScanFileError
from .orientation import Orientation
from .scan import RawScan
from .view_shifts import KEY as VIEW_SHIFTS
from .view_shifts import shifts_entry

ZEISS_SUFFIXES = (".txrm", ".txm")
_DTYPES = {5: np.dtype("<u2"), 10: np.dtype("<f4")}


def _olefile():
    try:
        import olefile
    except ImportError:
        raise ImportError("reading Zeiss .txrm files needs olefile: pip install 'ctbench[io]' "
                          "(or pip install olefile)") from None
    return olefile


def _stream(ole, name: str, path: Path, dtype, *, required=True):
    if not ole.exists(name):
        if required:
            raise ScanFileError(path, f"has no stream {name}")
        return None
    raw = ole.openstream(name).read()
    if len(raw) % np.dtype(dtype).itemsize:
        raise ScanFileError(path, f"stream {name} has {len(raw)} bytes, not a whole number of {np.dtype(dtype)}")
    return np.frombuffer(raw, dtype=dtype)


def read_zeiss(path) -> RawScan:
    """A Zeiss ``.txrm`` file -> :class:`RawScan` (counts, cone beam), lazy; the file stays open."""
    import dask
    import dask.array as da

    olefile = _olefile()
    path = Path(path)
    if not olefile.isOleFile(str(path)):
        raise ScanFileError(path, "is not an OLE2 compound file (a Zeiss .txrm)")
    ole = olefile.OleFileIO(str(path))
    try:
        def one(name, dtype="<i4", required=True):
            a = _stream(ole, name, path, dtype, required=required)
            return None if a is None else (a[0] if a.size else None)

        cols, rows = int(one("ImageInfo/ImageWidth")), int(one("ImageInfo/ImageHeight"))
        n = one("ImageInfo/ImagesTaken", required=False)
        n = int(n if n is not None else one("ImageInfo/NoOfImages"))
        if min(cols, rows, n) <= 0:
            raise ScanFileError(path, f"announces {n} images of {cols} x {rows} pixels")
        code = int(one("ImageInfo/DataType", required=False) or 5)
        if code not in _DTYPES:
            raise ScanFileError(path, f"has ImageInfo/DataType {code}; ctbench reads 5 (uint16) and 10 (float32)")
        dtype = _DTYPES[code]
        mode = one("ImageInfo/AcquisitionMode", required=False)
        if mode is not None and int(mode) != 0:        # as CIL reads it: 0 projections, otherwise a volume (.txm)
            raise ScanFileError(path, f"holds a reconstructed volume (ImageInfo/AcquisitionMode={int(mode)}), not "
                                      "projections; only projection files (.txrm) are scans")
        geometry = one("ImageInfo/XrayGeometry", required=False)
        parallel = geometry is not None and int(geometry) != 1     # 1: cone beam (CIL's reading), else parallel
        angles = _stream(ole, "ImageInfo/Angles", path, "<f4").astype(np.float64)[:n]
        if angles.size != n:
            raise ScanFileError(path, f"has {angles.size} angles for {n} images")
        sid = sdd = None
        if not parallel:
            sid = float(np.abs(_stream(ole, "ImageInfo/StoRADistance", path, "<f4")[:n]).mean())
            odd = float(np.abs(_stream(ole, "ImageInfo/DtoRADistance", path, "<f4")[:n]).mean())
            if not (np.isfinite(sid) and sid > 0 and np.isfinite(odd) and odd >= 0):
                raise ScanFileError(path, f"has source/detector distances {sid} / {odd} mm")
            sdd = sid + odd
        pixel_um = float(one("ImageInfo/PixelSize", "<f4"))
        if not (np.isfinite(pixel_um) and pixel_um > 0):
            raise ScanFileError(path, f"has ImageInfo/PixelSize {pixel_um}")
        pitch = pixel_um * 1e-3 * (1.0 if parallel else sdd / sid)
        for i in (1, n):
            if not ole.exists(f"ImageData{(i - 1) // 100 + 1}/Image{i}"):
                raise ScanFileError(path, f"has no stream ImageData{(i - 1) // 100 + 1}/Image{i} (image {i} of {n})")
        lock = threading.Lock()          # one OLE file object shared by dask's threads

        def image(i):
            with lock:
                a = _stream(ole, f"ImageData{i // 100 + 1}/Image{i + 1}", path, dtype)
            if a.size != rows * cols:
                raise ScanFileError(path, f"image {i + 1} has {a.size} pixels, not {cols} x {rows}")
            return a.reshape(rows, cols)

        proj = da.stack([da.from_delayed(dask.delayed(image)(i), (rows, cols), dtype) for i in range(n)])
        ref = _stream(ole, "ReferenceData/Image", path, "<f4", required=False)
        flats = None
        if ref is not None:
            if ref.size != rows * cols:
                raise ScanFileError(path, f"ReferenceData/Image has {ref.size} pixels, not {cols} x {rows}")
            flats = ref.reshape(1, rows, cols).astype(np.float32)
        scanner = {"format": "Zeiss Xradia", "pixel_size_at_object_um": pixel_um}
        if parallel:
            scanner["beam"] = "parallel"
        else:
            scanner |= {"source_object_distance_mm": sid, "source_detector_distance_mm": sdd}
        xs = _stream(ole, "Alignment/X-Shifts", path, "<f4", required=False)
        ys = _stream(ole, "Alignment/Y-Shifts", path, "<f4", required=False)
        if xs is not None or ys is not None:
            xs = np.zeros(n) if xs is None else xs[:n]
            ys = None if ys is None else ys[:n]
            if np.any(xs) or (ys is not None and np.any(ys)):     # all zero: no alignment was recorded
                scanner[VIEW_SHIFTS] = shifts_entry(xs, ys, n, "Alignment/X-Shifts, Y-Shifts", path)
        return RawScan(proj, flats, None, angles=np.radians(angles), pixel_size=(pitch, pitch), scanner=scanner,
                       source=str(path), format="zeiss", orientation=Orientation("auto", "right", "down", "ccw"))
    except ScanFileError:
        ole.close()
        raise
    except (ValueError, OSError) as e:
        ole.close()
        raise ScanFileError(path, str(e)) from None
