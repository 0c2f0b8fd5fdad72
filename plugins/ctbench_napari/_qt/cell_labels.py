"""Names on the canvas: a label in the corner of each grid cell saying which layer the cell shows.

Qt labels laid over the canvas widget, not vispy text: under software OpenGL the first draw of a text visual
in each cell stalled the window for seconds, while a Qt label costs nothing in the GL frame.  They follow
the canvas's size and go away with the grid.
"""

from __future__ import annotations

import weakref

from qtpy.QtCore import QEvent, QObject, Qt
from qtpy.QtWidgets import QLabel

STYLE = ("QLabel { background-color: rgba(20, 20, 20, 170); color: #f0f0f0; padding: 2px 6px; "
         "border-radius: 3px; }")


def _canvas_widget(viewer):
    real = getattr(viewer, "__wrapped__", viewer)
    qt_viewer = getattr(getattr(real, "window", None), "_qt_viewer", None)
    canvas = getattr(qt_viewer, "canvas", None)
    return getattr(canvas, "native", None)


class _Follow(QObject):
    """Re-places the labels when the canvas widget is resized."""

    def __init__(self, overlay):
        super().__init__(overlay.widget)
        self.overlay = weakref.ref(overlay)

    def eventFilter(self, obj, event):  # noqa: N802 - Qt name
        if event.type() == QEvent.Resize:
            o = self.overlay()
            if o is not None:
                o.place()
        return False


class CellLabels:
    """The labels of one viewer's canvas; ``show(cells, shape)`` with ``cells`` = [((row, col), name)]."""

    def __init__(self, widget):
        self._widget = weakref.ref(widget)      # the widget holds this object, never the other way round
        self.labels: list[QLabel] = []
        self.cells: list = []
        self.shape = (1, 1)
        self._filter = _Follow(self)
        widget.installEventFilter(self._filter)

    @property
    def widget(self):
        return self._widget()

    def show(self, cells, shape) -> None:
        self.cells, self.shape = list(cells), (max(int(shape[0]), 1), max(int(shape[1]), 1))
        while len(self.labels) < len(self.cells):
            label = QLabel(self.widget)
            label.setStyleSheet(STYLE)
            label.setAttribute(Qt.WA_TransparentForMouseEvents)
            label.setObjectName("ctbench_cell_label")
            self.labels.append(label)
        for label, (_, name) in zip(self.labels, self.cells):
            label.setText(name)
            label.setToolTip(name)
        for label in self.labels[len(self.cells):]:
            label.hide()
        self.place()

    def place(self) -> None:
        rows, cols = self.shape
        w, h = self.widget.width(), self.widget.height()
        for label, ((r, c), name) in zip(self.labels, self.cells):
            cw = max(w // cols, 40)
            label.setMaximumWidth(cw - 12)
            text = label.fontMetrics().elidedText(name, Qt.ElideMiddle, max(cw - 24, 20))
            label.setText(text)
            label.adjustSize()
            label.move(int(c * w / cols) + 6, int(r * h / rows) + 6)
            label.show()
            label.raise_()

    def hide(self) -> None:
        self.cells = []
        for label in self.labels:
            label.hide()

    def texts(self) -> list[str]:
        """The names shown (for tests): the full names, in cell order."""
        return [name for _, name in self.cells]

    def geometries(self) -> list:
        return [label.geometry() for label in self.labels[:len(self.cells)]]


def overlay_of(viewer) -> CellLabels | None:
    """The viewer's cell labels (made on first use, kept on the canvas widget: they go with it), or None
    without a canvas (a headless viewer)."""
    widget = _canvas_widget(viewer)
    if widget is None:
        return None
    o = getattr(widget, "_ctbench_cell_labels", None)
    if o is None:
        o = CellLabels(widget)
        widget._ctbench_cell_labels = o
    return o
