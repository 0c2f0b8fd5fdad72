"""One display rule for every source of a layer (samples, scan import, simulation, reconstruction, jobs, files).

Whatever adds a layer (File > Open Sample, a reader, a widget, a script), once
any ctbench widget is docked the viewer applies the frames of ``display.py``
when the layer arrives:

- projection stacks, line integrals and sinograms live in their own 2D pixel
  frame: shown alone, as a 2D image with the view index on the slider, the
  camera fitted, a percentile contrast window when the layer has none of its own;
- volumes (phantoms, results, files) live in millimetres: a new volume never
  shares the canvas with a pixel-frame layer; it replaces it on screen.

Sliders and camera follow the visible frame (``display.apply_frame_range``).
Layers of the same frame as the visible ones are left as their widget placed
them (the designer's 3D preview, a comparison grid).
"""

from __future__ import annotations

import weakref

from qtpy.QtCore import QTimer

from .._layers import kind_of
from .common import is_deleted, qt_window
from .per_viewer import viewer_state
from .units import give_world_units, install_slider_readouts
from .display import (PIXEL_KINDS, VOLUME_AXES, VOLUME_FRAME, frame_of, label_axes, set_contrast, set_visible,
                      show_frame, show_scale_bar)

_INSTALLED: dict = {}


def install(viewer) -> None:
    """Apply the rule to every layer later added to ``viewer`` (once per viewer)."""
    state, new = viewer_state(_INSTALLED, viewer)
    if not new:
        return
    vref = state["viewer"]
    real = vref()
    pending: list = []
    # A timer owned by the viewer's window: it dies with the window, so a flush never runs on a closed
    # viewer (its canvas is gone; drawing on it would crash).
    window = qt_window(real)
    timer = QTimer(window)
    wref = weakref.ref(window) if window is not None else None    # never keep the window alive
    del window
    timer.setSingleShot(True)
    timer.setInterval(0)

    def inserted(event) -> None:
        give_world_units(event.value)       # the scale bar reads mm (units.py)
        pending.append(event.value)
        try:
            # After napari's own insertion (and after the widget that added it has placed it); the layers
            # of one sample or file arrive together and are judged together: the last one decides.
            timer.start()
        except RuntimeError:     # the window (and its timer) is gone
            pending.clear()

    def flush() -> None:
        layers = list(pending)
        pending.clear()
        viewer = vref()
        window = wref() if wref is not None else None
        if viewer is None or (wref is not None and (window is None or is_deleted(window))):
            return
        alive = [x for x in layers if x in viewer.layers and x.__class__.__name__ == "Image" and x.visible]
        if alive:
            apply(viewer, alive[-1])

    timer.timeout.connect(flush)
    real.layers.events.inserted.connect(inserted)
    # Every widget installs the rule; the same moment warms up what the workbench will draw (warm_up.py)
    # and makes the layer list's thumbnails safe to paint (thumbnail_fix.py).
    from . import thumbnail_fix
    from .warm_up import install as warm_up

    thumbnail_fix.install()
    install_slider_readouts(real)
    warm_up(real)


def apply(viewer, layer) -> None:
    """Put ``layer`` in its frame now (see the module docstring)."""
    frame = frame_of(layer)
    if kind_of(layer) in PIXEL_KINDS:
        if not layer.visible:
            return
        if _default_contrast(layer):
            set_contrast(layer)
        others = [x for x in viewer.layers if x is not layer and x.visible]
        # Already alone in 2D (its widget placed it): leave the user's slider and camera alone.
        if others or viewer.dims.ndisplay != 2:
            for x in others:       # stacks of other scans do not line up with this one: one at a time
                if frame_of(x) == frame:
                    set_visible(x, False)
            show_frame(viewer, [layer], ndisplay=2)
        return
    if frame == VOLUME_FRAME and layer.visible:
        mixed = [x for x in viewer.layers if x.visible and frame_of(x) != VOLUME_FRAME]
        shown = [x for x in viewer.layers if x.visible and frame_of(x) == VOLUME_FRAME]
        if mixed:
            show_frame(viewer, shown, ndisplay=2)
        else:       # the axes named z, y, x (napari's "-3", "-2", "-1" otherwise) with the slider in mm
            label_axes(viewer, VOLUME_AXES[-max(x.ndim for x in shown):])
            show_scale_bar(viewer)


def reveal(viewer, layer) -> None:
    """Show a layer that was added hidden (so that its add and its first draw take two event-loop turns)
    and put it in its frame as if it had arrived visible: the rule skips hidden layers."""
    set_visible(layer, True)
    apply(viewer, layer)


def _default_contrast(layer) -> bool:
    """Whether the layer is an in-memory array that still has napari's full-range default window (nobody
    chose one); lazy stacks (a scan's raw counts) keep theirs: their percentiles would read every file."""
    import numpy as np

    if not isinstance(layer.data, np.ndarray) or layer.data.size > 1 << 26:
        return False
    try:
        lo, hi = layer.contrast_limits
        rlo, rhi = layer.contrast_limits_range
    except (AttributeError, TypeError, ValueError):
        return False
    return (lo, hi) == (rlo, rhi)
