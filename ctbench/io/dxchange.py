"""APS Data Exchange (DXchange) HDF5 files: ``/exchange/data``, ``data_white``, ``data_dark``, ``theta``; lazy.

The layout (the DXfile definition used at APS 2-BM and 32-ID, read by
dxchange and tomopy):

- ``/exchange/data``: projections ``(n, rows, cols)`` in counts;
  ``/exchange/data_white`` and ``/exchange/data_dark``: flat and dark fields;
- ``/exchange/theta``: the rotation angle of every projection, in degrees
  unless its ``units`` attribute says ``rad``;
- the pixel pitch at the sample, first found of
  ``/measurement/instrument/detection_system/objective/resolution`` (the
  effective pixel of the stored image, micrometres),
  ``/measurement/instrument/detector/actual_pixel_size_x`` / ``_y`` or
  ``pixel_size_x`` / ``_y`` divided by
  ``/measurement/instrument/detection_system/objective/magnification``
  (sensor pixels, micrometres unless a ``units`` attribute says otherwise),
  the last two multiplied by ``/measurement/instrument/detector/binning_x``
  / ``_y`` when the file records a binning.

Beamline scans are parallel-beam: the scan's ``scanner["beam"]`` is
"parallel".  The format says nothing about the image orientation or the
sense of ``theta``, so both are "auto" unless the ``/exchange`` group
carries ctbench's orientation attributes (``image_seen_from``,
``image_columns``, ``image_rows``, ``rotation_direction``).  For a parallel
beam no data can tell the two handedness classes apart (a reversed
detector is a mirror image of the object), so state them in the recon
config when the handedness matters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ScanFileError
from .nexus import _LENGTH_TO_MM, _text
from .orientation import FILE_KEYS, Orientation
from .scan import RawScan, lazy_stack

_RESOLUTION = "measurement/instrument/detection_system/objective/resolution"
_MAGNIFICATION = "measurement/instrument/detection_system/objective/magnification"
_DETECTOR = "measurement/instrument/detector"


def is_dxchange(path) -> bool:
    """Whether an HDF5 file has a ``/exchange/data`` dataset (False for anything unreadable)."""
    try:
        import h5py

        with h5py.File(path, "r") as f:
            return isinstance(f.get("exchange/data"), h5py.Dataset)
    except (OSError, ImportError):
        return False


def _scalar(f, name: str, path: Path):
    ds = f.get(name)
    if ds is None:
        return None
    try:
        v = float(np.asarray(ds[()]).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        raise ScanFileError(path, f"/{name} must be a number") from None
    if not np.isfinite(v) or v <= 0:
        raise ScanFileError(path, f"/{name} must be a positive number, got {v!r}")
    return v


def _length(f, name: str, path: Path, default_units: str = "um"):
    v = _scalar(f, name, path)
    if v is None:
        return None
    units = _text(f[name].attrs.get("units", default_units)).strip() or default_units
    if units not in _LENGTH_TO_MM:
        raise ScanFileError(path, f"/{name} has units {units!r}; expected one of {sorted(_LENGTH_TO_MM)}")
    return v * _LENGTH_TO_MM[units]


def _pixel_size(f, path: Path):
    """(du, dv) in mm at the sample, or None when the file gives no pitch."""
    res = _length(f, _RESOLUTION, path)
    if res is not None:
        return res, res
    pitch = []
    for axis in ("x", "y"):
        p = _length(f, f"{_DETECTOR}/actual_pixel_size_{axis}", path)
        if p is None:
            p = _length(f, f"{_DETECTOR}/pixel_size_{axis}", path)
            if p is not None:
                p /= _scalar(f, _MAGNIFICATION, path) or 1.0
        if p is None:
            return None
        pitch.append(p * (_scalar(f, f"{_DETECTOR}/binning_{axis}", path) or 1.0))
    return tuple(pitch)


def read_dxchange(path) -> RawScan:
    """A DXchange HDF5 file -> :class:`RawScan` (counts, parallel beam), lazy; the file stays open."""
    import h5py

    path = Path(path)
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ScanFileError(path, f"is not a readable HDF5 file ({e})") from None
    try:
        data = f.get("exchange/data")
        if not isinstance(data, h5py.Dataset) or data.ndim != 3:
            raise ScanFileError(path, "has no 3D /exchange/data dataset (projections, rows, columns)")
        stacks = {}
        for key, name in (("flats", "exchange/data_white"), ("darks", "exchange/data_dark")):
            ds = f.get(name)
            if ds is None:
                continue
            if not isinstance(ds, h5py.Dataset) or ds.ndim not in (2, 3):
                raise ScanFileError(path, f"/{name} must be a 2D or 3D dataset")
            stacks[key] = lazy_stack(ds) if ds.ndim == 3 else np.asarray(ds[()])
        angles = None
        th = f.get("exchange/theta")
        if th is not None:
            a = np.asarray(th[()], dtype=np.float64).reshape(-1)
            units = _text(th.attrs.get("units", "degrees")).strip().lower()
            if units in ("rad", "radian", "radians"):
                angles = a
            elif units in ("deg", "degree", "degrees"):
                angles = np.radians(a)
            else:
                raise ScanFileError(path, f"/exchange/theta has units {units!r}; expected degrees or rad")
        attrs = {k: _text(v) for k, v in f["exchange"].attrs.items() if k in FILE_KEYS.values()}
        try:
            orientation = Orientation.from_dict(attrs, "/exchange attributes")
        except ValueError as e:
            raise ScanFileError(path, str(e)) from None
        scanner = {"beam": "parallel", "format": "DXchange"}
        return RawScan(lazy_stack(data), stacks.get("flats"), stacks.get("darks"), angles=angles,
                       pixel_size=_pixel_size(f, path), scanner=scanner, source=str(path), format="dxchange",
                       orientation=orientation)
    except ScanFileError:
        f.close()
        raise
    except ValueError as e:
        f.close()
        raise ScanFileError(path, str(e)) from None
