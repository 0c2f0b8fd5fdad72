"""HDF5 / NeXus ``NXtomo`` reader (h5py), lazy.

An NXtomo entry stores every frame in one ``(n, rows, cols)`` dataset,
``instrument/detector/data``, with ``image_key`` telling them apart
(0 projection, 1 flat field, 2 dark field, 3 invalid), the rotation angle
of every frame in ``sample/rotation_angle`` and the pixel pitch in
``instrument/detector/x_pixel_size`` / ``y_pixel_size`` with a ``units``
attribute.  The file stays open while the returned stack is in use; frames
are read when indexed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import guarded_open
from .errors import ScanFileError, check_frame, check_input
from .scan import RawScan, lazy_stack

NEXUS_SUFFIXES = (".h5", ".hdf5", ".hdf", ".nxs", ".nx", ".nx5")
_LENGTH_TO_MM = {"m": 1e3, "metre": 1e3, "meter": 1e3, "cm": 10.0, "mm": 1.0, "um": 1e-3, "µm": 1e-3,
                 "micron": 1e-3, "micrometre": 1e-3, "micrometer": 1e-3, "nm": 1e-6}
_ANGLE_TO_RAD = {"degree": np.pi / 180, "degrees": np.pi / 180, "deg": np.pi / 180, "rad": 1.0, "radian": 1.0,
                 "radians": 1.0}


def _text(v) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray) and v.size == 1:
        return _text(v.reshape(-1)[0])
    return str(v)


def _find_entry(f, path: Path):
    entries = [g for g in f.values() if hasattr(g, "keys") and _text(g.attrs.get("NX_class", "")) == "NXentry"]
    tomo = [g for g in entries if "definition" in g and _text(g["definition"][()]) == "NXtomo"]
    if tomo:
        return tomo[0]
    if entries:
        return entries[0]
    if "entry" in f:
        return f["entry"]
    raise ScanFileError(path, "has no NXentry group (expected an NXtomo entry, e.g. /entry)")


def _first(group, names):
    for n in names:
        if n in group:
            return group[n]
    return None


def _length_mm(ds, path: Path, what: str) -> float:
    value = float(np.asarray(ds[()]).reshape(-1)[0])
    units = _text(ds.attrs.get("units", "mm")).strip()
    if units not in _LENGTH_TO_MM:
        raise ScanFileError(path, f"{ds.name} ({what}) has units {units!r}; expected one of {sorted(_LENGTH_TO_MM)}")
    return value * _LENGTH_TO_MM[units]


def _check_declared(path: Path, data, n: int) -> None:
    """Bounds before allocation: frame size, frame count and h5py chunk size, from the metadata alone."""
    max_views = guarded_open.reader_limit("CTBENCH_READER_MAX_VIEWS", 1_000_000)
    if n > max_views:
        raise ScanFileError(path, f"{data.name} declares {n} frames, more than the reader's bound of {max_views}; "
                                  "raise CTBENCH_READER_MAX_VIEWS to read it")
    itemsize = np.dtype(data.dtype).itemsize
    check_frame(path, data.shape[1:], itemsize, f"{data.name} frames")
    if data.chunks is not None:     # reading one pixel decompresses its whole chunk
        check_frame(path, data.chunks, itemsize, f"{data.name} chunks")


def _image_keys(path: Path, key_ds, n: int) -> np.ndarray:
    """The image_key of every frame: whole numbers in {0, 1, 2, 3} (a 0.7 is not silently a projection)."""
    if key_ds is None:
        return np.zeros(n, dtype=np.int64)
    if key_ds.size != n:
        raise ScanFileError(path, f"{key_ds.name} has {key_ds.size} entries for {n} frames")
    raw = np.asarray(key_ds[()]).reshape(-1)
    if raw.dtype.kind not in "iuf":
        raise ScanFileError(path, f"{key_ds.name} must hold integers, got {raw.dtype}")
    if raw.dtype.kind == "f" and not (np.isfinite(raw).all() and (raw == np.round(raw)).all()):
        bad = raw[~(np.isfinite(raw) & (raw == np.round(raw)))][:5].tolist()
        raise ScanFileError(path, f"{key_ds.name} must hold whole numbers 0-3, got {bad}")
    keys = raw.astype(np.int64)
    bad = sorted(set(np.unique(keys).tolist()) - {0, 1, 2, 3})
    if bad:
        raise ScanFileError(path, f"{key_ds.name} holds {bad}; NXtomo uses 0 projection, 1 flat, 2 dark, 3 invalid")
    return keys


def read_nexus(path, entry: str | None = None) -> RawScan:
    """An NXtomo file -> :class:`RawScan` with projections, flats and darks split by ``image_key``."""
    import h5py

    path = Path(path)
    check_input(path)     # a FIFO or device is refused before h5py opens it by name
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ScanFileError(path, f"is not a readable HDF5 file ({e})") from None
    try:
        ent = f[entry] if entry else _find_entry(f, path)
    except KeyError:
        f.close()
        raise ScanFileError(path, f"has no group {entry!r}") from None
    except ScanFileError:
        f.close()
        raise
    det = _first(ent, ["instrument/detector"])
    data = None
    for name in ("instrument/detector/data", "data/data", "data"):
        if name in ent and isinstance(ent[name], h5py.Dataset):
            data = ent[name]
            break
    if data is None:
        f.close()
        raise ScanFileError(path, f"{ent.name} has no frame data (looked for instrument/detector/data and data/data)")
    if data.ndim != 3:
        f.close()
        raise ScanFileError(path, f"{data.name} has shape {data.shape}; expected (frames, rows, cols)")
    n = data.shape[0]
    try:
        _check_declared(path, data, n)
        keys = _image_keys(path, _first(ent, ["instrument/detector/image_key", "data/image_key"]), n)
    except ScanFileError:
        f.close()
        raise
    try:
        # Reading a frame's first pixel finds truncated or damaged files now rather than mid-reconstruction.
        data[n - 1, 0, 0]
    except Exception as e:
        f.close()
        raise ScanFileError(path, f"{data.name} cannot be read ({e}); the file may be truncated") from None
    stack = lazy_stack(data)
    proj_idx, flat_idx, dark_idx = (np.flatnonzero(keys == k) for k in (0, 1, 2))
    if proj_idx.size == 0:
        f.close()
        raise ScanFileError(path, "has no projections (no frame with image_key 0)")
    angles = None
    ang = _first(ent, ["sample/rotation_angle", "data/rotation_angle"])
    if ang is not None:
        unit = _text(ang.attrs.get("units", "degree")).strip()
        if unit not in _ANGLE_TO_RAD:
            f.close()
            raise ScanFileError(path, f"{ang.name} has units {unit!r}; expected degree or rad")
        ang_name = ang.name        # read before the file is closed: a closed dataset has no name
        if ang.size != n:
            f.close()
            raise ScanFileError(path, f"{ang_name} has {ang.size} angles for {n} frames")
        a = np.asarray(ang[()], dtype=np.float64).reshape(-1)
        angles = a[proj_idx] * _ANGLE_TO_RAD[unit]
    pixel = None
    scanner: dict = {}
    if det is not None:
        xs, ys = _first(det, ["x_pixel_size"]), _first(det, ["y_pixel_size"])
        if xs is not None:
            du = _length_mm(xs, path, "x pixel size")
            pixel = (du, _length_mm(ys, path, "y pixel size") if ys is not None else du)
        if "distance" in det:
            scanner["sample_detector_distance_mm"] = _length_mm(det["distance"], path, "detector distance")
    src = _first(ent, ["instrument/source/distance"])
    if src is not None:
        scanner["source_sample_distance_mm"] = abs(_length_mm(src, path, "source distance"))
    scanner["entry"] = ent.name
    return RawScan(stack[proj_idx], stack[flat_idx] if flat_idx.size else None,
                   stack[dark_idx] if dark_idx.size else None, angles=angles, pixel_size=pixel,
                   scanner=scanner, source=str(path), format="nexus")
