"""Reader and writer contributions: ctbench datasets (.zarr) and trajectory JSON.

napari calls ``get_reader(path)``; it returns a reader function for paths
this plugin understands and None otherwise, so other readers get their turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ctbench.workbench.design import SCAN_FORMAT, ScanGeometry, scan_from_trajectory
from ctbench.geometry import Trajectory
from ctbench.workbench.dataset import Dataset, is_dataset, load_dataset, save_dataset

from ._layers import KEY, LayerData, display_to_sinogram, sinogram_layer, trajectory_layers, volume_layer


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
    if p.endswith(".json") and _json_format(p) in ("ctbench.trajectory", SCAN_FORMAT):
        return read_trajectory
    return None


def _json_format(path: str) -> str | None:
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d.get("format") if isinstance(d, dict) else None


def dataset_layers(ds: Dataset, name: str) -> list[LayerData]:
    """Layers of a dataset: the volume (placed in mm) and the sinogram (with its geometry)."""
    layers = []
    if ds.volume is not None:
        layers.append(volume_layer(np.asarray(ds.volume), ds.voxel_spacing, f"{name} volume", geometry=ds.geometry,
                                   extra={"dataset_meta": ds.meta}))
    if ds.sinogram is not None:
        if ds.geometry is None:
            # Without geometry the sinogram is only an image: say so in the metadata.
            layers.append((np.asarray(ds.sinogram), {"name": f"{name} sinogram (no geometry)",
                                                     "metadata": {KEY: {"kind": "image"}}}, "image"))
        else:
            layers.append(sinogram_layer(ds.sinogram, ds.geometry, f"{name} sinogram",
                                         extra={"dataset_meta": ds.meta}))
    return layers


def read_dataset(path) -> list[LayerData]:
    p = _single(path)
    ds = load_dataset(p)
    return dataset_layers(ds, Path(p.rstrip("/")).stem)


def read_trajectory(path) -> list[LayerData]:
    """Trajectory preview layers of a ``ctbench.trajectory`` (or ``ctbench.scan``) JSON file.

    A bare trajectory gets its detector and grid from the designer form saved
    in its meta, or defaults (64-pixel detector, 64^3 grid of 1 mm voxels).
    """
    p = _single(path)
    text = Path(p).read_text()
    d = json.loads(text)
    if d.get("format") == SCAN_FORMAT:
        geo = ScanGeometry.from_dict(d)
    else:
        geo = scan_from_trajectory(Trajectory.from_dict(d))
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
    except (ValueError, TypeError, KeyError, FileExistsError) as e:
        raise DatasetWriteError(f"cannot save {Path(str(path)).name} as a ctbench dataset: {str(e).strip(chr(39))}") \
            from e


def _write_dataset(path: str, layer_data: list[tuple[Any, dict, str]]) -> list[str]:
    """Write image layers as one ctbench dataset: at most one volume and one sinogram.

    A layer with ctbench sinogram metadata becomes the sinogram (with its
    geometry); any other image becomes the volume, with its scale as the
    voxel pitch.  Returns the written path.
    """
    volume = sinogram = geometry = spacing = None
    meta: dict = {}
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
    save_dataset(p, volume=volume, sinogram=sinogram, geometry=geometry, voxel_spacing=spacing, meta=meta,
                 overwrite=True)
    return [p]

