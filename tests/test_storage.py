"""Block stores: the protocol, the in-memory TensorStore and the zarr v3 ZarrStore (atomic chunk writes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from ctbench.storage import BlockStore, TensorStore, ZarrStore
from ctbench.storage import zarr_store as zarr_store_mod
from ctbench.storage.base import is_chunk_aligned, normalize_window, staging_bytes


def chunk_files(path):
    out = []
    for root, _, files in os.walk(path):
        out += [os.path.join(root, f) for f in files if f != "zarr.json"]
    return sorted(out)


# ---------------------------------------------------------------- windows
def test_normalize_window():
    assert normalize_window(None, (3, 4)) == (slice(0, 3), slice(0, 4))
    assert normalize_window((slice(1, 2),), (3, 4)) == (slice(1, 2), slice(0, 4))
    with pytest.raises(ValueError, match="outside"):
        normalize_window((slice(0, 5),), (3, 4))
    with pytest.raises(ValueError, match="step"):
        normalize_window((slice(0, 3, 2),), (3, 4))
    with pytest.raises(TypeError, match="slice"):
        normalize_window((1,), (3, 4))
    assert is_chunk_aligned((slice(4, 8), slice(0, 5)), (4, 4), (10, 5))
    assert not is_chunk_aligned((slice(2, 6), slice(0, 5)), (4, 4), (10, 5))


# ------------------------------------------------------------ TensorStore
def test_tensor_store_reads_copies_and_writes_windows():
    t = torch.arange(24.0).reshape(2, 3, 4)
    store = TensorStore(t, chunks=(1, 3, 4))
    assert isinstance(store, BlockStore)
    assert (store.shape, store.dtype, store.chunks) == ((2, 3, 4), torch.float32, (1, 3, 4))
    part = store.read((slice(1, 2), slice(0, 2)))
    assert torch.equal(part, t[1:2, 0:2])
    part += 100  # the caller owns what it read
    assert torch.equal(store.read(), torch.arange(24.0).reshape(2, 3, 4))
    store.write((slice(0, 1),), torch.ones(1, 3, 4, dtype=torch.float64))
    assert torch.equal(store.read()[0], torch.ones(3, 4)) and store.read().dtype == torch.float32
    with pytest.raises(ValueError, match="shape"):
        store.write((slice(0, 1),), torch.ones(2, 3, 4))
    with pytest.raises(TypeError, match="torch.Tensor"):
        store.write(None, [1, 2])
    assert staging_bytes(store, (1, 3, 4)) == 0


# -------------------------------------------------------------- ZarrStore
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zarr_store_round_trip_is_zarr_v3_with_attrs(tmp_path, dtype):
    path = tmp_path / "vol.zarr"
    store = ZarrStore.create(path, (10, 6, 7), dtype, chunks=(4, 6, 7), attrs={"voxel_spacing": [1, 2, 3]})
    assert isinstance(store, BlockStore)
    assert json.loads((path / "zarr.json").read_text())["zarr_format"] == 3
    assert torch.equal(store.read(), torch.zeros(10, 6, 7, dtype=dtype))  # zero-filled, nothing written yet
    data = torch.randn(10, 6, 7, dtype=dtype)
    store.write((slice(0, 8),), data[:8])
    store.write((slice(8, 10),), data[8:])
    again = ZarrStore.open(path, mode="r")
    assert again.shape == (10, 6, 7) and again.dtype == dtype and again.chunks == (4, 6, 7)
    assert again.attrs == {"voxel_spacing": [1, 2, 3]}
    assert torch.equal(again.read(), data)
    assert torch.equal(again.read((slice(3, 5), slice(1, 4), slice(2, 3))), data[3:5, 1:4, 2:3])
    with pytest.raises(Exception):
        again.write(None, data)  # opened read-only


def test_zarr_store_bad_arguments(tmp_path):
    ZarrStore.create(tmp_path / "a.zarr", (4, 4))
    with pytest.raises(FileExistsError, match="overwrite"):
        ZarrStore.create(tmp_path / "a.zarr", (4, 4))
    ZarrStore.create(tmp_path / "a.zarr", (5, 5), overwrite=True)
    assert ZarrStore.open(tmp_path / "a.zarr").shape == (5, 5)
    with pytest.raises(FileNotFoundError):
        ZarrStore.open(tmp_path / "missing.zarr")
    with pytest.raises(ValueError, match="chunks"):
        ZarrStore.create(tmp_path / "b.zarr", (4, 4), chunks=(2,))
    with pytest.raises(ValueError, match="shape"):
        ZarrStore.create(tmp_path / "c.zarr", (4, 0))
    with pytest.raises(TypeError, match="dtype"):
        ZarrStore.create(tmp_path / "d.zarr", (4, 4), torch.complex64)
    with pytest.raises(ValueError, match="mode"):
        ZarrStore.open(tmp_path / "a.zarr", mode="w")


def test_zarr_writes_go_through_the_atomic_writer_one_file_per_chunk(tmp_path, monkeypatch):
    writes = []
    real = zarr_store_mod.atomic_write_bytes

    def counting(path, data, fsync=False):
        writes.append(path.name)
        return real(path, data, fsync)

    monkeypatch.setattr(zarr_store_mod, "atomic_write_bytes", counting)
    store = ZarrStore.create(tmp_path / "v.zarr", (8, 6, 6), chunks=(2, 3, 6))
    writes.clear()
    store.write((slice(2, 6),), torch.ones(4, 6, 6))  # chunk-aligned: 2 x 2 chunks, whole
    assert len(writes) == 4
    assert len(chunk_files(tmp_path / "v.zarr")) == 4
    assert not any(".partial" in f for f in chunk_files(tmp_path / "v.zarr"))


def test_a_crash_mid_write_never_leaves_a_half_written_chunk(tmp_path, monkeypatch):
    store = ZarrStore.create(tmp_path / "v.zarr", (4, 8, 8), chunks=(2, 8, 8))
    old = torch.arange(4 * 8 * 8, dtype=torch.float32).reshape(4, 8, 8)
    store.write(None, old)
    before = {f: Path(f).read_bytes() for f in chunk_files(tmp_path / "v.zarr")}

    real_fdopen = os.fdopen

    class Crashing:
        """A file that dies half-way through writing a chunk (disk full, killed writer...)."""

        def __init__(self, f):
            self.f = f

        def write(self, data):
            view = memoryview(data).cast("B")
            self.f.write(view[: len(view) // 2])
            self.f.flush()
            raise OSError("simulated crash half-way through a chunk")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(zarr_store_mod.os, "fdopen", lambda fd, mode: Crashing(real_fdopen(fd, mode)))
    with pytest.raises(OSError, match="simulated crash"):
        store.write((slice(0, 2),), torch.full((2, 8, 8), -1.0))
    monkeypatch.setattr(zarr_store_mod.os, "fdopen", real_fdopen)

    after = {f: Path(f).read_bytes() for f in chunk_files(tmp_path / "v.zarr")}
    assert after == before  # every chunk is the old one, byte for byte; no temporary file left
    assert torch.equal(ZarrStore.open(tmp_path / "v.zarr").read(), old)


def test_partial_chunk_writes_merge_into_the_stored_chunk(tmp_path):
    store = ZarrStore.create(tmp_path / "v.zarr", (6, 4, 4), chunks=(4, 4, 4))
    data = torch.rand(6, 4, 4)
    store.write((slice(0, 3),), data[:3])  # part of chunk 0
    store.write((slice(3, 6),), data[3:])  # the rest of chunk 0 and chunk 1
    assert torch.equal(store.read(), data)
    # Staging model: whole chunks in flight; a checksummed write also holds the encoded chunk,
    # and a write that merges into stored chunks also holds the stored chunk.
    chunk = 4 * 4 * 4 * 4
    assert store.checksummed
    assert staging_bytes(store, (4, 4, 4), write=True) == 2 * chunk
    assert staging_bytes(store, (3, 4, 4), write=True) == 3 * chunk
    assert staging_bytes(store, (3, 4, 4), write=False) == chunk


def test_zarr_store_wraps_a_dataset_array(tmp_path):
    import zarr

    group = zarr.open_group(str(tmp_path / "ds.zarr"), mode="w", zarr_format=3)
    arr = group.create_array("sinogram", shape=(3, 5), dtype="float64", chunks=(1, 5))
    arr[...] = 2.0
    store = ZarrStore(arr)
    assert store.dtype == torch.float64 and torch.equal(store.read(), torch.full((3, 5), 2.0, dtype=torch.float64))
    with pytest.raises(TypeError, match="zarr.Array"):
        ZarrStore(torch.zeros(3))
