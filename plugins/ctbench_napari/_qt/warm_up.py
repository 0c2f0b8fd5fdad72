"""Start-up warm-up: one-time costs of what the workbench draws, paid when it opens instead of in an action.

Measured with ``bench_gui.py --stalls --trace-stacks``, two of them landed in the
middle of user actions:

- the scale bar's label: napari draws text from glyphs it renders on first use
  (a Qt font at 256 pt, a signed-distance field in numpy, tens of ms a glyph)
  and the bar first appears on the first 2D slice of a volume, the quick
  preview's or a result's, so that click paid for every digit it showed;
- the difference images' PiYG colour map: napari builds it from vispy's and
  matplotlib's tables on first use (every vispy colour map, cubehelix included);
- the first layer of the process: napari gives every layer's transform units
  from pint's application registry, which parses pint's unit definitions on
  first use (0.4-0.5 s); the first Vectors layer (the designer's preview)
  also imports pandas for its features table (0.3 s). Both landed in the
  first action that added a layer (a sample, the designer's first preview).

Glyphs go into napari's one font atlas shared by every canvas, so they are
loaded once per process: one glyph per event-loop turn on the GUI thread (the
atlas is an OpenGL texture fed from that thread).  Colour maps are registered
in napari's table, which has its own lock, the unit registry is built and
pandas imported, in a background thread (none of them touches Qt).

The workbench's process (``ctbench gui``) also freezes Python's heap once the
warm-up is done (``freeze_heap_when_warm``): Python's full garbage collection
walks every tracked object, and with torch, napari and vispy loaded that is
about 450 000 objects and 0.19-0.23 s with the GIL held, at moments nobody
chooses (every few layers made); the traced stall runs caught it inside the
start-up and a SIRT run.  Objects alive when the workbench docks its widgets
and again at the end of the warm-up (modules, classes, the viewer) are moved
out of the collector's reach (``gc.freeze``); whatever is made later is
collected as before (a full collection then took 0.03-0.06 s at load 4).  Only the launcher asks for
it: a plugin docked into someone else's napari leaves the host's collector
alone.
"""

from __future__ import annotations

import gc
import threading

from qtpy.QtCore import Qt, QTimer
from qtpy.QtWidgets import QWidget

from .common import Steps, is_deleted, log, qt_window, unwrap

# What napari's scale bar writes: a length ("0.5", "20", "1e+03") and its unit ("pixel", "mm", "µm", ...).
SCALE_BAR_GLYPHS = "ÅÉÑŐjgpqy0123456789.e+- ixlmµnk"   # the first nine: vispy measures every line by them
COLORMAPS = ("PiYG",)        # the difference images' (compare.DIFFERENCE_COLORMAP)

_BACKGROUND_THREAD = None


def install(viewer) -> None:
    """Warm up what ``viewer`` will draw (once per viewer; glyphs already loaded are skipped)."""
    real = unwrap(viewer)
    window = qt_window(real)
    if window is None or getattr(window, "_ctbench_warm_up", None) is not None:
        return
    from qtpy.QtCore import QObject

    # The steps' owner is a child of the window: it dies with the window (no step runs on a closed viewer),
    # and a step still queued when the viewer closes holds that child, not the window.
    steps = Steps(QObject(window))
    window._ctbench_warm_up = steps
    _start_background()
    font = _scale_bar_font(real)
    glyphs = [_glyph_step(font, c) for c in SCALE_BAR_GLYPHS] if font is not None else []
    steps.run([*glyphs, _controls_width_step(real, steps)],
              on_error=lambda e: log.debug("GUI warm-up step failed: %s", e))


FREEZE_POLL_MS = 200
IDLE_GC_MS = 200           # how often the workbench looks for an idle moment to run a full collection
IDLE_TICKS = 3             # ... which is when this many ticks in a row came on time (0.6 s of a calm loop)
# Full collections Python would start on its own: after this many collections of the middle generation
# (Python's default is 10; the idle collector runs one once 10 have passed, so the total stays the same).
FULL_GC_THRESHOLD = 1000
IDLE_GC_GAP_S = 5.0        # at most one idle collection this often (a calm moment can be a pause mid-action)


def freeze_heap_when_warm(viewer, extra_ready=lambda: True) -> None:
    """Freeze the objects Python's collector tracks (``gc.freeze``) now, and again once the warm-up of
    ``viewer`` is done (and ``extra_ready()``, e.g. the launcher's sample thread); undone (``gc.unfreeze``)
    when the window closes.  For a process that is the workbench (see the module docstring).

    Now as well: the warm-up itself makes enough objects (glyphs, pint's registry) to set off a full
    collection, which walked the whole heap inside the start-up (0.25 s); after a first freeze it walks
    only what was made since."""
    real = unwrap(viewer)
    window = qt_window(real)
    if window is None or getattr(window, "_ctbench_heap_freeze", None) is not None:
        return
    window._ctbench_heap_freeze = _HeapFreeze(window, lambda: not pending(real) and background_ready(0)
                                              and extra_ready())


def heap_frozen(viewer) -> bool:
    """Whether ``freeze_heap_when_warm`` has frozen the heap for ``viewer`` after its warm-up (and it holds)."""
    guard = getattr(qt_window(viewer), "_ctbench_heap_freeze", None)
    return bool(guard is not None and not is_deleted(guard) and guard.frozen and not guard.off)


class _HeapFreeze(QWidget):
    """A 0x0 child of the workbench window that keeps the heap frozen while the window is on screen.

    Its hide event comes with the window's close, at once (the window itself is deleted later, after a
    caller may already collect it: a test fixture's leak check, a script opening another viewer), and
    unfreezes; shown again (a minimised window restored) it freezes again."""

    def __init__(self, window, ready):
        super().__init__(window)
        self.setFixedSize(0, 0)
        self.setAttribute(Qt.WA_TransparentForMouseEvents)
        self.ready = ready
        self.frozen = False      # the final freeze, after the warm-up, is done
        self.off = False         # hidden since: unfrozen
        self.timer = QTimer(self)
        self.timer.setInterval(FREEZE_POLL_MS)
        self.timer.timeout.connect(self._check)
        self.thresholds = gc.get_threshold()      # Python's, restored when the window goes
        self.idle_timer = None
        self.idle_collections = 0                 # full collections run by the idle timer
        saved = self.thresholds
        self.destroyed.connect(lambda *_: (gc.unfreeze(), gc.set_threshold(*saved)))
        gc.freeze()              # O(1): the tracked objects join the permanent generation
        self.show()
        self.timer.start()

    def _check(self) -> None:
        if not self.ready():
            return
        self.timer.stop()
        if not self.off:
            gc.freeze()
            self._collect_when_idle(True)
        self.frozen = True
        log.debug("heap frozen after the warm-up: %d objects", gc.get_freeze_count())

    # Full collections at idle moments.  After the freeze a full collection walks only what was made since
    # (20-70 ms, growing with the session), but Python starts one after every 10 collections of the middle
    # generation, which a new layer's 100 000 allocations set off: it ran inside the turn that added the
    # layer (seen in the FDK run's, the difference images' and Attach geometry's longest gaps).  While the
    # workbench is on screen Python's own trigger is raised (FULL_GC_THRESHOLD) and the same collection runs
    # from a timer once it is due, between turns: when the timer fires on time (the event loop is idle).
    # Python's trigger still fires if the window stays busy that long; napari's own ``gc.collect()`` on a
    # layer's removal is unchanged, so the memory of a removed layer is returned as before.
    def _collect_when_idle(self, on: bool) -> None:
        from qtpy.QtCore import QTimer

        if on and self.idle_timer is None:
            gc.set_threshold(self.thresholds[0], self.thresholds[1], max(FULL_GC_THRESHOLD, self.thresholds[2]))
            self.idle_timer = QTimer(self)
            self.idle_timer.setInterval(IDLE_GC_MS)
            self.idle_timer.timeout.connect(self._idle_collect)
            self._last_idle_tick, self._calm, self._last_collection = None, 0, -IDLE_GC_GAP_S
            self.idle_timer.start()
        elif not on and self.idle_timer is not None:
            self.idle_timer.stop()
            self.idle_timer.deleteLater()
            self.idle_timer = None
            gc.set_threshold(*self.thresholds)

    def _idle_collect(self) -> None:
        import time

        now = time.perf_counter()
        last, self._last_idle_tick = self._last_idle_tick, now
        on_time = last is not None and now - last < 1.5 * IDLE_GC_MS / 1000
        self._calm = self._calm + 1 if on_time else 0
        # Not while an action is still under way: a worker's results and a Steps chain's turns come at
        # any moment, and a collection then would sit in front of them (or of the Cancel click).
        if busy_elsewhere():
            self._calm = 0
            return
        if (self._calm >= IDLE_TICKS and gc.get_count()[2] >= self.thresholds[2]
                and now - self._last_collection >= IDLE_GC_GAP_S):
            gc.collect()
            self.idle_collections += 1
            self._calm = 0
            self._last_idle_tick = self._last_collection = time.perf_counter()

    def hideEvent(self, event):  # noqa: N802 - Qt name
        gc.unfreeze()
        self._collect_when_idle(False)
        self.off = True
        super().hideEvent(event)

    def showEvent(self, event):  # noqa: N802 - Qt name
        if self.off:
            gc.freeze()
            self.off = False
            if self.frozen:
                self._collect_when_idle(True)
        super().showEvent(event)


def busy_elsewhere() -> bool:
    """Whether a ctbench worker is running or a Steps chain still has steps (the idle collector waits)."""
    from .common import live_workers, steps_pending

    return live_workers() > 0 or steps_pending() > 0


def pending(viewer) -> int:
    """Warm-up steps not yet run on the GUI thread for ``viewer`` (0 when done or never installed)."""
    steps = getattr(qt_window(viewer), "_ctbench_warm_up", None)
    return steps.pending if steps is not None else 0


def background_ready(timeout: float | None = None) -> bool:
    """Whether the background warm-up (colour maps, units, pandas) has finished (waiting up to ``timeout`` s)."""
    t = _BACKGROUND_THREAD
    if t is None:
        return False
    t.join(timeout)
    return not t.is_alive()


def _glyph_step(font, char: str):
    def step():
        font[char]           # renders and stores the glyph when missing (napari's QtTextureFont)
    return step


def _controls_width_step(viewer, steps):
    """Give the layer-controls dock the width an image layer's controls give it, before any layer comes.

    In an empty viewer the dock is as wide as napari's empty page; the first layer's controls widen it
    (271 -> 337 px at 1920x1080), so the canvas shrank and napari painted it twice inside the first
    ``add_image`` (about 0.1 s of a sample's opening; Qt's OpenGL widget paints inside every resize).
    Here, at start-up, the controls of a throwaway image layer join napari's stack of control pages (never
    shown: the stack is as wide as its widest page) and leave it a turn after the first layer has arrived,
    whose own controls then hold the same width: nothing moves in an action.  The slider row is held the
    same way (``_hold_slider_row``)."""

    def step():
        if not background_ready(0):      # the throwaway layer needs pint's registry (built in the background)
            steps.extend([step])
            return
        qt_viewer = getattr(viewer.window, "_qt_viewer", None)
        container = getattr(qt_viewer, "controls", None)
        if container is None or len(viewer.layers):
            return                        # another napari, or a layer's controls already set the width
        import numpy as np
        from napari._qt.layer_controls.qt_layer_controls_container import create_qt_layer_controls
        from napari.layers import Image

        from .._layers import COMPLETENESS_COLORMAP

        # With the designer's completeness colour map: its long name widens every image's colour-map box
        # (napari lists all registered maps), so the designer's first map widened the dock by 42 px then.
        page = create_qt_layer_controls(Image(np.zeros((2, 2, 2), np.float32), name="ctbench width",
                                              colormap=COMPLETENESS_COLORMAP))
        if hasattr(page, "ndisplay"):
            page.ndisplay = 3     # the rows an image shows in 3D too (rendering, depiction)

        def add_page():
            if not len(viewer.layers) and not is_deleted(page) and not is_deleted(container):
                container.addWidget(page)
        # Each geometry change in a turn of its own (each resizes the canvas, and Qt paints it inside the
        # resize): the page joins napari's stack of control pages (styled as napari's own, never current),
        # then the slider row is held at one slider's height.
        steps.extend([add_page, lambda: _hold_slider_row(viewer, qt_viewer)])

        def release(_event=None):
            viewer.layers.events.inserted.disconnect(release)

            def remove():
                if not is_deleted(page) and not is_deleted(container):
                    container.removeWidget(page)
                    page.deleteLater()
            QTimer.singleShot(0, remove)
        viewer.layers.events.inserted.connect(release)
    return step


def _hold_slider_row(viewer, qt_viewer) -> None:
    """The empty viewer's slider row at one slider's height: the first volume shown as a 2D slice brings
    the z slider, which shrank the canvas (and napari painted it) inside the add.  napari sets the row's
    height itself on every later change of the sliders."""
    dims = getattr(qt_viewer, "dims", None)
    if dims is not None and not is_deleted(dims) and not len(viewer.layers) and viewer.dims.ndisplay == 2 \
            and hasattr(dims, "SLIDERHEIGHT"):
        _steady_slider_row(viewer, dims)
        QWidget.setMinimumHeight(dims, max(dims.minimumHeight(), int(dims.SLIDERHEIGHT)))


def _steady_slider_row(viewer, dims) -> None:
    """Never let napari's slider row ask for more rows than the view can show sliders for.

    When the number of dimensions changes (the first volume, a 2D layer after a 3D one) napari makes
    every slider anew and sets the row's minimum height once per slider made, before it hides those of
    the displayed axes; the ``show()`` of the remaining slider then lays the window out synchronously
    with that interim height (three rows for a volume), so the canvas shrank by two rows and napari
    painted it inside the ``add_layer``, and a later turn grew it back (a second paint and a repaint of
    the whole window).  The rows napari settles on are never more than the non-displayed axes, so
    capping each request there only removes the interim heights."""
    if getattr(dims, "_ctbench_steady_rows", False):
        return
    model = viewer.dims
    row = int(dims.SLIDERHEIGHT)

    def set_minimum_height(h):
        rows = max(0, int(model.ndim) - len(model.displayed))
        QWidget.setMinimumHeight(dims, int(min(int(h), rows * row)))
    dims.setMinimumHeight = set_minimum_height      # napari calls it through the instance (Python)
    dims._ctbench_steady_rows = True


def _scale_bar_font(viewer):
    """napari's texture font of the canvas's text (the scale bar's), or None where napari has no such font."""
    try:
        info = viewer.window._qt_viewer.canvas.font_info
        info = info() if callable(info) else info      # a method in napari 0.9
        return info.font_manager.get_font(info.face)
    except Exception:  # noqa: BLE001 - another napari version: no warm-up, nothing else changes
        log.debug("no napari font to warm up", exc_info=True)
        return None


def _start_background() -> None:
    global _BACKGROUND_THREAD
    if _BACKGROUND_THREAD is not None:
        return
    _BACKGROUND_THREAD = threading.Thread(target=_background, name="ctbench-gui-warm-up", daemon=True)
    _BACKGROUND_THREAD.start()


def _background() -> None:
    for job in (_unit_registry, _pandas, _colormaps):
        try:
            job()
        except Exception:  # noqa: BLE001 - that cost is then paid on first use, as without the warm-up
            log.debug("GUI warm-up step %s failed", job.__name__, exc_info=True)


def unit_registry_built() -> bool:
    """Whether pint's application registry (napari's layer units) is built, not still the lazy stand-in."""
    import pint

    app = pint.get_application_registry()
    return type(getattr(app, "_registry", app)).__name__ != "LazyRegistry"


def _unit_registry() -> None:
    """Build pint's registry here and hand it to the application registry if nobody touched the lazy one.

    Not by touching the lazy registry from this thread: it turns itself into a UnitRegistry first and
    fills it for 0.4 s, and a layer made on the GUI thread meanwhile would read it half-filled.  A private
    registry is filled instead and swapped in whole; if the GUI thread was first, the lazy one is left alone
    (a second registry then would make units of two registries, which pint refuses to compare)."""
    import pint
    from pint.registry import LazyRegistry

    app = pint.get_application_registry()
    lazy = getattr(app, "_registry", None)
    if type(lazy) is not LazyRegistry:
        return
    args, kwargs = lazy.__dict__["params"]
    built = pint.UnitRegistry(*args, **{**kwargs, "on_redefinition": "raise"})   # as the lazy one would
    if type(app._registry) is LazyRegistry:
        pint.set_application_registry(built)


def _pandas() -> None:
    import pandas  # noqa: F401 - napari imports it lazily for the first layer with features (Vectors)


def _colormaps() -> None:
    from napari.utils.colormaps import ensure_colormap

    for name in COLORMAPS:
        ensure_colormap(name)
