"""Zeiss Xradia ``.txrm`` / ``.txm`` scans: an OLE2 compound file (read with ``olefile``, the ``io`` extra); lazy.

The streams used (little-endian; the open readers dxchange and CIL read
the same ones; docs/SCANS.md has the table with the source of each rule):

- ``ImageInfo/ImageWidth``, ``ImageHeight`` (int32), ``NoOfImages`` (and
  ``ImagesTaken``, which must agree), ``DataType`` (5: uint16, 10: float32);
- ``ImageInfo/AcquisitionMode`` (0: projections, anything else a
  reconstructed volume, refused) and ``ImageInfo/XrayGeometry`` (1: cone
  beam, otherwise parallel, as CIL's ZEISSDataReader reads them; absent:
  cone beam);
- ``ImageInfo/Angles`` (float32 per image, degrees);
- ``ImageInfo/StoRADistance`` / ``DtoRADistance`` (float32 per image, mm:
  source and detector distances to the rotation axis, the source's written
  negative): SID = |mean StoRA|, SDD = SID + |mean DtoRA|;
- ``ImageInfo/PixelSize`` (micrometres, the pixel at the object of the stored,
  binned images; ``ImageInfo/CameraBinning`` is recorded, not applied again):
  the detector pitch is it times SDD / SID;
- the images ``ImageData<k>/Image<i>`` (``i`` from 1, 100 per storage); the
  reference (flat field) ``ReferenceData/Image`` in ``ReferenceData/DataType``
  (float32 when absent), when present;
- ``Alignment/X-Shifts`` / ``Y-Shifts`` (pixels per image, the alignment
  Xradia's reconstructor applies: image ``k`` moved by ``x_k`` columns and
  ``y_k`` rows, as CIL and txrm2tiff apply them): the scan's per-view shifts
  (:mod:`ctbench.io.view_shifts`).

Orientation, as CIL's ZEISSDataReader reads the file: the stored image's
pixel 0 at the *bottom left* of the panel seen from the source (CIL's default
panel origin), so ``image_seen_from="source", image_columns="right",
image_rows="up"``; CIL takes the stored angles as they are in its frame,
whose sense is the reverse of ctbench's, so ctbench's angles are the stored
ones negated (rotation ``"cw"`` for increasing stored angles).  The file is
handed to olefile as a file object that passed the guarded checks.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from .errors import ScanFileError, check_frame, open_input, read_head, require
from .fields import Provenance, max_views, rotation_of
from .orientation import Orientation
from .scan import RawScan
from .view_shifts import KEY as VIEW_SHIFTS
from .view_shifts import shifts_entry

ZEISS_SUFFIXES = (".txrm", ".txm")
_DTYPES = {5: np.dtype("<u2"), 10: np.dtype("<f4")}
_OLE_MAGIC = bytes.fromhex("D0CF11E0A1B11AE1")
ZEISS_IMAGES = Orientation("source", "right", "up", "cw")


def _olefile(path):
    return require("olefile", "Zeiss .txrm files", path)


class _Container:
    """The open OLE file: bounded stream reads that name the file and stream on every failure."""

    def __init__(self, ole, path: Path, size: int):
        self.ole, self.path, self.size = ole, path, size
        self.lock = threading.Lock()          # one OLE file object shared by dask's threads

    def stream(self, name: str, dtype, *, required=True, max_bytes: int | None = None):
        with self.lock:
            if not self.ole.exists(name):
                if required:
                    raise ScanFileError(self.path, f"has no stream {name}")
                return None
            try:
                nbytes = int(self.ole.get_size(name))
                limit = self.size if max_bytes is None else min(self.size, max_bytes)
                if nbytes > limit:
                    raise ScanFileError(self.path, f"stream {name} declares {nbytes} bytes, more than "
                                                   f"{'the file holds' if limit == self.size else 'expected'}")
                raw = self.ole.openstream(name).read()
            except ScanFileError:
                raise
            except Exception as e:    # olefile raises several types for damaged containers
                raise ScanFileError(self.path, f"stream {name} cannot be read ({e}); the file may be truncated") \
                    from None
        if len(raw) % np.dtype(dtype).itemsize:
            raise ScanFileError(self.path, f"stream {name} has {len(raw)} bytes, not a whole number of "
                                           f"{np.dtype(dtype)}")
        return np.frombuffer(raw, dtype=dtype)

    def one(self, name: str, dtype="<i4", *, required=True):
        a = self.stream(name, dtype, required=required, max_bytes=1 << 20)
        if a is None:
            return None
        if a.size == 0:
            if required:
                raise ScanFileError(self.path, f"stream {name} is empty; expected one {np.dtype(dtype)} value")
            return None
        v = a[0]
        if not np.isfinite(v):
            raise ScanFileError(self.path, f"stream {name} holds {v}; expected a finite value")
        return v

    def per_image(self, name: str, n: int, *, required=True):
        a = self.stream(name, "<f4", required=required, max_bytes=4 * max(n, 1) + (1 << 16))
        if a is None:
            return None
        if a.size < n:
            raise ScanFileError(self.path, f"stream {name} has {a.size} values for {n} images")
        a = a[:n].astype(np.float64)
        if not np.isfinite(a).all():
            raise ScanFileError(self.path, f"stream {name} holds NaN or infinite values")
        return a


def _open(path: Path):
    olefile = _olefile(path)
    if read_head(path, 8) != _OLE_MAGIC:
        raise ScanFileError(path, "is not an OLE2 compound file (a Zeiss .txrm)")
    fh = open_input(path)
    size = fh.seek(0, 2)
    fh.seek(0)
    try:
        ole = olefile.OleFileIO(fh)
    except Exception as e:    # OleFileError, struct errors and index errors of a damaged or truncated container
        fh.close()
        raise ScanFileError(path, f"is not a readable OLE2 container ({e}); the file may be truncated") from None
    return _Container(ole, path, size), fh


def _image_streams(ole) -> set[str]:
    """The ``ImageData<k>/Image<i>`` streams the container holds (its directory is bounded by the file's size)."""
    out = set()
    for parts in ole.listdir(streams=True, storages=False):
        if len(parts) == 2 and parts[0].lower().startswith("imagedata") and parts[1].lower().startswith("image"):
            out.add(f"{parts[0]}/{parts[1]}".lower())
    return out


def read_zeiss(path) -> RawScan:
    """A Zeiss ``.txrm`` file -> :class:`RawScan` (counts, cone beam), lazy; the file stays open."""
    import dask
    import dask.array as da

    path = Path(path)
    c, fh = _open(path)
    try:
        return _read(c, path, dask, da)
    except BaseException:
        c.ole.close()
        fh.close()
        raise


def _read(c: _Container, path: Path, dask, da) -> RawScan:
    prov = Provenance(path)
    cols, rows = int(c.one("ImageInfo/ImageWidth")), int(c.one("ImageInfo/ImageHeight"))
    n_of = c.one("ImageInfo/NoOfImages", required=False)
    taken = c.one("ImageInfo/ImagesTaken", required=False)
    if n_of is None and taken is None:
        raise ScanFileError(path, "has neither ImageInfo/NoOfImages nor ImageInfo/ImagesTaken (the image count)")
    if n_of is not None and taken is not None and int(n_of) != int(taken):
        raise ScanFileError(path, f"ImageInfo/NoOfImages ({int(n_of)}) and ImageInfo/ImagesTaken ({int(taken)}) "
                                  "disagree; the scan may have been stopped early")
    n = int(n_of if n_of is not None else taken)
    if min(cols, rows, n) <= 0:
        raise ScanFileError(path, f"announces {n} images of {cols} x {rows} pixels (ImageInfo/NoOfImages, "
                                  "ImageWidth, ImageHeight)")
    if n > max_views():
        raise ScanFileError(path, f"ImageInfo/NoOfImages={n} is more than the reader's bound of {max_views()}; "
                                  "raise CTBENCH_READER_MAX_VIEWS if the file is right")
    code = int(c.one("ImageInfo/DataType", required=False) or 5)
    if code not in _DTYPES:
        raise ScanFileError(path, f"has ImageInfo/DataType {code}; ctbench reads 5 (uint16) and 10 (float32)")
    dtype = _DTYPES[code]
    check_frame(path, (rows, cols), dtype.itemsize, "images")
    mode = c.one("ImageInfo/AcquisitionMode", required=False)
    if mode is not None and int(mode) != 0:        # as CIL reads it: 0 projections, otherwise a volume (.txm)
        raise ScanFileError(path, f"holds a reconstructed volume (ImageInfo/AcquisitionMode={int(mode)}), not "
                                  "projections; only projection files (.txrm) are scans")
    streams = _image_streams(c.ole)
    missing = [i for i in range(1, n + 1) if f"imagedata{(i - 1) // 100 + 1}/image{i}" not in streams]
    if missing:
        raise ScanFileError(path, f"announces {n} images (ImageInfo/NoOfImages) but has no stream "
                                  f"ImageData{(missing[0] - 1) // 100 + 1}/Image{missing[0]}"
                                  + (f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""))
    geometry = c.one("ImageInfo/XrayGeometry", required=False)
    parallel = geometry is not None and int(geometry) != 1     # 1: cone beam (CIL's reading), else parallel
    stored = c.per_image("ImageInfo/Angles", n)
    sid = sdd = None
    if not parallel:
        sid = float(np.abs(c.per_image("ImageInfo/StoRADistance", n)).mean())
        odd = float(np.abs(c.per_image("ImageInfo/DtoRADistance", n)).mean())
        if not (sid > 0 and odd >= 0):
            raise ScanFileError(path, f"has source/detector distances {sid} / {odd} mm (ImageInfo/StoRADistance, "
                                      "DtoRADistance)")
        sdd = sid + odd
        prov.derived("sid_mm", sid, "ImageInfo/StoRADistance", note="|mean| (CIL: |first|)")
        prov.derived("sdd_mm", sdd, "ImageInfo/StoRADistance + ImageInfo/DtoRADistance")
    pixel_um = float(c.one("ImageInfo/PixelSize", "<f4"))
    if not pixel_um > 0:
        raise ScanFileError(path, f"has ImageInfo/PixelSize {pixel_um}; expected a positive size in micrometres")
    pitch = pixel_um * 1e-3 * (1.0 if parallel else sdd / sid)
    prov.derived("pixel_size_mm", pitch, "ImageInfo/PixelSize" + ("" if parallel else " x SDD / SID"),
                 note="the pixel at the object, binning included (CIL)")
    binning = c.one("ImageInfo/CameraBinning", required=False)
    if binning is not None:
        prov.field("binning", int(binning), "ImageInfo/CameraBinning", note="recorded; PixelSize includes it")

    def image(i):
        a = c.stream(f"ImageData{i // 100 + 1}/Image{i + 1}", dtype, max_bytes=rows * cols * dtype.itemsize)
        if a.size != rows * cols:
            raise ScanFileError(path, f"stream ImageData{i // 100 + 1}/Image{i + 1} has {a.size} pixels, not "
                                      f"{cols} x {rows} (ImageInfo/ImageWidth x ImageHeight)")
        return a.reshape(rows, cols)

    proj = da.stack([da.from_delayed(dask.delayed(image)(i), (rows, cols), dtype) for i in range(n)])
    flats = None
    ref_code = int(c.one("ReferenceData/DataType", required=False) or 10)
    if ref_code not in _DTYPES:
        raise ScanFileError(path, f"has ReferenceData/DataType {ref_code}; ctbench reads 5 (uint16) and 10 (float32)")
    ref = c.stream("ReferenceData/Image", _DTYPES[ref_code], required=False,
                   max_bytes=rows * cols * _DTYPES[ref_code].itemsize)
    if ref is not None:
        if ref.size != rows * cols:
            raise ScanFileError(path, f"ReferenceData/Image has {ref.size} pixels, not {cols} x {rows}")
        flats = ref.reshape(1, rows, cols).astype(np.float32)
        prov.field("flat", "the reference image", "ReferenceData/Image", note="divided out, as CIL does")
    else:
        prov.default("flat", None, "no ReferenceData/Image: the brightest counts stand in for the flat field")
    scanner = {"format": "Zeiss Xradia", "pixel_size_at_object_um": pixel_um}
    if binning is not None:
        scanner["binning"] = int(binning)
    if parallel:
        scanner["beam"] = "parallel"
        prov.field("beam", "parallel", "ImageInfo/XrayGeometry")
    else:
        scanner |= {"source_object_distance_mm": sid, "source_detector_distance_mm": sdd}
    xs = c.per_image("Alignment/X-Shifts", n, required=False)
    ys = c.per_image("Alignment/Y-Shifts", n, required=False)
    if xs is not None or ys is not None:
        xs = np.zeros(n) if xs is None else xs
        if np.any(xs) or (ys is not None and np.any(ys)):     # all zero: no alignment was recorded
            scanner[VIEW_SHIFTS] = shifts_entry(xs, ys, n, "Alignment/X-Shifts, Y-Shifts", path, shape=(rows, cols))
            prov.field("view_shifts", f"{n} views", "Alignment/X-Shifts, Alignment/Y-Shifts",
                       note="image k moved by x_k columns, y_k rows (CIL, txrm2tiff)")
    angles = -np.radians(stored)
    orientation = ZEISS_IMAGES.replace(rotation=rotation_of(angles))
    prov.derived("angles", f"{n} angles", "ImageInfo/Angles", note="negated: CIL takes them as they are in its "
                                                                   "frame, which turns the other way")
    prov.default("orientation", orientation.to_dict(), "CIL's ZEISSDataReader: pixel 0 at the bottom left of the "
                                                       "panel seen from the source")
    return RawScan(proj, flats, None, angles=angles, pixel_size=(pitch, pitch), scanner=scanner,
                   source=str(path), format="zeiss", orientation=orientation, provenance=prov.as_dict())
