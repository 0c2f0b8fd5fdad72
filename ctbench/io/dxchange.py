"""APS Data Exchange (DXchange) HDF5 files: ``/exchange/data``, ``data_white``, ``data_dark``, ``theta``; lazy.

The layout (the DXfile definition used at APS 2-BM and 32-ID, read by
dxchange's ``read_aps_tomoscan_hdf5`` and tomopy; docs/SCANS.md has the table):

- ``/exchange/data``: projections ``(n, rows, cols)`` in counts;
  ``/exchange/data_white`` and ``/exchange/data_dark``: flat and dark fields
  (2D or 3D); where they are missing, or one all-zero frame, the scalar
  ``/process/acquisition/flat_fields/flat_field_value`` (``dark_fields/
  dark_field_value``) stands in, as dxchange reads it;
- ``/exchange/theta``: the rotation angle of every projection, in degrees
  unless its ``units`` attribute says ``rad`` (dxchange converts degrees);
  files written without ``units`` whose angles span no more than 2 pi but at
  least a half turn *in radians* (APS 7-BM writes radians) are read as radians
  with a warning; without ``theta``, ``/process/acquisition/rotation/
  rotation_start``, ``rotation_step`` and ``num_angles`` give them;
- the pixel pitch at the sample, first found of
  ``/measurement/instrument/detection_system/objective/resolution``,
  ``/measurement/instrument/detector/actual_pixel_size_x`` / ``_y`` or
  ``pixel_size_x`` / ``_y`` divided by the objective's ``magnification``
  (micrometres unless a ``units`` attribute says otherwise), the last two
  multiplied by ``/measurement/instrument/detector/binning_x`` / ``_y``.

Beamline scans are parallel-beam: the scan's ``scanner["beam"]`` is
"parallel".  The format says nothing about the image orientation or the
sense of ``theta``, so both are "auto" unless the ``/exchange`` group
carries ctbench's orientation attributes.  For a parallel beam no data can
tell the two handedness classes apart, so state them in the recon config when
the handedness matters.  Every dataset's declared size is checked before
anything is read; h5py is given a file object that passed the guarded checks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ScanFileError, check_frame, read_head
from .fields import Provenance, max_views
from .nexus import _LENGTH_TO_MM, _text, open_hdf5
from .orientation import FILE_KEYS, Orientation
from .scan import RawScan, lazy_stack

_RESOLUTION = "measurement/instrument/detection_system/objective/resolution"
_MAGNIFICATION = "measurement/instrument/detection_system/objective/magnification"
_DETECTOR = "measurement/instrument/detector"
_ROTATION = "process/acquisition/rotation"
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def is_dxchange(path) -> bool:
    """Whether an HDF5 file has a ``/exchange/data`` dataset (False for anything unreadable, a FIFO or device
    included: the guarded opener refuses those before h5py sees them)."""
    try:
        if read_head(path, 8) != _HDF5_MAGIC:
            return False
        import h5py

        f, fh = open_hdf5(Path(path))
    except (ScanFileError, ImportError):
        return False
    try:
        return isinstance(f.get("exchange/data"), h5py.Dataset)
    except (OSError, RuntimeError, KeyError):      # damaged: the NeXus reader then names the file
        return False
    finally:
        f.close()
        fh.close()


def _scalar(f, name: str, path: Path, *, positive=True):
    ds = f.get(name)
    if ds is None:
        return None
    try:
        v = float(np.asarray(ds[()], dtype=np.float64).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        raise ScanFileError(path, f"/{name} must be a number") from None
    if not np.isfinite(v) or (positive and v <= 0):
        raise ScanFileError(path, f"/{name} must be a {'positive' if positive else 'finite'} number, got {v!r}")
    return v


def _length(f, name: str, path: Path, default_units: str = "um"):
    v = _scalar(f, name, path)
    if v is None:
        return None
    units = _text(f[name].attrs.get("units", default_units)).strip() or default_units
    if units not in _LENGTH_TO_MM:
        raise ScanFileError(path, f"/{name} has units {units!r}; expected one of {sorted(_LENGTH_TO_MM)}")
    return v * _LENGTH_TO_MM[units]


def _pixel_size(f, path: Path, prov: Provenance):
    """(du, dv) in mm at the sample, or None when the file gives no pitch."""
    res = _length(f, _RESOLUTION, path)
    if res is not None:
        prov.field("pixel_size_mm", [res, res], "/" + _RESOLUTION)
        return res, res
    pitch, used = [], []
    for axis in ("x", "y"):
        name = f"{_DETECTOR}/actual_pixel_size_{axis}"
        p = _length(f, name, path)
        if p is None:
            name = f"{_DETECTOR}/pixel_size_{axis}"
            p = _length(f, name, path)
            if p is not None:
                p /= _scalar(f, _MAGNIFICATION, path) or 1.0
                name += " / objective/magnification"
        if p is None:
            return None
        pitch.append(p * (_scalar(f, f"{_DETECTOR}/binning_{axis}", path) or 1.0))
        used.append(name + f" x binning_{axis}")
    prov.derived("pixel_size_mm", pitch, ", ".join("/" + u for u in used))
    return tuple(pitch)


def _stack(f, name: str, path: Path, frame_shape):
    """A 2D or 3D dataset as a lazy stack, its declared size checked first (a 60000^2 flat is never read)."""
    import h5py

    ds = f.get(name)
    if ds is None:
        return None
    if not isinstance(ds, h5py.Dataset) or ds.ndim not in (2, 3):
        raise ScanFileError(path, f"/{name} must be a 2D or 3D dataset")
    itemsize = np.dtype(ds.dtype).itemsize
    check_frame(path, ds.shape[-2:], itemsize, f"/{name} frames")
    if ds.chunks is not None:
        check_frame(path, ds.chunks, itemsize, f"/{name} chunks")
    if ds.ndim == 3 and ds.shape[0] > max_views():
        raise ScanFileError(path, f"/{name} declares {ds.shape[0]} frames, more than the reader's bound of "
                                  f"{max_views()}")
    if tuple(ds.shape[-2:]) != tuple(frame_shape):
        raise ScanFileError(path, f"/{name} frames are {tuple(ds.shape[-2:])} pixels but /exchange/data's are "
                                  f"{tuple(frame_shape)}")
    st = lazy_stack(ds, source=path)
    return st[None] if ds.ndim == 2 else st


def _angles(f, path: Path, n: int, prov: Provenance, scanner: dict):
    th = f.get("exchange/theta")
    if th is None:
        start, step = _scalar(f, f"{_ROTATION}/rotation_start", path, positive=False), \
            _scalar(f, f"{_ROTATION}/rotation_step", path, positive=False)
        if start is None or step is None:
            return None
        num = _scalar(f, f"{_ROTATION}/num_angles", path)
        if num is not None and int(num) != n:
            raise ScanFileError(path, f"/{_ROTATION}/num_angles is {int(num)} for {n} projections")
        prov.derived("angles", f"{n} angles", f"/{_ROTATION}/rotation_start + rotation_step x i (degrees)")
        return np.radians(start + step * np.arange(n))
    if th.size > max_views() or th.ndim > 2:
        raise ScanFileError(path, f"/exchange/theta has shape {th.shape}; expected one angle per projection")
    a = np.asarray(th[()], dtype=np.float64).reshape(-1)
    if a.size != n:
        raise ScanFileError(path, f"/exchange/theta has {a.size} angles for {n} projections")
    if not np.isfinite(a).all():
        raise ScanFileError(path, "/exchange/theta holds NaN or infinite angles")
    declared = th.attrs.get("units")
    units = _text(declared).strip().lower() if declared is not None else ""
    if units in ("rad", "radian", "radians"):
        prov.field("angles", f"{n} angles", "/exchange/theta", note="units rad")
        return a
    if units in ("deg", "degree", "degrees"):
        prov.field("angles", f"{n} angles", "/exchange/theta", note="units degrees")
        return np.radians(a)
    if units:
        raise ScanFileError(path, f"/exchange/theta has units {units!r}; expected degrees or rad")
    span = float(a.max() - a.min()) if a.size else 0.0
    if a.size >= 3 and np.pi * 0.95 <= span <= 2 * np.pi * 1.02:
        # In degrees this would be a scan of 3 to 6 degrees, which no tomography is: the file wrote radians.
        scanner.setdefault("warnings", []).append(
            f"{path.name}: /exchange/theta has no units and spans {span:.4g}: read as radians (a span of "
            f"{span:.3g} degrees is no tomography); give its units attribute to be sure")
        prov.derived("angles", f"{n} angles", "/exchange/theta", note="no units; its span says radians (as APS 7-BM "
                                                                      "writes them)")
        return a
    prov.field("angles", f"{n} angles", "/exchange/theta", note="no units: degrees (dxchange)")
    return np.radians(a)


def read_dxchange(path) -> RawScan:
    """A DXchange HDF5 file -> :class:`RawScan` (counts, parallel beam), lazy; the file stays open."""
    path = Path(path)
    f, fh = open_hdf5(path)
    try:
        return _read(f, path)
    except (OSError, RuntimeError, KeyError) as e:    # h5py's errors for damaged groups, links and headers
        f.close()
        fh.close()
        raise ScanFileError(path, f"is damaged or truncated: h5py cannot read it ({e})") from None
    except BaseException:
        f.close()
        fh.close()
        raise


def _read(f, path: Path) -> RawScan:
    import dask.array as da
    import h5py

    prov = Provenance(path)
    data = f.get("exchange/data")
    if not isinstance(data, h5py.Dataset) or data.ndim != 3:
        raise ScanFileError(path, "has no 3D /exchange/data dataset (projections, rows, columns)")
    n = int(data.shape[0])
    if n > max_views():
        raise ScanFileError(path, f"/exchange/data declares {n} projections, more than the reader's bound of "
                                  f"{max_views()}; raise CTBENCH_READER_MAX_VIEWS to read it")
    itemsize = np.dtype(data.dtype).itemsize
    check_frame(path, data.shape[1:], itemsize, "/exchange/data frames")
    if data.chunks is not None:
        check_frame(path, data.chunks, itemsize, "/exchange/data chunks")
    frame = tuple(data.shape[1:])
    stacks = {}
    for key, name, value in (("flats", "exchange/data_white", "process/acquisition/flat_fields/flat_field_value"),
                             ("darks", "exchange/data_dark", "process/acquisition/dark_fields/dark_field_value")):
        st = _stack(f, name, path, frame)
        single_zero = st is not None and st.shape[0] == 1 and f[name].size <= (1 << 24) and \
            not np.any(np.asarray(f[name][()]))
        if st is None or single_zero:
            v = _scalar(f, value, path, positive=False)
            if v is not None:
                st = da.full((1, *frame), v, dtype=np.float32)
                prov.field(key, v, "/" + value, note="dxchange's stand-in for missing frames")
            elif single_zero:
                st = None
        elif st is not None:
            prov.field(key, int(st.shape[0]), "/" + name)
        if st is not None:
            stacks[key] = st
    scanner = {"beam": "parallel", "format": "DXchange"}
    angles = _angles(f, path, n, prov, scanner)
    attrs = {k: _text(v) for k, v in f["exchange"].attrs.items() if k in FILE_KEYS.values()}
    try:
        orientation = Orientation.from_dict(attrs, "/exchange attributes")
    except ValueError as e:
        raise ScanFileError(path, str(e)) from None
    if attrs:
        prov.field("orientation", orientation.to_dict(), "/exchange attributes (ctbench's)")
    else:
        prov.default("orientation", orientation.to_dict(), "the format states no image view or rotation sense")
    prov.default("beam", "parallel", "a beamline format")
    return RawScan(lazy_stack(data, source=path), stacks.get("flats"), stacks.get("darks"), angles=angles,
                   pixel_size=_pixel_size(f, path, prov), scanner=scanner, source=str(path), format="dxchange",
                   orientation=orientation, provenance=prov.as_dict())
