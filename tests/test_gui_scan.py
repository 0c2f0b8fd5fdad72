"""A measured scan through napari: TIFF sample -> correct -> centre -> geometry -> FDK and SIRT -> TIFF export."""

from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import torch

from ctbench.io import read_scan, read_volume
from ctbench.pipeline import PreprocessConfig, load_config, prepare
from ctbench.io.sample_scan import LabScanSpec, sample_scan_path
from ctbench.solvers import fdk
from ctbench.workbench.design import ScanGeometry
from ctbench_napari import PLUGIN
from ctbench_napari._layers import display_to_sinogram
from ctbench_napari._testing import doc_images_dir, save_viewer_screenshot, save_widget_screenshot, wait_for

pytestmark = pytest.mark.gui
DOC_IMAGES = doc_images_dir()
SPEC = LabScanSpec()


@pytest.fixture
def quiet_qt_warning(monkeypatch):
    monkeypatch.setattr("napari._qt.qt_main_window.SHOW_QT_WARNING", False, raising=False)


def _reconstruct(recon, algorithm, **params):
    recon.select_algorithm(algorithm, **params)
    recon.run_button.click()
    assert recon.message.level != "error", recon.message.text()
    wait_for(lambda: not recon.running, timeout=300)
    assert recon.message.level != "error", recon.message.text()
    return recon.last_run["finished"], recon.results[-1]


def _fit(viewer, layer):
    from qtpy.QtWidgets import QApplication

    from ctbench_napari._qt.common import fit_view

    for _ in range(3):
        QApplication.processEvents()
    fit_view(viewer, [layer])


def test_tiff_sample_to_exported_volume_through_the_widgets(make_napari_viewer, tmp_path, quiet_qt_warning):
    viewer = make_napari_viewer(show=True)
    viewer.window.resize(1500, 950)
    viewer.open_sample(PLUGIN, "lab_scan")
    [raw] = viewer.layers
    assert raw.metadata["ctbench"]["kind"] == "projections" and isinstance(raw.data, da.Array)   # lazy
    assert raw.data.shape == (SPEC.n_views, SPEC.detector_v, SPEC.detector_u)
    _, scan = viewer.window.add_plugin_dock_widget(PLUGIN, "Scan import")
    assert scan.sid.value() == SPEC.sid and scan.sdd.value() == SPEC.sdd   # from scan.json, before Correct

    # a bad path is reported in the widget, naming the file
    scan.path.setText(str(tmp_path / "missing.tif"))
    scan.open_button.click()
    assert scan.message.level == "error" and "missing.tif: does not exist" in scan.message.text()
    scan.path.setText(str(sample_scan_path()))

    scan.projections.select(raw.name)
    scan.correct_button.click()
    assert scan.busy                                          # in a worker thread; the GUI stays live
    wait_for(lambda: not scan.busy, timeout=120)
    assert scan.message.level == "note", scan.message.text()
    lines = viewer.layers[scan.target.currentText()]
    expect = prepare(read_scan(sample_scan_path()), PreprocessConfig()).images
    np.testing.assert_array_equal(lines.data, expect)                        # the library's correction
    assert scan.sid.value() == SPEC.sid and scan.sdd.value() == SPEC.sdd   # from scan.json

    scan.centre_button.click()
    wait_for(lambda: not scan.busy, timeout=300)
    assert scan.message.level == "note", scan.message.text()
    assert abs(scan.last_centre.offset_px - SPEC.offset_px) <= 0.25
    assert scan.offset_u.value() == pytest.approx(scan.last_centre.offset_mm, abs=1e-4)

    for spin in (scan.vol_d, scan.vol_h, scan.vol_w):
        spin.setValue(64)
    scan.voxel.setValue(1.0)
    scan.attach_button.click()
    assert scan.busy                                          # in a worker thread too
    wait_for(lambda: not scan.busy, timeout=120)
    assert scan.message.level == "note", scan.message.text()
    sino_layer = scan.last_sinogram
    geo = ScanGeometry.from_dict(sino_layer.metadata["ctbench"]["geometry"])
    assert geo.volume_shape == (64, 64, 64) and geo.sinogram_shape == (SPEC.n_views, SPEC.detector_u, SPEC.detector_v)
    np.testing.assert_allclose(geo.trajectory.meta["detector_offset"][0], scan.offset_u.value(), atol=1e-4)
    lines.visible = raw.visible = False
    viewer.dims.set_point(0, 30)
    _fit(viewer, sino_layer)
    save_viewer_screenshot(viewer, "scan_import", DOC_IMAGES)
    save_widget_screenshot(scan, "scan_import_widget", DOC_IMAGES)

    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction", tabify=True)
    recon.sinogram.select(sino_layer.name)
    fin, fdk_layer = _reconstruct(recon, "fbp")
    direct = fdk(geo.projector(), torch.from_numpy(display_to_sinogram(sino_layer.data).astype(np.float32)))
    np.testing.assert_allclose(fdk_layer.data, direct.numpy(), rtol=1e-4, atol=1e-6)
    truth = SPEC.phantom()
    rmse = float(np.sqrt(np.mean((fdk_layer.data - truth) ** 2)))
    assert rmse < 0.5 * float(np.sqrt(np.mean(truth ** 2)))
    fin_sirt, sirt_layer = _reconstruct(recon, "sirt", n_iter=5, nonneg=True)
    assert fin_sirt.n_iter == 5 and fin_sirt.residuals[-1] < fin_sirt.residuals[0]
    for layer in viewer.layers:
        layer.visible = layer.name == fdk_layer.name
    viewer.dims.set_point(0, 0.0)
    _fit(viewer, fdk_layer)
    save_viewer_screenshot(viewer, "scan_recon", DOC_IMAGES)

    scan.volume.select(fdk_layer.name)
    scan.export_path.setText(str(tmp_path / "fdk.tif"))
    scan.export_button.click()
    assert scan.message.level == "note", scan.message.text()
    vol, spacing = read_volume(tmp_path / "fdk.tif")
    np.testing.assert_array_equal(vol, fdk_layer.data.astype(np.float32))
    assert spacing == pytest.approx((1.0, 1.0, 1.0))
    scan.export_button.click()                                       # exists and overwrite is off
    assert scan.message.level == "error" and "exists" in scan.message.text()
    assert "tick Overwrite" in scan.message.text() and "overwrite=True" not in scan.message.text()   # GUI words

    scan.config_path.setText(str(tmp_path / "recon.json"))
    scan.config_button.click()
    assert scan.message.level == "note", scan.message.text()
    cfg = load_config(tmp_path / "recon.json")
    assert Path(cfg.input.path) == Path(sample_scan_path())
    assert cfg.geometry.detector_offset_u_mm == pytest.approx(scan.offset_u.value())
    assert cfg.geometry.volume_shape == (64, 64, 64) and cfg.algorithm.name == "fbp"
    assert Path(cfg.output.path) == tmp_path / "fdk.tif"


def test_napari_opens_scan_files_lazily_through_the_reader(make_napari_viewer, tmp_path):
    import tifffile

    from ctbench_napari._scan_io import get_scan_reader

    stack = np.arange(4 * 5 * 6, dtype=np.uint16).reshape(4, 5, 6)
    tifffile.imwrite(tmp_path / "stack.tif", stack)
    (tmp_path / "notes.txt").write_text("x")
    assert get_scan_reader(str(tmp_path / "notes.txt")) is None
    assert get_scan_reader(str(tmp_path / "nothing.tif")) is None
    viewer = make_napari_viewer()
    layers = viewer.open(str(tmp_path / "stack.tif"), plugin=PLUGIN)
    assert len(layers) == 1 and isinstance(layers[0].data, da.Array)
    np.testing.assert_array_equal(np.asarray(layers[0].data), stack)
    meta = layers[0].metadata["ctbench"]
    assert meta["kind"] == "projections" and meta["source"]["format"] == "tiff"
    [folder] = viewer.open(str(sample_scan_path()), plugin=PLUGIN)
    assert folder.metadata["ctbench"]["source"]["format"] == "scanner"
    assert folder.data.shape == (SPEC.n_views, SPEC.detector_v, SPEC.detector_u)


@pytest.mark.slow
def test_napari_shows_one_view_of_a_2gb_stack_without_loading_it(make_napari_viewer, tmp_path):
    import psutil
    import tifffile
    from qtpy.QtWidgets import QApplication

    n, rows, cols = 1024, 1024, 1024                 # uint16: 2 GiB, sparse apart from two views
    path = tmp_path / "big.tif"
    mm = tifffile.memmap(path, shape=(n, rows, cols), dtype=np.uint16, photometric="minisblack")
    mm[0] = 7
    mm[600] = 600
    mm.flush()
    del mm
    viewer = make_napari_viewer(show=True)
    proc = psutil.Process()
    for _ in range(3):
        QApplication.processEvents()
    before = proc.memory_info().rss
    [layer] = viewer.open(str(path), plugin=PLUGIN)
    viewer.dims.set_point(0, 600)
    for _ in range(5):
        QApplication.processEvents()
    after = proc.memory_info().rss
    grew = (after - before) / 2 ** 20
    print(f"napari: RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB (+{grew:.0f}) showing view 600 of a "
          f"{path.stat().st_size / 2**30:.2f} GiB stack")
    assert isinstance(layer.data, da.Array) and layer.data.shape == (n, rows, cols)
    assert float(np.asarray(layer._slice.image.view).max()) == 600      # the view on screen was read
    assert grew < 300
