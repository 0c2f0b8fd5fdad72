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

Reliability (docs/RELIABILITY.md):

- Writes follow the output policy (:mod:`ctbench.output_policy`) and go to a
  fresh hidden sibling folder; when it is complete it is flushed to disk and
  swapped with the old dataset by rename (one atomic ``renameat2`` exchange on
  Linux, two renames elsewhere, finished by the next save or load if killed
  between them) and only then is the old one deleted.  Killed at any point, the
  path holds the old dataset or the new one, complete.
- Version 2 datasets hold a ``manifest`` (the arrays with shape, dtype,
  chunks) and crc32c-checksummed chunks, every chunk written; a missing array
  or attribute, a missing chunk or a damaged chunk raises
  :class:`DatasetError` naming the array and the chunk.  Each array also
  records the checksum of every chunk at its position
  (:func:`ctbench.storage.zarr_store.write_chunk_positions`), so a valid chunk
  copied over another is refused too.
- Reads refuse symlinks out of the dataset and non-regular files (FIFOs,
  devices), and an eager load refuses to allocate more than ``max_bytes``.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.base import StoreIntegrityError
from ..atomic_files import pid_alive
from ..output_policy import check_output, replace_into_place, staging_path
from ..storage.zarr_store import MAX_METADATA_BYTES, atomic_local_store, safe_file_size, write_chunk_positions
from .design import ScanGeometry

FORMAT = "ctbench.dataset"
VERSION = 2  # 2: manifest + crc32c chunks; version 1 datasets still load (without those checks)
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
            if isinstance(sp, bool) or (isinstance(sp, (tuple, list)) and any(isinstance(v, bool) for v in sp)):
                raise ValueError(f"voxel_spacing must be lengths in mm, got {sp!r} (a boolean is not a length)")
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


#: Largest array an eager :func:`load_dataset` allocates unless told otherwise (``max_bytes=``).
DEFAULT_MAX_BYTES = 8 << 30
_NEW, _OLD = ".new-", ".old-"


class DatasetError(StoreIntegrityError):
    """A dataset on disk is damaged or incomplete; the message names the array, chunk or attribute."""


def _check_meta(meta) -> dict:
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict of JSON values, got {type(meta).__name__}")
    return dict(meta)


def save_dataset(path: str | Path, dataset: Dataset | None = None, *, volume=None, sinogram=None,
                 geometry: ScanGeometry | None = None, voxel_spacing=None, meta: dict | None = None,
                 overwrite: bool = False, chunks: int = 64, force: bool = False, inputs=()) -> Path:
    """Write a dataset to ``path`` (a ``.zarr`` folder) and return the path.

    Pass a :class:`Dataset` or its fields as keywords.  The output policy
    (:mod:`ctbench.output_policy`) applies: ``overwrite=False`` refuses to
    replace an existing path; ``overwrite=True`` replaces a dataset or an empty
    folder (never another kind of folder or file, unless ``force=True``)
    crash-safely: the old one stays complete until the new one is; the path
    may not be, contain or lie inside any of ``inputs``.  Arrays are chunked in
    blocks of at most ``chunks`` along every axis.
    """
    if dataset is None:
        dataset = Dataset(volume=None if volume is None else _as_numpy(volume),
                          sinogram=None if sinogram is None else _as_numpy(sinogram),
                          geometry=geometry, voxel_spacing=voxel_spacing, meta=_check_meta(meta))
    elif any(x is not None for x in (volume, sinogram, geometry, voxel_spacing, meta)):
        raise TypeError("pass either a Dataset or its fields as keywords, not both")
    try:
        json.dumps(dataset.meta)
    except TypeError as e:
        raise ValueError(f"dataset meta must be JSON-serialisable: {e}") from None
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks <= 0:
        raise ValueError(f"chunks must be a positive integer (voxels per chunk axis), got {chunks!r}")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_interrupted_save(path)
    check_output(path, inputs, overwrite=overwrite, force=force, what="dataset path")
    tmp = staging_path(path)
    tmp.mkdir(mode=0o700)
    try:
        _write_group(tmp, dataset, chunks)
        swap_into_place(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _write_group(folder: Path, dataset: Dataset, chunks: int) -> None:
    """The whole dataset in ``folder``: arrays (every chunk, crc32c) first, the group's attributes last."""
    import zarr

    store = atomic_local_store(folder)
    group = zarr.open_group(store=store, mode="w", zarr_format=3)
    attrs: dict[str, Any] = {"format": FORMAT, "version": VERSION, "units": UNITS,
                             "geometry": None if dataset.geometry is None else dataset.geometry.to_dict(),
                             "meta": dataset.meta, "manifest": {}}
    for name in ("volume", "sinogram"):
        data = getattr(dataset, name)
        if data is None:
            continue
        data = _as_numpy(data)
        chunk_shape = tuple(min(chunks, max(s, 1)) for s in data.shape)
        arr, attrs["manifest"][name] = create_array(group, name, data.shape, data.dtype, chunk_shape)
        arr[...] = data
        write_chunk_positions(folder / name)   # binds each chunk's checksum to its position
        attrs[name] = {"axes": _axes(name, data.ndim)}
    if dataset.volume is not None:
        attrs["volume"]["voxel_spacing"] = list(dataset.voxel_spacing)
    group.attrs.update(attrs)


# Every chunk is written, even when all zeros, so that a missing chunk is damage, not "zeros".
WRITE_CONFIG = {"write_empty_chunks": True}


def open_array_for_writing(path: str | Path):
    """An array of a dataset being written, opened again so that every chunk is written (also all-zero ones).

    ``zarr.open_array(..., config=...)`` ignores ``config`` for an existing array (zarr 3.1), which let
    the job worker skip all-zero planes that a strict load then read as damage; ``with_config`` holds.
    """
    import zarr

    arr = zarr.open_array(str(path), mode="r+").with_config(WRITE_CONFIG)
    if not arr.config.write_empty_chunks:  # a zarr that drops the setting again must fail here, not at load
        raise RuntimeError(f"zarr did not keep write_empty_chunks=True for {path}")
    return arr


def create_array(group, name: str, shape, dtype, chunk_shape):
    """Create the array ``name`` of a dataset in the zarr ``group`` with the format's codecs (zstd, crc32c on
    every chunk); returns (the array, opened for writing every chunk, and its manifest entry).

    Writers that fill a dataset in parts (the job worker's ranks) use it too, opening the array again with
    :func:`open_array_for_writing`, so every dataset is verifiable.
    """
    from zarr.codecs import Crc32cCodec, ZstdCodec

    dtype = np.dtype(dtype)
    arr = group.create_array(name, shape=tuple(shape), dtype=dtype, chunks=tuple(chunk_shape),
                             compressors=(ZstdCodec(), Crc32cCodec()), config=WRITE_CONFIG)
    arr = arr.with_config(WRITE_CONFIG)
    return arr, {"shape": list(shape), "dtype": dtype.str, "chunks": list(chunk_shape), "checksum": "crc32c"}


def swap_into_place(new: Path, path: Path, *, may_replace=None) -> None:
    """Put the complete dataset ``new`` at ``path`` by exchange; the old dataset is deleted only after
    (:func:`ctbench.output_policy.replace_into_place`; ``may_replace(old)`` vetoes deleting a foreign one)."""
    replace_into_place(new, path, may_replace=may_replace)


def _remove_tree(folder: Path) -> None:
    if os.path.islink(folder):  # a dataset path that was a symlink: drop the link, never its target
        os.unlink(folder)
    else:
        shutil.rmtree(folder, ignore_errors=True)


def _siblings(path: Path, tag: str) -> list[Path]:
    return sorted(path.parent.glob(f".{glob.escape(path.name)}{tag}*"))


def _writer_alive(folder: Path, path: Path, tag: str) -> bool:
    pid = folder.name[len(f".{path.name}{tag}"):].split("-")[0]
    return pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid))


def recover_interrupted_save(path: str | Path) -> None:
    """Finish or undo a save that was killed, and remove what dead writers left next to ``path``.

    Only a save killed between the two renames of the fallback swap leaves
    ``path`` missing: the complete new dataset is then moved into place (or,
    failing that, the complete old one).  Temporary folders of writers that
    are still running are left alone.
    """
    path = Path(path)
    if not os.path.lexists(path):
        for tag in (_NEW, _OLD):
            for cand in _siblings(path, tag):
                if not _writer_alive(cand, path, tag) and _is_complete(cand):
                    os.rename(cand, path)
                    break
            if os.path.lexists(path):
                break
    for tag in (_NEW, _OLD):
        for cand in _siblings(path, tag):
            if not _writer_alive(cand, path, tag):
                _remove_tree(cand)


def _is_complete(folder: Path) -> bool:
    try:
        verify_dataset(folder)
        return True
    except (DatasetError, OSError, ValueError):
        return False


def _read_small_json(path: Path, root: Path, what: str, limit: int = MAX_METADATA_BYTES) -> dict | None:
    """A JSON document from a regular file inside ``root`` of at most ``limit`` bytes (None if absent)."""
    size = safe_file_size(path, os.path.realpath(root), what)
    if size is None:
        return None
    if size > limit:
        raise DatasetError(f"{what} is {size} bytes; at most {limit} expected")
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    try:
        return json.loads(raw)
    except RecursionError:     # 100000 nested '[' in a small file: an integrity error, not a crash
        raise DatasetError(f"{what} is nested too deeply to be ctbench metadata") from None


def is_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a ctbench dataset (cheap: reads only the group's attributes; never blocks)."""
    path = Path(path)
    try:
        if not path.is_dir():
            return False
        doc = _read_small_json(path / "zarr.json", path, f"{path}/zarr.json")
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("node_type") == "group" and \
        isinstance(doc.get("attributes"), dict) and doc["attributes"].get("format") == FORMAT


def _group_attrs(path: Path) -> dict:
    doc = _read_small_json(path / "zarr.json", path, f"{path}/zarr.json")
    if not isinstance(doc, dict) or doc.get("node_type") != "group" or \
            not isinstance(doc.get("attributes"), dict) or doc["attributes"].get("format") != FORMAT:
        raise ValueError(f"{path} is not a ctbench dataset (a zarr v3 group with attrs format={FORMAT!r})")
    return doc["attributes"]


def verify_dataset(path: str | Path, *, chunks: bool = False) -> dict:
    """Check a dataset against its manifest; returns the group attributes.

    Every array of the manifest must exist with its shape, dtype and chunks,
    and the attributes that describe it must be there; ``chunks=True`` also
    reads every chunk (each present, each passing its crc32c checksum).
    Raises :class:`DatasetError` naming the damaged array, chunk or attribute.
    """
    path = Path(path)
    attrs = _group_attrs(path)
    version = attrs.get("version", 0)
    if not isinstance(version, int) or version > VERSION:
        raise ValueError(f"{path} is a version {version!r} dataset; this ctbench reads up to {VERSION}")
    manifest = attrs.get("manifest")
    if version >= 2:
        if not isinstance(manifest, dict) or not manifest or set(manifest) - {"volume", "sinogram"}:
            raise DatasetError(f"{path}: the dataset's manifest (attrs 'manifest': the arrays it holds) is "
                               "missing or damaged")
    else:  # version 1: no manifest; the attributes name the arrays
        manifest = {name: None for name in ("volume", "sinogram") if name in attrs}
        if not manifest:
            raise DatasetError(f"{path}: the dataset names neither a volume nor a sinogram")
    for name, want in manifest.items():
        section = attrs.get(name)
        if not isinstance(section, dict) or "axes" not in section:
            raise DatasetError(f"{path}: the attribute '{name}' (its axes) is missing for the stored {name}")
        if name == "volume" and "voxel_spacing" not in section:
            raise DatasetError(f"{path}: the attribute 'volume.voxel_spacing' is missing")
        meta = _read_small_json(path / name / "zarr.json", path, f"{path}/{name}/zarr.json")
        if not isinstance(meta, dict) or meta.get("node_type") != "array":
            raise DatasetError(f"{path}: the array '{name}' listed in the dataset is missing")
        if want is not None:
            got = {"shape": meta.get("shape"), "chunks": (meta.get("chunk_grid") or {}).get("configuration",
                                                                                             {}).get("chunk_shape")}
            for key in ("shape", "chunks"):
                if list(got[key] or []) != list(want[key]):
                    raise DatasetError(f"{path}: the array '{name}' has {key} {got[key]}; the manifest says "
                                       f"{want[key]}")
            codecs = meta.get("codecs") or []
            if not codecs or not isinstance(codecs[-1], dict) or codecs[-1].get("name") != "crc32c":
                raise DatasetError(f"{path}: the array '{name}' lost its crc32c checksum codec")
    if chunks:
        group = _open_group(path, manifest)
        for name in manifest:
            arr = group[name]
            step = arr.chunks[0]
            for z in range(0, arr.shape[0], step):
                arr[z:z + step]
    return attrs


def _open_group(path: Path, manifest: dict):
    import zarr

    required = [name for name, want in manifest.items() if want is not None]
    store = atomic_local_store(path, read_only=True, require_chunks=required)
    return zarr.open_group(store=store, mode="r")


def _wrap(fn, *args):
    """Integrity errors of the store layer as DatasetError (same message)."""
    try:
        return fn(*args)
    except DatasetError:
        raise
    except StoreIntegrityError as e:
        raise DatasetError(str(e)) from None


def load_dataset(path: str | Path, *, lazy: bool = False, max_bytes: int | None = DEFAULT_MAX_BYTES) -> Dataset:
    """Open a dataset written by :func:`save_dataset`, checked against its manifest.

    ``lazy=True`` returns zarr arrays that read (and verify) chunks on
    indexing, for volumes larger than memory; otherwise numpy arrays, each
    chunk verified.  An eager load refuses an array larger than ``max_bytes``
    (default 8 GiB; ``None`` for no bound) before allocating it, so that the
    metadata of a damaged or planted file cannot exhaust memory.  Damage
    raises :class:`DatasetError` naming the array and chunk.
    """
    path = Path(path)
    if not os.path.lexists(path):
        recover_interrupted_save(path)
        if not os.path.lexists(path):
            raise FileNotFoundError(f"no dataset at {path}")
    if not is_dataset(path):
        raise ValueError(f"{path} is not a ctbench dataset (a zarr v3 group with attrs format={FORMAT!r})")
    if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes <= 0):
        raise ValueError(f"max_bytes must be a positive number of bytes or None, got {max_bytes!r}")
    attrs = _wrap(verify_dataset, path)
    units = (attrs.get("units") or {}).get("length", "mm")
    if units != "mm":
        raise ValueError(f"{path}: length unit {units!r} is not supported (expected 'mm')")
    manifest = attrs.get("manifest") if attrs.get("version", 1) >= 2 else \
        {name: None for name in ("volume", "sinogram") if name in attrs}
    group = _wrap(_open_group, path, manifest)
    arrays = {}
    for name in manifest:
        arr = group[name]
        if lazy:
            arrays[name] = arr
            continue
        nbytes = int(np.prod(arr.shape, dtype=np.float64) * arr.dtype.itemsize)
        if max_bytes is not None and nbytes > max_bytes:
            raise ValueError(f"{path}: the {name} is {arr.shape} {arr.dtype} ({nbytes / 2**30:.2f} GiB), more "
                             f"than max_bytes={max_bytes}; pass lazy=True to read it window by window, or a "
                             "larger max_bytes (None: no bound) if it fits in memory")
        arrays[name] = _wrap(lambda a: np.asarray(a[...]), arr)
    geo = attrs.get("geometry")
    geometry = ScanGeometry.from_dict(geo) if geo else None
    spacing = attrs["volume"].get("voxel_spacing") if "volume" in arrays else None
    meta = attrs.get("meta", {})
    return Dataset(volume=arrays.get("volume"), sinogram=arrays.get("sinogram"), geometry=geometry,
                   voxel_spacing=None if spacing is None else tuple(spacing),
                   meta=dict(meta) if isinstance(meta, dict) else {})
