"""The layer list paints thumbnails from pixels it owns (napari's model hands out a QImage over freed bytes)."""

import numpy as np
import pytest

from ctbench_napari import PLUGIN

pytestmark = pytest.mark.gui


def _pixels(img) -> np.ndarray:
    return np.frombuffer(img.constBits().asstring(img.sizeInBytes()), np.uint8).reshape(img.height(), img.width(), 4)


def test_layer_list_thumbnail_survives_the_memory_reuse_that_crashed_the_paint(make_napari_viewer):
    from napari._qt.containers.qt_layer_model import ThumbnailRole

    from ctbench_napari._qt import thumbnail_fix

    viewer = make_napari_viewer()
    viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")     # every ctbench widget installs the fix
    assert getattr(type(viewer.window._qt_viewer.layers.model().sourceModel()).data, thumbnail_fix.MARK, False)
    rng = np.random.default_rng(3)
    layer = viewer.add_image(rng.random((64, 64), dtype=np.float32), name="noise")
    view = viewer.window._qt_viewer.layers
    index = view.model().index(0, 0)            # through the view's proxy model, as the delegate asks
    img = index.data(ThumbnailRole)
    # napari's data() built its QImage over ``thumbnail.tobytes()``, freed when data() returned: blocks of that
    # size handed out again overwrite such pixels (zeros here); owned pixels stay the thumbnail's.
    reuse = [bytes(img.sizeInBytes()) for _ in range(5000)]
    assert len(reuse) == 5000
    np.testing.assert_array_equal(_pixels(img), layer.thumbnail)
    assert _pixels(img).any()                   # a real thumbnail, not an empty image that would pass trivially
    # The other roles are napari's own answers.
    assert index.data() == "noise"
