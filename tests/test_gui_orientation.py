"""The Scan import widget's orientation combo boxes: a wrong choice is flagged, "auto" is decided from the data."""

import pytest

from ctbench.io.sample_scan import LabScanSpec
from ctbench_napari import PLUGIN
from ctbench_napari._testing import wait_for

pytestmark = pytest.mark.gui
SPEC = LabScanSpec()


@pytest.fixture
def quiet_qt_warning(monkeypatch):
    monkeypatch.setattr("napari._qt.qt_main_window.SHOW_QT_WARNING", False, raising=False)


def test_scan_import_flags_a_wrong_orientation_and_decides_auto(make_napari_viewer, quiet_qt_warning):
    viewer = make_napari_viewer()
    viewer.open_sample(PLUGIN, "lab_scan")
    [raw] = viewer.layers
    _, scan = viewer.window.add_plugin_dock_widget(PLUGIN, "Scan import")
    scan.projections.select(raw.name)
    scan.correct_button.click()
    wait_for(lambda: not scan.busy, timeout=120)
    # the sample's scan.json states ctbench's convention: the combos show it
    assert scan.seen_from.currentText() == "detector" and scan.rotation.currentText() == "ccw"

    scan.seen_from.setCurrentText("source")          # wrong: a camera-convention reading of ctbench's images
    scan.centre_button.click()
    wait_for(lambda: not scan.busy, timeout=300)
    text = scan.message.text()
    # the data overrule the stated reading (the image view kept, the rotation reversed), and the user is told
    assert "warning: the data contradict the orientation" in text and "conjugate-ray mismatch" in text
    assert scan.rotation.currentText() == "cw"

    scan.seen_from.setCurrentText("auto")             # the image view undecided, the rotation stated
    scan.rotation.setCurrentText("ccw")
    scan.centre_button.click()
    wait_for(lambda: not scan.busy, timeout=300)
    assert scan.seen_from.currentText() == "detector"     # decided from the data
    assert "orientation from the data" in scan.message.text() and "warning" not in scan.message.text()
    assert abs(scan.last_centre.offset_px - SPEC.offset_px) <= 0.25
    cfg = scan.recon_config()
    assert cfg.geometry.image_seen_from == "detector" and cfg.geometry.rotation_direction == "ccw"

    # both undecided: the camera convention's reading of the right handedness (the mirror image, as the note says)
    scan.seen_from.setCurrentText("auto")
    scan.rotation.setCurrentText("auto")
    scan.centre_button.click()
    wait_for(lambda: not scan.busy, timeout=300)
    assert (scan.seen_from.currentText(), scan.rotation.currentText()) == ("source", "cw")
    assert "its mirror reading fits as well" in scan.message.text() and "warning" not in scan.message.text()
    assert abs(abs(scan.last_centre.offset_px) - abs(SPEC.offset_px)) <= 0.25
