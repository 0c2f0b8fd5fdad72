"""Runners: drive a generator of ctbench workflow events off the GUI thread.

A runner takes a *factory* ``make_events(cancel: threading.Event) -> Iterator``
(typically ``lambda cancel: ctbench.workbench.workflow.reconstruct(..., cancel=cancel)``)
and re-emits every event on the GUI thread through :attr:`Runner.event`.
Widgets only talk to this interface, so a jobs panel can later supply a
runner whose events come from a background GPU job (through the job bridge)
instead of a local thread, and the reconstruction widget stays unchanged.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator

from qtpy.QtCore import QObject, Signal


def for_display(ev):
    """Prepare a result for the screen in the worker thread: its float32 array and contrast window ride along
    as ``ev.display`` (the GUI thread then only swaps the layer's data)."""
    from ctbench.workbench.workflow import Finished

    if isinstance(ev, Finished) and ev.volume is not None:
        import numpy as np

        from ctbench.workbench.metrics import percentile_window

        data = ev.volume.detach().cpu().numpy().astype(np.float32, copy=False)
        ev.display = {"data": data, "window": percentile_window(data)}
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


class LocalRunner(Runner):
    """Runs the generator in a napari thread worker on this machine.

    Cancelling sets the event the workflow checks after every iteration, so
    the run ends within one iteration and still delivers its partial result.
    """

    def __init__(self, parent=None):
        super().__init__(parent)
        self._worker = None
        self._cancel = threading.Event()

    @property
    def running(self) -> bool:
        return self._worker is not None

    def start(self, make_events: Callable[[threading.Event], Iterator]) -> None:
        from .common import start_worker

        if self.running:
            raise RuntimeError("a run is in progress; cancel it or wait for it to finish")
        self._cancel = threading.Event()
        cancel = self._cancel

        def work():
            for ev in make_events(cancel):
                yield for_display(ev)

        # One error path: ``failed`` (no napari traceback toast, no re-raise that would abort a script).
        self._worker = start_worker(work, on_yield=self.event.emit, on_error=self.failed.emit,
                                    on_finished=self._finished)

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout_ms: int = 10000) -> bool:
        """Block until the worker thread ends (for shutdown and tests); True if it did."""
        w = self._worker
        if w is None:
            return True
        from qtpy.QtCore import QThreadPool
        return QThreadPool.globalInstance().waitForDone(timeout_ms)

    def _finished(self) -> None:
        self._worker = None
        self.done.emit()
