"""Layer-list thumbnails that own their pixels (a napari use-after-free that crashed bench_gui's long SIRT run).

napari 0.9's ``QtLayerListModel.data`` answers the thumbnail role with ``QImage(thumbnail.tobytes(), ...)``:
a QImage over a temporary ``bytes`` object.  Qt copies that QImage into the QVariant the layer-list delegate
receives without copying its pixels, and the ``bytes`` object is freed as soon as ``data`` returns, so the
delegate draws (``QPixmap.fromImage``, ``_layer_delegate.py`` ``_paint_thumbnail``) from freed memory: wrong
pixels once that memory is reused (a solver's worker allocates all the time), a crash once it is returned to
the system.  ctbench updates a live layer's data, hence its thumbnail, many times a run.  (The segfaults seen
in that paint during bench_gui runs came with its stack sampler: see bench_gui.StackSampler.)

``install`` wraps the model's ``data`` once: the thumbnail comes back as an owning deep copy, made while
napari's QImage still holds its bytes.  Other roles, and napari versions without that model, are untouched.
"""

from __future__ import annotations

MARK = "_ctbench_owning_thumbnail"


def install() -> bool:
    """Wrap napari's layer-list model (once per process); True if the fix is in place."""
    try:
        from napari._qt.containers import qt_layer_model as m
        from qtpy.QtCore import Qt
        from qtpy.QtGui import QImage
    except ImportError:          # another napari layout: nothing to fix here
        return False
    cls, role = getattr(m, "QtLayerListModel", None), getattr(m, "ThumbnailRole", None)
    if cls is None or role is None:
        return False
    if getattr(cls.data, MARK, False):
        return True
    napari_data = cls.data

    def data(self, index, role_=Qt.ItemDataRole.DisplayRole):
        out = napari_data(self, index, role_)
        if role_ == role and isinstance(out, QImage):
            return out.copy()    # own pixels: ``out``'s bytes die when napari's QImage does
        return out

    setattr(data, MARK, True)
    data.__doc__ = napari_data.__doc__
    cls.data = data
    return True
