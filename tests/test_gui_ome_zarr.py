"""A scanner-sized volume that ``ctbench recon`` wrote as OME-Zarr opens lazily in napari: one multiscale
layer in mm, the right way up, without reading the volume (issue 42, "viewing at any size")."""

from __future__ import annotations

import numpy as np
import psutil
import pytest

from ctbench.io.ome_zarr import OmeZarrVolume, is_ctbench_volume
from ctbench_napari._io import get_reader, read_ome_zarr
from ctbench_napari._testing import SCREENSHOT_DIR

pytestmark = [pytest.mark.gui, pytest.mark.slow]

N = 1024                      # 4 GiB of float32 at full resolution: far more than a test may read
SPACING = (0.05, 0.05, 0.05)
MARK = 700                    # the bright block: rows and columns past this index (y > 0 and x > 0)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 1024^3 volume with two written slabs around the middle plane (the other chunks are the store's fill
    value, so the file stays small); the slabs hold a block at y > 0, x > 0 and a thin bar at x < 0."""
    path = tmp_path_factory.mktemp("big") / "big.ome.zarr"
    vol = OmeZarrVolume.create(path, (N, N, N), SPACING)
    slab = np.zeros((16, N, N), np.float32)
    slab[:, MARK:, MARK:] = 1.0
    slab[:, 100:140, 100:N // 2] = 0.5
    vol.write_slab(N // 2 - 16, slab)
    vol.write_slab(N // 2, slab)
    return path


def test_the_ctbench_reader_claims_its_own_volumes_and_leaves_other_ome_zarr_to_napari_ome_zarr(big, tmp_path):
    assert is_ctbench_volume(big) and get_reader(str(big)) is read_ome_zarr
    other = tmp_path / "other.ome.zarr"          # an OME-Zarr another program wrote (no ctbench marker)
    ome_writer = pytest.importorskip("ome_zarr.writer")
    import zarr
    ome_writer.write_image(np.zeros((8, 8, 8), np.float32), zarr.open_group(str(other), mode="w"), axes="zyx")
    assert not is_ctbench_volume(other) and get_reader(str(other)) is None


def test_a_1024_cubed_volume_opens_as_a_lazy_multiscale_layer_in_mm_the_right_way_up(big, make_napari_viewer):
    viewer = make_napari_viewer(show=True)
    viewer.window._qt_window.resize(1366, 768)
    rss0 = psutil.Process().memory_info().rss
    viewer.open(str(big), plugin="ctbench")
    layer = viewer.layers[-1]
    assert layer.multiscale and len(layer.data) == OmeZarrVolume.open(big).n_levels
    assert [tuple(d.shape) for d in layer.data][:2] == [(N, N, N), (N // 2, N // 2, N // 2)]
    assert list(layer.scale) == pytest.approx(SPACING)
    assert list(layer.translate) == pytest.approx([-(N - 1) / 2 * d for d in SPACING])   # centred, in mm
    assert layer.metadata["ctbench"]["kind"] == "volume" and layer.metadata["ctbench"]["levels"] == len(layer.data)
    # the middle plane (napari's first) is one of the written ones
    z = viewer.dims.point[0]
    assert abs(z) <= SPACING[0], z
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / "ome_zarr_1024_middle_plane.png"
    img = viewer.screenshot(path=str(path), canvas_only=True, flash=False)[..., :3].astype(float).mean(-1)
    bright = np.argwhere(img > 200)
    assert bright.size, f"nothing bright on the canvas ({path})"
    # napari draws rows (y) downwards and columns (x) rightwards: the block at y > 0, x > 0 is bottom right,
    # the bar at y < 0 above the middle
    cy, cx = bright.mean(axis=0)
    assert cy > img.shape[0] / 2 and cx > img.shape[1] / 2, (cy, cx, img.shape)
    grey = np.argwhere((img > 90) & (img < 170))
    assert grey.size and grey[:, 0].mean() < img.shape[0] / 2
    # lazily: napari read the chunks it drew, not the 4 GiB level
    grown = psutil.Process().memory_info().rss - rss0
    assert grown < 1 << 30, f"the process grew by {grown / 2**20:.0f} MiB opening the volume"
    from ctbench_napari._qt.datasets import _dataset_path
    assert _dataset_path(str(big)) is not None      # a drop on the canvas opens it with the ctbench reader
