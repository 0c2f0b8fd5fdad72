"""File > Open Sample in the workbench: samples the warm-up is still computing, and samples of several layers.

napari calls a sample function on the GUI thread and adds what it returns at
once; computing the sample there (a projection, a file read) would freeze the
window.  Instead the sample function returns small placeholder layers (the
sample's names and kinds, no geometry, marked ``loading``, so no widget takes
them for data), and this module waits for the warm-up thread, polling from the
GUI thread's timer, then fills each placeholder in place: data, placement,
metadata and colour window, and puts the last one in its frame.  The wait
happens in the warm-up thread; the GUI thread only copies arrays.  In the workbench (``ctbench gui``)
a sample adds its first layer at once and the others one per event-loop turn, each hidden and shown
(with the display rule) in the turn after its add.
"""

from __future__ import annotations

import numpy as np

from .._layers import KEY
from .common import add_or_update, is_deleted, log, qt_window

POLL_MS = 50


def placeholders(layers: list[tuple[str, str, int]]) -> list:
    """LayerData of empty placeholders: (name, ctbench kind, number of dimensions) each."""
    return [(np.zeros((1,) * ndim, np.float32),
             {"name": name, "metadata": {KEY: {"kind": kind, "loading": True}}, "colormap": "gray"}, "image")
            for name, kind, ndim in layers]


def fill_when_ready(viewer, ready, make) -> None:
    """Once ``ready()`` is true, put ``make()``'s layers into the viewer's placeholders of the same names."""
    from qtpy.QtCore import QTimer

    import weakref

    window = qt_window(viewer)
    if window is None:
        raise RuntimeError("no napari window to add the sample to")
    timer = QTimer(window)       # dies with the window: never fills a closed viewer
    timer.setInterval(POLL_MS)
    vref, tref = weakref.ref(viewer), weakref.ref(timer)     # the waiting timer keeps no viewer alive

    def check():
        viewer, timer = vref(), tref()
        if viewer is None or timer is None or is_deleted(timer):
            return
        if not ready():
            return
        timer.stop()
        timer.deleteLater()
        try:
            _fill(viewer, make())
        except Exception as e:  # noqa: BLE001 - a failing sample says so in the placeholder's name
            log.debug("deferred sample failed", exc_info=True)
            for x in viewer.layers:
                if (x.metadata.get(KEY) or {}).get("loading"):
                    x.name = f"{x.name} (failed: {e})"
    timer.timeout.connect(check)
    timer.start()


def _fill(viewer, layer_data: list) -> None:
    from .display import set_contrast
    from .display_rule import apply

    filled = []
    for data, kwargs, ltype in layer_data:
        name = kwargs["name"]
        if name not in viewer.layers or not (viewer.layers[name].metadata.get(KEY) or {}).get("loading"):
            continue             # removed (or replaced) by the user meanwhile
        layer = add_or_update(viewer, (data, kwargs, ltype), keep_display=False)
        if "contrast_limits" not in kwargs and isinstance(layer.data, np.ndarray):
            set_contrast(layer)
        filled.append(layer)
    if filled and filled[-1].visible:
        apply(viewer, filled[-1])    # the display rule, now with the real extent and data


def add_in_later_turns(viewer, layer_data: list, first: str | None = None) -> None:
    """Add ``layer_data`` one layer per event-loop turn (the workbench's samples with several layers: each
    new layer costs napari a visual, its controls and a first draw; two in one turn stall twice as long).

    Each layer is added hidden and shown in the next turn, and so is ``first`` (the name of the layer napari
    adds now, hidden by the caller): a layer's add and its first draw (vispy builds the visual's shaders,
    the slice is uploaded) were one turn, 0.3-0.45 s at load 4 on the 2-core machine."""
    from qtpy.QtCore import QObject

    from .common import Steps

    window = viewer.window._qt_window
    steps = Steps(QObject(window))        # a child of the window: dies with it, holds no viewer alive
    window._ctbench_sample_steps = steps     # kept until the window goes

    def add(data, kwargs, ltype):
        getattr(viewer, f"add_{ltype}")(data, **{**kwargs, "visible": False})

    def reveal(name):
        from . import display_rule

        layer = viewer.layers[name] if name in viewer.layers else None
        if layer is not None and not layer.visible:
            display_rule.reveal(viewer, layer)
    later = [lambda: reveal(first)] if first is not None else []
    for ld in layer_data:
        later += [lambda ld=ld: add(*ld), lambda name=ld[1]["name"]: reveal(name)]
    # Steps runs its first step at once: a no-op, so that the first layer is napari's, in this turn.  A
    # second no-op: the chain's timer is armed here, before napari adds the first layer, so it is already
    # due when that add ends and fires in the same timer pass; re-armed then, the next step waits a turn.
    steps.run([lambda: None, lambda: None, *later], on_error=lambda e: log.debug("sample layer failed: %s", e))
