"""The Calibrate widget under Xvfb: a misaligned sinogram layer calibrates in a thread worker, the
after-image is sharper and closer to the object than the before-image, and the geometry is applied."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from qtpy.QtCore import Qt

from ctbench.calibration.simulate import object_volume
from ctbench.workbench.design import ScanGeometry
from ctbench_napari import PLUGIN
from ctbench_napari._layers import sinogram_layer
from ctbench_napari._testing import doc_images_dir, save_widget_screenshot, wait_for
from selfcal_scans import cone_scan, misaligned
from test_gui_calibrate_layout import assert_table_shows_every_row, assert_ticks_fit

pytestmark = pytest.mark.gui


def _settle() -> None:
    """A few event-loop turns: plots that grew with their curves get their new height before a screenshot."""
    from qtpy.QtWidgets import QApplication
    for _ in range(4):
        QApplication.processEvents()


def test_calibrate_widget_recovers_offset_and_sharpens(make_napari_viewer):
    from napari.layers import Layer
    from qtpy.QtTest import QTest

    P, ells = cone_scan(size=40, views=48, det=40, seed=7)
    y, _ = misaligned(P, ells, {"offset_u": 3.6}, seed=8)
    geo = ScanGeometry(P.trajectory, P.detector_shape, P.detector_spacing, P.global_volume_shape,
                       P.voxel_spacing)
    viewer = make_napari_viewer()
    layer = viewer.add_layer(Layer.create(*sinogram_layer(y.numpy(), geo, "misaligned scan")))
    _, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Calibrate")
    w.sinogram.select("misaligned scan")
    for name, box in w.checks.items():
        box.setChecked(name == "offset_u")
    w.coarse_iters.setValue(4)
    w.fine_iters.setValue(2)
    results = []
    w.finished.connect(results.append)
    # The result reaches the screen in steps: count event-loop turns, and note the turn each new layer came in.
    from qtpy.QtCore import QTimer
    turns, inserted = [0], []
    ticker = QTimer()
    ticker.timeout.connect(lambda: turns.__setitem__(0, turns[0] + 1))
    ticker.start(0)
    viewer.layers.events.inserted.connect(lambda e: inserted.append(turns[0]))
    QTest.mouseClick(w.run_button, Qt.LeftButton)
    assert w.message.level != "error", w.message.text()
    assert w.cancel_button.isEnabled()
    assert [w.table.item(0, c).text() for c in (0, 5)] == ["offset_u [px]", "running"]   # the row at once
    wait_for(lambda: not w.running, timeout=300)
    ticker.stop()
    assert w.message.level != "error", w.message.text()
    assert w.message.text().startswith("completed: the reprojection misfit of the reconstruction falls")
    assert len(inserted) == 2 and inserted[0] < inserted[1], inserted       # before, after: separate turns
    wait_for(lambda: not w.comparison.busy, timeout=60)
    assert w.layers["nominal"].visible and w.layers["calibrated"].visible    # shown by the comparison, in 2D
    assert viewer.dims.ndisplay == 2 and not layer.visible
    [res] = results
    assert abs(res.value("offset_u") - 3.6) < 0.15
    assert w.table.rowCount() == 1 and w.table.item(0, 0).text().startswith("offset_u")
    assert w.table.item(0, 2).text() == f"{res.value('offset_u'):.4g}"
    assert_table_shows_every_row(w.table)
    assert len(w.plot.points) == len(res.loss_history) >= 2              # one point per progress step
    assert [n for _, n in w.plot.stage_starts] == ["binned ×2", "full resolution"]
    assert_ticks_fit(w.plot)
    # the after-image fits the data better and is closer to the object (RMSE against it, measured here)
    assert w.misfit["calibrated"] < 0.7 * w.misfit["nominal"]
    truth = object_volume(ells, P).numpy().astype(np.float32)
    err = {k: float(np.sqrt(np.mean((w.layers[k].data - truth) ** 2))) for k in ("nominal", "calibrated")}
    print(f"RMSE against the object: before {err['nominal']:.3e}, after {err['calibrated']:.3e}")
    assert err["calibrated"] < 0.9 * err["nominal"]
    viewer.add_image(truth, name="object", scale=P.voxel_spacing,
                     translate=[-(n - 1) / 2 * d for n, d in zip(truth.shape, P.voxel_spacing)])
    # The Calibrate comparison's only reference is the reconstruction on the exact geometry (truth.json); this
    # scan has none, so a volume on the same grid (the object) is not offered as one: the comparison shows the
    # nominal and calibrated images side by side, with no metrics to measure against.
    w.comparison.reference.refresh()
    assert "exact" not in w.layers and w.comparison.reference.names() == []
    with pytest.raises(ValueError, match="no layer named 'object'"):
        w.comparison.reference.select("object")
    shown = w.comparison.compare(layers=w.checked_results())
    assert [l.name for l in shown] == ["misaligned scan: nominal geometry (before calibration)",
                                       "misaligned scan: calibrated geometry"]
    wait_for(lambda: not w.comparison.busy, timeout=60)    # the comparison's numbers come from a worker thread
    assert w.comparison.last_metrics == {}
    w.apply()
    applied = ScanGeometry.from_dict(layer.metadata["ctbench"]["geometry"])
    torch.testing.assert_close(applied.trajectory.detector_center, res.trajectory.detector_center.float())
    wait_for(lambda: not w.comparison.busy, timeout=60)
    _settle()
    save_widget_screenshot(w.scroll_area.widget(), "calibrate_widget")   # the whole panel; docs/images has a copy


def test_known_object_layer_frees_pitch_and_sdd(make_napari_viewer):
    """Known object in the Calibrate step: with the object's volume chosen as a layer, a detector pitch and a
    source-detector distance error (which an unknown object imitates) are calibrated and recovered; without it
    the same run reports them not identifiable.  Tolerances: tests/test_selfcal_globals.py's (0.4 deg, 1 mm)."""
    from napari.layers import Layer
    from qtpy.QtTest import QTest

    P, ells = cone_scan(size=48, views=60, det=48, seed=3)
    truth = {"offset_u": 1.3, "pitch": 2.0, "sdd": 15.0}
    y, _ = misaligned(P, ells, truth, seed=4)
    geo = ScanGeometry(P.trajectory, P.detector_shape, P.detector_spacing, P.global_volume_shape,
                       P.voxel_spacing)
    viewer = make_napari_viewer()
    viewer.add_layer(Layer.create(*sinogram_layer(y.numpy(), geo, "pitched scan")))
    obj = object_volume(ells, P).numpy().astype(np.float32)
    _, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Calibrate")
    w.sinogram.select("pitched scan")
    for name, box in w.checks.items():
        box.setChecked(name in ("offset_u", "pitch", "sdd"))
    w.coarse_iters.setValue(6)
    w.fine_iters.setValue(3)
    results = []
    w.finished.connect(results.append)
    # ticked without a volume: a clear message, no run
    w.use_known.setChecked(True)
    assert w.known.isEnabled() and w.known.layer() is None
    w.run()
    assert w.message.level == "error" and "no volume layer is chosen" in w.message.text() and not w.running
    # a volume on another grid is refused by name
    viewer.add_image(obj[:, :, :-2], name="cropped object", scale=P.voxel_spacing)
    w.known.select("cropped object")
    w.run()
    assert w.message.level == "error" and "known object 'cropped object' has shape" in w.message.text()
    viewer.add_image(obj, name="object", scale=P.voxel_spacing,
                     translate=[-(n - 1) / 2 * d for n, d in zip(obj.shape, P.voxel_spacing)])
    w.known.select("object")
    QTest.mouseClick(w.run_button, Qt.LeftButton)
    assert w.message.level != "error", w.message.text()
    wait_for(lambda: not w.running, timeout=600)
    assert w.message.level != "error", w.message.text()
    assert w.known.layer().name == "object"          # the before/after layers did not take the choice
    rows = {p.name: p for p in results[-1].parameters}
    print(results[-1].table())
    assert rows["pitch"].status == "estimated" and abs(rows["pitch"].value - 2.0) < 0.4
    assert rows["sdd"].status == "estimated" and abs(rows["sdd"].value - 15.0) < 1.0
    assert abs(rows["offset_u"].value - 1.3) < 0.05
    status = {w.table.item(r, 0).text().split(" ")[0]: w.table.item(r, 5).text() for r in range(w.table.rowCount())}
    assert status["pitch"] == "estimated" and status["sdd"] == "estimated"
    assert w.table.rowCount() == 3
    assert_table_shows_every_row(w.table)
    assert_ticks_fit(w.plot)        # the misfit moves little here: a linear axis, its exponent in the label
    assert [n for _, n in w.plot.stage_starts][0] == "binned ×2"
    wait_for(lambda: not w.comparison.busy, timeout=60)
    _settle()
    save_widget_screenshot(w.scroll_area.widget(), "calibrate_known_object")  # docs/images has a copy
    # the same scan with Known object unticked: pitch and sdd cannot be told from an unknown object
    w.use_known.setChecked(False)
    QTest.mouseClick(w.run_button, Qt.LeftButton)
    wait_for(lambda: not w.running, timeout=600)
    rows = {p.name: p for p in results[-1].parameters}
    assert rows["pitch"].status == "not identifiable" and rows["sdd"].status == "not identifiable"


def test_calibrate_widget_reports_bad_input(make_napari_viewer):
    from napari.layers import Layer

    P, ells = cone_scan(size=16, views=8, det=16)
    y, _ = misaligned(P, ells, {})
    geo = ScanGeometry(P.trajectory, P.detector_shape, P.detector_spacing, P.global_volume_shape,
                       P.voxel_spacing)
    viewer = make_napari_viewer()
    viewer.add_layer(Layer.create(*sinogram_layer(y.numpy(), geo, "eight views")))
    _, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Calibrate")
    w.sinogram.select("eight views")
    w.run()
    assert w.message.level == "error" and "needs at least 12 views" in w.message.text()
    assert not w.running


def _gradient_energy(v) -> float:
    """Mean squared gradient of a volume: a misaligned geometry smears edges, so a sharper image has more."""
    return float(sum(np.mean(g.astype(np.float64) ** 2) for g in np.gradient(v)))


def test_scan_import_calibrate_step_sharpens_a_misaligned_sample(make_napari_viewer, tmp_path):
    """A simulated lab scan (raw counts, flats, darks) with a centre offset that scan.json does not state goes
    through Scan import (open, correct, attach the nominal geometry); its Calibrate step opens the Calibrate
    widget on that sinogram, which recovers the offset; the after-image is closer to the object and sharper."""
    from ctbench.calibration.simulate import random_object
    from ctbench.io.selfcal_sample import SelfCalSpec, write_selfcal_sample
    from ctbench_napari._qt.calibrate import CalibrateWidget
    import imageio.v3 as iio

    from ctbench_napari._testing import save_viewer_screenshot

    spec = SelfCalSpec(n_views=60, detector_u=48, detector_v=40, pitch=2.0 * 64 / 48, offset_u_px=3.3,
                       roll_deg=0.0, drift_rms_px=0.0, seed=27)
    folder = write_selfcal_sample(tmp_path / "scan", spec)
    viewer = make_napari_viewer(show=True)
    viewer.window.resize(1500, 950)
    _, scan = viewer.window.add_plugin_dock_widget(PLUGIN, "Scan import")
    scan.calibrate_button.click()                       # nothing attached yet: told what to do first
    assert scan.message.level == "error" and "Attach geometry first" in scan.message.text()
    scan.path.setText(str(folder))
    scan.open_button.click()
    assert scan.message.level == "note", scan.message.text()
    scan.correct_button.click()
    wait_for(lambda: not scan.busy, timeout=300)
    assert scan.message.level == "note", scan.message.text()
    assert scan.sid.value() == spec.sid and scan.sdd.value() == spec.sdd
    scan.seen_from.setCurrentText("detector")           # ctbench's own images; the rotation is in scan.json
    scan.rotation.setCurrentText("ccw")
    field_mm = spec.detector_u * spec.pitch * spec.sid / spec.sdd
    for s, n in ((scan.vol_d, 32), (scan.vol_h, 40), (scan.vol_w, 40)):   # within the field of view
        s.setValue(n)
    scan.voxel.setValue(field_mm / 40)
    scan.attach_button.click()
    wait_for(lambda: not scan.busy, timeout=300)
    assert scan.message.level == "note", scan.message.text()
    sino = scan.last_sinogram

    scan.calibrate_button.click()                       # the Calibrate step
    assert scan.message.level != "error", scan.message.text()
    docks = [d for d in viewer.window._wrapped_dock_widgets.values() if isinstance(d.inner_widget(), CalibrateWidget)]
    assert len(docks) == 1
    w = docks[0].inner_widget()
    assert w.sinogram.currentText() == sino.name
    scan.calibrate_button.click()                       # a second press reuses the same widget
    assert len([d for d in viewer.window._wrapped_dock_widgets.values()
                if isinstance(d.inner_widget(), CalibrateWidget)]) == 1
    for name, box in w.checks.items():
        box.setChecked(name == "offset_u")
    w.coarse_iters.setValue(6)
    w.fine_iters.setValue(2)
    results = []
    w.finished.connect(results.append)
    w.run_button.click()
    assert w.message.level != "error", w.message.text()
    wait_for(lambda: not w.running, timeout=600)
    assert w.message.level != "error", w.message.text()
    assert "exact geometry (truth.json)" in w.message.text(), w.message.text()     # the closing message names it
    [res] = results
    assert abs(res.value("offset_u") - spec.offset_u_px) < 0.15

    geo = ScanGeometry.from_dict(sino.metadata["ctbench"]["geometry"])
    P = geo.projector(backend="cpu")
    truth = object_volume(random_object(0.38 * field_mm, seed=spec.seed), P).numpy()
    before, after = (w.layers[k].data for k in ("nominal", "calibrated"))
    err = {k: float(np.sqrt(np.mean((v - truth) ** 2))) for k, v in (("nominal", before), ("calibrated", after))}
    sharp = {k: _gradient_energy(v) for k, v in (("nominal", before), ("calibrated", after))}
    print(f"Scan import -> Calibrate: RMSE against the object {err['nominal']:.3e} -> {err['calibrated']:.3e}; "
          f"gradient energy {sharp['nominal']:.3e} -> {sharp['calibrated']:.3e} (object {_gradient_energy(truth):.3e})")
    assert err["calibrated"] < 0.8 * err["nominal"]
    assert sharp["calibrated"] > 1.05 * sharp["nominal"]
    w.apply()
    assert sino.metadata["ctbench"]["calibration"]["offset_u"] == pytest.approx(res.value("offset_u"))

    # The sample's truth.json gives the exact geometry: its reconstruction is the comparison's reference (the
    # only one offered), and the calibrated image is closer to it than the nominal one.
    assert "exact" in w.layers, "the sample's truth.json was not used"
    assert w.misfit["exact"] < w.misfit["nominal"] and w.misfit["calibrated"] < w.misfit["nominal"]
    names = {k: w.layers[k].name for k in ("nominal", "calibrated", "exact")}
    w.comparison.reference.refresh()
    assert w.comparison.reference.names() == [names["exact"]]
    with pytest.raises(ValueError, match="no layer named"):
        w.comparison.reference.select(names["nominal"])
    w.comparison.reference.select(names["exact"])
    shown = w.comparison.compare(layers=w.checked_results())
    assert [x.name for x in shown] == [names["exact"], names["nominal"], names["calibrated"]]
    wait_for(lambda: not w.comparison.busy, timeout=120)
    m = w.comparison.last_metrics
    print(f"RMSE against the exact geometry's reconstruction: nominal {m[names['nominal']].rmse:.3e}, "
          f"calibrated {m[names['calibrated']].rmse:.3e}")
    assert m[names["calibrated"]].rmse < 0.8 * m[names["nominal"]].rmse

    # the screenshots for docs/CALIBRATION.md: the widget, and exact | nominal | calibrated side by side
    DOC = doc_images_dir()
    _settle()
    save_widget_screenshot(w.scroll_area.widget(), "calibrate_from_scan_import", DOC)
    for layer in viewer.layers:
        layer.visible = layer.name in names.values()
    # the comparison panel lays them out side by side (the exact one is its reference)
    viewer.dims.ndisplay = 2
    viewer.dims.set_point(0, 0.0)
    viewer.reset_view()
    path, _ = save_viewer_screenshot(viewer, "calibrate_before_after", DOC, canvas_only=True)
    img = iio.imread(path)           # the canvas is tall (docks take the width): keep the band of the images
    band = img[40:-60, :, :3].max(axis=2) > 0
    rows, cols = band.any(axis=1).nonzero()[0] + 40, band.any(axis=0).nonzero()[0]
    iio.imwrite(path, img[max(0, rows[0] - 15):rows[-1] + 15, max(0, cols[0] - 15):cols[-1] + 15])
