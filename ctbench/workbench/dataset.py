"""The ctbench dataset format: a zarr v3 group with a volume and/or a sinogram.

Layout of ``name.zarr/``::

    volume     (D, H, W) or (H, W) array, world axes (z, y, x), attenuation per mm
    sinogram   (n_views, U, V) or (n_views, U) array of line integrals
    attrs      {"format": "ctbench.dataset", "version": 1,
                "units": {...},
                "volume": {"axes": [...], "voxel_spacing": [...]},      # when a volume is stored
                "sinogram": {"axes": [...]},                           # when a sinogram is stored
                "geometry": <ScanGeometry.to_dict()> or null,          # trajectory, detector, grid
                "meta": {...}}                                         # free-form, JSON

Arrays keep ctbench's tensor axis order (never a display order), so a
dataset opens identically in scripts, in the napari plugin and in jobs.
Writes go to a temporary sibling folder that is renamed into place, so a
crash never leaves a half-written dataset under the final name.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .design import ScanGeometry

FORMAT = "ctbench.dataset"
VERSION = 1
UNITS = {
    "length": "mm",
    "volume": "linear attenuation per mm",
    "sinogram": "line integral (attenuation per mm x mm, dimensionless)",
}


@dataclass
class Dataset:
    """A volume and/or sinogram with the scan geometry that relates them.

    ``volume`` and ``sinogram`` are numpy arrays (or zarr arrays when opened
    lazily); ``voxel_spacing`` belongs to the stored volume, which may be on
    another grid than ``geometry``'s reconstruction grid.
    """

    volume: Any = None
    sinogram: Any = None
    geometry: ScanGeometry | None = None
    voxel_spacing: tuple[float, ...] | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.volume is None and self.sinogram is None:
            raise ValueError("a dataset needs a volume, a sinogram or both")
        if self.geometry is not None and not isinstance(self.geometry, ScanGeometry):
            raise TypeError(f"geometry must be a ctbench ScanGeometry, got {type(self.geometry).__name__}")
        if self.volume is not None:
            ndim = len(self.volume.shape)
            if ndim not in (2, 3):
                raise ValueError(f"volume must be (D, H, W) or (H, W), got shape {tuple(self.volume.shape)}")
            if self.voxel_spacing is None:
                geo = self.geometry
                if geo is not None and tuple(self.volume.shape) == tuple(geo.volume_shape):
                    self.voxel_spacing = tuple(geo.voxel_spacing)
                else:
                    raise ValueError("voxel_spacing is required for a volume (mm per voxel along each axis) "
                                     "unless the volume has the geometry's volume_shape")
            sp = self.voxel_spacing
            sp = (float(sp),) * ndim if isinstance(sp, (int, float)) else tuple(float(s) for s in sp)
            if len(sp) != ndim or not all(math.isfinite(s) and s > 0 for s in sp):
                raise ValueError(f"voxel_spacing must be {ndim} positive lengths in mm, got {self.voxel_spacing!r}")
            self.voxel_spacing = sp
        if self.sinogram is not None:
            if len(self.sinogram.shape) not in (2, 3):
                raise ValueError(f"sinogram must be (n_views, U, V) or (n_views, U), got shape "
                                 f"{tuple(self.sinogram.shape)}")
            if self.geometry is not None and tuple(self.sinogram.shape) != self.geometry.sinogram_shape:
                raise ValueError(f"sinogram shape {tuple(self.sinogram.shape)} does not match the geometry's "
                                 f"{self.geometry.sinogram_shape} (n_views, *detector_shape)")


def _axes(kind: str, ndim: int) -> list[str]:
    if kind == "volume":
        return ["z", "y", "x"] if ndim == 3 else ["y", "x"]
    return ["view", "u", "v"] if ndim == 3 else ["view", "u"]


def _as_numpy(a) -> np.ndarray:
    try:  # torch tensors, without importing torch here
        a = a.detach().cpu().numpy()
    except AttributeError:
        pass
    a = np.asarray(a)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"dataset arrays must be numeric, got dtype {a.dtype}")
    return a


def save_dataset(path: str | Path, dataset: Dataset | None = None, *, volume=None, sinogram=None,
                 geometry: ScanGeometry | None = None, voxel_spacing=None, meta: dict | None = None,
                 overwrite: bool = False, chunks: int = 64) -> Path:
    """Write a dataset to ``path`` (a ``.zarr`` folder) and return the path.

    Pass a :class:`Dataset` or its fields as keywords.  ``overwrite=False``
    refuses to replace an existing path.  Arrays are chunked in blocks of at
    most ``chunks`` along every axis.
    """
    if dataset is None:
        dataset = Dataset(volume=None if volume is None else _as_numpy(volume),
                          sinogram=None if sinogram is None else _as_numpy(sinogram),
                          geometry=geometry, voxel_spacing=voxel_spacing, meta=dict(meta or {}))
    elif any(x is not None for x in (volume, sinogram, geometry, voxel_spacing, meta)):
        raise TypeError("pass either a Dataset or its fields as keywords, not both")
    try:
        json.dumps(dataset.meta)
    except TypeError as e:
        raise ValueError(f"dataset meta must be JSON-serialisable: {e}") from None
    import zarr

    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    tmp = path.with_name(path.name + ".tmp-write")
    if tmp.exists():
        shutil.rmtree(tmp)
    attrs: dict[str, Any] = {"format": FORMAT, "version": VERSION, "units": UNITS,
                             "geometry": None if dataset.geometry is None else dataset.geometry.to_dict(),
                             "meta": dataset.meta}
    group = zarr.open_group(str(tmp), mode="w", zarr_format=3)
    for name in ("volume", "sinogram"):
        data = getattr(dataset, name)
        if data is None:
            continue
        data = _as_numpy(data)
        arr = group.create_array(name, shape=data.shape, dtype=data.dtype,
                                 chunks=tuple(min(chunks, max(s, 1)) for s in data.shape))
        arr[...] = data
        attrs[name] = {"axes": _axes(name, data.ndim)}
    if dataset.volume is not None:
        attrs["volume"]["voxel_spacing"] = list(dataset.voxel_spacing)
    group.attrs.update(attrs)
    if path.exists():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    tmp.rename(path)
    return path


def is_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a ctbench dataset (cheap: reads only the group's attributes)."""
    path = Path(path)
    meta = path / "zarr.json"
    if not meta.is_file():
        return False
    try:
        doc = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return doc.get("node_type") == "group" and doc.get("attributes", {}).get("format") == FORMAT


def load_dataset(path: str | Path, *, lazy: bool = False) -> Dataset:
    """Open a dataset written by :func:`save_dataset`.

    ``lazy=True`` returns zarr arrays that read on indexing (for volumes
    larger than memory); otherwise numpy arrays.
    """
    import zarr

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no dataset at {path}")
    if not is_dataset(path):
        raise ValueError(f"{path} is not a ctbench dataset (a zarr v3 group with attrs format={FORMAT!r})")
    group = zarr.open_group(str(path), mode="r")
    attrs = dict(group.attrs)
    if int(attrs.get("version", 0)) > VERSION:
        raise ValueError(f"{path} is a version {attrs.get('version')} dataset; this ctbench reads up to {VERSION}")
    units = attrs.get("units", {}).get("length", "mm")
    if units != "mm":
        raise ValueError(f"{path}: length unit {units!r} is not supported (expected 'mm')")
    arrays = {}
    for name in ("volume", "sinogram"):
        if name in attrs and name in group:
            arr = group[name]
            arrays[name] = arr if lazy else np.asarray(arr[...])
    geo = attrs.get("geometry")
    geometry = ScanGeometry.from_dict(geo) if geo else None
    spacing = attrs.get("volume", {}).get("voxel_spacing") if "volume" in arrays else None
    return Dataset(volume=arrays.get("volume"), sinogram=arrays.get("sinogram"), geometry=geometry,
                   voxel_spacing=None if spacing is None else tuple(spacing), meta=dict(attrs.get("meta", {})))
