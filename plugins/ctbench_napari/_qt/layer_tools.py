"""Layers seen from the widgets: napari's proxies unwrapped, pickers that follow the layer list, in-place
updates, placement that assigns only changes, camera fits."""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
from qtpy.QtCore import Signal
from qtpy.QtWidgets import QComboBox

from .._layers import UNITS

log = logging.getLogger("ctbench_napari")


def unwrap(obj):
    """The object behind napari's public-only proxy (plugin widgets see proxies, new ones on every access)."""
    return getattr(obj, "__wrapped__", obj)


def qt_window(viewer):
    """The Qt main window of ``viewer`` (a proxy is unwrapped), or None (no window: a headless viewer)."""
    return getattr(getattr(unwrap(viewer), "window", None), "_qt_window", None)


def same_layer(a, b) -> bool:
    """Identity of layers, seen through napari's proxies."""
    return a is not None and b is not None and unwrap(a) is unwrap(b)


class LayerPicker(QComboBox):
    """A combo box of the viewer's layers that pass ``accept``, kept in sync with the layer list.

    It follows the user: a newly added layer that passes ``accept`` becomes
    the choice (the newest matching layer is the one just made or opened),
    the choice survives renames (it is tracked by identity, not by name),
    and ``prefer`` sorts the first choice on opening (e.g. trajectory
    previews before sinograms).
    """

    layer_changed = Signal(object)

    def __init__(self, viewer, accept: Callable[[Any], bool], prefer: Callable[[Any], bool] | None = None,
                 parent=None):
        super().__init__(parent)
        self.viewer = viewer
        self._accept = accept
        self._prefer = prefer
        self._layers: list = []
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(16)
        ev = viewer.layers.events
        for e in (ev.removed, ev.moved, ev.reordered):
            e.connect(self.refresh)
        ev.inserted.connect(self._inserted)
        for layer in viewer.layers:
            self._watch_layer(layer)
        self.currentIndexChanged.connect(lambda _i: self.layer_changed.emit(self.layer()))
        self.refresh()
        newest = self._newest()
        if newest is not None:
            self._set_layer(newest)

    def _inserted(self, event) -> None:
        layer = event.value
        self._watch_layer(layer)
        self.refresh()
        if self._follows(layer):
            self._set_layer(layer)

    def _follows(self, layer) -> bool:
        """Whether a new layer becomes the choice: it must match, and be preferred if anything is preferred."""
        if not self._accept(layer):
            return False
        return self._prefer is None or self._prefer(layer) or self.layer() is None

    def _watch_layer(self, event_or_layer) -> None:
        layer = getattr(event_or_layer, "value", event_or_layer)
        layer.events.name.connect(self.refresh)
        if hasattr(layer.events, "metadata"):
            layer.events.metadata.connect(self._metadata_changed)

    def _metadata_changed(self, event) -> None:
        layer = getattr(event, "source", None)
        known = any(same_layer(x, layer) for x in self._layers)
        self.refresh()
        if layer is not None and not known and self._follows(layer):
            self._set_layer(layer)      # a layer that just became usable (e.g. a finished result)

    def _newest(self):
        layers = [x for x in self.viewer.layers if self._accept(x)]
        if self._prefer is not None and any(self._prefer(x) for x in layers):
            layers = [x for x in layers if self._prefer(x)]
        return layers[-1] if layers else None

    def candidates(self) -> list:
        layers = [x for x in self.viewer.layers if self._accept(x)]
        if self._prefer is not None:
            layers.sort(key=lambda x: not self._prefer(x))
        return layers

    def refresh(self, *_args) -> None:
        current = self.layer()
        layers = self.candidates()
        names = [x.name for x in layers]
        same = len(layers) == len(self._layers) and all(same_layer(a, b) for a, b in zip(layers, self._layers))
        if same and names == [self.itemText(i) for i in range(self.count())]:
            return
        self.blockSignals(True)
        self.clear()
        self.addItems(names)
        self._layers = layers
        keep = next((i for i, x in enumerate(layers) if same_layer(x, current)), -1)
        if keep >= 0:
            self.setCurrentIndex(keep)
        self.blockSignals(False)
        if keep < 0:
            self.layer_changed.emit(self.layer())

    def layer(self):
        """The chosen layer, or None."""
        i = self.currentIndex()
        if 0 <= i < len(self._layers) and self._layers[i] in self.viewer.layers:
            return self._layers[i]
        return None

    def _set_layer(self, layer) -> None:
        i = next((k for k, x in enumerate(self._layers) if same_layer(x, layer)), -1)
        if i >= 0 and i != self.currentIndex():
            self.setCurrentIndex(i)

    def select(self, name: str) -> None:
        self.refresh()
        i = self.findText(name)
        if i < 0:
            raise ValueError(f"no layer named {name!r} in this list")
        self.setCurrentIndex(i)

    def names(self) -> list[str]:
        return [self.itemText(i) for i in range(self.count())]


def add_or_update(viewer, layer_data, *, keep_display: bool = True):
    """Put a LayerDataTuple into the viewer: update the layer of that name in place, or add it.

    In-place updates keep what the user changed (visibility, opacity,
    contrast) when ``keep_display``; a layer of another type is replaced.
    """
    data, kwargs, ltype = layer_data
    name = kwargs["name"]
    if name in viewer.layers:
        layer = viewer.layers[name]
        if layer.__class__.__name__.lower() == ltype:
            try:
                _update_layer(layer, data, kwargs, keep_display)
                return layer
            except (ValueError, TypeError):
                log.debug("in-place update of %s failed; replacing the layer", name, exc_info=True)
        viewer.layers.remove(layer)
    # Millimetres from the start, as every ctbench layer (units.py): a layer added in napari's default pixels
    # mixes units until the display rule's hook changes them, and a draw in between puts napari's
    # "Inconsistent units across layers" toast over the canvas.
    return getattr(viewer, f"add_{ltype}")(data, **{"units": UNITS, **kwargs})


def set_placement(layer, scale=None, translate=None) -> None:
    """Set a layer's ``scale`` / ``translate`` only where they change: napari recomputes the viewer's
    dimensions (every layer's extent, the sliders, the camera) on every assignment, equal or not."""
    for k, v in (("scale", scale), ("translate", translate)):
        if v is None:
            continue
        old = np.asarray(getattr(layer, k), dtype=float)
        new = np.asarray(v, dtype=float)
        if old.shape != new.shape or not np.array_equal(old, new):
            setattr(layer, k, v)


def _update_layer(layer, data, kwargs, keep_display: bool) -> None:
    layer.data = data
    set_placement(layer, kwargs.get("scale"), kwargs.get("translate"))
    layer.metadata = kwargs.get("metadata", layer.metadata)
    for k in ("edge_color", "edge_width"):
        if k in kwargs:
            setattr(layer, k, kwargs[k])
    if not keep_display:
        for k in ("contrast_limits", "colormap", "opacity"):
            if k in kwargs:
                setattr(layer, k, kwargs[k])
    elif "contrast_limits" in kwargs and layer.__class__.__name__ == "Image":
        layer.contrast_limits = kwargs["contrast_limits"]


def fit_view(viewer, layers) -> None:
    """reset_view, then zoom so that ``layers`` fill the view (reset_view fits every layer, hidden ones too)."""
    viewer.reset_view()
    shown = list(viewer.dims.displayed)
    n = viewer.dims.ndim

    def span(group):
        lo = np.full(len(shown), np.inf)
        hi = np.full(len(shown), -np.inf)
        for layer in group:
            ext = np.asarray(layer.extent.world)
            for i, axis in enumerate(shown):
                k = axis - (n - ext.shape[1])    # layers fill the last dims of the viewer
                if k >= 0:
                    lo[i], hi[i] = min(lo[i], ext[0, k]), max(hi[i], ext[1, k])
        return lo, hi

    lo_all, hi_all = span(list(viewer.layers))
    lo, hi = span(layers)
    if not (np.isfinite(lo).all() and np.isfinite(lo_all).all()):
        return
    ratio = float(np.max(hi_all - lo_all) / max(float(np.max(hi - lo)), 1e-9))
    if ratio <= 1.0:
        return
    camera = viewer.scene.camera
    camera.zoom = camera.zoom * ratio * 0.9
    center = list(camera.center)
    mid = (lo + hi) / 2
    m = min(len(center), len(mid))
    center[len(center) - m:] = [float(x) for x in mid[len(mid) - m:]]
    camera.center = tuple(center)
