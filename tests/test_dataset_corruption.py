"""Damage on disk is detected on read and named; reads are bounded and never follow a planted entry.

Real datasets and zarr stores on disk are damaged the ways disks and people
damage them: a flipped bit, a deleted or truncated chunk, a dropped array or
attribute, a symlink out of the dataset, a FIFO, metadata that claims a huge
array, a tiny trajectory JSON that asks for 2e7 views.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from ctbench.storage import StoreIntegrityError, TensorStore, ZarrStore, project_into
from ctbench.workbench.dataset import DatasetError, load_dataset, save_dataset, verify_dataset

VOLUME = np.arange(8 * 8 * 8, dtype=np.float32).reshape(8, 8, 8) / 7


@pytest.fixture
def ds_path(tmp_path):
    return save_dataset(tmp_path / "d.zarr", volume=VOLUME, sinogram=np.ones((6, 5, 4), np.float32),
                        voxel_spacing=0.5, chunks=4)


def chunk(path: Path, array: str, key: str) -> Path:
    return path / array / "c" / Path(*key.split("/"))


def flip_bit(f: Path, byte: int = 10) -> None:
    raw = bytearray(f.read_bytes())
    raw[byte] ^= 0x04
    f.write_bytes(bytes(raw))


@pytest.mark.parametrize("lazy", [False, True])
def test_a_flipped_bit_names_the_array_and_chunk(ds_path, lazy):
    flip_bit(chunk(ds_path, "volume", "1/0/1"))
    with pytest.raises(StoreIntegrityError, match=r"chunk c/1/0/1 of array 'volume'.*crc32c"):
        ds = load_dataset(ds_path, lazy=lazy)
        ds.volume[4:8, 0:4, 4:8]
    if lazy:  # the undamaged chunks still read
        assert np.array_equal(load_dataset(ds_path, lazy=True).volume[0:4], VOLUME[0:4])


def test_a_deleted_or_truncated_chunk_is_an_error_not_zeros(ds_path):
    chunk(ds_path, "sinogram", "1/0/0").unlink()
    with pytest.raises(DatasetError, match=r"chunk c/1/0/0 of array 'sinogram'.*missing"):
        load_dataset(ds_path)
    f = chunk(ds_path, "volume", "0/1/0")
    f.write_bytes(f.read_bytes()[:-9])
    with pytest.raises(StoreIntegrityError, match=r"chunk c/0/1/0 of array 'volume'"):
        load_dataset(ds_path, lazy=True).volume[...]


def test_a_dropped_array_or_attribute_or_manifest_is_named(ds_path, tmp_path):
    import shutil
    shutil.rmtree(ds_path / "volume")
    with pytest.raises(DatasetError, match="array 'volume' listed in the dataset is missing"):
        load_dataset(ds_path)
    for drop, message in ((("volume", "voxel_spacing"), "volume.voxel_spacing"), (("sinogram",), "'sinogram'"),
                          (("manifest",), "manifest")):
        p = save_dataset(tmp_path / f"{drop[-1]}.zarr", volume=VOLUME, sinogram=np.ones((6, 5, 4), np.float32),
                         voxel_spacing=0.5)
        meta = json.loads((p / "zarr.json").read_text())
        target = meta["attributes"]
        for key in drop[:-1]:
            target = target[key]
        del target[drop[-1]]
        (p / "zarr.json").write_text(json.dumps(meta))
        with pytest.raises(DatasetError, match=message):
            load_dataset(p)
    p = save_dataset(tmp_path / "shape.zarr", volume=VOLUME, voxel_spacing=0.5)
    meta = json.loads((p / "volume" / "zarr.json").read_text())
    meta["shape"] = [1024, 1024, 1024]  # metadata that claims a 4 GiB array
    (p / "volume" / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"array 'volume' has shape \[1024, 1024, 1024\]; the manifest"):
        load_dataset(p)


def test_verify_dataset_reads_every_chunk_on_request(ds_path):
    verify_dataset(ds_path, chunks=True)
    flip_bit(chunk(ds_path, "sinogram", "0/1/0"), byte=3)
    verify_dataset(ds_path)  # metadata only: fine
    with pytest.raises(StoreIntegrityError, match="c/0/1/0 of array 'sinogram'"):
        verify_dataset(ds_path, chunks=True)


def test_eager_loads_are_bounded_with_an_explicit_override(tmp_path):
    p = save_dataset(tmp_path / "big.zarr", volume=np.zeros((16, 16, 16), np.float32), voxel_spacing=1.0)
    with pytest.raises(ValueError, match=r"more than max_bytes=1000; pass lazy=True"):
        load_dataset(p, max_bytes=1000)
    assert load_dataset(p, max_bytes=None).volume.shape == (16, 16, 16)
    assert load_dataset(p, max_bytes=1000, lazy=True).volume.shape == (16, 16, 16)


def test_planted_symlinks_and_fifos_are_refused_without_blocking(ds_path, tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\0" * 300)
    victim = chunk(ds_path, "volume", "0/0/0")
    victim.unlink()
    victim.symlink_to(outside)
    with pytest.raises(StoreIntegrityError, match="symlink out of the store folder"):
        load_dataset(ds_path)
    victim.unlink()
    victim.symlink_to("/dev/zero")
    with pytest.raises(StoreIntegrityError, match="symlink out of the store folder"):
        load_dataset(ds_path)
    victim.unlink()
    os.mkfifo(victim)
    result = {}

    def read():
        try:
            load_dataset(ds_path)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            result["error"] = e
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "reading a dataset with a FIFO chunk blocked"
    assert isinstance(result.get("error"), StoreIntegrityError) and "not a regular file" in str(result["error"])
    # A FIFO in place of the group metadata: not a dataset, and no hang.
    fifo_ds = tmp_path / "f.zarr"
    fifo_ds.mkdir()
    os.mkfifo(fifo_ds / "zarr.json")
    from ctbench.workbench.dataset import is_dataset
    assert not is_dataset(fifo_ds)


def _projector():
    from ctbench import Projector, circular_trajectory_3d
    return Projector(circular_trajectory_3d(6, 60.0, 120.0, dtype=torch.float64), (4, 6, 6), (6, 4))


def test_zarr_store_chunks_are_checksummed_and_a_complete_output_misses_no_chunk(tmp_path):
    P = _projector()
    vol = ZarrStore.create(tmp_path / "v.zarr", (4, 6, 6), torch.float64, chunks=(2, 6, 6))
    vol.write(None, torch.rand(4, 6, 6, dtype=torch.float64))
    flip_bit(tmp_path / "v.zarr" / "c" / "1" / "0" / "0", byte=17)
    with pytest.raises(StoreIntegrityError, match=r"chunk c/1/0/0 of the array in the store .*v.zarr.*crc32c"):
        ZarrStore.open(tmp_path / "v.zarr", "r").read()
    vol.write(None, torch.ones(4, 6, 6, dtype=torch.float64))
    sino = ZarrStore.create(tmp_path / "s.zarr", (6, 6, 4), torch.float64, chunks=(2, 6, 4))
    project_into(P, ZarrStore.open(tmp_path / "v.zarr", "r"), sino)
    (tmp_path / "s.zarr" / "c" / "2" / "0" / "0").unlink()  # written by a complete run: damage, not zeros
    with pytest.raises(StoreIntegrityError, match="chunk c/2/0/0 of the array .* is missing"):
        ZarrStore.open(tmp_path / "s.zarr", "r").read()


def _square_projector(**options):
    # volume (6, 6, 6) and sinogram (6 views, 6, 6) have the same shape: one store could pose as both.
    from ctbench import Projector, circular_trajectory_3d
    return Projector(circular_trajectory_3d(6, 60.0, 120.0, dtype=torch.float64), (6, 6, 6), (6, 6), **options)


def test_aliased_stores_are_refused_before_anything_is_written(tmp_path):
    from ctbench.solvers import fdk_into
    from ctbench.storage import backproject_into

    P = _square_projector()
    path = tmp_path / "same.zarr"
    data = torch.rand(6, 6, 6, dtype=torch.float64)
    ZarrStore.create(path, (6, 6, 6), torch.float64).write(None, data)
    (tmp_path / "link.zarr").symlink_to(path)
    # The same folder opened twice, and once through a symlink: two objects, one location.
    for other in (path, tmp_path / "link.zarr"):
        with pytest.raises(ValueError, match="must be different stores; both are .*same.zarr"):
            project_into(P, ZarrStore.open(path, "r"), ZarrStore.open(other))
        with pytest.raises(ValueError, match="must be different stores"):
            backproject_into(P, ZarrStore.open(path, "r"), ZarrStore.open(other))
        with pytest.raises(ValueError, match="must be different stores"):
            fdk_into(P, ZarrStore.open(path, "r"), ZarrStore.open(other))
    assert torch.equal(ZarrStore.open(path, "r").read(), data)  # the input is untouched
    # Tensor stores over the same memory are the same store too.
    t = torch.rand(6, 6, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="must be different stores"):
        project_into(P, TensorStore(t), TensorStore(t))
    # fdk's scratch may not be its input or output either.
    Pb = _square_projector(view_chunk_size=2)
    sino = TensorStore(torch.rand(6, 6, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="scratch must be a store of its own"):
        fdk_into(Pb, sino, TensorStore.empty((6, 6, 6), torch.float64), scratch=TensorStore(sino.tensor))


def test_version_1_datasets_still_load_and_a_named_missing_array_is_caught(tmp_path):
    import shutil

    import zarr

    # The layout save_dataset wrote before manifests and checksums (format version 1).
    p = tmp_path / "v1.zarr"
    group = zarr.open_group(str(p), mode="w", zarr_format=3)
    group.create_array("volume", shape=VOLUME.shape, dtype=VOLUME.dtype, chunks=(4, 4, 4))[...] = VOLUME
    group.attrs.update({"format": "ctbench.dataset", "version": 1, "units": {"length": "mm"}, "geometry": None,
                        "meta": {"old": True}, "volume": {"axes": ["z", "y", "x"], "voxel_spacing": [1, 1, 1]}})
    ds = load_dataset(p)
    np.testing.assert_array_equal(ds.volume, VOLUME)
    assert ds.meta == {"old": True}
    shutil.rmtree(p / "volume")
    with pytest.raises(DatasetError, match="array 'volume' listed in the dataset is missing"):
        load_dataset(p)


def test_a_dataset_filled_in_parts_writes_its_all_zero_chunks_and_loads_strictly(tmp_path):
    """The job worker's way of writing (create, reopen, fill by slabs): all-zero planes are chunks on disk,
    so a strict load reads them as zeros; a chunk deleted afterwards is still damage."""
    import zarr

    from ctbench.workbench.dataset import FORMAT, UNITS, VERSION, create_array, open_array_for_writing

    path = tmp_path / "r.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    _, entry = create_array(group, "volume", (5, 4, 4), "float32", (1, 4, 4))
    vol = np.zeros((5, 4, 4), np.float32)
    vol[1:4] = np.arange(48, dtype=np.float32).reshape(3, 4, 4) + 1   # planes 0 and 4 all zero
    arr = open_array_for_writing(path / "volume")
    arr[0:2] = vol[0:2]            # two "ranks", disjoint slabs
    arr[2:5] = vol[2:5]
    group.attrs.update({"format": FORMAT, "version": VERSION, "units": UNITS, "geometry": None, "meta": {},
                        "manifest": {"volume": entry}, "volume": {"axes": ["z", "y", "x"],
                                                                 "voxel_spacing": [1.0, 1.0, 1.0]}})
    assert sorted(os.listdir(path / "volume" / "c")) == ["0", "1", "2", "3", "4"]
    np.testing.assert_array_equal(load_dataset(path).volume, vol)
    verify_dataset(path, chunks=True)
    chunk(path, "volume", "4/0/0").unlink()
    with pytest.raises(DatasetError, match=r"chunk c/4/0/0 of array 'volume'.*missing"):
        load_dataset(path)
