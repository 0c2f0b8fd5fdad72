"""The screenshot helper reads every QImage format a grab gives, without Qt's threaded conversion
(which deadlocked a GUI test: Qt waited for its thread pool while PyQt held the GIL the pool's
Python workers needed)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gui


@pytest.mark.parametrize("name", ["Format_RGB32", "Format_ARGB32", "Format_ARGB32_Premultiplied",
                                  "Format_RGBA8888", "Format_RGB888"])
def test_qimage_to_array_gives_rgba_in_every_format(qapp, name):
    from qtpy.QtGui import QColor, QImage

    from ctbench_napari._testing import qimage_to_array

    img = QImage(5, 3, getattr(QImage, name))
    img.fill(QColor(10, 20, 30, 255))
    img.setPixelColor(1, 2, QColor(200, 100, 50, 255))
    a = qimage_to_array(img)
    assert a.shape == (3, 5, 4) and a.dtype == np.uint8
    assert tuple(a[0, 0]) == (10, 20, 30, 255)
    assert tuple(a[2, 1]) == (200, 100, 50, 255)
