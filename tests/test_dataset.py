"""The ctbench dataset format (zarr v3 group with geometry in attrs)."""

import json

import numpy as np
import pytest
import torch
import zarr

from ctbench.workbench.design import ScanGeometry, TrajectoryDesign
from ctbench.workbench.dataset import FORMAT, Dataset, is_dataset, load_dataset, save_dataset


@pytest.fixture
def geometry():
    return TrajectoryDesign(kind="helical", n_views=12, detector_u=10, detector_v=6, volume_d=5, volume_h=7,
                            volume_w=9, voxel_size=0.75).build(dtype=torch.float64)


def test_round_trip_keeps_arrays_geometry_and_meta(tmp_path, geometry):
    rng = np.random.default_rng(0)
    sino = rng.random(geometry.sinogram_shape).astype(np.float32)
    vol = torch.rand(5, 7, 9, dtype=torch.float64)
    path = save_dataset(tmp_path / "scan.zarr", volume=vol, sinogram=sino, geometry=geometry,
                        meta={"note": "test", "i0": 1e4})
    assert is_dataset(path)
    ds = load_dataset(path)
    np.testing.assert_array_equal(ds.sinogram, sino)
    assert ds.sinogram.dtype == np.float32
    np.testing.assert_array_equal(ds.volume, vol.numpy())
    assert ds.volume.dtype == np.float64
    assert ds.voxel_spacing == (0.75, 0.75, 0.75)   # taken from the geometry: same grid
    assert ds.meta == {"note": "test", "i0": 1e4}
    g = ds.geometry
    assert g.detector_shape == (10, 6) and g.volume_shape == (5, 7, 9) and g.kind == "spiral"
    for a, b in zip(g.trajectory.tensors(), geometry.trajectory.tensors()):
        assert torch.equal(a, b)                     # float64 survives JSON exactly


def test_attrs_are_plain_json_with_units_and_axes(tmp_path, geometry):
    save_dataset(tmp_path / "d.zarr", sinogram=np.zeros(geometry.sinogram_shape, np.float32), geometry=geometry)
    attrs = dict(zarr.open_group(str(tmp_path / "d.zarr"), mode="r").attrs)
    assert attrs["format"] == FORMAT and attrs["version"] == 2
    assert attrs["units"]["length"] == "mm"
    assert attrs["sinogram"]["axes"] == ["view", "u", "v"]
    assert attrs["geometry"]["trajectory"]["format"] == "ctbench.trajectory"
    assert "volume" not in attrs
    json.dumps(attrs)


def test_volume_only_and_2d_data(tmp_path):
    save_dataset(tmp_path / "v.zarr", volume=np.ones((4, 6), np.float32), voxel_spacing=(0.5, 0.25))
    ds = load_dataset(tmp_path / "v.zarr")
    assert ds.sinogram is None and ds.geometry is None
    assert ds.voxel_spacing == (0.5, 0.25)
    fan = TrajectoryDesign(kind="fan", n_views=8, detector_u=12, volume_h=6, volume_w=6).build()
    save_dataset(tmp_path / "f.zarr", sinogram=np.zeros((8, 12), np.float32), geometry=fan)
    ds = load_dataset(tmp_path / "f.zarr")
    assert ds.geometry.is_2d and ds.sinogram.shape == (8, 12)


def test_lazy_loading_returns_zarr_arrays(tmp_path, geometry):
    save_dataset(tmp_path / "l.zarr", volume=np.arange(5 * 7 * 9, dtype=np.float32).reshape(5, 7, 9),
                 geometry=geometry, chunks=4)
    ds = load_dataset(tmp_path / "l.zarr", lazy=True)
    assert isinstance(ds.volume, zarr.Array)
    assert ds.volume.chunks == (4, 4, 4)
    assert float(ds.volume[4, 6, 8]) == 5 * 7 * 9 - 1


def test_bad_input_is_named(tmp_path, geometry):
    with pytest.raises(ValueError, match="needs a volume, a sinogram or both"):
        Dataset()
    with pytest.raises(ValueError, match="voxel_spacing is required"):
        save_dataset(tmp_path / "a.zarr", volume=np.zeros((3, 3, 3)))
    with pytest.raises(ValueError, match="voxel_spacing must be 3 positive"):
        save_dataset(tmp_path / "a.zarr", volume=np.zeros((3, 3, 3)), voxel_spacing=(1.0, -1.0, 1.0))
    with pytest.raises(ValueError, match="does not match the geometry"):
        save_dataset(tmp_path / "a.zarr", sinogram=np.zeros((3, 10, 6)), geometry=geometry)
    with pytest.raises(ValueError, match="JSON"):
        save_dataset(tmp_path / "a.zarr", volume=np.zeros((2, 2)), voxel_spacing=1.0, meta={"x": object()})
    assert not (tmp_path / "a.zarr").exists()
    save_dataset(tmp_path / "a.zarr", volume=np.zeros((2, 2)), voxel_spacing=1.0)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_dataset(tmp_path / "a.zarr", volume=np.zeros((2, 2)), voxel_spacing=1.0)
    save_dataset(tmp_path / "a.zarr", volume=np.ones((3, 3)), voxel_spacing=1.0, overwrite=True)
    assert load_dataset(tmp_path / "a.zarr").volume.shape == (3, 3)
    assert not any(p.name.endswith(".tmp-write") for p in tmp_path.iterdir())


def test_foreign_folders_are_not_datasets(tmp_path):
    zarr.open_group(str(tmp_path / "other.zarr"), mode="w", zarr_format=3).attrs["format"] = "something else"
    assert not is_dataset(tmp_path / "other.zarr")
    assert not is_dataset(tmp_path / "missing.zarr")
    with pytest.raises(ValueError, match="not a ctbench dataset"):
        load_dataset(tmp_path / "other.zarr")
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "missing.zarr")


def test_scan_geometry_json_round_trip_and_errors(geometry):
    d = json.loads(json.dumps(geometry.to_dict()))
    g = ScanGeometry.from_dict(d)
    assert g.sinogram_shape == geometry.sinogram_shape and g.voxel_spacing == geometry.voxel_spacing
    with pytest.raises(ValueError, match="lacks the fields"):
        ScanGeometry.from_dict({k: v for k, v in d.items() if k != "detector_shape"})
    with pytest.raises(ValueError, match="units"):
        ScanGeometry.from_dict({**d, "units": "inch"})
    with pytest.raises(ValueError, match="detector_shape must be 2 positive integers"):
        ScanGeometry(geometry.trajectory, (0, 4), 1.0, (4, 4, 4), 1.0)
