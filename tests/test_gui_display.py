"""Issue 14: the workbench as people use it, with a real napari viewer under Xvfb.

Display model (frames, 2D slice, fitted camera, percentile contrast, oblique designer camera), inputs that
follow the user, honest state (one error path, cancelled, ETA, projection progress), the ctbench reader
winning for datasets, writer errors, and software OpenGL.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from qtpy.QtCore import QMimeData, QPointF, Qt, QUrl
from qtpy.QtGui import QDropEvent

from ctbench.workbench.design import TrajectoryDesign
from ctbench.workbench.metrics import percentile_window
from ctbench_napari import PLUGIN
from ctbench_napari._qt.display import filled_fraction, view_direction_angle_to_z
from ctbench_napari._testing import save_viewer_screenshot, save_widget_screenshot, wait_for

pytestmark = pytest.mark.gui
SHOTS = Path(__file__).parent / "screenshots"
ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(n_views=24, sid=150.0, sdd=300.0, detector_u=48, detector_v=32, pixel_u=1.5, pixel_v=1.5,
             volume_d=32, volume_h=32, volume_w=32, voxel_size=1.0)


@pytest.fixture
def quiet_qt_warning(monkeypatch):
    monkeypatch.setattr("napari._qt.qt_main_window.SHOW_QT_WARNING", False, raising=False)


def _same(a, b) -> bool:
    from ctbench_napari._qt.common import same_layer
    return same_layer(a, b)


def _dock(viewer, name):
    return viewer.window.add_plugin_dock_widget(PLUGIN, name, tabify=True)[1]


def _small_scan(viewer):
    """The 32^3 phantom and its 24-view cone-beam sinogram as layers (no widget, a fraction of a second)."""
    from napari.layers import Layer

    from ctbench_napari._layers import sinogram_layer
    from ctbench_napari._samples import phantom_sinogram
    _phantom32(viewer)
    geo, sino = phantom_sinogram(TrajectoryDesign(**SMALL).build())
    return viewer.add_layer(Layer.create(*sinogram_layer(sino, geo, "small scan")))


def _phantom32(viewer):
    from napari.layers import Layer

    from ctbench_napari._samples import phantom_layer
    return viewer.add_layer(Layer.create(*phantom_layer(shape=(32, 32, 32))))


# ------------------------------------------------------------------ 1. display model
def _settle_canvas(viewer, qtbot, timeout_s: float = 20.0) -> None:
    """Wait until the canvas keeps its size for 0.3 s (a new dock's layout; a fixed wait was too short under
    the full suite's load, and the camera fit then met a canvas that grew afterwards)."""
    import time

    last, since, t0 = None, time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        qtbot.wait(50)
        size = tuple(viewer.canvas.size)
        if size != last:
            last, since = size, time.monotonic()
        elif time.monotonic() - since >= 0.3:
            return


def test_sinograms_have_their_own_frame_aspect_and_labels(make_napari_viewer, quiet_qt_warning, qtbot):
    viewer = make_napari_viewer(show=True)
    viewer.window.resize(1200, 800)
    _dock(viewer, "Reconstruction")
    viewer.open_sample(PLUGIN, "phantom_scan")
    phantom, sino = viewer.layers
    designer = _dock(viewer, "Trajectory designer")
    designer.set_design(TrajectoryDesign(**{**SMALL, "kind": "helical", "z_range": 30.0, "n_turns": 2.0}))
    designer.update_preview()
    # The designer: volume frame in 3D, oblique camera (not down the rotation axis), sinograms hidden.
    assert viewer.dims.ndisplay == 3
    assert 30 < view_direction_angle_to_z(viewer) < 80
    assert not sino.visible and phantom.visible
    assert viewer.dims.axis_labels[-3:] == ("z", "y", "x")
    save_viewer_screenshot(viewer, "designer_oblique", SHOTS)

    proj = _dock(viewer, "Projection")
    _settle_canvas(viewer, qtbot)                         # let the window lay out its new dock (canvas size)
    assert _same(proj.volume.layer(), phantom) and proj.scan.layer().name == "trajectory"
    proj.scan.select("Shepp-Logan cone-beam scan")      # its geometry, on the phantom's grid
    proj.run_button.click()
    wait_for(lambda: not proj.busy, timeout=60)
    new = proj.last_layer
    # Only the new sinogram is shown: 2D, in detector pixels, labelled (view, v, u), middle view, fitted.
    assert [x.name for x in viewer.layers if x.visible] == [new.name]
    assert viewer.dims.ndisplay == 2
    assert viewer.dims.axis_labels[-3:] == ("view", "v (px)", "u (px)")
    assert list(new.scale) == [1.0, 1.0, 1.0]                # 1.5 mm square pixels: aspect 1 in pixel units
    assert viewer.dims.point[-3] == pytest.approx(59.5, abs=0.6)     # the middle of 120 views
    assert tuple(viewer.dims.range[0]) == (0.0, 119.0, 1.0)          # the slider spans views only, not z in mm
    assert filled_fraction(viewer, new) > 0.85
    np.testing.assert_allclose(new.contrast_limits, percentile_window(new.data), rtol=1e-5)
    save_viewer_screenshot(viewer, "sinogram_frame", SHOTS)

    viewer.open_sample(PLUGIN, "htc2022")
    htc = viewer.layers[-1]
    from ctbench_napari._qt.display import show_sinogram
    show_sinogram(viewer, htc)
    assert list(htc.scale) == [1.0, 1.0] and htc.data.shape == (721, 560)   # not a 721 x 112 strip
    ext = np.asarray(htc.extent.world)
    assert (ext[1] - ext[0]) == pytest.approx([720, 559])      # pixel centres: views and u in the same unit
    assert filled_fraction(viewer, htc) > 0.85
    assert [x.name for x in viewer.layers if x.visible] == [htc.name]       # one sinogram at a time
    save_viewer_screenshot(viewer, "htc2022_frame", SHOTS)


def test_a_new_result_is_a_fitted_2d_slice_with_percentile_contrast(make_napari_viewer, qtbot):
    viewer = make_napari_viewer(show=True)
    _phantom32(viewer)
    designer = _dock(viewer, "Trajectory designer")
    designer.show_map.setChecked(False)
    designer.set_design(TrajectoryDesign(**SMALL))
    designer.update_preview()
    assert viewer.dims.ndisplay == 3
    proj = _dock(viewer, "Projection")
    proj.run()
    wait_for(lambda: not proj.busy, timeout=60)
    viewer.dims.ndisplay = 3                              # as the user may have left it
    viewer.scene.camera.zoom = 0.05
    recon = _dock(viewer, "Reconstruction")
    _settle_canvas(viewer, qtbot)                         # let the window lay out its new dock (canvas size)
    assert _same(recon.sinogram.layer(), proj.last_layer)
    recon.select_algorithm("fbp", filter="hann")
    recon.run_button.click()
    wait_for(lambda: not recon.running, timeout=60)
    result = recon.results[-1]
    assert recon.last_run["views"] == [16, 24]                        # real progress: per batch of 16 views
    assert recon.progress.text() == "24 / 24 views"
    assert viewer.dims.ndisplay == 2
    assert [x.name for x in viewer.layers if x.visible] == [result.name]
    assert viewer.dims.point[0] == pytest.approx(0.0, abs=0.6)      # the central slice (z = 0 mm)
    assert filled_fraction(viewer, result) > 0.85
    np.testing.assert_allclose(result.contrast_limits, percentile_window(result.data), rtol=1e-5)
    assert viewer.dims.axis_labels == ("z", "y", "x")
    assert tuple(viewer.dims.range[0]) == (-15.5, 15.5, 1.0)          # z in mm only, not the 24 views


# ------------------------------------------------------------------ 2. inputs follow the user
def test_pickers_list_the_right_kind_follow_new_layers_and_renames(make_napari_viewer):
    viewer = make_napari_viewer()
    recon = _dock(viewer, "Reconstruction")
    proj = _dock(viewer, "Projection")
    viewer.open_sample(PLUGIN, "phantom_scan")
    phantom, sino = viewer.layers
    assert recon.sinogram.names() == [sino.name]              # not the phantom volume
    assert _same(recon.sinogram.layer(), sino)
    assert proj.volume.names() == [phantom.name]              # a sinogram is not a volume to project
    designer = _dock(viewer, "Trajectory designer")
    designer.show_map.setChecked(False)
    designer.update_preview()
    assert "trajectory: completeness" not in recon.sinogram.names()
    viewer.open_sample(PLUGIN, "htc2022")
    htc = viewer.layers[-1]
    assert _same(recon.sinogram.layer(), htc)                      # the newest matching layer is chosen
    htc.name = "my disc"
    assert _same(recon.sinogram.layer(), htc) and recon.sinogram.currentText() == "my disc"
    assert recon.grid[1].value() == htc.metadata["ctbench"]["geometry"]["volume_shape"][0]
    recon.sinogram.select(sino.name)
    sino.name = "renamed scan"
    assert _same(recon.sinogram.layer(), sino) and recon.sinogram.currentText() == "renamed scan"


def test_algorithms_a_scan_cannot_use_are_disabled_with_the_reason(make_napari_viewer, qtbot):
    viewer = make_napari_viewer()
    _phantom32(viewer)
    designer = _dock(viewer, "Trajectory designer")
    designer.show_map.setChecked(False)
    designer.set_design(TrajectoryDesign(**{**SMALL, "kind": "saddle", "amplitude": 10.0}))
    designer.update_preview()
    proj = _dock(viewer, "Projection")
    proj.run()
    wait_for(lambda: not proj.busy, timeout=60)
    recon = _dock(viewer, "Reconstruction")
    reason = recon.algorithm_reason("fbp")
    assert reason is not None and "circular orbit" in reason and "SIRT" in reason
    assert "helical_fdk" not in reason and "fdk(" not in reason
    assert recon.algorithm.currentData() != "fbp"             # a usable algorithm is selected
    assert all(recon.algorithm_reason(a) is None for a in ("sirt", "cgls", "tv"))
    recon.algorithm.setCurrentIndex(recon.algorithm.findData("fbp"))   # forced (e.g. from a script)
    qtbot.mouseClick(recon.run_button, Qt.LeftButton)
    assert recon.message.level == "error" and "circular orbit" in recon.message.text()
    assert not recon.running
    # SIRT works on the saddle scan, here on a coarser grid set in the form (16^3 voxels of 2 mm).
    recon.select_algorithm("sirt", n_iter=2)
    for box in recon.grid:
        box.setValue(16)
    recon.pitch.setValue(2.0)
    qtbot.mouseClick(recon.run_button, Qt.LeftButton)
    wait_for(lambda: not recon.running, timeout=60)
    assert recon.results[-1].data.shape == (16, 16, 16) and list(recon.results[-1].scale) == [2.0, 2.0, 2.0]
    # A circular scan makes FBP/FDK usable again.
    designer.set_design(TrajectoryDesign(**SMALL))
    designer.update_preview()
    proj.scan.select("trajectory")
    proj.run()
    wait_for(lambda: not proj.busy, timeout=60)
    assert _same(recon.sinogram.layer(), proj.last_layer) and recon.algorithm_reason("fbp") is None


# ------------------------------------------------------------------ 3. honest state
def test_a_worker_error_is_shown_once_and_the_state_resets(make_napari_viewer):
    from napari.utils.notifications import notification_manager

    viewer = make_napari_viewer()
    sino = _small_scan(viewer)
    recon = _dock(viewer, "Reconstruction")
    data = sino.data.copy()
    data[5, 10, 10] = np.nan                                  # the solver refuses it, in the worker
    sino.data = data
    toasts = []
    notification_manager.notification_ready.connect(toasts.append)
    try:
        recon.select_algorithm("sirt", n_iter=3)
        recon.run_button.click()
        wait_for(lambda: not recon.running, timeout=60)
    finally:
        notification_manager.notification_ready.disconnect(toasts.append)
    assert recon.message.level == "error"
    assert "NaN" in recon.message.text() and recon.message.text().count("NaN") == 1
    # The same words once as a napari notification (where the user may be looking), never a traceback.
    nan_toasts = [str(getattr(t, "message", t)) for t in toasts if "NaN" in str(getattr(t, "message", t))]
    assert nan_toasts == [recon.message.text()] and "Traceback" not in nan_toasts[0]
    assert recon.status.text() == "ready"
    assert recon.progress.text() == "failed"
    assert recon.run_button.isEnabled() and not recon.cancel_button.isEnabled()
    assert not [x for x in viewer.layers if x.name.startswith("SIRT")]           # no empty result left behind
    save_widget_screenshot(recon, "reconstruction_error", SHOTS)


def test_cancel_reads_cancelled_and_iterative_runs_show_an_eta(make_napari_viewer):
    viewer = make_napari_viewer()
    _small_scan(viewer)
    recon = _dock(viewer, "Reconstruction")
    recon.select_algorithm("sirt", n_iter=100000)
    recon.preview_every.setValue(2)
    viewer.dims.ndisplay = 3                              # e.g. left in 3D by the designer
    recon.run_button.click()
    try:
        # The first preview's display follows its data one event-loop turn later (issue 23: no stall).
        wait_for(lambda: recon.n_live_updates >= 1 and not recon.display_steps.pending, timeout=60)
        # The live preview is a 2D central slice (contrast from its percentiles), not a saturated 3D projection.
        assert viewer.dims.ndisplay == 2
        assert [x.name for x in viewer.layers if x.visible] == [recon.live_layer.name]
        lo, hi = recon.live_layer.contrast_limits
        assert hi > lo and hi < float(recon.live_layer.data.max()) * 1.5
        wait_for(lambda: len(recon.last_run.get("progress", [])) >= 3, timeout=60)
    except BaseException:
        recon.cancel()
        wait_for(lambda: not recon.running, timeout=60)
        raise
    assert "left" in recon.status.text() and "left" in recon.progress.text()   # an estimate of the time to go
    recon.cancel_button.click()
    wait_for(lambda: not recon.running, timeout=60)
    k = recon.last_run["finished"].n_iter
    assert recon.progress.text() == f"{k} / 100000 (cancelled)"
    assert recon.progress.value() == k and recon.progress.maximum() == 100000
    save_widget_screenshot(recon, "reconstruction_cancelled", SHOTS)


def test_projection_progress_counts_views(make_napari_viewer):
    viewer = make_napari_viewer()
    _phantom32(viewer)
    designer = _dock(viewer, "Trajectory designer")
    designer.show_map.setChecked(False)
    designer.set_design(TrajectoryDesign(**{**SMALL, "n_views": 40}))
    designer.update_preview()
    proj = _dock(viewer, "Projection")
    assert not proj.i0.isEnabled()
    proj.noise.setChecked(True)
    assert proj.i0.isEnabled()
    labels = [w.text() for w in proj.findChildren(type(proj.message).__mro__[1]) if hasattr(w, "text")]
    assert any("I0" in t for t in labels)                     # the noise field is labelled
    values = []
    proj.progress.valueChanged.connect(values.append)
    proj.run_button.click()
    wait_for(lambda: not proj.busy, timeout=60)
    assert proj.progress.maximum() == 40
    assert values[-1] == 40 and len([v for v in values if 0 < v < 40]) >= 3     # per batch of views
    assert "views" in proj.progress.text()


# ------------------------------------------------------------------ 5. reader and writer
def test_the_ctbench_reader_wins_for_datasets_and_writer_errors_reach_the_user(make_napari_viewer, tmp_path):
    from ctbench_napari._io import DatasetWriteError, write_dataset
    from ctbench_napari._samples import make_phantom_scan

    path = str(tmp_path / "scan.zarr")
    write_dataset(path, make_phantom_scan())
    viewer = make_napari_viewer()
    _dock(viewer, "Reconstruction")
    viewer.open(path)                                         # napari's default: its own reader
    wait_for(lambda: len(viewer.layers) == 2 and all("ctbench" in x.metadata for x in viewer.layers), timeout=10)
    assert [x.metadata["ctbench"]["kind"] for x in viewer.layers] == ["volume", "sinogram"]
    assert all(x.source.reader_plugin == "ctbench" for x in viewer.layers)
    viewer.layers.clear()
    # Drag and drop on the canvas: the canvas filter sees the drop before napari's reader dialog would.
    # (Qt delivers synthetic drops only during a real drag, so the filter is handed the event directly,
    # as napari's own tests call QtViewer.dropEvent.)
    from ctbench_napari._qt import datasets
    canvas = viewer.window._qt_viewer.canvas.native
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(path)])
    event = QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    assert datasets.drop_filter().eventFilter(canvas, event) is True
    assert event.isAccepted()
    assert all(x.source.reader_plugin == "ctbench" for x in viewer.layers)
    other = QMimeData()
    other.setUrls([QUrl.fromLocalFile(str(tmp_path))])        # not a dataset: left to napari
    assert datasets.drop_filter().eventFilter(canvas, QDropEvent(QPointF(1, 1), Qt.CopyAction, other,
                                                                 Qt.LeftButton, Qt.NoModifier)) is False
    assert [x.metadata["ctbench"]["kind"] for x in viewer.layers] == ["volume", "sinogram"]
    # A writer error reaches the caller with its own text (not napari's "No data written!").
    viewer.layers.clear()
    viewer.add_image(np.zeros((2, 3, 4, 5), np.float32), name="four-d")
    with pytest.raises(DatasetWriteError, match="'four-d' has 4 dimensions"):
        viewer.layers.save(str(tmp_path / "bad.zarr"), selected=False, plugin=PLUGIN)
    assert not (tmp_path / "bad.zarr").exists()


# ------------------------------------------------------------------ 3 and 6, in a fresh process
def test_a_script_survives_worker_errors_and_software_gl_layer_replacement(tmp_path):
    """One subprocess (napari starts once): a script without ``napari.run()`` under Mesa's software OpenGL.

    - a worker error (an infinite sinogram value) must not abort the script (napari's default re-raises it
      in the event loop, which kills a PyQt5 process without ``napari.run()``);
    - the designer's 3D layers are replaced (3D <-> 2D scans change their dimensionality) and the viewer
      goes back to 2D for a sinogram, drawing each state, with llvmpipe.
    """
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, napari
        from OpenGL import GL
        from napari.layers import Layer
        from ctbench.workbench.design import TrajectoryDesign
        from ctbench_napari import PLUGIN
        from ctbench_napari._layers import sinogram_layer
        from ctbench_napari._samples import phantom_layer
        from ctbench_napari._testing import wait_for

        viewer = napari.Viewer(show=True)
        _, designer = viewer.window.add_plugin_dock_widget(PLUGIN, "Trajectory designer")
        _, proj = viewer.window.add_plugin_dock_widget(PLUGIN, "Projection")
        _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
        small = dict(n_views=12, volume_d=24, volume_h=24, volume_w=24, detector_u=40, detector_v=40)

        geo = TrajectoryDesign(**small).build()
        sino = np.ones(geo.sinogram_shape, np.float32); sino[0, 0, 0] = np.inf
        data, kwargs, _ = sinogram_layer(sino, geo, "bad scan")
        viewer.add_image(data, **kwargs)
        recon.select_algorithm("cgls", n_iter=2)
        recon.run()
        wait_for(lambda: not recon.running, timeout=60)
        print("MESSAGE:", recon.message.text(), flush=True)

        viewer.add_layer(Layer.create(*phantom_layer(shape=(24, 24, 24))))
        for kind in ("helical", "fan", "saddle"):
            designer.set_design(TrajectoryDesign(kind=kind, **small))
            designer.update_preview()              # 3D layers replaced
            viewer.screenshot(canvas_only=True, flash=False)
            viewer.dims.ndisplay = 2
            viewer.screenshot(canvas_only=True, flash=False)
            viewer.dims.ndisplay = 3
        designer.set_design(TrajectoryDesign(kind="circular", **small))
        designer.update_preview()
        proj.volume.select("Shepp-Logan phantom")
        proj.scan.select("trajectory")
        proj.run()                                 # the sinogram frame: back to 2D
        wait_for(lambda: not proj.busy, timeout=60)
        img = viewer.screenshot(canvas_only=True, flash=False)
        assert viewer.dims.ndisplay == 2 and img.std() > 5, proj.message.text()
        print("RENDERER", GL.glGetString(GL.GL_RENDERER).decode())
        viewer.close()
        print("SURVIVED")
    """))
    env = {**os.environ, "LIBGL_ALWAYS_SOFTWARE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SURVIVED" in out.stdout and "infinite" in out.stdout, out.stdout
    assert "llvmpipe" in out.stdout or "softpipe" in out.stdout, out.stdout


def test_designer_completeness_grid_and_manual_updates(make_napari_viewer, qtbot):
    viewer = make_napari_viewer()
    designer = _dock(viewer, "Trajectory designer")
    designer.set_design(TrajectoryDesign(**SMALL))
    designer.grid_size.setValue(10)
    # The button computes in a worker thread (the GUI stays responsive): wait for the layers to follow.
    qtbot.mouseClick(designer.update_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: designer.geometry is not None and not designer.busy, timeout=10000)
    assert max(viewer.layers["trajectory: completeness"].data.shape) <= 10
    designer.auto.setChecked(False)                   # edits wait for "Update preview"
    n = designer.n_updates
    designer.form.editors["n_views"].setValue(40)
    qtbot.wait(400)
    assert designer.n_updates == n and designer.geometry.n_views == 24
    qtbot.mouseClick(designer.update_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: designer.geometry.n_views == 40, timeout=10000)
    designer.show_map.setChecked(False)
    qtbot.mouseClick(designer.update_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "trajectory: completeness" not in viewer.layers, timeout=10000)


def test_the_canvas_follows_the_docks_width(make_napari_viewer, monkeypatch):
    # Checked for issue 23: when a docked panel widens, the canvas (Qt widget and vispy canvas) narrows with it.
    import napari

    from ctbench_napari._launch import open_workbench

    monkeypatch.setattr(napari, "run", lambda *a, **k: None)
    viewer = make_napari_viewer(show=True)
    window = viewer.window._qt_window
    window.resize(1600, 900)
    open_workbench(None, block=False, viewer=viewer)
    recon = next(w for k, w in viewer.window.dock_widgets.items() if str(k).startswith("Reconstruction"))
    canvas = viewer.window._qt_viewer.canvas._scene_canvas

    def width_now():
        wait_for(lambda: canvas.native.width() == canvas.size[0], timeout=10)
        return canvas.native.width()
    wait_for(lambda: window.isVisible(), timeout=10)
    before = width_now()
    recon.setMinimumWidth(recon.width() + 300)       # the panel grows (e.g. a wide comparison table)
    wait_for(lambda: canvas.native.width() <= before - 250, timeout=10)
    narrowed = width_now()
    assert narrowed <= before - 250 and tuple(canvas.size) == (canvas.native.width(), canvas.native.height())


def test_scale_bar_follows_2d_3d_once_without_private_attribute_warnings(make_napari_viewer, recwarn):
    """Widgets see napari's public-only proxy of the viewer: displaying through it twice must connect the
    bar's 2D/3D follower once and never touch a private attribute (napari warns: FutureWarning)."""
    import gc

    from napari.utils._proxies import PublicOnlyProxy

    from ctbench_napari._qt import display

    viewer = make_napari_viewer()
    phantom = _phantom32(viewer)
    proxy = PublicOnlyProxy(viewer)

    def followers():
        return [c for c in viewer.dims.events.ndisplay.callbacks
                if getattr(c, "__qualname__", "").startswith("_scale_bar.")]

    assert followers() == []
    display.show_frame(proxy, [phantom])
    display.show_frame(proxy, [phantom])
    assert len(followers()) == 1
    bar = display.scale_bar(viewer)
    assert bar.visible                                    # a 2D slice of a volume shows the bar
    viewer.dims.ndisplay = 3
    assert not bar.visible                                # ...and the follower hides it in 3D
    viewer.dims.ndisplay = 2
    assert bar.visible
    assert not [w for w in recwarn.list if issubclass(w.category, FutureWarning)], \
        [str(w.message) for w in recwarn.list]

    gone = _shown_and_dropped_viewer()                   # a closed viewer is not kept alive by the module
    gc.collect()
    assert gone() is None


def _shown_and_dropped_viewer():
    """A weak reference to a viewer model that was displayed through a proxy, then dropped (in its own frame:
    a snapshot of the calling test's frame locals was seen to hold it)."""
    import weakref

    from napari.components import ViewerModel
    from napari.utils._proxies import PublicOnlyProxy

    from ctbench_napari._qt import display

    model = ViewerModel()
    layer = model.add_image(np.zeros((4, 5, 6), np.float32))
    display.show_frame(PublicOnlyProxy(model), [layer])
    assert model in display._BAR_FOLLOWS
    return weakref.ref(model)


def test_a_fitted_image_stays_fitted_when_the_canvas_resizes_until_the_user_moves_the_camera(make_napari_viewer,
                                                                                              qtbot):
    """A dock laid out after the fit resizes the canvas (seen in the full suite: 0.71 of the canvas filled)."""
    from ctbench_napari._qt.display import show_result
    viewer = make_napari_viewer(show=True)
    layer = _phantom32(viewer)
    window = viewer.window._qt_window
    window.resize(1200, 900)
    _settle_canvas(viewer, qtbot)
    show_result(viewer, layer)
    assert filled_fraction(viewer, layer) > 0.9
    before = tuple(viewer.canvas.size)
    window.resize(700, 500)                              # the canvas shrinks: the fitted image follows
    _settle_canvas(viewer, qtbot)
    assert tuple(viewer.canvas.size) != before
    assert 0.9 < filled_fraction(viewer, layer) <= 1.0
    viewer.scene.camera.zoom *= 0.5                      # the user zooms out: a resize leaves the camera alone
    zoom = viewer.scene.camera.zoom
    window.resize(1100, 850)
    _settle_canvas(viewer, qtbot)
    assert viewer.scene.camera.zoom == pytest.approx(zoom)
