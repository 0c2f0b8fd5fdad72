"""The napari workbench with a real viewer under Xvfb: docking, samples, designer, projection, reader/writer."""

from pathlib import Path

import numpy as np
import pytest
import torch
from qtpy.QtCore import Qt

from ctbench.workbench.design import ScanGeometry, TrajectoryDesign
from ctbench.workbench.workflow import simulate
from ctbench_napari import PLUGIN, SAMPLES, WIDGETS
from ctbench_napari._layers import display_to_sinogram, volume_layer
from ctbench_napari._samples import PHANTOM_SCAN
from ctbench_napari._qt.designer import TrajectoryDesignerWidget
from ctbench_napari._qt.projection import ProjectionWidget
from ctbench_napari._qt.reconstruction import ReconstructionWidget
from ctbench_napari._testing import save_viewer_screenshot, save_widget_screenshot, wait_for

pytestmark = pytest.mark.gui
SHOTS = Path(__file__).parent / "screenshots"
SMALL = dict(n_views=30, sid=150.0, sdd=300.0, detector_u=48, detector_v=48, pixel_u=1.5, pixel_v=1.5,
             volume_d=32, volume_h=32, volume_w=32, voxel_size=1.0)


@pytest.fixture
def quiet_qt_warning(monkeypatch):
    # napari shows a one-off "PyQt5 is deprecated" toast on the first window; keep it out of screenshots.
    monkeypatch.setattr("napari._qt.qt_main_window.SHOW_QT_WARNING", False, raising=False)


def _designer(viewer, **changes) -> TrajectoryDesignerWidget:
    _, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Trajectory designer")
    w.set_design(TrajectoryDesign(**{**SMALL, **changes}))
    w.update_preview()
    return w


def test_every_widget_docks_from_the_manifest(make_napari_viewer):
    viewer = make_napari_viewer()
    from ctbench_napari._qt.calibrate import CalibrateWidget
    from ctbench_napari._qt.jobs import JobsPanel
    from ctbench_napari._qt.scan import ScanImportWidget

    kinds = {"Trajectory designer": TrajectoryDesignerWidget, "Projection": ProjectionWidget,
             "Reconstruction": ReconstructionWidget, "Scan import": ScanImportWidget, "Calibrate": CalibrateWidget,
             "Jobs": JobsPanel}
    assert set(WIDGETS) == set(kinds)
    for name in WIDGETS:
        dock, widget = viewer.window.add_plugin_dock_widget(PLUGIN, name)
        assert isinstance(widget, kinds[name])
        assert dock.isAncestorOf(widget)


@pytest.mark.parametrize("key", SAMPLES)
def test_every_sample_opens(make_napari_viewer, key):
    viewer = make_napari_viewer()
    viewer.open_sample(PLUGIN, key)
    kinds = [layer.metadata["ctbench"]["kind"] for layer in viewer.layers]
    want = {"phantom": ["volume"], "phantom_scan": ["volume", "sinogram"], "htc2022": ["sinogram"],
            "lab_scan": ["projections"]}[key]
    assert kinds == want
    for layer in viewer.layers:
        assert np.isfinite(layer.data).all() and float(np.abs(layer.data).max()) > 0
        if layer.metadata["ctbench"]["kind"] == "sinogram":
            geo = ScanGeometry.from_dict(layer.metadata["ctbench"]["geometry"])
            assert display_to_sinogram(layer.data).shape == geo.sinogram_shape
    if key == "htc2022":
        geo = ScanGeometry.from_dict(viewer.layers[0].metadata["ctbench"]["geometry"])
        assert geo.is_2d and geo.n_views == 721 and geo.detector_shape == (560,)
        assert viewer.layers[0].data.shape == (721, 560)   # views vertical, detector horizontal


def test_designer_preview_follows_the_form(make_napari_viewer, qtbot):
    viewer = make_napari_viewer()
    w = _designer(viewer)
    names = ["trajectory", "trajectory: detector", "trajectory: volume box", "trajectory: completeness"]
    assert [n for n in names if n in viewer.layers] == names
    path = viewer.layers["trajectory"]
    assert path.data.shape[0] == 29 + 6          # 29 segments of the source path + 6 central rays
    # Editing a field updates the preview by itself (debounced), with the event loop running.
    before = w.n_updates
    w.form.editors["n_views"].setValue(45)
    qtbot.waitUntil(lambda: w.n_updates > before, timeout=5000)
    assert viewer.layers["trajectory"].data.shape[0] == 44 + 6
    geo = ScanGeometry.from_dict(viewer.layers["trajectory"].metadata["ctbench"]["geometry"])
    assert geo.n_views == 45
    # Another generator: the helical source path climbs through its z range.
    before = w.n_updates
    w.kind.setCurrentIndex(w.kind.findData("helical"))
    qtbot.waitUntil(lambda: w.n_updates > before, timeout=5000)
    z = viewer.layers["trajectory"].data[:44, 0, 0]
    assert z.max() - z.min() == pytest.approx(w.design().z_range * 43 / 44, rel=0.05)
    # The volume box follows the grid.
    w.form.editors["volume_w"].setValue(40)
    w.update_preview()
    box = viewer.layers["trajectory: volume box"].data
    assert np.abs(box[:, 0, 2]).max() == pytest.approx(20.0)


def test_the_designer_adds_no_preview_until_the_user_designs_and_edits_compute_off_the_gui_thread(
        make_napari_viewer, qtbot):
    import threading

    viewer = make_napari_viewer()
    _, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Trajectory designer")
    qtbot.wait(500)                                      # longer than the edit debounce
    assert not [x.name for x in viewer.layers if x.name.startswith("trajectory")] and w.geometry is None
    import ctbench_napari._qt.designer as designer_module
    threads = []
    real = designer_module._preview_data
    designer_module._preview_data = lambda *a: (threads.append(threading.current_thread()), real(*a))[1]
    try:
        w.form.editors["n_views"].setValue(30)           # the user designs: the preview appears
        qtbot.waitUntil(lambda: "trajectory" in viewer.layers and not w.busy, timeout=10000)
    finally:
        designer_module._preview_data = real
    assert w.geometry.n_views == 30
    assert threads and all(t is not threading.main_thread() for t in threads)


def test_completeness_map_shows_truncation(make_napari_viewer):
    viewer = make_napari_viewer()
    w = _designer(viewer, detector_u=12, volume_d=8)     # 18 mm of detector: ~9 mm field at the axis
    layer = viewer.layers["trajectory: completeness"]
    counts = layer.data
    n = w.geometry.n_views
    zc, yc, xc = (np.array(counts.shape) - 1) / 2
    yy, xx = np.meshgrid(np.arange(counts.shape[1]) - yc, np.arange(counts.shape[2]) - xc, indexing="ij")
    r = np.hypot(yy, xx) * w.geometry.volume_extent()[2] / counts.shape[2]
    assert (counts[:, r > 14] < n).all()                  # the outer voxels are incomplete
    assert (counts[:, r < 3] == n).all()
    assert layer.metadata["ctbench"]["full"] < 0.3
    assert "by some" in w.summary.text()
    # Colour carries meaning, so there are keys: the lines' legend and the map's colour bar (0 .. n views).
    assert not w.legend.isHidden() and "source path" in w.legend.text()
    assert not w.map_bar.isHidden() and (w.map_bar.lo, w.map_bar.hi) == (0, n) and len(w.map_bar.colours) == 64
    w.form.editors["detector_u"].setValue(96)             # a detector wide enough for the whole box
    w.update_preview()
    layer = viewer.layers["trajectory: completeness"]
    assert (layer.data == n).all()
    assert layer.metadata["ctbench"]["full"] == 1.0


def test_designer_saves_and_loads_trajectory_json(make_napari_viewer, tmp_path):
    viewer = make_napari_viewer()
    w = _designer(viewer, kind="saddle", amplitude=7.5)
    w.save(tmp_path / "saddle.json")
    w.set_design(TrajectoryDesign())
    w.update_preview()
    assert w.design().kind == "circular"
    w.load(tmp_path / "saddle.json")
    assert w.design() == TrajectoryDesign(**{**SMALL, "kind": "saddle", "amplitude": 7.5})
    assert w.geometry.kind == "saddle"
    # The reader opens the same file as preview layers.
    viewer.open(str(tmp_path / "saddle.json"), plugin=PLUGIN)
    assert "saddle" in viewer.layers and viewer.layers["saddle"].metadata["ctbench"]["kind"] == "trajectory"
    w.load(tmp_path / "missing.json")
    assert w.message.level == "error" and "missing.json" in w.message.text()


def test_projection_widget_simulates_a_sinogram_with_geometry(make_napari_viewer, qtbot):
    viewer = make_napari_viewer()
    w = _designer(viewer)
    vol = np.zeros((32, 32, 32), np.float32)
    vol[8:24, 10:20, 12:22] = 0.02
    viewer.add_layer(_layer(volume_layer(vol, (1.0, 1.0, 1.0), "box")))
    _, p = viewer.window.add_plugin_dock_widget(PLUGIN, "Projection")
    p.volume.select("box")
    p.scan.select("trajectory")
    qtbot.mouseClick(p.run_button, Qt.LeftButton)
    wait_for(lambda: not p.busy, timeout=60)
    assert p.message.level == "note", p.message.text()
    layer = p.last_layer
    assert layer.data.shape == (30, 48, 48)                # (views, V, U): views on the slider
    geo = ScanGeometry.from_dict(layer.metadata["ctbench"]["geometry"])
    assert geo == geo and geo.volume_shape == (32, 32, 32) and geo.sinogram_shape == (30, 48, 48)
    want = simulate(w.geometry, torch.from_numpy(vol)).numpy()
    np.testing.assert_allclose(display_to_sinogram(layer.data), want, rtol=1e-6, atol=1e-7)
    # With noise: seeded, so reproducible; and different from the clean data.
    p.noise.setChecked(True)
    p.i0.setValue(1000)
    p.seed.setValue(3)
    p.run()
    wait_for(lambda: not p.busy, timeout=60)
    noisy = display_to_sinogram(p.last_layer.data)
    np.testing.assert_allclose(noisy, simulate(w.geometry, torch.from_numpy(vol), i0=1000, seed=3).numpy(),
                               rtol=1e-6, atol=1e-6)
    assert "I0=1000" in p.last_layer.name


def test_bad_input_in_forms_is_a_message_not_a_traceback(make_napari_viewer, qtbot):
    # pytest-qt fails a test on any exception raised in a Qt slot: every click below must
    # end in a message in the widget.
    viewer = make_napari_viewer()
    _, p = viewer.window.add_plugin_dock_widget(PLUGIN, "Projection")
    _, r = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    qtbot.mouseClick(p.run_button, Qt.LeftButton)
    assert p.message.level == "error" and "pick an image layer" in p.message.text()
    viewer.add_image(np.ones((8, 8), np.float32), name="flat")
    qtbot.mouseClick(p.run_button, Qt.LeftButton)
    assert "pick a scan" in p.message.text()
    qtbot.mouseClick(r.run_button, Qt.LeftButton)
    assert r.message.level == "error" and "no sinogram to reconstruct" in r.message.text()
    assert r.sinogram.names() == []                       # an image without geometry is not offered

    w = _designer(viewer)
    n_layers = len(viewer.layers)
    w.form.editors["sdd"].setValue(100.0)                 # SDD < SID
    qtbot.mouseClick(w.update_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=10000)    # the preview is built in a worker thread
    assert w.message.level == "error" and "SDD (100 mm) must be at least SID (150 mm)" in w.message.text()
    assert len(viewer.layers) == n_layers                 # the last valid preview stays
    w.form.editors["sdd"].setValue(300.0)
    w.form.editors["n_views"].setValue(0)                 # zero views
    qtbot.mouseClick(w.update_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=10000)    # the preview is built in a worker thread
    assert "Views must be at least 1" in w.message.text()
    w.form.editors["n_views"].setValue(30)
    qtbot.mouseClick(w.update_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=10000)    # the preview is built in a worker thread
    assert w.message.level == ""

    p.volume.select("flat")                               # a 3D scan for a 2D image
    qtbot.mouseClick(p.run_button, Qt.LeftButton)
    assert "is 3D and needs a 3D (z, y, x) volume" in p.message.text()
    viewer.add_image(np.ones((10, 8, 8), np.float32), name="plain image")
    assert "plain image" not in r.sinogram.names()
    qtbot.mouseClick(r.preview_button, Qt.LeftButton)
    assert "no sinogram to reconstruct" in r.message.text()
    qtbot.mouseClick(r.compare_button, Qt.LeftButton)
    assert "at least two results" in r.message.text()
    assert not r.running and not p.busy


def test_dataset_reader_and_writer_through_napari(make_napari_viewer, tmp_path):
    viewer = make_napari_viewer()
    viewer.open_sample(PLUGIN, "phantom_scan")
    out = tmp_path / "scan.zarr"
    written = viewer.layers.save(str(out), plugin=PLUGIN)
    assert written == [str(out)]
    before = [np.asarray(layer.data) for layer in viewer.layers]
    viewer.layers.clear()
    viewer.open(str(out), plugin=PLUGIN)
    assert [layer.metadata["ctbench"]["kind"] for layer in viewer.layers] == ["volume", "sinogram"]
    for a, layer in zip(before, viewer.layers):
        np.testing.assert_array_equal(a, layer.data)
    assert list(viewer.layers[0].scale) == [1.0, 1.0, 1.0]


def test_screenshots_of_designer_and_projection(make_napari_viewer, quiet_qt_warning):
    viewer = make_napari_viewer(show=True)
    viewer.window.resize(1300, 850)
    w = _designer(viewer, kind="helical", n_views=60, z_range=30.0, n_turns=2.0, detector_v=24)
    _, stats = save_viewer_screenshot(viewer, "designer", SHOTS)
    assert stats["foreground"] > 0.05
    save_widget_screenshot(w, "designer_widget", SHOTS)
    viewer.window.remove_dock_widget("all")
    viewer.layers.clear()
    viewer.open_sample(PLUGIN, "phantom")
    w = TrajectoryDesignerWidget(viewer)
    w.set_design(PHANTOM_SCAN)              # a detector wide enough for the 64 mm phantom
    w.update_preview()
    _, p = viewer.window.add_plugin_dock_widget(PLUGIN, "Projection")
    p.volume.select("Shepp-Logan phantom")
    p.run()
    wait_for(lambda: not p.busy, timeout=60)
    # The sinogram is shown alone in its own frame (views on the slider), fitted, without help from the test.
    assert [x.name for x in viewer.layers if x.visible] == [p.last_layer.name]
    assert viewer.dims.ndisplay == 2
    _, stats = save_viewer_screenshot(viewer, "projection", SHOTS)
    assert stats["foreground"] > 0.05
    save_widget_screenshot(p, "projection_widget", SHOTS)
    w.deleteLater()


def _layer(layer_data):
    from napari.layers import Layer
    return Layer.create(*layer_data)


def test_launch_docks_the_widgets_and_loads_a_sample(make_napari_viewer, monkeypatch):
    import napari

    import ctbench_napari

    monkeypatch.setattr(napari, "Viewer", make_napari_viewer)   # the fixture cleans the viewer up
    ran = []
    monkeypatch.setattr(napari, "run", lambda *a, **k: ran.append(True))
    viewer = ctbench_napari.launch("phantom")
    assert ran == [True]                                         # it blocks in napari.run()
    from ctbench_napari._testing import wait_for
    # The sample arrives once the start-up thread has computed it (never computed on the GUI thread).
    wait_for(lambda: len(viewer.layers) > 0, timeout=60)
    assert [layer.name for layer in viewer.layers] == ["Shepp-Logan phantom"]
    docked = {type(w).__name__ for w in viewer.window.dock_widgets.values()}
    assert docked == {"TrajectoryDesignerWidget", "ProjectionWidget", "ReconstructionWidget", "ScanImportWidget",
                      "CalibrateWidget", "JobsPanel"}            # Calibrate and Jobs are docked with the rest
    from qtpy.QtWidgets import QDockWidget, QTabBar
    bars = [b for b in viewer.window._qt_window.findChildren(QTabBar)
            if "Designer" in [b.tabText(i) for i in range(b.count())]]
    assert len(bars) == 1
    [bar] = bars
    from ctbench_napari._testing import wait_for
    wait_for(lambda: bar.tabText(bar.currentIndex()) == "Designer", timeout=5)   # starts in the designer
    # short tab titles (six tabs side by side in a narrow dock), never elided; the full name is the dock's tooltip
    assert [bar.tabText(i) for i in range(bar.count())] == ["Designer", "Projection", "Reconstruct", "Scan import",
                                                            "Calibrate", "Jobs"]
    assert bar.elideMode() == Qt.ElideNone
    docks = {d.windowTitle(): d.toolTip() for d in viewer.window._qt_window.findChildren(QDockWidget)
             if d.windowTitle() in [bar.tabText(i) for i in range(bar.count())]}
    assert docks == {ctbench_napari.TAB_TITLES.get(n, n): n for n in ctbench_napari.WIDGETS}
    with pytest.raises(ValueError, match="sample must be one of"):
        ctbench_napari.launch("nope", block=False)


def test_the_workbench_fits_a_1080_pixel_screen_and_scrolls_on_a_laptop(make_napari_viewer, monkeypatch):
    """All widgets docked (tabbed), a result and a comparison present: the window's minimum size is at most
    1000 px high (1920x1080) and fits 1366x768; tall panels scroll instead of growing the window."""
    import napari

    import ctbench_napari
    from qtpy.QtWidgets import QApplication

    monkeypatch.setattr(napari, "Viewer", make_napari_viewer)
    viewer = ctbench_napari.launch("phantom_scan", block=False)
    window = viewer.window._qt_window
    recon = next(w for w in viewer.window.dock_widgets.values() if type(w).__name__ == "ReconstructionWidget")
    for it in range(1, 6):
        recon.plot.add(it, 1.0 / it)               # the residual plot drawn, as after a run
    recon.comparison.profile.set_curves([("a", [0, 1], [0, 1]), ("b", [0, 1], [1, 0]), ("c", [0, 1], [0, 0])])
    recon.comparison.colour_bar.show()
    QApplication.processEvents()
    hint = window.minimumSizeHint()
    assert hint.height() <= 1000, hint.height()
    assert hint.height() <= 768 and hint.width() <= 1366, (hint.width(), hint.height())
    for w in viewer.window.dock_widgets.values():
        area = w.scroll_area                        # each panel scrolls inside its dock
        assert area.widget().minimumSizeHint().height() > area.minimumSizeHint().height()
    window.resize(1366, 768)
    QApplication.processEvents()
    assert window.height() <= 768 and window.width() <= 1366
    assert recon.scroll_area.verticalScrollBar().maximum() > 0   # the Reconstruction panel scrolls there


def test_the_eta_uses_the_measured_time_per_iteration_not_the_set_up():
    from ctbench_napari._qt.reconstruction import eta_seconds

    # The first iteration took 3 s (set-up included), the next ones 1 s each: 7 left take 7 s, not 11.7 s.
    progress = [(1, 3.0, 0.5), (2, 4.0, 0.4), (3, 5.0, 0.3)]
    assert eta_seconds(progress, 10) == pytest.approx(7.0)
    assert eta_seconds(progress[:1], 10) == pytest.approx(27.0)      # only the first known: it is the estimate


def test_error_text_keeps_closing_quotes_and_drops_only_keyerror_quotes():
    from ctbench_napari._qt.common import error_text

    assert error_text(ValueError("n_iter must be an integer, got 'abc'")) == "n_iter must be an integer, got 'abc'"
    assert error_text(KeyError("no layer named 'x'")) == "no layer named 'x'"
    assert error_text(RuntimeError("boom")) == "RuntimeError: boom"
