"""Runners: drive a generator of ctbench workflow events off the GUI thread.

A runner takes a *factory* ``make_events(cancel: threading.Event) -> Iterator``
(typically ``lambda cancel: ctbench.workbench.workflow.reconstruct(..., cancel=cancel)``)
and re-emits every event on the GUI thread through :attr:`Runner.event`.
Widgets only talk to this interface, so a jobs panel can later supply a
runner whose events come from a background GPU job (through the job bridge)
instead of a local thread, and the reconstruction widget stays unchanged.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from typing import Callable, Iterator

from qtpy.QtCore import QObject, QTimer, Signal

from .common import after_this_turn


def for_display(ev):
    """Prepare a result for the screen in the worker thread: its float32 array and contrast window ride along
    as ``ev.display`` (the GUI thread then only swaps the layer's data)."""
    from ctbench.workbench.workflow import Finished

    if isinstance(ev, Finished) and ev.volume is not None:
        import numpy as np

        from ctbench.workbench.metrics import percentile_window

        data = ev.volume.detach().cpu().numpy().astype(np.float32, copy=False)
        ev.display = {"data": data, "window": percentile_window(data), "empty": not bool(np.any(data))}
    return ev


class Runner(QObject):
    """The interface: ``start``, ``cancel``, ``running`` and three signals."""

    event = Signal(object)      # each workflow event, on the GUI thread
    failed = Signal(object)     # the exception that ended the run
    done = Signal()             # after the last event (or a failure)

    def start(self, make_events: Callable[[threading.Event], Iterator]) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        raise NotImplementedError


class _Failed:
    def __init__(self, exc):
        self.exc = exc


_DONE = object()


class LocalRunner(Runner):
    """Runs the generator in a napari thread worker on this machine.

    Cancelling sets the event the workflow checks after every iteration, so
    the run ends within one iteration and still delivers its partial result.

    The worker's events are paced: Qt would deliver every queued signal of a
    fast run (a quick preview's Started, Finished and the end) back to back in
    one turn of the event loop, the new layer, its data and its display in one
    stall; here they wait in a queue and go out one per turn, the failure and
    ``done`` last.  A live preview that a newer one in the queue supersedes is
    dropped from its event (the plot, the bar and the status still get every
    iteration); only the newest estimate is drawn.
    """

    GAP_MS = 1      # a timer, not 0: Qt handles the repaint an event asked for before the next event

    _posted = Signal(object)       # an event from any thread (ordered-subset progress), for the queue

    def __init__(self, parent=None):
        super().__init__(parent)
        self._worker = None
        self._cancel = threading.Event()
        self._queue: deque = deque()
        self._active = False
        self._arming = False           # the next delivery waits for the end of this turn (_deliver_one)
        # No child objects: Qt would send this object a ChildAdded event, and ``event`` (the signal) hides the
        # QObject.event that handles it.
        self._timer = QTimer()
        self._timer.setSingleShot(True)
        self._timer.setInterval(self.GAP_MS)
        self._timer.timeout.connect(self._deliver_one)
        # Lambdas, not this object's methods: PyQt then receives the queued calls in a proxy object of the
        # GUI thread; a queued call to this object would go through QObject.event, hidden here too.
        self._posted.connect(lambda ev: self._enqueue(ev))      # queued onto the GUI thread from a worker

    @property
    def running(self) -> bool:
        """From ``start`` until ``done`` is delivered (the worker may have ended with events still queued)."""
        return self._active

    def post(self, event) -> None:
        """Queue ``event`` behind the worker's events; callable from any thread (e.g. a solver callback)."""
        self._posted.emit(event)

    def start(self, make_events: Callable[[threading.Event], Iterator]) -> None:
        from .common import start_worker

        if self.running:
            raise RuntimeError("a run is in progress; cancel it or wait for it to finish")
        self._cancel = threading.Event()
        cancel = self._cancel

        def work():
            for ev in make_events(cancel):
                yield for_display(ev)

        self._active = True
        self._queue.clear()
        # One error path: ``failed`` (no napari traceback toast, no re-raise that would abort a script).
        self._worker = start_worker(work, on_yield=lambda ev: self._enqueue(ev),
                                    on_error=lambda e: self._enqueue(_Failed(e)),
                                    on_finished=lambda: self._enqueue(_DONE),
                                    owner=self, cancel=cancel.set)

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout_ms: int = 10000) -> bool:
        """Block until the worker thread ends (for shutdown and tests); True if it did."""
        w = self._worker
        if w is None:
            return True
        from qtpy.QtCore import QThreadPool
        return QThreadPool.globalInstance().waitForDone(timeout_ms)

    def _enqueue(self, item) -> None:
        self._queue.append(item)
        if len(self._queue) == 1 and not self._timer.isActive() and not self._arming:
            self._timer.start()

    def _arm(self) -> None:
        self._arming = False
        if self._queue:
            self._timer.start()

    def _deliver_one(self) -> None:
        if not self._queue:
            return
        item = _without_stale_preview(self._queue.popleft(), self._queue)
        try:
            if item is _DONE:
                self._worker = None
                self._active = False
                self.done.emit()
            elif isinstance(item, _Failed):
                self.failed.emit(item.exc)
            else:
                self.event.emit(item)
        finally:
            if self._queue:         # the next event after this turn's repaints and due timers (common.py)
                self._arming = True
                after_this_turn(self._arm)


def _has_preview(ev) -> bool:
    return getattr(ev, "preview", None) is not None


def _without_stale_preview(ev, queue):
    """``ev`` without its preview volume when a later queued event brings a newer one (drawing both in
    consecutive turns shows the older for one frame only)."""
    if _has_preview(ev) and dataclasses.is_dataclass(ev) and any(_has_preview(x) for x in queue):
        return dataclasses.replace(ev, preview=None)
    return ev
