"""HDF5 / NeXus ``NXtomo`` reader (h5py), lazy.

An NXtomo entry (the application definition; docs/SCANS.md has the table)
stores every frame in one ``(n, rows, cols)`` dataset, the NXdetector's
``data``, with ``image_key`` telling them apart (0 projection, 1 flat field,
2 dark field, 3 invalid; ``image_key_control``'s -1, an alignment frame, is
preferred where present and left out too), the rotation angle of every frame in the NXsample's
``rotation_angle`` (required; ``units`` degree or rad), the pixel pitch in the
NXdetector's ``x_pixel_size`` (columns) / ``y_pixel_size`` (rows) with a
``units`` attribute, the sample-detector ``distance``, and optionally the
axis column ``x_rotation_axis_pixel_position``.  Groups are found by their
``NX_class`` (an entry may be an ``NXsubentry``, as Diamond writes
``/entry1/tomo_entry``), not only by the names the definition suggests.  The
file stays open while the returned stack is in use; frames are read when
indexed.  h5py is given a file object that passed the guarded checks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ScanFileError, check_frame, open_input, require
from .fields import Provenance, max_views
from .scan import RawScan, lazy_stack

NEXUS_SUFFIXES = (".h5", ".hdf5", ".hdf", ".nxs", ".nx", ".nx5")
_LENGTH_TO_MM = {"m": 1e3, "metre": 1e3, "meter": 1e3, "cm": 10.0, "mm": 1.0, "um": 1e-3, "µm": 1e-3,
                 "micron": 1e-3, "microns": 1e-3, "micrometre": 1e-3, "micrometer": 1e-3, "nm": 1e-6}
_ANGLE_TO_RAD = {"degree": np.pi / 180, "degrees": np.pi / 180, "deg": np.pi / 180, "rad": 1.0, "radian": 1.0,
                 "radians": 1.0}


def _text(v) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray) and v.size == 1:
        return _text(v.reshape(-1)[0])
    return str(v)


def h5py_module(path):
    return require("h5py", "HDF5 files (NeXus, DXchange)", path)


def open_hdf5(path: Path):
    """``(h5py.File, file object)`` of ``path`` opened through the guarded opener (a FIFO or device never
    reaches h5py); ScanFileError for anything h5py cannot read."""
    h5py = h5py_module(path)
    fh = open_input(path)
    try:
        return h5py.File(fh, "r"), fh
    except Exception as e:     # OSError for a damaged file, others for a truncated superblock
        fh.close()
        raise ScanFileError(path, f"is not a readable HDF5 file ({e})") from None


def _nx_class(g) -> str:
    return _text(g.attrs.get("NX_class", ""))


def _children(g, cls: str):
    import h5py

    return [v for v in g.values() if isinstance(v, h5py.Group) and _nx_class(v) == cls]


def _find_entry(f, path: Path):
    """The NXtomo entry: an NXentry or NXsubentry (one level down) whose ``definition`` is NXtomo, else the first
    NXentry, else ``/entry``."""
    entries = _children(f, "NXentry")
    cands = []
    for e in entries:
        cands.append(e)
        cands += _children(e, "NXsubentry")
    for g in cands:
        if "definition" in g and _text(g["definition"][()]).strip() == "NXtomo":
            return g
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


def _detector(ent):
    """The NXdetector holding the frames: ``instrument/detector``, else any NXdetector of any NXinstrument."""
    if "instrument/detector" in ent:
        return ent["instrument/detector"]
    for inst in _children(ent, "NXinstrument") + ([ent["instrument"]] if "instrument" in ent else []):
        dets = _children(inst, "NXdetector")
        with_data = [d for d in dets if "data" in d]
        if with_data or dets:
            return (with_data or dets)[0]
    return None


def _sample(ent):
    if "sample" in ent:
        return ent["sample"]
    found = _children(ent, "NXsample")
    return found[0] if found else None


def _source(ent):
    for inst in _children(ent, "NXinstrument") + ([ent["instrument"]] if "instrument" in ent else []):
        if "source" in inst:
            return inst["source"]
        found = _children(inst, "NXsource")
        if found:
            return found[0]
    return None


def _length_mm(ds, path: Path, what: str) -> float:
    try:
        value = float(np.asarray(ds[()], dtype=np.float64).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        raise ScanFileError(path, f"{ds.name} ({what}) must be a number") from None
    if not np.isfinite(value):
        raise ScanFileError(path, f"{ds.name} ({what}) is {value}; expected a finite length")
    units = _text(ds.attrs.get("units", "mm")).strip()
    if units not in _LENGTH_TO_MM:
        raise ScanFileError(path, f"{ds.name} ({what}) has units {units!r}; expected one of {sorted(_LENGTH_TO_MM)}")
    return value * _LENGTH_TO_MM[units]


def _check_declared(path: Path, data, n: int) -> None:
    """Bounds before allocation: frame size, frame count and h5py chunk size, from the metadata alone."""
    if n > max_views():
        raise ScanFileError(path, f"{data.name} declares {n} frames, more than the reader's bound of {max_views()}; "
                                  "raise CTBENCH_READER_MAX_VIEWS to read it")
    itemsize = np.dtype(data.dtype).itemsize
    check_frame(path, data.shape[1:], itemsize, f"{data.name} frames")
    if data.chunks is not None:     # reading one pixel decompresses its whole chunk
        check_frame(path, data.chunks, itemsize, f"{data.name} chunks")


def _image_keys(path: Path, key_ds, n: int, control: bool = False) -> np.ndarray:
    """The image_key of every frame: whole numbers in {0, 1, 2, 3} (a 0.7 is not silently a projection);
    ``image_key_control`` also has -1 (alignment), left out like 3."""
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
    allowed = {0, 1, 2, 3} | ({-1} if control else set())
    bad = sorted(set(np.unique(keys).tolist()) - allowed)
    if bad:
        raise ScanFileError(path, f"{key_ds.name} holds {bad}; NXtomo uses 0 projection, 1 flat, 2 dark, 3 invalid"
                                  + (" (-1 alignment in image_key_control)" if control else ""))
    return np.where(keys < 0, 3, keys)


def read_nexus(path, entry: str | None = None, *, require_angles: bool = True) -> RawScan:
    """An NXtomo file -> :class:`RawScan` with projections, flats and darks split by ``image_key``.

    ``require_angles=False`` accepts a file without ``rotation_angle`` (the caller gives the angles)."""
    path = Path(path)
    f, fh = open_hdf5(path)
    try:
        return _read(f, path, entry, require_angles)
    except (OSError, RuntimeError, KeyError) as e:    # h5py's errors for damaged groups, links and headers
        f.close()
        fh.close()
        raise ScanFileError(path, f"is damaged or truncated: h5py cannot read it ({e})") from None
    except BaseException:
        f.close()
        fh.close()
        raise


def _read(f, path: Path, entry, require_angles: bool) -> RawScan:
    import h5py

    prov = Provenance(path)
    try:
        ent = f[entry] if entry else _find_entry(f, path)
    except KeyError:
        raise ScanFileError(path, f"has no group {entry!r}") from None
    det = _detector(ent)
    data = None
    for holder, name in ((det, "data"), (ent, "data/data"), (ent, "data")):
        if holder is not None and name in holder and isinstance(holder[name], h5py.Dataset):
            data = holder[name]
            break
    if data is None:
        raise ScanFileError(path, f"{ent.name} has no frame data (looked for the NXdetector's data and data/data)")
    if data.ndim != 3:
        raise ScanFileError(path, f"{data.name} has shape {data.shape}; expected (frames, rows, cols)")
    n = data.shape[0]
    _check_declared(path, data, n)
    key_ds = None
    control = False
    # image_key_control first: nxtomomill writes -1 there for alignment frames, which image_key calls projections
    for holder, name, ctl in ((det, "image_key_control", True), (det, "image_key", False),
                              (ent, "data/image_key", False)):
        if holder is not None and name in holder:
            key_ds, control = holder[name], ctl
            break
    keys = _image_keys(path, key_ds, n, control)
    if key_ds is not None:
        prov.field("frames", {"projections": int((keys == 0).sum()), "flats": int((keys == 1).sum()),
                              "darks": int((keys == 2).sum())}, key_ds.name)
    else:
        prov.default("frames", {"projections": n}, "no image_key: every frame a projection")
    try:
        # Reading a frame's first pixel finds truncated or damaged files now rather than mid-reconstruction.
        data[n - 1, 0, 0]
    except Exception as e:
        raise ScanFileError(path, f"{data.name} cannot be read ({e}); the file may be truncated") from None
    stack = lazy_stack(data, source=path)
    proj_idx, flat_idx, dark_idx = (np.flatnonzero(keys == k) for k in (0, 1, 2))
    if proj_idx.size == 0:
        raise ScanFileError(path, "has no projections (no frame with image_key 0)")
    angles = None
    sample = _sample(ent)
    ang = None
    for holder, name in ((sample, "rotation_angle"), (ent, "data/rotation_angle")):
        if holder is not None and name in holder:
            ang = holder[name]
            break
    if ang is not None:
        unit = _text(ang.attrs.get("units", "degree")).strip()
        if unit not in _ANGLE_TO_RAD:
            raise ScanFileError(path, f"{ang.name} has units {unit!r}; expected degree or rad")
        if ang.size != n:
            raise ScanFileError(path, f"{ang.name} has {ang.size} angles for {n} frames")
        a = np.asarray(ang[()], dtype=np.float64).reshape(-1)[proj_idx]
        if not np.isfinite(a).all():
            raise ScanFileError(path, f"{ang.name} holds NaN or infinite angles")
        angles = a * _ANGLE_TO_RAD[unit]
        prov.field("angles", f"{angles.size} angles", ang.name, note=f"units {unit!r}, taken as ctbench's")
    elif require_angles:
        raise ScanFileError(path, f"has no rotation angles ({ent.name}/sample/rotation_angle, which NXtomo requires); "
                                  "a scan without angles cannot be reconstructed")
    pixel = None
    scanner: dict = {}
    if det is not None:
        xs, ys = _first(det, ["x_pixel_size"]), _first(det, ["y_pixel_size"])
        if xs is not None:
            du = _length_mm(xs, path, "x pixel size")
            dv = _length_mm(ys, path, "y pixel size") if ys is not None else du
            if not (du > 0 and dv > 0):
                raise ScanFileError(path, f"{xs.name} / y_pixel_size must be positive, got {du} / {dv} mm")
            pixel = (du, dv)
            prov.field("pixel_size_mm", pixel, xs.name + (", y_pixel_size" if ys is not None else ""),
                       note="x along the columns, y along the rows")
        if "distance" in det:
            scanner["sample_detector_distance_mm"] = abs(_length_mm(det["distance"], path, "detector distance"))
            prov.field("sample_detector_distance_mm", scanner["sample_detector_distance_mm"], det["distance"].name)
        if "x_rotation_axis_pixel_position" in det and pixel is not None:
            ds = det["x_rotation_axis_pixel_position"]
            try:
                col = float(np.asarray(ds[()], dtype=np.float64).reshape(-1)[0])
            except (TypeError, ValueError, IndexError):
                raise ScanFileError(path, f"{ds.name} must be a number") from None
            cols = data.shape[2]
            if not (np.isfinite(col) and abs(col) <= 2 * cols):
                raise ScanFileError(path, f"{ds.name} is {col}; expected a column of the {cols}-pixel detector")
            scanner["rotation_axis_column"] = col
            prov.field("rotation_axis_column", col, ds.name, note="kept; the offset follows the image view")
    src = _source(ent)
    if src is not None and "distance" in src:
        scanner["source_sample_distance_mm"] = abs(_length_mm(src["distance"], path, "source distance"))
        prov.field("sid_mm", scanner["source_sample_distance_mm"], src["distance"].name)
    scanner["entry"] = ent.name
    prov.default("orientation", "auto", "NXtomo states no image view or rotation sense: decided from the data")
    return RawScan(stack[proj_idx], stack[flat_idx] if flat_idx.size else None,
                   stack[dark_idx] if dark_idx.size else None, angles=angles, pixel_size=pixel,
                   scanner=scanner, source=str(path), format="nexus", provenance=prov.as_dict())
