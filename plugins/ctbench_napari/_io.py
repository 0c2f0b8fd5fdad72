"""Reader and writer contributions: ctbench datasets (.zarr), volumes ``ctbench recon`` wrote as OME-Zarr
(.ome.zarr, read lazily as a multiscale layer in mm) and trajectory JSON.

napari calls ``get_reader(path)``; it returns a reader function for paths
this plugin understands and None otherwise, so other readers get their turn.

Reading is bounded (docs/RELIABILITY.md): only regular files are opened (a
FIFO or device never blocks napari), JSON files are at most
``CTBENCH_READER_MAX_BYTES`` (default 64 MiB), a dataset's volume stays a lazy
zarr array (chunks read and verified as napari displays them), a sinogram is
read only up to ``CTBENCH_READER_MAX_BYTES`` (default 2 GiB) and a trajectory
preview builds at most ``CTBENCH_READER_MAX_VIEWS`` views (default 100000).
The environment variables are the explicit override.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ctbench import guarded_open
from ctbench.workbench.design import SCAN_FORMAT, ScanGeometry, design_of, scan_from_trajectory
from ctbench.geometry import Trajectory
from ctbench.io.ome_zarr import is_ctbench_volume
from ctbench.workbench.dataset import Dataset, is_dataset, load_dataset, save_dataset

from ._layers import (KEY, UNITS, LayerData, display_to_sinogram, sinogram_layer, trajectory_layers,
                      volume_layer_kwargs)


def _single(path) -> str | None:
    if isinstance(path, (list, tuple)):
        return str(path[0]) if len(path) == 1 else None
    return str(path)


# ------------------------------------------------------------------ reading
def get_reader(path) -> Callable | None:
    """Reader for a ctbench dataset folder (.zarr) or a trajectory/scan JSON file."""
    p = _single(path)
    if p is None:
        return None
    if p.rstrip("/").endswith(".zarr") and is_dataset(p):
        return read_dataset
    if p.rstrip("/").endswith(".zarr") and is_ctbench_volume(p):
        return read_ome_zarr
    if p.endswith(".json") and _json_format(p) in ("ctbench.trajectory", SCAN_FORMAT):
        return read_trajectory
    return None


def _limit(name: str, default: int) -> int:
    """A reader bound from the environment (the explicit override), else ``default``."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise ValueError(f"{name} must be a positive number, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {raw!r}")
    return value


def _max_bytes() -> int:
    return _limit("CTBENCH_READER_MAX_BYTES", 2 << 30)


def _load_json(path: str):
    """A JSON file that is a regular file of bounded size (never a FIFO, device or huge file)."""
    return guarded_open.read_json(path)   # the one guarded way to open an input (InputError is a ValueError)


def _json_format(path: str) -> str | None:
    try:
        d = _load_json(path)
    except (OSError, ValueError):
        return None
    return d.get("format") if isinstance(d, dict) else None


def dataset_layers(ds: Dataset, name: str) -> list[LayerData]:
    """Layers of a dataset: the volume (placed in mm) and the sinogram (with its geometry)."""
    layers = []
    if ds.volume is not None:
        vol = ds.volume
        kw = volume_layer_kwargs(vol.shape, ds.voxel_spacing, f"{name} volume", geometry=ds.geometry,
                                 extra={"dataset_meta": ds.meta})
        layers.append((vol, kw, "image"))    # a lazy array stays lazy
    if ds.sinogram is not None:
        if ds.geometry is None:
            # Without geometry the sinogram is only an image: say so in the metadata.
            layers.append((np.asarray(ds.sinogram), {"name": f"{name} sinogram (no geometry)", "units": UNITS,
                                                     "metadata": {KEY: {"kind": "image"}}}, "image"))
        else:
            layers.append(sinogram_layer(ds.sinogram, ds.geometry, f"{name} sinogram",
                                         extra={"dataset_meta": ds.meta}))
    return layers


def read_ome_zarr(path) -> list[LayerData]:
    """A ctbench OME-Zarr volume as one multiscale image: every level a lazy dask array (napari reads the
    chunks of the level and region it draws, so the first picture does not wait for the volume), placed in
    mm, with the recon's geometry in the metadata."""
    from ctbench.io.ome_zarr import OmeZarrVolume

    p = _single(path)
    vol = OmeZarrVolume.open(p)
    levels = [vol.level(k) for k in range(vol.n_levels)]
    attrs = dict(vol.group.attrs.get("ctbench") or {})
    geometry = None
    if isinstance(attrs.get("geometry"), dict):
        try:
            geometry = ScanGeometry.from_dict(attrs["geometry"])
        except (ValueError, TypeError, KeyError):
            geometry = None          # a volume without a usable geometry still displays
    # the contrast of the plane napari shows first (the middle one), from the smallest level: a few chunks
    from ctbench.workbench.metrics import percentile_window
    small = levels[-1]
    lo, hi = percentile_window(np.asarray(small[small.shape[0] // 2], dtype=np.float32))
    recon = attrs.get("recon") if isinstance(attrs.get("recon"), dict) else {}
    extra = {"source": "ome-zarr", "path": str(Path(p).resolve()), "levels": len(levels)}
    if isinstance(recon.get("algorithm"), dict):
        extra["recon"] = recon["algorithm"]
    kw = volume_layer_kwargs(levels[0].shape, vol.voxel_spacing, Path(p.rstrip("/")).name.removesuffix(".ome.zarr"),
                             geometry=geometry, extra=extra, multiscale=True, contrast_limits=[lo, hi])
    return [(levels, kw, "image")]


def read_dataset(path) -> list[LayerData]:
    """Layers of a dataset: the volume stays lazy; the sinogram is read within the reader's bound."""
    p = _single(path)
    ds = load_dataset(p, lazy=True)
    if ds.sinogram is not None:
        s = ds.sinogram
        nbytes = int(np.prod(s.shape, dtype=np.float64)) * s.dtype.itemsize
        if nbytes > _max_bytes():
            raise ValueError(f"{p}: the sinogram is {tuple(s.shape)} {s.dtype} ({nbytes / 2**30:.2f} GiB), more "
                             f"than the reader's bound of {_max_bytes()} bytes; raise CTBENCH_READER_MAX_BYTES "
                             "to read it")
        ds.sinogram = np.asarray(s[...])
    return dataset_layers(ds, Path(p.rstrip("/")).stem)


def result_layers(path) -> list[LayerData]:
    """Layers of a reconstruction result (a job's or a saved local one): the one result loader of the widgets.

    Reads and verifies every chunk now (call it in a worker thread) when the
    volume fits the reader's bound, else keeps it lazy; the dataset's ``meta``
    (algorithm, parameters, ranks) becomes the layer's ``recon`` metadata, as
    for a result made in this window.
    """
    p = _single(path)
    ds = load_dataset(p, lazy=True)
    for name in ("volume", "sinogram"):
        a = getattr(ds, name)
        if a is not None and int(np.prod(a.shape, dtype=np.float64)) * a.dtype.itemsize <= _max_bytes():
            setattr(ds, name, np.asarray(a[...]))
    layers = dataset_layers(ds, Path(p.rstrip("/")).stem)
    from ctbench.workbench.metrics import percentile_window

    for data, kw, _ in layers:
        meta = kw.setdefault("metadata", {}).setdefault(KEY, {})
        meta["recon"] = dict(ds.meta)
        if isinstance(data, np.ndarray) and "contrast_limits" not in kw:
            kw["contrast_limits"] = percentile_window(data)   # here, in the caller's worker thread
    return layers


def _check_views(n_views, where: str) -> None:
    limit = _limit("CTBENCH_READER_MAX_VIEWS", 100_000)
    if not isinstance(n_views, int) or n_views > limit:
        raise ValueError(f"{where} asks for {n_views!r} views, more than the reader's bound of {limit}; raise "
                         "CTBENCH_READER_MAX_VIEWS to preview it")


def read_trajectory(path) -> list[LayerData]:
    """Trajectory preview layers of a ``ctbench.trajectory`` (or ``ctbench.scan``) JSON file.

    A bare trajectory gets its detector and grid from the designer form saved
    in its meta, or defaults (64-pixel detector, 64^3 grid of 1 mm voxels).
    """
    p = _single(path)
    d = _load_json(p)
    if d.get("format") == SCAN_FORMAT:
        geo = ScanGeometry.from_dict(d)
    else:
        tr = Trajectory.from_dict(d)
        design = design_of(tr)
        if design is not None:  # its build() would generate design.n_views views
            _check_views(design.n_views, f"{p}: the saved trajectory design")
        geo = scan_from_trajectory(tr)
    return trajectory_layers(geo, Path(p).stem)


# ------------------------------------------------------------------ writing
class DatasetWriteError(Exception):
    """Why a ctbench dataset could not be written.

    Deliberately not a ValueError: napari's save path swallows ValueErrors
    from writers and tells the user only "No data written!"; this one
    reaches the user with its own text.
    """


def write_dataset(path: str, layer_data: list[tuple[Any, dict, str]]) -> list[str]:
    """Write image layers as one ctbench dataset (see :func:`_write_dataset`); errors as :class:`DatasetWriteError`."""
    try:
        return _write_dataset(path, layer_data)
    except (ValueError, TypeError, KeyError, FileExistsError) as e:   # the output policy's refusals included
        from ._text import unquote

        raise DatasetWriteError(f"cannot save {Path(str(path)).name} as a ctbench dataset: {unquote(str(e))}") \
            from e


def _write_dataset(path: str, layer_data: list[tuple[Any, dict, str]]) -> list[str]:
    """Write image layers as one ctbench dataset: at most one volume and one sinogram.

    A layer with ctbench sinogram metadata becomes the sinogram (with its
    geometry); any other image becomes the volume, with its scale as the
    voxel pitch.  Returns the written path.
    """
    volume = sinogram = geometry = spacing = None
    meta: dict = {}
    inputs = [src for data, _, _ in layer_data if (src := _lazy_source(data)) is not None]
    for data, attrs, ltype in layer_data:
        if ltype != "image":
            raise ValueError(f"a ctbench dataset stores image layers only, not {ltype} layers")
        m = (attrs.get("metadata") or {}).get(KEY, {})
        if m.get("kind") == "sinogram":
            if sinogram is not None:
                raise ValueError("select at most one sinogram layer to save as a ctbench dataset")
            sinogram = display_to_sinogram(np.asarray(data), m.get("axes"))
            geometry = ScanGeometry.from_dict(m["geometry"])
            meta["sinogram_layer"] = attrs.get("name")
        else:
            if volume is not None:
                raise ValueError("select at most one volume layer to save as a ctbench dataset")
            volume = np.asarray(data)
            if volume.ndim not in (2, 3):
                raise ValueError(f"layer '{attrs.get('name')}' has {volume.ndim} dimensions; "
                                 "a volume is (z, y, x) or (y, x)")
            scale = attrs.get("scale")
            spacing = tuple(float(s) for s in scale[-volume.ndim:]) if scale is not None else (1.0,) * volume.ndim
            meta["volume_layer"] = attrs.get("name")
            if "recon" in m:
                meta["recon"] = m["recon"]
            if geometry is None and isinstance(m.get("geometry"), dict):
                geometry = ScanGeometry.from_dict(m["geometry"])
    p = path if path.rstrip("/").endswith(".zarr") else path + ".zarr"
    # The output policy: replaces only a ctbench dataset, never the dataset a lazy layer still reads from.
    save_dataset(p, volume=volume, sinogram=sinogram, geometry=geometry, voxel_spacing=spacing, meta=meta,
                 overwrite=True, inputs=inputs)
    return [p]


def _lazy_source(data) -> str | None:
    """The folder a lazily opened zarr layer reads from (an input of the save), else None."""
    root = getattr(getattr(data, "store", None), "root", None)
    return None if root is None else str(root)

