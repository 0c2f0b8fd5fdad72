"""A dataset chunk is bound to its position (issue 20, "a valid chunk copied over another chunk's position
reads back without an error"): real zarr stores, eager and lazy reads, and what the table does not claim."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ctbench.storage.base import StoreIntegrityError
from ctbench.storage.zarr_store import POSITIONS_FILE
from ctbench.workbench.dataset import DatasetError, load_dataset, save_dataset, verify_dataset

VOL = np.random.default_rng(1).random((8, 8, 8), dtype=np.float32)


@pytest.fixture
def dataset(tmp_path):
    return save_dataset(tmp_path / "d.zarr", volume=VOL, sinogram=VOL[:3] * 2, voxel_spacing=1.0, chunks=4)


def test_every_array_of_a_saved_dataset_records_its_chunk_positions(dataset):
    # volume 8^3 in 4^3 chunks: 8 chunks; sinogram (3, 8, 8) in (3, 4, 4): 4; 4 bytes each + the table's crc
    assert (dataset / "volume" / POSITIONS_FILE).stat().st_size == 4 * 8 + 4
    assert (dataset / "sinogram" / POSITIONS_FILE).stat().st_size == 4 * 4 + 4
    np.testing.assert_array_equal(load_dataset(dataset).volume, VOL)


def test_a_valid_chunk_copied_over_another_position_is_refused_eager_lazy_and_by_verify(dataset):
    c = dataset / "volume" / "c"
    shutil.copyfile(c / "0" / "0" / "0", c / "0" / "0" / "1")     # a complete, self-consistent chunk
    with pytest.raises(DatasetError, match=r"c/0/0/1 .* not the one written at this position"):
        load_dataset(dataset)
    with pytest.raises(StoreIntegrityError, match="not the one written at this position"):
        load_dataset(dataset, lazy=True).volume[0:4, 0:4, 4:8]
    np.testing.assert_array_equal(load_dataset(dataset, lazy=True).volume[0:4, 0:4, 0:4], VOL[0:4, 0:4, 0:4])
    with pytest.raises(StoreIntegrityError, match="not the one written"):
        verify_dataset(dataset, chunks=True)


def test_a_damaged_position_table_is_reported_not_ignored(dataset):
    table = dataset / "volume" / POSITIONS_FILE
    data = bytearray(table.read_bytes())
    data[0] ^= 0xFF
    table.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match="position table .* fails its checksum"):
        load_dataset(dataset)
    table.write_bytes(bytes(data[:-1]))
    with pytest.raises(DatasetError, match="position table .* bytes"):
        load_dataset(dataset)


def test_a_dataset_without_a_table_still_loads(dataset):
    """Older datasets (and other writers' arrays) have no table: content checks only, as before."""
    (dataset / "volume" / POSITIONS_FILE).unlink()
    np.testing.assert_array_equal(load_dataset(dataset).volume, VOL)
