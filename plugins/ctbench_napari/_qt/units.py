"""Units that mean what they say: the scale bar in millimetres, and sliders that show where they are in mm.

- napari's sliders count steps (the index of a slice).  A volume's axes are named ``z``, ``y``, ``x`` and each
  slider of the volume frame gets a read-out beside it with its world position, ``z = +3.50 mm``; pixel-frame
  axes (``view``, ``v (px)``, ``u (px)``) are indices and say so in their names.
- napari's scale bar takes its unit from the layers' units (``pixel`` unless a layer says otherwise).  Every
  layer that arrives in a workbench viewer with napari's default units is given millimetres: the world frame
  of ctbench is in mm.  Pixel-frame layers get them too, so that the layer list's units agree (mixed units
  would leave the bar without any); the bar is shown on volume slices only (``display._scale_bar``), where
  the millimetre is true.
"""

from __future__ import annotations

import logging
import weakref

from qtpy.QtCore import QTimer
from qtpy.QtWidgets import QLabel

log = logging.getLogger("ctbench_napari")

WORLD_UNIT = "mm"
VOLUME_AXIS_NAMES = ("z", "y", "x")


def give_world_units(layer) -> bool:
    """Give ``layer`` millimetres as its units when it still has napari's default (pixels); True if changed."""
    try:
        units = tuple(str(u) for u in layer.units)
    except (AttributeError, TypeError):
        return False
    if not units or any(u != "pixel" for u in units):
        return False          # a layer whose units someone chose keeps them
    try:
        layer.units = (WORLD_UNIT,) * len(units)
        return True
    except Exception:  # noqa: BLE001 - units are a display nicety; never fail the layer's arrival
        log.debug("could not set units on %s", getattr(layer, "name", "?"), exc_info=True)
        return False


def position_text(label: str, value: float) -> str:
    """The read-out of a slider at world position ``value``: ``z = +3.50 mm`` for a volume axis, else empty."""
    if label not in VOLUME_AXIS_NAMES:
        return ""
    return f"  {label} = {value:+.2f} {WORLD_UNIT}"


_INSTALLED: "weakref.WeakSet" = weakref.WeakSet()


def install_slider_readouts(viewer) -> None:
    """Add a world-position read-out beside every slider of ``viewer`` (kept up to date; once per viewer)."""
    real = getattr(viewer, "__wrapped__", viewer)
    if real in _INSTALLED:
        return
    qt_viewer = getattr(getattr(real, "window", None), "_qt_viewer", None)
    if qt_viewer is None:
        return
    _INSTALLED.add(real)
    ref = weakref.ref(real)
    qref = weakref.ref(qt_viewer)

    def update(*_):
        v, q = ref(), qref()
        if v is None or q is None:
            return
        try:
            refresh_readouts(v, q)
        except RuntimeError:        # the window is gone
            pass

    def later(*_):                  # after napari has made or changed its sliders for this change
        try:
            QTimer.singleShot(0, update)
        except RuntimeError:
            pass

    dims = real.dims.events
    dims.current_step.connect(update)
    for e in (dims.ndim, dims.axis_labels, dims.range, dims.ndisplay, dims.order):
        e.connect(later)
    later()


def refresh_readouts(viewer, qt_viewer) -> None:
    labels = viewer.dims.axis_labels
    point = viewer.dims.point
    for slider in getattr(qt_viewer.dims, "slider_widgets", []):
        axis = slider.axis
        readout = getattr(slider, "_ctbench_readout", None)
        if readout is None:
            readout = QLabel(slider)
            readout.setObjectName("ctbench_position")
            readout.setToolTip("where this slice is in the world frame (millimetres, centred on the origin)")
            slider.layout().addWidget(readout)
            slider._ctbench_readout = readout
        text = position_text(labels[axis], float(point[axis])) if axis < len(labels) else ""
        if readout.text() != text:
            readout.setText(text)
        readout.setVisible(bool(text))
