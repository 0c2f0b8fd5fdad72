"""Form building blocks of the widgets: spin boxes, rows, parameter forms, a progress bar that never paints
the canvas inside a slot, tables sized to their rows."""

from __future__ import annotations

from typing import Iterable

from qtpy.QtCore import Signal
from qtpy.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QHBoxLayout, QLabel, QProgressBar,
                            QSpinBox, QWidget)


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


def rows_height(table, max_rows: int) -> int:
    """The height of a QTableWidget's first ``max_rows`` rows, fitted to their contents (one default row
    when empty): what a table sized to its rows needs besides its header and frame."""
    table.resizeRowsToContents()
    if not table.rowCount():
        return table.verticalHeader().defaultSectionSize()
    return sum(table.rowHeight(r) for r in range(min(table.rowCount(), max_rows)))
