"""Volumes as multiscale OME-Zarr (OME-NGFF 0.5 on zarr v3), written slab by slab along z.

The layout is the one ome-zarr-py and napari-ome-zarr read: a zarr group whose
``ome.multiscales`` attribute lists one array per level (``"0"`` full
resolution, ``"1"`` half, ...), each with its ``scale`` in millimetres and the
``translation`` of its first voxel's centre, so a viewer places every level in
the same physical frame as ctbench's volume (centred on the origin,
docs/GEOMETRY.md).  Level ``k`` is the mean of 2 x 2 x 2 voxels of level
``k - 1`` (an odd edge pools what it has).

:class:`OmeZarrVolume` writes one z-slab at a time, all levels at once, so a
volume larger than memory never needs to be held whole.  Slabs start at
multiples of :attr:`OmeZarrVolume.slab_alignment` (the level-0 chunk depth,
at least ``2**(levels - 1)``), and the chunk depth halves from level to level,
so every slab pools only its own planes and writes whole chunks at every level: slabs can be written in any order, by several
processes at once, and a slab written twice gives the same bytes.  Chunks are
written atomically and carry a crc32c checksum (:mod:`ctbench.storage.zarr_store`).
Which slabs are finished is not recorded here: the writer's caller keeps that
(the recon pipeline's run folder), because a half-written volume must never
look finished.

The group's attributes also hold ``ctbench_output`` (the output policy's marker)
and a ``ctbench`` entry (the recon config, geometry, algorithm) for provenance.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

NGFF_VERSION = "0.5"
CHUNK_DEPTH = 16       # level-0 chunk depth along z (at least): the slab alignment
CHUNK_XY = 256         # chunk edge along y and x (a 1024^2 plane is 16 chunks)
SMALLEST_LEVEL = 128   # levels are added until the largest edge is at most this (1024^3: 4 levels)


def level_shapes(shape, n_levels: int | None = None) -> list[tuple[int, int, int]]:
    """The (z, y, x) shape of each level: halved (rounded up) until the largest edge is <= SMALLEST_LEVEL."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or any(s <= 0 for s in shape):
        raise ValueError(f"an OME-Zarr volume needs a (z, y, x) shape of positive sizes, got {shape!r}")
    out = [shape]
    while (n_levels is None and max(out[-1]) > SMALLEST_LEVEL) or (n_levels is not None and len(out) < n_levels):
        if max(out[-1]) == 1:
            break
        out.append(tuple((s + 1) // 2 for s in out[-1]))
    return out


def pool2(a: np.ndarray) -> np.ndarray:
    """Mean of 2 x 2 x 2 blocks of a (z, y, x) array; an odd edge averages the voxels it has (float32)."""
    a = np.asarray(a, dtype=np.float32)
    out = a
    for axis in range(3):
        n = out.shape[axis]
        even = n - n % 2
        head = np.take(out, np.arange(0, even, 2), axis=axis) + np.take(out, np.arange(1, even, 2), axis=axis)
        head *= 0.5
        if n % 2:
            head = np.concatenate([head, np.take(out, [n - 1], axis=axis)], axis=axis)
        out = head
    return out


def multiscales(shape, voxel_spacing, name: str = "volume", n_levels: int | None = None) -> dict:
    """The NGFF 0.5 ``multiscales`` entry of a centred (z, y, x) volume with ``voxel_spacing`` (mm)."""
    sp = tuple(float(s) for s in voxel_spacing)
    if len(sp) != 3 or not all(math.isfinite(s) and s > 0 for s in sp):
        raise ValueError(f"voxel_spacing must be three positive lengths in mm (dz, dy, dx), got {voxel_spacing!r}")
    levels = level_shapes(shape, n_levels)
    first = [-(n - 1) / 2 * d for n, d in zip(levels[0], sp)]      # centre of voxel 0, ctbench's frame
    datasets = []
    for k, _ in enumerate(levels):
        f = 2 ** k
        datasets.append({"path": str(k), "coordinateTransformations": [
            {"type": "scale", "scale": [d * f for d in sp]},
            {"type": "translation", "translation": [o + (f - 1) / 2 * d for o, d in zip(first, sp)]}]})
    axes = [{"name": a, "type": "space", "unit": "millimeter"} for a in ("z", "y", "x")]
    return {"name": name, "axes": axes, "datasets": datasets}


class OmeZarrVolume:
    """A multiscale OME-Zarr volume on disk, written slab by slab (module doc)."""

    def __init__(self, path, group):
        self.path = Path(path)
        self.group = group
        ms = group.attrs["ome"]["multiscales"][0]
        self.arrays = [group[d["path"]] for d in ms["datasets"]]
        self.shape = tuple(self.arrays[0].shape)
        self.voxel_spacing = tuple(ms["datasets"][0]["coordinateTransformations"][0]["scale"])

    # ------------------------------------------------------------ creating
    @classmethod
    def create(cls, path, shape, voxel_spacing, *, attrs: dict | None = None, n_levels: int | None = None,
               name: str = "volume") -> "OmeZarrVolume":
        """A new zero-filled multiscale volume at ``path`` (a folder that must not exist yet)."""
        import zarr
        from zarr.codecs import Crc32cCodec

        from ..output_policy import MARKER_KEY, MARKER_VALUE
        from ..storage.zarr_store import atomic_local_store

        path = Path(path)
        if path.exists():
            raise FileExistsError(f"{path} exists; an OME-Zarr volume is created in a new folder")
        meta = multiscales(shape, voxel_spacing, name, n_levels)
        store = atomic_local_store(path)
        group = zarr.create_group(store=store, zarr_format=3, attributes={
            "ome": {"version": NGFF_VERSION, "multiscales": [meta]}, MARKER_KEY: MARKER_VALUE,
            "ctbench": dict(attrs or {})})
        levels = level_shapes(shape, n_levels)
        align = max(CHUNK_DEPTH, 2 ** (len(levels) - 1))
        for k, lvl in enumerate(levels):
            chunks = (max(1, align >> k), min(CHUNK_XY, lvl[1]), min(CHUNK_XY, lvl[2]))
            group.create_array(str(k), shape=lvl, chunks=chunks, dtype=np.float32, fill_value=0.0,
                               compressors=[Crc32cCodec()], dimension_names=("z", "y", "x"))
        return cls(path, group)

    @classmethod
    def open(cls, path, mode: str = "r") -> "OmeZarrVolume":
        """Open a volume this module wrote (``mode`` "r" or "r+"); ValueError if it is not one."""
        import zarr

        from ..storage.zarr_store import atomic_local_store

        path = Path(path)
        if not (path / "zarr.json").is_file():
            raise FileNotFoundError(f"no OME-Zarr volume at {path} (no zarr.json)")
        group = zarr.open_group(store=atomic_local_store(path, read_only=mode == "r"), mode=mode)
        ome = group.attrs.get("ome")
        if not isinstance(ome, dict) or not ome.get("multiscales"):
            raise ValueError(f"{path} is a zarr group without OME-NGFF multiscales metadata")
        return cls(path, group)

    # ------------------------------------------------------------ writing
    @property
    def slab_alignment(self) -> int:
        """Slabs start at multiples of this many planes (the level-0 chunk depth)."""
        return int(self.arrays[0].chunks[0])

    @property
    def n_levels(self) -> int:
        return len(self.arrays)

    def write_slab(self, z0: int, data) -> None:
        """Write planes ``[z0, z0 + len(data))`` of level 0 and the matching planes of every other level."""
        data = np.ascontiguousarray(np.asarray(data, dtype=np.float32))
        D = self.shape[0]
        z0 = int(z0)
        if data.ndim != 3 or data.shape[1:] != self.shape[1:]:
            raise ValueError(f"a slab must be (planes, {self.shape[1]}, {self.shape[2]}), got {data.shape}")
        z1 = z0 + data.shape[0]
        if z0 < 0 or z1 > D or z1 <= z0:
            raise ValueError(f"slab [{z0}, {z1}) does not lie within the volume's {D} planes")
        if z0 % self.slab_alignment or (z1 % self.slab_alignment and z1 != D):
            raise ValueError(f"slab [{z0}, {z1}) is not aligned to {self.slab_alignment} planes (the chunk depth)")
        level = data
        for k, arr in enumerate(self.arrays):
            f = 2 ** k
            arr[z0 // f:z0 // f + level.shape[0]] = level
            if k + 1 < len(self.arrays):
                level = pool2(level)

    def set_attrs(self, **entries) -> None:
        """Add entries to the ``ctbench`` attribute (written atomically with the group's metadata)."""
        ct = dict(self.group.attrs.get("ctbench", {}))
        ct.update(entries)
        self.group.attrs["ctbench"] = ct

    # ------------------------------------------------------------ reading
    def level(self, k: int = 0):
        """Level ``k`` as a lazy dask array (chunks as stored)."""
        import dask.array as da
        return da.from_zarr(self.arrays[k])

    def read(self, z0: int = 0, z1: int | None = None, level: int = 0) -> np.ndarray:
        """Planes ``[z0, z1)`` of a level (checksums verified)."""
        return np.asarray(self.arrays[level][z0:z1])


def _group_attrs(path) -> dict | None:
    """The attributes in a folder's zarr.json (bounded read), or None."""
    import json

    from .. import guarded_open

    meta = Path(path) / "zarr.json"
    try:
        doc = json.loads(guarded_open.read_bytes(meta, limit=1 << 20))
    except (OSError, ValueError):
        return None
    attrs = doc.get("attributes") if isinstance(doc, dict) else None
    return attrs if isinstance(attrs, dict) else None


def is_ome_zarr(path) -> bool:
    """Whether ``path`` is a folder holding a zarr group with OME multiscales metadata (read from zarr.json only)."""
    attrs = _group_attrs(path)
    return attrs is not None and isinstance(attrs.get("ome"), dict) and "multiscales" in attrs["ome"]


def is_ctbench_volume(path) -> bool:
    """Whether ``path`` is an OME-Zarr volume that ctbench wrote (``ctbench recon``'s output)."""
    from ..output_policy import MARKER_KEY, MARKER_VALUE
    attrs = _group_attrs(path)
    return is_ome_zarr(path) and attrs is not None and attrs.get(MARKER_KEY) == MARKER_VALUE


__all__ = ["OmeZarrVolume", "level_shapes", "multiscales", "pool2", "is_ome_zarr", "is_ctbench_volume",
           "CHUNK_DEPTH"]
