"""The Calibrate widget under Xvfb: a misaligned sinogram layer calibrates in a thread worker, the
after-image is sharper and closer to the object than the before-image, and the geometry is applied."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from qtpy.QtCore import Qt

from ctbench.calibration.simulate import object_volume
from ctbench.workbench.design import ScanGeometry
from ctbench_napari import PLUGIN
from ctbench_napari._layers import sinogram_layer
from ctbench_napari._testing import save_widget_screenshot, wait_for
from selfcal_scans import cone_scan, misaligned

pytestmark = pytest.mark.gui


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
    QTest.mouseClick(w.run_button, Qt.LeftButton)
    assert w.message.level != "error", w.message.text()
    assert w.cancel_button.isEnabled()
    wait_for(lambda: not w.running, timeout=300)
    assert w.message.level != "error", w.message.text()
    [res] = results
    assert abs(res.value("offset_u") - 3.6) < 0.15
    assert w.table.rowCount() == 1 and w.table.item(0, 0).text().startswith("offset_u")
    assert len(w.plot.points) >= 2
    # the after-image fits the data better and is closer to the object (RMSE against it, measured here and
    # by the comparison panel with the object as its reference)
    assert w.misfit["after"] < 0.7 * w.misfit["before"]
    truth = object_volume(ells, P).numpy().astype(np.float32)
    err = {k: float(np.sqrt(np.mean((w.layers[k].data - truth) ** 2))) for k in ("before", "after")}
    print(f"RMSE against the object: before {err['before']:.3e}, after {err['after']:.3e}")
    assert err["after"] < 0.9 * err["before"]
    viewer.add_image(truth, name="object", scale=P.voxel_spacing,
                     translate=[-(n - 1) / 2 * d for n, d in zip(truth.shape, P.voxel_spacing)])
    w.comparison.reference.select("object")
    shown = w.comparison.compare(layers=w.checked_results())
    assert [l.name for l in shown] == ["object", "misaligned scan before calibration",
                                       "misaligned scan after calibration"]
    wait_for(lambda: not w.comparison.busy, timeout=60)    # the comparison's numbers come from a worker thread
    m = w.comparison.last_metrics
    assert m["misaligned scan after calibration"].rmse < m["misaligned scan before calibration"].rmse
    w.apply()
    applied = ScanGeometry.from_dict(layer.metadata["ctbench"]["geometry"])
    torch.testing.assert_close(applied.trajectory.detector_center, res.trajectory.detector_center.float())
    save_widget_screenshot(w, "calibrate_widget")   # tests/screenshots; docs/images/calibrate_widget.png is a copy


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
