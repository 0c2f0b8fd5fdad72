"""The memory and time estimate the Reconstruction widget shows before Run (ctbench.workbench.estimate).

It follows the settings (sinogram, algorithm, parameters, grid), debounced;
the estimate (a planner query and, once per problem shape, a short timed
projection) runs in a worker thread, so editing never waits for it.
"""

from __future__ import annotations

from qtpy.QtCore import QTimer
from qtpy.QtWidgets import QLabel

from .common import error_text, is_deleted, start_worker


class EstimateLabel(QLabel):
    """``Estimate: about 30 MiB of memory and 4.1 s (...)`` for the widget's current full run."""

    def __init__(self, widget, parent=None):
        super().__init__(parent)
        self.widget = widget          # the ReconstructionWidget: problem_inputs() and request()
        self.setWordWrap(True)
        self.setToolTip("memory: the data, the solver's arrays and the largest projector window (the planner); "
                        "time: one forward and backprojection measured on a few views, scaled to the run")
        self.last = None              # the latest RunEstimate shown
        self.n_estimates = 0
        self._generation = 0
        self._pending = 0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(300)
        self._timer.timeout.connect(self.refresh)
        self.setText("Estimate: choose a sinogram")

    @property
    def busy(self) -> bool:
        return self._pending > 0 or self._timer.isActive()

    def schedule(self, *_) -> None:
        """Estimate again shortly (debounced); the old figure is marked out of date at once, naming the new
        settings, so it never describes a method or size that is no longer chosen."""
        self._timer.start()
        self._generation += 1          # an answer for the old settings that arrives now is dropped
        try:
            title = self.widget.request("full").title()
        except Exception:  # noqa: BLE001 - invalid settings: refresh says why
            title = ""
        self.last = None
        self.setText(f"Estimate for {title}: updating…" if title else "Estimate: updating…")

    # A window closed with an estimate still due started its worker afterwards, after the viewer was gone
    # (seen: a test's closed workbench estimating inside the next test).  Hidden, the estimate waits; shown
    # again (a dock tab brought back), it is asked for again.
    def hideEvent(self, event):  # noqa: N802 - Qt name
        if self._timer.isActive():
            self._timer.stop()
            self._resume = True
        super().hideEvent(event)

    def showEvent(self, event):  # noqa: N802 - Qt name
        if getattr(self, "_resume", False):
            self._resume = False
            self.schedule()
        super().showEvent(event)

    def refresh(self, *_) -> None:
        """Estimate the current settings now (in a worker); older answers that arrive late are dropped."""
        from ctbench.workbench.estimate import estimate_run

        self._timer.stop()
        if getattr(self.widget, "running", False):
            self.setText("Estimate: after the run (a timing now would be skewed by it)")
            return          # the run in progress would skew the timing; the widget asks again when it ends
        self._generation += 1
        gen = self._generation
        try:
            geo = self.widget.problem_geometry()
            request = self.widget.request("full")
        except Exception as e:  # noqa: BLE001 - no usable settings: say why instead of a number
            self.last = None
            self.setText(f"Estimate: {error_text(e)}")
            return
        self.setText("Estimate: measuring…")

        def done(est):
            if is_deleted(self) or gen != self._generation:
                return
            self.last = est
            self.n_estimates += 1
            self.setText(f"Estimate for Run, {est.summary()}")

        def failed(e):
            if not is_deleted(self) and gen == self._generation:
                self.last = None
                self.setText(f"Estimate: {error_text(e)}")

        def finished():
            self._pending = max(0, self._pending - 1)

        self._pending += 1
        start_worker(estimate_run, geo, request, on_return=done, on_error=failed, on_finished=finished,
                     owner=self)
