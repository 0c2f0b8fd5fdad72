"""Issue 23: one display rule for every source of a layer, checked under Xvfb in a real napari viewer.

Samples, scan import (raw counts, line integrals, the attached sinogram), simulation, reconstruction,
job results and files: pixel-frame layers (projection stacks, sinograms) are shown alone in 2D with
view/pixel axes and the slider over the views; volumes are in millimetres and never share the canvas
with a pixel-frame layer; the sliders span only the visible frame.
"""

from __future__ import annotations

import numpy as np
import pytest

from ctbench.workbench.design import TrajectoryDesign
from ctbench_napari import PLUGIN
from ctbench_napari._qt.display import SINOGRAM_FRAME, VOLUME_FRAME, frame_of, scale_bar
from ctbench_napari._testing import wait_for

pytestmark = pytest.mark.gui
SMALL = dict(n_views=24, sid=150.0, sdd=300.0, detector_u=48, detector_v=32, pixel_u=1.5, pixel_v=1.5,
             volume_d=32, volume_h=32, volume_w=32, voxel_size=1.0)


def _settle(qtbot, ms: int = 50) -> None:
    qtbot.wait(ms)      # the rule runs just after napari's insertion


def assert_pixel_frame(viewer, layer) -> None:
    """Alone on the canvas, 2D, view/pixel axes, the slider over the views only, the camera on it."""
    visible = [x for x in viewer.layers if x.visible]
    assert visible == [layer], [x.name for x in visible]
    assert frame_of(layer) == SINOGRAM_FRAME and viewer.dims.ndisplay == 2
    assert viewer.dims.axis_labels[-layer.ndim] == "view"
    if layer.ndim == 3:
        n = layer.data.shape[0]
        lo, hi, _ = viewer.dims.range[viewer.dims.ndim - 3]
        assert (lo, hi) == pytest.approx((0.0, n - 1.0))              # views, never z in mm
        assert 0 <= viewer.dims.point[viewer.dims.ndim - 3] <= n - 1
    ext = np.asarray(layer.extent.world)
    centre = (ext[0, -2:] + ext[1, -2:]) / 2
    np.testing.assert_allclose(viewer.scene.camera.center[-2:], centre, atol=1.0)


def assert_volume_frame(viewer) -> None:
    """No visible layer of the pixel frame; the axes in mm."""
    visible = [x for x in viewer.layers if x.visible]
    assert visible and all(frame_of(x) == VOLUME_FRAME for x in visible), [x.name for x in visible]
    assert viewer.dims.axis_labels[-1] == "x"


def test_every_source_puts_its_layers_in_their_own_frame(make_napari_viewer, qtbot, tmp_path):
    viewer = make_napari_viewer()
    _, designer = viewer.window.add_plugin_dock_widget(PLUGIN, "Trajectory designer", tabify=True)
    designer.set_design(TrajectoryDesign(**SMALL))
    designer.update_preview()                                     # the designer's 3D volume frame
    assert viewer.dims.ndisplay == 3

    # Samples from File > Open Sample: the sinogram and the raw-count stack in their pixel frame.
    viewer.open_sample(PLUGIN, "phantom_scan")
    _settle(qtbot)
    assert_pixel_frame(viewer, viewer.layers["Shepp-Logan cone-beam scan"])
    viewer.open_sample(PLUGIN, "lab_scan")
    _settle(qtbot)
    raw = viewer.layers["lab scan (raw counts)"]
    assert_pixel_frame(viewer, raw)
    # A volume after them: back to mm, the pixel-frame layers hidden.
    viewer.open_sample(PLUGIN, "phantom")
    _settle(qtbot)
    assert_volume_frame(viewer)
    assert not raw.visible

    # Scan import: line integrals and the attached sinogram, each in the pixel frame.
    _, scan = viewer.window.add_plugin_dock_widget(PLUGIN, "Scan import", tabify=True)
    scan.projections.select(raw.name)
    scan.correct()
    wait_for(lambda: not scan.busy, timeout=120)
    _settle(qtbot)
    li = viewer.layers[f"{raw.name.split(' (')[0]} line integrals"]
    assert_pixel_frame(viewer, li)
    scan.attach_geometry()
    wait_for(lambda: not scan.busy, timeout=120)
    _settle(qtbot)
    assert scan.message.level != "error", scan.message.text()
    assert_pixel_frame(viewer, scan.last_sinogram)

    # Simulation (the Projection widget) -> a sinogram in the pixel frame.
    designer.update_preview()
    _, proj = viewer.window.add_plugin_dock_widget(PLUGIN, "Projection", tabify=True)
    proj.volume.select("Shepp-Logan phantom")
    proj.scan.select("trajectory")
    proj.run()
    wait_for(lambda: not proj.busy, timeout=120)
    _settle(qtbot)
    assert_pixel_frame(viewer, proj.last_layer)
    # The sinogram view: a detector row (the slider) against the view angle, same layer, rows transposed.
    sino = proj.last_layer
    proj.show_sinogram_view()
    n = viewer.dims.ndim
    assert viewer.dims.order[-3:] == (n - 2, n - 3, n - 1)          # slider: v; shown: view down, u across
    assert viewer.dims.displayed[-2:] == (n - 3, n - 1)
    assert viewer.dims.current_step[n - 2] == sino.data.shape[1] // 2   # the middle detector row
    assert not scale_bar(viewer).visible                             # pixel frames have no mm scale bar

    # Reconstruction -> a volume in mm, the sinogram hidden, slider in mm over the result's z.
    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction", tabify=True)
    recon.sinogram.select(proj.last_layer.name)
    recon.select_algorithm("fbp")
    recon.run()
    wait_for(lambda: not recon.running, timeout=120)
    _settle(qtbot)
    result = recon.results[-1]
    assert_volume_frame(viewer)
    assert viewer.dims.ndisplay == 2 and result.visible and not proj.last_layer.visible
    zlo, zhi, _ = viewer.dims.range[0]
    ext = np.asarray(result.extent.world)
    assert ext[0, 0] - 1 <= zlo and zhi <= ext[1, 0] + 1            # not "96 | 254": z in mm of the result
    assert scale_bar(viewer).visible                                 # volumes (world unit: mm) get a scale bar
    viewer.dims.ndisplay = 3
    assert not scale_bar(viewer).visible                             # none in 3D (lengths foreshorten)
    viewer.dims.ndisplay = 2
    assert scale_bar(viewer).visible                                 # back on the 2D slice
    assert viewer.dims.order == tuple(range(viewer.dims.ndim))        # the projection order is back

    # Files and job results (the one result loader): a dataset with a volume and a sinogram.
    from napari.layers import Layer

    from ctbench.workbench.dataset import save_dataset
    from ctbench_napari._io import result_layers
    from ctbench_napari._layers import display_to_sinogram

    from ctbench.workbench.design import ScanGeometry

    geo = ScanGeometry.from_dict(proj.last_layer.metadata["ctbench"]["geometry"])
    path = save_dataset(tmp_path / "r.zarr", volume=np.asarray(result.data), geometry=geo,
                        voxel_spacing=tuple(float(s) for s in result.scale),
                        sinogram=display_to_sinogram(np.asarray(proj.last_layer.data)), meta={"algorithm": "fbp"})
    layers = [viewer.add_layer(Layer.create(*d)) for d in result_layers(path)]
    _settle(qtbot)
    vol_layer, sino_layer = layers
    assert_pixel_frame(viewer, sino_layer)                          # the last one added wins the canvas
    assert vol_layer.metadata["ctbench"]["recon"] == {"algorithm": "fbp"}
    viewer.open(str(path), plugin="ctbench")                       # File > Open
    _settle(qtbot)
    assert_pixel_frame(viewer, viewer.layers[-1])
