"""The corrections box of the Scan import widget: its keys reach the config, and Preview shows before | after of
the view under the slider, computed off the GUI thread by the same code as ``ctbench recon``."""


import numpy as np
import pytest

from ctbench.io import read_scan
from ctbench.pipeline.corrections_preview import correction_preview
from ctbench_napari import PLUGIN
from ctbench_napari._qt.corrections import PREVIEW, PREVIEW_ROW
from ctbench_napari._testing import doc_images_dir, save_viewer_screenshot, wait_for

pytestmark = pytest.mark.gui
DOC_IMAGES = doc_images_dir()


def test_corrections_box_sets_the_keys_and_previews_the_current_view(make_napari_viewer):
    viewer = make_napari_viewer(show=True)
    viewer.window.resize(1500, 950)
    viewer.open_sample(PLUGIN, "lab_scan")
    [raw] = viewer.layers
    _, scan = viewer.window.add_plugin_dock_widget(PLUGIN, "Scan import")
    box = scan.corrections
    box.zingers.setChecked(True)
    box.z_threshold.setValue(0.2)
    box.rings.setCurrentText("sorting")
    box.r_size.setValue(9)
    box.hardening.setText("1, 0.05")
    pre = scan.preprocess_config()
    assert pre.zingers.threshold == 0.2 and pre.rings.method == "sorting" and pre.rings.size == 9
    assert pre.beam_hardening.coefficients == [1.0, 0.05]

    viewer.dims.set_current_step(0, 17)
    box.preview_button.click()
    assert box.busy or PREVIEW in viewer.layers                  # the work runs in a worker thread
    wait_for(lambda: not box.busy, timeout=300)
    assert box.message.level == "note", box.message.text()
    pv = box.last_preview
    want = correction_preview(read_scan(raw.metadata["ctbench"]["source"]["path"]), pre, view=17)
    np.testing.assert_allclose(pv.view_after, want.view_after, atol=1e-6)
    np.testing.assert_allclose(viewer.layers[PREVIEW].data, want.side_by_side("view"), atol=1e-6)
    np.testing.assert_allclose(viewer.layers[PREVIEW_ROW].data, want.side_by_side("sinogram"), atol=1e-6)
    assert not np.allclose(pv.sinogram_before, pv.sinogram_after)    # the sample has rings: the filter acts
    assert "view 17" in box.message.text()
    for layer in viewer.layers:
        layer.visible = layer.name == PREVIEW_ROW
    viewer.reset_view()
    save_viewer_screenshot(viewer, "correction_preview", DOC_IMAGES)

    box.hardening.setText("1, x")                                     # bad input is named in the box
    box.preview_button.click()
    assert box.message.level == "error" and "beam hardening coefficients" in box.message.text()
