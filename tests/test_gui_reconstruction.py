"""Projection then reconstruction through the widgets, with the GUI event loop running."""

import html
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from qtpy.QtCore import Qt, QTimer

from ctbench import solvers
from ctbench.workbench.design import ScanGeometry, TrajectoryDesign
from ctbench.workbench.workflow import ReconRequest
from ctbench_napari import PLUGIN
from ctbench_napari._layers import display_to_sinogram
from ctbench_napari._samples import phantom_layer
from ctbench_napari._testing import save_viewer_screenshot, save_widget_screenshot, wait_for

pytestmark = pytest.mark.gui
SHOTS = Path(__file__).parent / "screenshots"
CONE = TrajectoryDesign(kind="circular", n_views=30, sid=150.0, sdd=300.0, detector_u=48, detector_v=48,
                        pixel_u=1.5, pixel_v=1.5, volume_d=32, volume_h=32, volume_w=32, voxel_size=1.0)
# Parallel beam with detector rows at voxel-plane heights: the slab-separable case.
PARALLEL = CONE.replace(kind="parallel", angle_range=180.0, detector_u=48, detector_v=32, pixel_u=1.0, pixel_v=1.0)


@pytest.fixture
def quiet_qt_warning(monkeypatch):
    monkeypatch.setattr("napari._qt.qt_main_window.SHOW_QT_WARNING", False, raising=False)


def _workbench(viewer, design=CONE):
    """Phantom (32^3) -> designer scan -> projection widget -> sinogram layer; returns the widgets."""
    from napari.layers import Layer

    viewer.add_layer(Layer.create(*phantom_layer(shape=(32, 32, 32))))
    docks = {}
    docks["designer"], designer = viewer.window.add_plugin_dock_widget(PLUGIN, "Trajectory designer")
    designer.show_map.setChecked(False)
    designer.set_design(design)
    designer.update_preview()
    docks["projection"], proj = viewer.window.add_plugin_dock_widget(PLUGIN, "Projection")
    proj.volume.select("Shepp-Logan phantom")
    proj.scan.select("trajectory")
    proj.run()
    wait_for(lambda: not proj.busy, timeout=60)
    assert proj.last_layer is not None, proj.message.text()
    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    recon.sinogram.select(proj.last_layer.name)
    recon.test_docks = docks
    return designer, proj, recon


def _run(recon, button="run", timeout=120.0):
    from qtpy.QtTest import QTest

    QTest.mouseClick(getattr(recon, f"{button}_button"), Qt.LeftButton)
    assert recon.message.level != "error", recon.message.text()
    wait_for(lambda: not recon.running, timeout=timeout)
    assert recon.message.level != "error", recon.message.text()
    return recon.last_run["finished"]


def _direct_inputs(proj_layer):
    geo = ScanGeometry.from_dict(proj_layer.metadata["ctbench"]["geometry"])
    sino = torch.from_numpy(display_to_sinogram(proj_layer.data).astype(np.float32))
    return geo, sino


def test_sirt_through_the_widgets_matches_ctbench_with_live_preview(make_napari_viewer):
    viewer = make_napari_viewer()
    _, proj, recon = _workbench(viewer)
    recon.select_algorithm("sirt", n_iter=20, nonneg=True)
    recon.preview_every.setValue(5)
    results = []
    recon.result_added.connect(results.append)
    finished = _run(recon)
    assert finished.stopped == "completed" and finished.n_iter == 20
    [layer] = results
    assert recon.n_live_updates >= 3                       # previews at 5, 10, 15, 20
    geo, sino = _direct_inputs(proj.last_layer)
    direct = solvers.sirt(geo.projector(), sino, 20, bounds=(0.0, None)).volume.numpy()
    np.testing.assert_allclose(layer.data, direct, rtol=1e-5, atol=1e-7)
    assert list(layer.scale) == [1.0, 1.0, 1.0]
    assert list(layer.translate) == [-15.5, -15.5, -15.5]
    meta = layer.metadata["ctbench"]["recon"]
    assert meta["algorithm"] == "sirt" and meta["params"] == {"n_iter": 20, "nonneg": True}
    assert len(meta["residuals"]) == 20 and meta["residuals"][-1] < meta["residuals"][0]
    assert layer.name == "SIRT n_iter=20 nonneg | sinogram of Shepp-Logan phantom"   # algorithm, parameters, source
    assert len(recon.plot.points) == 20
    assert recon.progress.value() == 20


def test_gui_stays_responsive_and_cancel_stops_within_one_iteration(make_napari_viewer):
    viewer = make_napari_viewer()
    _, _, recon = _workbench(viewer)
    recon.select_algorithm("sirt", n_iter=100000)
    recon.preview_every.setValue(5)
    # A timer on the GUI thread keeps firing while the solve works in its thread: its ticks fall between the
    # solver's iterations (counted, not timed: how long a gap may be is a benchmark, bench_gui.py --stalls).
    seen_at_tick = []
    timer = QTimer()
    timer.setInterval(20)
    timer.timeout.connect(lambda: seen_at_tick.append(len(recon.last_run.get("progress", []))))
    recon.run_button.click()        # adds the result layer (napari's slow step), then hands off to the worker
    timer.start()
    try:
        # The event loop runs while the solve is under way, at several different points of it: a solve that
        # blocked the GUI thread would let no tick in until it ended (it runs 100000 iterations).
        wait_for(lambda: len({n for n in seen_at_tick if n > 0}) >= 3 and recon.n_live_updates >= 1, timeout=300)
        timer.stop()
        assert recon.running and recon.n_live_updates >= 1, (recon.running, recon.n_live_updates, seen_at_tick)
    except BaseException:
        timer.stop()
        recon.cancel_button.click()      # no solver thread may outlive the viewer
        wait_for(lambda: not recon.running, timeout=60)
        raise

    t_cancel = time.perf_counter()
    recon.cancel_button.click()
    wait_for(lambda: not recon.running, timeout=30)
    fin = recon.last_run["finished"]
    started = recon.last_run["started"]
    assert fin.stopped == "cancelled" and fin.n_iter < 100000
    # Iterations that finished after the click: at most the one that was running.
    late = [it for it, elapsed, _ in recon.last_run["progress"] if started.clock + elapsed > t_cancel]
    assert len(late) <= 1, late
    assert recon.results[-1].name.endswith(f"(cancelled at {fin.n_iter})")
    np.testing.assert_array_equal(recon.results[-1].data, fin.volume.numpy())
    assert recon.run_button.isEnabled() and not recon.cancel_button.isEnabled()


def test_quick_preview_equals_the_full_central_slice_on_a_parallel_beam(make_napari_viewer):
    # (FBP/FDK slices against full runs: tests/test_gui_core.py)
    algorithm, params = "sirt", {"n_iter": 15}
    viewer = make_napari_viewer()
    _, proj, recon = _workbench(viewer, PARALLEL)
    recon.select_algorithm(algorithm, **params)
    recon.preview_mode.setCurrentIndex(recon.preview_mode.findData("slice"))
    preview = _run(recon, "preview")
    assert preview.request.mode == "slice" and preview.volume.shape == (1, 32, 32)
    title = ReconRequest(algorithm, preview.request.params, "slice").title()
    layer = viewer.layers[f"preview: {title} | sinogram of Shepp-Logan phantom"]
    assert layer.translate[0] == pytest.approx(0.5)          # plane 16 of 32 sits at z = +0.5 mm
    full = _run(recon, "run")
    np.testing.assert_allclose(layer.data[0], full.volume[16].numpy(), rtol=1e-4, atol=1e-6)


def test_compare_side_by_side_with_linked_cameras_and_screenshots(make_napari_viewer, quiet_qt_warning,
                                                                   monkeypatch):
    import napari._vispy.canvas as vispy_canvas

    # napari's canvas warns (a toast over it) when it draws layers whose units disagree
    canvas_warnings = []
    viewer = make_napari_viewer(show=True)
    monkeypatch.setattr(vispy_canvas, "show_warning", lambda text: canvas_warnings.append(
        (text, [(x.name, [str(u) for u in x.units]) for x in viewer.layers if str(x.units[0]) != "millimeter"])))
    _, proj, recon = _workbench(viewer)
    # Only the reconstruction widget stays docked: the screenshots show it in use.
    for dock in recon.test_docks.values():
        viewer.window.remove_dock_widget(dock)
    viewer.window.resize(1300, 820)
    for layer in list(viewer.layers):
        if layer.name.startswith("trajectory"):
            viewer.layers.remove(layer)
    viewer.dims.ndisplay = 2
    recon.select_algorithm("sirt", n_iter=30)
    recon.preview_every.setValue(3)
    recon.run_button.click()
    wait_for(lambda: recon.n_live_updates >= 3 or not recon.running, timeout=120)
    for layer in viewer.layers:
        layer.visible = layer.name.startswith("SIRT")
    _focus(viewer)
    save_viewer_screenshot(viewer, "reconstruction", SHOTS)
    save_widget_screenshot(recon, "reconstruction_widget", SHOTS)
    wait_for(lambda: not recon.running, timeout=120)
    assert recon.last_run["finished"].stopped == "completed"
    recon.select_algorithm("fbp")
    _run(recon)
    assert [r.name for r in recon.results] == ["SIRT n_iter=30 nonneg | sinogram of Shepp-Logan phantom",
                                               "FBP filter=ram-lak | sinogram of Shepp-Logan phantom"]

    visible_before = {layer.name: layer.visible for layer in viewer.layers}
    phantom = viewer.layers["Shepp-Logan phantom"]
    assert recon.comparison.reference.layer().name == phantom.name         # the non-reconstruction volume is the reference
    viewer.add_image(np.ones((5, 7), np.float32), name="an unrelated 2D image", visible=False)
    viewer.add_image(np.ones((8, 8, 8), np.float32), name="a volume on another grid", visible=False)
    offered = recon.comparison.reference.names()
    assert phantom.name in offered and "an unrelated 2D image" not in offered and "a volume on another grid" \
        not in offered                                                      # only volumes of the results' grid
    viewer.layers.remove("an unrelated 2D image")
    viewer.layers.remove("a volume on another grid")
    recon.comparison.mask.setCurrentIndex(recon.comparison.mask.findData("support"))
    recon.compare_button.click()
    assert recon.message.level == "note", recon.message.text()
    wait_for(lambda: not recon.comparison.busy, timeout=60)    # the numbers come from a worker thread
    assert viewer.canvas.grid.enabled
    a, b = recon.results
    assert [layer.name for layer in viewer.layers if layer.visible] == [phantom.name, a.name, b.name]
    # Every grid cell is named in the Qt cell list (no vispy text in the cells), at its grid position.
    cells = recon.comparison.cells
    assert not cells.isHidden() and not any(x.name_overlay.visible for x in viewer.layers)
    # In reading order of the cells napari draws (its grid puts the top layer of the list top left).
    where = {x.name: tuple(viewer.canvas.grid.position(i, viewer.layers)) for i, x in enumerate(viewer.layers)}
    assert recon.comparison.cell_list == sorted((where[x.name], x.name) for x in (phantom, a, b))
    assert len({pos for pos, _ in recon.comparison.cell_list}) == 3          # one cell each
    assert all(html.escape(x.name) in cells.text() for x in (phantom, a, b))
    rows, cols = viewer.canvas.grid.actual_shape(viewer.layers)
    assert rows * cols >= 3 and len([x for x in viewer.layers if x.visible]) == 3   # hidden layers take no cell
    canvas = viewer.window._qt_viewer.canvas
    assert all(c._camera is viewer.scene.camera for c in canvas.grid_cameras)   # one camera model for all cells
    # Shared contrast: the phantom's window on every cell, and linked afterwards.
    assert tuple(a.contrast_limits) == pytest.approx(tuple(phantom.contrast_limits))
    assert tuple(b.contrast_limits) == pytest.approx(tuple(phantom.contrast_limits))
    a.contrast_limits = (0.0, 0.008)
    assert tuple(b.contrast_limits) == pytest.approx((0.0, 0.008))
    # Metrics against the phantom inside its support, as the table shows them.
    from ctbench.workbench import metrics
    mask = metrics.support_mask(phantom.data, 0.05)
    for layer in (a, b):
        want = metrics.compare(layer.data, phantom.data, mask)
        got = recon.comparison.last_metrics[layer.name]
        assert got.rmse == pytest.approx(want.rmse) and got.ssim == pytest.approx(want.ssim)
    table = recon.comparison.table
    assert table.rowCount() == 2 and table.item(1, 0).text() == b.name
    # Every row is visible at the panel's size (the table is as tall as its rows), names in full.
    viewport = table.viewport().height()
    assert all(table.rowViewportPosition(r) + table.rowHeight(r) <= viewport for r in range(table.rowCount()))
    assert float(table.item(1, 2).text()) == pytest.approx(recon.comparison.last_metrics[b.name].psnr, abs=0.01)
    # Profile and histogram: one curve per cell; the profile is the central row of the current slice.
    assert [c[0] for c in recon.comparison.profile.curves] == [phantom.name, a.name, b.name]
    z_index = int(round((viewer.dims.point[0] - phantom.translate[0]) / phantom.scale[0]))
    np.testing.assert_allclose(recon.comparison.profile.curves[0][2], phantom.data[z_index, 15:17].mean(0), atol=1e-6)
    assert len(recon.comparison.histogram.curves) == 3
    a.colormap = "magma"
    assert b.colormap.name == "magma"
    _, stats = save_viewer_screenshot(viewer, "compare", SHOTS)
    assert stats["foreground"] > 0.05
    save_widget_screenshot(recon, "compare_widget", SHOTS)
    # Difference images: result − reference, in the grid with the others.
    vispy_grid = viewer.window._qt_viewer.canvas.grid          # napari's view boxes of the comparison grid
    # The test's own pixel layers above ("an unrelated 2D image") were drawn once in pixels, as any layer from
    # outside ctbench is; the layers ctbench adds are in mm from their creation.
    canvas_warnings.clear()
    recon.comparison.difference_button.click()
    wait_for(lambda: not recon.comparison.busy, timeout=60)
    # The results beside their differences, the reference out of the grid: the same 2 x 2 grid, not rebuilt.
    assert [x.name for x in viewer.layers if x.visible] == \
        [a.name, b.name, *(x.name for x in recon.comparison.differences_added)]
    assert viewer.window._qt_viewer.canvas.grid is vispy_grid and not phantom.visible
    diffs = [x for x in viewer.layers if x.name.startswith("difference")]
    assert len(diffs) == 2 and diffs == recon.comparison.differences_added
    # in millimetres from their creation: no draw saw mixed units
    assert all(str(u) == "millimeter" for d in diffs for u in d.units)
    assert not canvas_warnings, canvas_warnings
    assert diffs[1].metadata["ctbench"]["difference"] == {"result": b.name, "reference": phantom.name}
    bar = recon.comparison.colour_bar                                 # colour carries meaning: a key
    assert not bar.isHidden() and bar.lo == pytest.approx(-bar.hi) and len(bar.colours) == 64
    np.testing.assert_allclose(diffs[1].data, b.data - phantom.data, atol=1e-7)
    lo, hi = diffs[1].contrast_limits
    assert lo == pytest.approx(-hi)                                  # symmetric about zero
    listed = [name for _, name in recon.comparison.cell_list]            # the difference cells are listed too
    assert all(d.name in listed and html.escape(d.name) in cells.text() for d in diffs)
    _, stats = save_viewer_screenshot(viewer, "compare_difference", SHOTS)
    for d in diffs:
        viewer.layers.remove(d)
    recon.single_button.click()
    assert not viewer.canvas.grid.enabled
    # Single view restores exactly what was visible before comparing, and the labels go away.
    assert {layer.name: layer.visible for layer in viewer.layers} == visible_before
    assert not any(x.name_overlay.visible for x in viewer.layers) and cells.isHidden()
    # Unchecking a result in the list leaves it out of the comparison.
    recon.result_list.item(0).setCheckState(Qt.Unchecked)
    recon.compare_button.click()
    wait_for(lambda: not recon.comparison.busy, timeout=60)
    assert [layer.name for layer in viewer.layers if layer.visible] == [phantom.name, b.name]
    assert list(recon.comparison.last_metrics) == [b.name]
    recon.single_button.click()
    assert {layer.name: layer.visible for layer in viewer.layers} == visible_before


def _focus(viewer):
    """2D view of the central plane, fitted to the visible layers."""
    from qtpy.QtWidgets import QApplication

    from ctbench_napari._qt.common import fit_view

    viewer.dims.set_point(0, 0.0)
    QApplication.processEvents()
    fit_view(viewer, [layer for layer in viewer.layers if layer.visible])
