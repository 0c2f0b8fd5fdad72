"""Small Qt building blocks shared by the widgets: messages, layer pickers, parameter forms."""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterable

import numpy as np

from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QHBoxLayout, QLabel, QProgressBar,
                            QSpinBox, QWidget)

from .._text import unquote

log = logging.getLogger("ctbench_napari")


class MessageLabel(QLabel):
    """A one-paragraph status line: errors in red, notes in the normal colour."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.level = ""
        self.hide()

    def error(self, text: str) -> None:
        self.level = "error"
        self.setStyleSheet("color: #ff6b6b;")
        self.setText(text)
        self.show()

    def note(self, text: str) -> None:
        self.level = "note"
        self.setStyleSheet("")
        self.setText(text)
        self.show()

    def clear(self) -> None:
        self.level = ""
        self.setText("")
        self.hide()


class ProgressBar(QProgressBar):
    """A QProgressBar whose changes are drawn with the window's next paint, never at once.

    Qt's ``setValue``, ``setRange`` and ``reset`` call ``QWidget.repaint()``, a synchronous paint; in a
    window holding napari's OpenGL canvas that flushes the whole window and draws the canvas inside the
    slot that moved the bar (a software-OpenGL frame in the middle of a progress event, then another one
    for what the slot changed next).  With updates off around the change, re-enabling them schedules an
    ordinary ``update()``: the event loop draws the bar and the canvas once, together.
    """

    def _deferred(self, method, *args):
        was = self.updatesEnabled()
        self.setUpdatesEnabled(False)
        try:
            return method(self, *args)
        finally:
            self.setUpdatesEnabled(was)

    def setValue(self, value):  # noqa: N802 - Qt name
        return self._deferred(QProgressBar.setValue, int(value))

    def setRange(self, lo, hi):  # noqa: N802 - Qt name
        return self._deferred(QProgressBar.setRange, int(lo), int(hi))

    def setMaximum(self, hi):  # noqa: N802 - Qt name
        return self._deferred(QProgressBar.setMaximum, int(hi))

    def setMinimum(self, lo):  # noqa: N802 - Qt name
        return self._deferred(QProgressBar.setMinimum, int(lo))

    def reset(self):
        return self._deferred(QProgressBar.reset)


def double_spin(lo, hi, value, step=1.0, decimals=3, suffix="") -> QDoubleSpinBox:
    """A QDoubleSpinBox on ``[lo, hi]`` showing ``value`` (``suffix`` after a space)."""
    s = QDoubleSpinBox()
    s.setRange(lo, hi)
    s.setDecimals(decimals)
    s.setSingleStep(step)
    s.setValue(value)
    if suffix:
        s.setSuffix(f" {suffix}")
    return s


def int_spin(lo, hi, value, special="") -> QSpinBox:
    """A QSpinBox on ``[lo, hi]`` showing ``value`` (``special`` shown instead of ``lo``)."""
    s = QSpinBox()
    s.setRange(lo, hi)
    s.setValue(value)
    if special:
        s.setSpecialValueText(special)
    return s


def row_of(*widgets) -> QWidget:
    """The widgets side by side, without margins."""
    w = QWidget()
    lay = QHBoxLayout(w)
    lay.setContentsMargins(0, 0, 0, 0)
    for x in widgets:
        lay.addWidget(x)
    return w


def report_errors(method: Callable) -> Callable:
    """Show any exception of a widget action in its ``message`` label instead of a traceback."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the point is to catch everything a user can trigger
            log.debug("ctbench widget action failed", exc_info=True)
            self.message.error(error_text(e))
            return None

    return wrapper


def error_text(e: BaseException) -> str:
    """A readable one-liner for an exception (no traceback, no class name for plain value errors)."""
    text = str(e) or type(e).__name__
    if isinstance(e, (ValueError, TypeError, FileNotFoundError, FileExistsError, KeyError)):
        return unquote(text)
    return f"{type(e).__name__}: {text}"


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


def is_deleted(widget) -> bool:
    """Whether the Qt side of ``widget`` is gone (a worker may finish after its widget was closed)."""
    try:
        widget.objectName()
        return False
    except RuntimeError:
        return True


def scroll_contents(widget) -> None:
    """Put everything ``widget`` laid out into a vertical scroll area, so a tall panel never sets the
    window's minimum height (the window fits a 1080-pixel screen and scrolls on a 768-pixel laptop).

    The widget's own layout object is kept (moved onto the scrolled page), so code that added rows to it
    keeps working.
    """
    from qtpy.QtWidgets import QFrame, QScrollArea, QVBoxLayout

    page = QWidget()
    page.setLayout(widget.layout())      # Qt moves a widget's layout (and its children) onto the page
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    area.setWidget(page)
    # As wide as the page wants (no horizontal scrolling), as short as the window needs.
    area.setMinimumWidth(page.minimumSizeHint().width() + area.verticalScrollBar().sizeHint().width())
    outer = QVBoxLayout(widget)
    outer.setContentsMargins(0, 0, 0, 0)
    outer.addWidget(area)
    widget.scroll_area = area


def start_worker(func: Callable, *args, on_yield=None, on_return=None, on_error=None, on_finished=None):
    """Run ``func`` in a napari thread worker with one error path: ``on_error`` and nothing else.

    napari's workers also show every error as a traceback notification and
    superqt re-raises errors nobody handles, which aborts a script that has
    no ``napari.run()``; the widgets show the error once, in their own words.
    A RuntimeError of a generator ``func`` reaches ``on_error`` too (see WorkerRuntimeError).
    """
    import inspect

    from napari.qt.threading import create_worker

    handle = on_error or (lambda e: log.error("ctbench worker failed: %s", e))
    if threading.current_thread() is threading.main_thread():
        spawner_ready()          # before any worker lowers a thread's priority (see _Spawner)
    func, ended = _at_background_priority(func)
    if inspect.isgeneratorfunction(func):
        func = _runtime_errors_reported(func)
    connect = {"errored": lambda e: handle(e.error if isinstance(e, WorkerRuntimeError) else e)}
    worker = create_worker(func, *args, _start_thread=False, _connect=connect)
    try:
        worker.errored.disconnect(worker._relay_error)      # the notification toast (napari's mixin)
    except (AttributeError, TypeError, RuntimeError):
        pass
    if on_yield is not None:
        worker.yielded.connect(on_yield)
    if on_return is not None:
        worker.returned.connect(on_return)
    if on_finished is not None:
        worker.finished.connect(on_finished)
    # A generator worker quit before its first step never enters the generator (superqt checks the abort
    # first), so the count also ends with the worker: either way once.
    worker.finished.connect(ended)
    keep_a_pool_thread_free()
    worker.start()
    return worker


class WorkerRuntimeError(Exception):
    """A RuntimeError raised inside a generator worker, carried (as ``error``) under a type superqt passes on.

    superqt's generator workers take any RuntimeError for "the worker was deleted" and end silently, with
    neither ``errored`` nor ``finished``: torch's out-of-memory and shape errors are RuntimeErrors, and the
    widget would wait forever with its Cancel button lit.  ``start_worker`` hands ``on_error`` the original."""

    def __init__(self, error: RuntimeError):
        super().__init__(str(error) or type(error).__name__)
        self.error = error


def _runtime_errors_reported(gen_func):
    """``gen_func`` with a RuntimeError from its body re-raised as WorkerRuntimeError (the errors of the
    worker's own signals, outside the generator, keep superqt's handling)."""

    @functools.wraps(gen_func)
    def guarded(*args, **kwargs):
        try:
            return (yield from gen_func(*args, **kwargs))
        except RuntimeError as e:
            raise WorkerRuntimeError(e) from e

    return guarded


BACKGROUND_NICE = 10     # how much nicer than the GUI thread a worker runs (Linux; the ``nice`` default)


def background_priority() -> None:
    """Lower the calling thread's CPU priority to the GUI thread's nice value + ``BACKGROUND_NICE`` (Linux).

    A worker's solver and the OpenMP threads it starts (libgomp gives every calling thread its own team,
    created with that thread's priority) took every core while a run went on, and the GUI thread, Qt's
    repaints and llvmpipe's rasteriser threads waited for the CPU: the window's longest stalls were during
    runs.  At a lower priority the workers still get every core the GUI leaves idle.  A thread's nice value
    can only go up without privileges, so a pool thread stays at this level (it only ever runs workers).
    Elsewhere (macOS: ``setpriority`` would renice the whole process) nothing changes."""
    if not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return
    try:
        target = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + BACKGROUND_NICE)   # pid: the main thread
        tid = threading.get_native_id()
        if tid != os.getpid() and os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except OSError:
        log.debug("could not lower a worker's priority", exc_info=True)


_LIVE = {"workers": 0}           # ctbench workers started and not yet ended (see keep_a_pool_thread_free)
_LIVE_LOCK = threading.Lock()


def _live(delta: int) -> None:
    with _LIVE_LOCK:
        _LIVE["workers"] = max(0, _LIVE["workers"] + delta)


class _Spawner:
    """Starts processes from a thread of normal priority: a child process inherits the nice value of the
    thread that starts it, and a worker's (see ``background_priority``) can never go back down, so a
    detached process a worker starts (the local job bridge, its jobs) would run below normal priority
    for good.  The thread is made on first use from the GUI thread (``spawner_ready``) or else, with the
    same effect, from whichever thread has the process's own priority."""

    def __init__(self):
        import queue

        self._requests: "queue.Queue" = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()

    def ready(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="ctbench-spawner", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            fn, args, kwargs, future = self._requests.get()
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                future.set_exception(e)

    def popen(self, *args, **kwargs):
        """``subprocess.Popen(*args, **kwargs)``, run in the spawner thread."""
        import subprocess

        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the process spawner was not started (common.spawner_ready on the GUI thread)")
        future: Future = Future()
        self._requests.put((subprocess.Popen, args, kwargs, future))
        return future.result()


SPAWNER = _Spawner()


def spawner_ready() -> None:
    """Start ``SPAWNER``'s thread (call from the GUI thread, whose priority it takes)."""
    SPAWNER.ready()


def _at_background_priority(func):
    """``func`` (a generator function stays one: napari picks its worker type by that) run after
    ``background_priority`` in its worker thread, counted among the live workers until it ends; and
    ``ended()``, which ends the count too (once in all: whichever comes first)."""
    import inspect

    _live(+1)      # from the start (GUI thread): a queued worker that has not run yet counts too
    lock, counted = threading.Lock(), [True]

    def ended(*_):
        with lock:
            if not counted[0]:
                return
            counted[0] = False
        _live(-1)

    if inspect.isgeneratorfunction(func):
        @functools.wraps(func)
        def generator(*args, **kwargs):
            try:
                background_priority()
                return (yield from func(*args, **kwargs))
            finally:
                ended()
        return generator, ended

    @functools.wraps(func)
    def plain(*args, **kwargs):
        try:
            background_priority()
            return func(*args, **kwargs)
        finally:
            ended()
    return plain, ended


def keep_a_pool_thread_free() -> None:
    """Let Qt's global thread pool grow so that one of its threads stays free of Python workers.

    The workers run in that pool, and so do the pieces Qt splits a large image conversion into
    (``QImage.convertToFormat``, e.g. inside napari's ``viewer.screenshot``), which the GUI thread waits
    for while it holds the GIL.  With every pool thread running a Python worker that waits for the GIL,
    neither side moves: the window hangs for good (seen with two Run estimates and a screenshot on a
    2-core machine).  A free thread runs the conversion; the workers only wait as they did anyway."""
    from qtpy.QtCore import QThreadPool

    pool = QThreadPool.globalInstance()
    # Qt counts a thread as active once it has taken its task; a low-priority pool thread woken for a new
    # worker may not have yet, so the workers this module started are counted as well.
    need = max(pool.activeThreadCount() + 1, _LIVE["workers"]) + 1     # every worker, and one thread to spare
    if pool.maxThreadCount() < need:
        pool.setMaxThreadCount(need)


class ParamForm(QWidget):
    """A form built from parameter specs (``ctbench.workbench.workflow.ParamSpec`` or designer parameters).

    A spec needs ``name``, ``label`` and ``kind`` ("int", "float", "bool",
    "choice", or the types int/float); optional ``minimum``, ``maximum``,
    ``step``, ``unit``, ``choices``, ``help``, ``default``.  Ranges are
    deliberately wide: validation with a readable message happens in ctbench.
    """

    changed = Signal()

    def __init__(self, specs: Iterable, parent=None):
        super().__init__(parent)
        self.layout_ = QFormLayout(self)
        self.layout_.setContentsMargins(0, 0, 0, 0)
        self.editors: dict[str, QWidget] = {}
        self.labels: dict[str, QLabel] = {}
        for spec in specs:
            editor = self._editor(spec)
            label = QLabel(spec.label + (f" ({spec.unit})" if getattr(spec, "unit", "") else ""))
            tip = getattr(spec, "help", "")
            if tip:
                editor.setToolTip(tip)
                label.setToolTip(tip)
            editor.setObjectName(spec.name)
            self.editors[spec.name] = editor
            self.labels[spec.name] = label
            self.layout_.addRow(label, editor)
            if hasattr(spec, "default"):
                self.set_value(spec.name, spec.default)

    def _editor(self, spec) -> QWidget:
        kind = spec.kind if isinstance(spec.kind, str) else spec.kind.__name__
        lo = getattr(spec, "minimum", None)
        hi = getattr(spec, "maximum", None)
        if kind == "bool":
            w = QCheckBox()
            w.toggled.connect(self.changed)
        elif kind == "choice":
            w = QComboBox()
            w.addItems(list(spec.choices))
            w.currentIndexChanged.connect(self.changed)
        elif kind == "int":
            w = QSpinBox()
            w.setRange(int(lo) if lo is not None else -2**31 + 1, int(hi) if hi is not None else 2**31 - 1)
            w.setSingleStep(int(getattr(spec, "step", 1) or 1))
            w.valueChanged.connect(self.changed)
        else:
            w = QDoubleSpinBox()
            w.setDecimals(6 if getattr(spec, "log_scale", False) else 3)
            w.setRange(float(lo) if lo is not None else -1e12, float(hi) if hi is not None else 1e12)
            w.setSingleStep(float(getattr(spec, "step", 0.1) or 0.1))
            w.valueChanged.connect(self.changed)
        w.setKeyboardTracking(False) if hasattr(w, "setKeyboardTracking") else None
        return w

    def value(self, name: str):
        w = self.editors[name]
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, QComboBox):
            return w.currentText()
        return w.value()

    def values(self) -> dict:
        return {name: self.value(name) for name in self.editors}

    def set_value(self, name: str, value) -> None:
        w = self.editors[name]
        if isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, QComboBox):
            i = w.findText(str(value))
            if i < 0:
                raise ValueError(f"{name} has no choice {value!r}")
            w.setCurrentIndex(i)
        elif isinstance(w, QSpinBox):
            w.setValue(int(value))
        else:
            w.setValue(float(value))

    def set_values(self, values: dict) -> None:
        for k, v in values.items():
            if k in self.editors:
                self.set_value(k, v)

    def set_row_visible(self, name: str, visible: bool) -> None:
        self.editors[name].setVisible(visible)
        self.labels[name].setVisible(visible)


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
    return getattr(viewer, f"add_{ltype}")(data, **kwargs)


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


def rows_height(table, max_rows: int) -> int:
    """The height of a QTableWidget's first ``max_rows`` rows, fitted to their contents (one default row
    when empty): what a table sized to its rows needs besides its header and frame."""
    table.resizeRowsToContents()
    if not table.rowCount():
        return table.verticalHeader().defaultSectionSize()
    return sum(table.rowHeight(r) for r in range(min(table.rowCount(), max_rows)))


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


def _chains():
    import weakref

    if Steps._running is None:
        Steps._running = weakref.WeakSet()
    return Steps._running


def steps_pending() -> int:
    """Steps not yet run in every chain of the process (an action the user started is still showing)."""
    return sum(s.pending for s in list(_chains()))


def live_workers() -> int:
    """ctbench workers started and not yet ended."""
    return _LIVE["workers"]


def after_this_turn(start) -> None:
    """Call ``start`` (which arms the next step's timer) once the event loop has finished this turn.

    A timer armed inside a step is due before any timer that was armed earlier for a later time, e.g. the
    GUI-thread probe of ``bench_gui.py`` or a widget's own 20 ms timer: when the step and the repaint it
    caused outlast those, Qt fired the next step first, and two heavy turns ran back to back with nothing
    between them.  A queued call (Qt's zero-time single shot is a posted event) runs after the repaints
    posted before it, and a timer armed from it is due after every timer that came due meanwhile."""
    from qtpy.QtCore import QTimer

    QTimer.singleShot(0, start)


def next_turn() -> None:
    """A no-op step for ``Steps.run``: the steps after it wait one more turn (``run(later=True)`` starts the
    whole chain after this turn)."""


class Steps:
    """Run GUI-thread steps one per event-loop turn, so the canvas repaints between them.

    Under software OpenGL each layer that appears for the first time costs a
    shader build and a draw; a comparison grid or a designer preview that shows
    five new layers at once paints them all in one long frame.  Shown one per
    turn, each frame builds one layer and the event loop stays responsive.
    ``pending`` counts the steps not yet run (widgets add it to ``busy``); a new
    ``run`` drops the steps of an older one.  A step that raises ends its chain
    and goes to ``on_error``.
    """

    GAP_MS = 1     # a timer, not 0: Qt then handles the repaint the step asked for before the next step

    def __init__(self, owner):
        self.owner = owner
        self._chain: list = []
        self._generation = 0
        self.on_error = None

    @property
    def pending(self) -> int:
        return len(self._chain)

    _running: "weakref.WeakSet" = None     # every Steps object with steps still to run (see steps_pending)

    def cancel(self) -> None:
        """Drop the steps not yet run."""
        self._generation += 1
        self._chain = []

    def extend(self, steps) -> None:
        """Append ``steps`` to the chain being run (from one of its steps: e.g. the display steps of a layer
        that the step has just made), one per turn after the others."""
        self._chain.extend(steps)

    def run(self, steps, on_error=None, later: bool = False) -> None:
        """The first step now (``later``: after this turn), each further one in a later turn of the event loop."""
        from qtpy.QtCore import QTimer

        self._generation += 1
        self._chain = list(steps)
        self.on_error = on_error
        gen = self._generation
        _chains().add(self)

        def next_step():
            if gen != self._generation or not self._chain or is_deleted(self.owner):
                self._chain = [] if gen == self._generation else self._chain
                return
            step = self._chain.pop(0)
            try:
                step()
            except Exception as e:  # noqa: BLE001 - a display step failing shows in the widget
                log.debug("ctbench display step failed", exc_info=True)
                self._chain = []
                if self.on_error is not None:
                    self.on_error(e)
                return
            if self._chain:
                after_this_turn(lambda: QTimer.singleShot(self.GAP_MS, next_step))

        if later:
            after_this_turn(lambda: QTimer.singleShot(self.GAP_MS, next_step))
        else:
            next_step()
