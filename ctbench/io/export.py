"""Volume exporters: TIFF stack (voxel size in the tags), HDF5 and the ctbench zarr dataset.

Every exporter follows the output policy (:mod:`ctbench.output_policy`): the
target may not be, contain or lie inside an input; an existing target is
replaced only if ctbench wrote it (the files carry a ``ctbench_output`` marker)
or with ``force=True``.  The volume is written to a hidden sibling of the
target and exchanged into place only when the whole volume is written and
flushed, so an export that fails halfway (a full disk, an error while
computing a lazy volume) leaves no file behind and never damages an existing
one, and a kill leaves the old or the new file (what a kill between the
fallback's two renames leaves is put back by the next export or
:func:`read_volume`).  Volumes are written slab by slab along z, so lazy
(dask / zarr) volumes larger than memory export too.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..output_policy import (MARKER_KEY, MARKER_VALUE, check_output, recover_interrupted_replace, remove_path,
                             replace_into_place, staging_path)
from .errors import ScanFileError

EXPORT_FORMATS = {".tif": "tiff", ".tiff": "tiff", ".h5": "hdf5", ".hdf5": "hdf5", ".hdf": "hdf5", ".nxs": "hdf5",
                  ".zarr": "zarr"}


def export_format(path, format: str = "auto") -> str:
    """"tiff", "hdf5" or "zarr" from ``format`` or the suffix of ``path``; ValueError otherwise."""
    if format != "auto":
        if format not in ("tiff", "hdf5", "zarr"):
            raise ValueError(f"format must be 'auto', 'tiff', 'hdf5' or 'zarr', got {format!r}")
        return format
    suffix = Path(path).suffix.lower()
    if suffix not in EXPORT_FORMATS:
        raise ValueError(f"cannot tell the export format of {path}: use a suffix in {sorted(EXPORT_FORMATS)} "
                         "or pass format=")
    return EXPORT_FORMATS[suffix]


def _spacing(voxel_spacing, ndim: int) -> tuple[float, ...]:
    sp = voxel_spacing
    if isinstance(sp, bool) or (isinstance(sp, (tuple, list)) and any(isinstance(s, bool) for s in sp)):
        raise ValueError(f"voxel_spacing must be lengths in mm (z, y, x), got {voxel_spacing!r}")
    sp = (float(sp),) * ndim if isinstance(sp, (int, float)) else tuple(float(s) for s in sp)
    if len(sp) != ndim or not all(math.isfinite(s) and s > 0 for s in sp):
        raise ValueError(f"voxel_spacing must be {ndim} positive lengths in mm (z, y, x), got {voxel_spacing!r}")
    return sp


def _as_array(volume):
    try:
        volume = volume.detach().cpu().numpy()   # torch, without importing it
    except AttributeError:
        pass
    if not hasattr(volume, "shape") or not hasattr(volume, "dtype"):
        volume = np.asarray(volume)
    if len(volume.shape) not in (2, 3):
        raise ValueError(f"volume must be (D, H, W) or (H, W), got shape {tuple(volume.shape)}")
    if np.dtype(volume.dtype).kind not in "fiub":
        raise ValueError(f"volume must hold numbers, got dtype {volume.dtype}")
    return volume if len(volume.shape) == 3 else volume[None]


def _slabs(volume, step: int = 16):
    for z0 in range(0, volume.shape[0], step):
        slab = volume[z0:z0 + step]
        yield z0, np.asarray(slab.compute() if hasattr(slab, "compute") else slab)


def export_volume(path, volume, voxel_spacing, *, format: str = "auto", overwrite: bool = False,
                  meta: dict | None = None, geometry=None, force: bool = False, inputs=()) -> Path:
    """Write ``volume`` (z, y, x; numpy, torch, dask or zarr) with its voxel size (mm) and return the path.

    TIFF: an ImageJ-compatible float32 stack; X/YResolution hold pixels per
    mm, the ImageJ description holds ``spacing`` (dz) and ``unit=mm``.
    HDF5: dataset ``/volume`` with attributes ``voxel_spacing``, ``axes``,
    ``units`` and ``meta`` (JSON).  zarr: a ctbench dataset
    (:func:`ctbench.workbench.dataset.save_dataset`), with ``geometry`` if given.

    ``overwrite=True`` replaces an existing output only if ctbench wrote it;
    ``force=True`` replaces whatever stands there (never an input).  ``inputs``:
    paths the output may not be, contain or lie inside (the scan it came from).
    """
    path = Path(path)
    fmt = export_format(path, format)
    vol = _as_array(volume)
    sp = _spacing(voxel_spacing, 3 if len(getattr(volume, "shape", vol.shape)) == 3 else 2)
    sp3 = sp if len(sp) == 3 else (1.0, *sp)
    meta = dict(meta or {})
    try:
        meta_json = json.dumps(meta)
    except TypeError as e:
        raise ValueError(f"meta must be JSON-serialisable: {e}") from None
    if not path.parent.is_dir():
        raise ScanFileError(path, f"cannot be written: the folder {path.parent} does not exist")
    check_output(path, inputs, overwrite=overwrite, force=force)
    if fmt == "zarr":
        from ..workbench.dataset import save_dataset
        data = np.concatenate([s for _, s in _slabs(vol)]) if len(sp) == 3 else np.asarray(vol)[0]
        return save_dataset(path, volume=data, voxel_spacing=sp, geometry=geometry, meta=meta,
                            overwrite=overwrite, force=force, inputs=inputs)
    tmp = staging_path(path)
    try:
        if fmt == "tiff":
            _write_tiff(tmp, vol, sp3, meta_json)
        else:
            _write_hdf5(tmp, vol, sp3, meta_json)
        # Judged again after the swap: a foreign file that appeared meanwhile is put back, not deleted.
        replace_into_place(tmp, path, may_replace=None if force else _replaceable)
    except BaseException:
        remove_path(tmp)
        raise
    return path


def _replaceable(old: Path) -> bool:
    from ..output_policy import written_by_ctbench
    return written_by_ctbench(old)


def _write_tiff(tmp: Path, vol, sp, meta_json: str) -> None:
    import tifffile

    dz, dy, dx = sp
    D, H, W = vol.shape

    def pages():
        for _, slab in _slabs(vol):
            for page in slab.astype(np.float32, copy=False):
                yield page

    tifffile.imwrite(tmp, pages(), shape=(D, H, W), dtype=np.float32, imagej=True,
                     resolution=(1.0 / dx, 1.0 / dy),
                     metadata={"axes": "ZYX", "spacing": dz, "unit": "mm", MARKER_KEY: MARKER_VALUE,
                               "ctbench": meta_json})


def _write_hdf5(tmp: Path, vol, sp, meta_json: str) -> None:
    import h5py

    with h5py.File(tmp, "w") as f:
        f.attrs[MARKER_KEY] = MARKER_VALUE   # the output policy's marker: ctbench wrote this file
        ds = f.create_dataset("volume", shape=vol.shape, dtype=np.float32,
                              chunks=(1, *vol.shape[1:]) if vol.shape[0] > 1 else None)
        for z0, slab in _slabs(vol):
            ds[z0:z0 + slab.shape[0]] = slab
        ds.attrs["voxel_spacing"] = np.asarray(sp, dtype=np.float64)
        ds.attrs["axes"] = "z,y,x"
        ds.attrs["units"] = "mm"
        ds.attrs["values"] = "linear attenuation per mm"
        ds.attrs["meta"] = meta_json


def read_volume(path) -> tuple[np.ndarray, tuple[float, float, float]]:
    """Read back a volume written by :func:`export_volume`: (array, (dz, dy, dx) in mm).

    Guarded like every reader (regular files only; a compressed TIFF may not
    declare more than the reader's bound, ``CTBENCH_READER_MAX_BYTES``), and a
    damaged file's spacing (zero, negative, NaN) is an error naming the field.
    """
    path = Path(path)
    fmt = export_format(path)
    if not os.path.lexists(path):
        recover_interrupted_replace(path)   # an export killed between its two renames: put it back
    if not os.path.lexists(path):
        raise ScanFileError(path, "does not exist")
    if fmt == "tiff":
        vol, sp = _read_tiff_volume(path)
    elif fmt == "hdf5":
        vol, sp = _read_hdf5_volume(path)
    else:
        from ..workbench.dataset import load_dataset
        try:
            d = load_dataset(path)
        except (ValueError, FileNotFoundError) as e:
            raise ScanFileError(path, str(e)) from None
        if d.volume is None:
            raise ScanFileError(path, "holds no volume")
        sp = d.voxel_spacing
        vol, sp = np.asarray(d.volume), tuple(sp) if len(sp) == 3 else (1.0, *sp)
    bad = [name for name, s in zip(("dz", "dy", "dx"), sp) if not (math.isfinite(s) and s > 0)]
    if bad:
        raise ScanFileError(path, f"has a damaged voxel spacing {tuple(sp)}: {', '.join(bad)} must be positive "
                                  "finite lengths in mm")
    return vol, tuple(float(s) for s in sp)


def _read_tiff_volume(path: Path):
    import tifffile

    from .. import guarded_open
    from .errors import as_scan_error, check_frame

    try:
        fh = guarded_open.open_regular(path)
    except guarded_open.InputError as e:
        raise as_scan_error(e) from None
    with fh:
        try:
            tif = tifffile.TiffFile(fh)
        except Exception as e:
            raise ScanFileError(path, f"is not a readable TIFF file ({e})") from None
        with tif:
            series = tif.series[0]
            dtype = np.dtype(series.dtype)
            check_frame(path, series.shape[-2:], dtype.itemsize, "a page")
            page = tif.pages[0]
            if page.compression != 1:    # compressed: the declared size is bounded, not the file's
                check_frame(path, series.shape, dtype.itemsize, "a compressed volume")
            ij = tif.imagej_metadata or {}
            tags = page.tags
            res = []
            for tag in ("XResolution", "YResolution"):
                if tag not in tags:
                    res.append(1.0)
                    continue
                num, den = tags[tag].value
                if not num or not den:
                    raise ScanFileError(path, f"TIFF tag {tag} is {num}/{den}; a resolution must be a positive "
                                              "number of pixels per mm")
                res.append(den / num)
            try:
                dz = float(ij.get("spacing", 1.0))
            except (TypeError, ValueError):
                raise ScanFileError(path, f"ImageJ 'spacing' is {ij.get('spacing')!r}, not a number") from None
            try:
                vol = tif.asarray()
            except Exception as e:
                raise ScanFileError(path, f"could not be read ({e})") from None
    return (vol if vol.ndim == 3 else vol[None]), (dz, res[1], res[0])


def _read_hdf5_volume(path: Path):
    import h5py

    from .errors import check_frame, check_input

    check_input(path)
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ScanFileError(path, f"is not a readable HDF5 file ({e})") from None
    with f:
        ds = f.get("volume")
        if not isinstance(ds, h5py.Dataset):
            raise ScanFileError(path, "has no /volume dataset (not a volume exported by ctbench)")
        if ds.ndim not in (2, 3):
            raise ScanFileError(path, f"/volume has shape {ds.shape}; expected (D, H, W)")
        check_frame(path, ds.shape[-2:], ds.dtype.itemsize, "/volume slices")
        if ds.compression is not None:
            check_frame(path, ds.shape, ds.dtype.itemsize, "a compressed /volume")
        if "voxel_spacing" not in ds.attrs:
            raise ScanFileError(path, "/volume lacks its voxel_spacing attribute")
        try:
            sp = tuple(float(s) for s in np.asarray(ds.attrs["voxel_spacing"]).reshape(-1))
        except (TypeError, ValueError):
            raise ScanFileError(path, "/volume's voxel_spacing attribute is not three numbers") from None
        if len(sp) != 3:
            raise ScanFileError(path, f"/volume's voxel_spacing attribute has {len(sp)} values; expected 3")
        return ds[()], sp
