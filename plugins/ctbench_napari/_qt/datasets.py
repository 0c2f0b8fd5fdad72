"""Make the ctbench reader win for ctbench datasets and volumes, however they are opened.

napari reads a ``.zarr`` folder with its built-in reader when a script calls
``viewer.open(path)`` (its default plugin is napari's own), and asks the
user to choose a reader on drag and drop.  For a ctbench dataset both lose
the geometry and the display conventions; for an OME-Zarr volume that
``ctbench recon`` wrote, napari's built-in reader loses the scale in mm.  Once any ctbench widget is docked
(or the workbench is launched), the viewer:

- opens dropped ctbench datasets with the ctbench reader directly (an
  application event filter that acts only on drops of ctbench datasets on a
  napari canvas; other drops go to napari as usual);
- replaces layers that napari's built-in reader made from a ctbench dataset
  by the ctbench reader's layers (scripted ``viewer.open``).

Nothing is written to napari's settings; other ``.zarr`` folders are untouched.
"""

from __future__ import annotations

import logging
import weakref
from pathlib import Path

from qtpy.QtCore import QEvent, QObject, QTimer
from qtpy.QtWidgets import QApplication

from ctbench.io.ome_zarr import is_ctbench_volume
from ctbench.workbench.dataset import is_dataset

log = logging.getLogger("ctbench_napari")


def _dataset_path(path) -> str | None:
    if not path:
        return None
    p = str(path).rstrip("/\\")
    return p if p.endswith(".zarr") and Path(p).is_dir() and (is_dataset(p) or is_ctbench_volume(p)) else None


class _DropFilter(QObject):
    """On each viewer's canvas: a drop of ctbench datasets opens them with the ctbench reader."""

    def eventFilter(self, obj, event):  # noqa: N802 - Qt name
        if event.type() != QEvent.Drop:
            return False
        mime = event.mimeData()
        if mime is None or not mime.hasUrls():
            return False
        paths = [u.toLocalFile() for u in mime.urls() if u.isLocalFile()]
        if not paths or not all(_dataset_path(p) for p in paths):
            return False
        viewer = _viewer_of(obj)
        if viewer is None:
            return False
        for p in paths:
            viewer.open(p, plugin="ctbench")
        event.acceptProposedAction()
        return True


def _viewer_of(widget):
    """The napari viewer model of the QtViewer that contains ``widget`` (None outside napari canvases)."""
    w = widget
    while w is not None:
        if type(w).__name__ == "QtViewer" and hasattr(w, "viewer"):
            return w.viewer
        w = w.parent() if hasattr(w, "parent") else None
    return None


_DROP_FILTER: _DropFilter | None = None


def _drop_targets(viewer) -> list:
    """The widgets a drop on ``viewer``'s canvas is delivered to: napari's QtViewer (it accepts drops) and
    the canvas widget inside it."""
    real = getattr(viewer, "__wrapped__", viewer)      # through the proxy, a private attribute warns
    qt_viewer = getattr(getattr(real, "window", None), "_qt_viewer", None)
    if qt_viewer is None:
        return []
    targets = [qt_viewer]
    try:
        targets.append(qt_viewer.canvas.native)
    except AttributeError:
        pass
    return targets


def drop_filter() -> _DropFilter | None:
    """The application's ctbench drop filter (installed with the first ctbench widget)."""
    return _DROP_FILTER


class _Handler:
    def __init__(self, viewer):
        global _DROP_FILTER
        self.viewer = viewer
        self._pending: set[str] = set()
        viewer.layers.events.inserted.connect(self._inserted)
        app = QApplication.instance()
        if _DROP_FILTER is None and app is not None:
            _DROP_FILTER = _DropFilter(app)
        # On the viewer's drop targets only, not application-wide: an application filter in Python takes
        # every Qt event of every widget through Python and the GIL (thousands per action, each one waiting
        # for a worker thread that holds the GIL), stalling the event loop while a solve runs.
        if _DROP_FILTER is not None:
            for target in _drop_targets(viewer):
                target.installEventFilter(_DROP_FILTER)

    def _inserted(self, event) -> None:
        layer = event.value
        src = getattr(layer, "source", None)
        if src is None or src.reader_plugin in (None, "ctbench"):
            return
        path = _dataset_path(src.path)
        if path is None or path in self._pending:
            return
        self._pending.add(path)
        QTimer.singleShot(0, lambda: self._adopt(path))    # not inside napari's own insertion

    def _adopt(self, path: str) -> None:
        self._pending.discard(path)
        stale = [x for x in self.viewer.layers
                 if x.source.path and str(x.source.path).rstrip("/\\") == path and x.source.reader_plugin != "ctbench"]
        if not stale:
            return
        for layer in stale:
            self.viewer.layers.remove(layer)
        self.viewer.open(path, plugin="ctbench")
        log.info("opened %s with the ctbench reader instead of %s", path, stale[0].source.reader_plugin)


def install(viewer) -> None:
    """Install the dataset handling on ``viewer`` (once per viewer)."""
    real = getattr(viewer, "__wrapped__", viewer)      # plugin widgets get a proxy of the viewer
    key = id(real)
    ref, _ = _HANDLERS.get(key, (None, None))
    if ref is not None and ref() is real:
        return
    # the callback holds the dict itself: at interpreter exit the module global may already be None
    _HANDLERS[key] = (weakref.ref(real, lambda _r, k=key, h=_HANDLERS: h.pop(k, None)), _Handler(viewer))


_HANDLERS: dict = {}
