"""GUI-thread work split one step per event-loop turn (the canvas repaints between steps)."""

from __future__ import annotations

import logging

from .layout import is_deleted

log = logging.getLogger("ctbench_napari")


def _chains():
    import weakref

    if Steps._running is None:
        Steps._running = weakref.WeakSet()
    return Steps._running


def steps_pending() -> int:
    """Steps not yet run in every chain of the process (an action the user started is still showing)."""
    return sum(s.pending for s in list(_chains()))


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

    _running = None        # every Steps object with steps still to run (see steps_pending)

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
