"""The Calibrate step's parameter table: one row per freed parameter, all rows visible, names never cut.

Columns: parameter [unit], start, estimate, ± 1 sd, identifiability, status.
The table is as tall as its rows (up to ``MAX_VISIBLE`` rows; more scroll), its
columns as wide as their contents, and the status column wraps ("not
identifiable" on two lines in a narrow dock) with the row growing to fit.  The
calibration's note about a parameter ("not determined by this scan ...") is
the status cell's tooltip.
"""

from __future__ import annotations

import math

from qtpy.QtCore import Qt
from qtpy.QtWidgets import QAbstractItemView, QHeaderView, QSizePolicy, QTableWidget, QTableWidgetItem

from ctbench.calibration import SPECS
from ctbench.calibration.parameters import PER_VIEW

from .common import rows_height

HEADERS = ("parameter", "start", "change", "± 1 sd", "ident.", "status")
TIPS = ("the parameter and its unit (per-view shifts: the RMS over the views)",
        "where the calibration started, relative to the sinogram's attached geometry (0: that geometry)",
        "the calibrated change from the attached geometry (while running: the current estimate); the "
        "comparison below gives each geometry's values in the scan's frame",
        "one standard deviation from the linearised fit (per-view shifts: their RMS)",
        "identifiability: the share of the parameter's effect on the data that neither a changed object nor the other "
        "parameters explain (0 to 1)",
        "estimated, at bound, not identifiable (held at its start: the scan does not determine it), "
        "not reached (cancelled before its stage)")
MAX_VISIBLE = 9            # the usual 3-8 freed parameters, plus one; beyond that the table scrolls


def _num(v, digits: int) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}g}"


def row_name(name: str, unit: str, per_view: bool) -> str:
    return f"{name}{' rms' if per_view else ''} [{unit}]"


class ParameterTable(QTableWidget):
    """Rows of (name, start, estimate, sd, identifiability, status); ``rows_fit()`` keeps every row in view."""

    def __init__(self, parent=None):
        super().__init__(0, len(HEADERS), parent)
        self.setHorizontalHeaderLabels(list(HEADERS))
        for c, tip in enumerate(TIPS):
            self.horizontalHeaderItem(c).setToolTip(tip)
        self.verticalHeader().setVisible(False)
        self.setWordWrap(True)
        self.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)   # widths fit the contents instead
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        header = self.horizontalHeader()
        for c in range(len(HEADERS) - 1):
            header.setSectionResizeMode(c, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(len(HEADERS) - 1, QHeaderView.Stretch)
        self.names: list[str] = []
        self.setMinimumWidth(self._min_width())
        self.rows_fit()

    # ------------------------------------------------------------ contents
    def start_run(self, free, start: dict | None = None) -> None:
        """One row per freed parameter before the first step: its start, no estimate yet, "running"."""
        start = start or {}
        self.setRowCount(0)
        self.names = list(free)
        for name in self.names:
            spec = SPECS[name]
            self._add_row(name, [row_name(name, spec.unit, name in PER_VIEW), _num(start.get(name, 0.0), 4), "…",
                                 "–", "–", "running"], spec.meaning)
        self.rows_fit()

    def show_state(self, parameters: dict, shifts: dict) -> None:
        """The current estimates of one progress step (global values; per-view shifts as their RMS)."""
        for r, name in enumerate(self.names):
            if name in parameters:
                v = float(parameters[name])
            elif name in shifts and len(shifts[name]):
                v = math.sqrt(sum(float(s) ** 2 for s in shifts[name]) / len(shifts[name]))
            else:
                continue
            self.item(r, 2).setText(_num(v, 4))

    def stop_run(self, status: str) -> None:
        """The run ended without a result (an error): the rows still "running" say so."""
        for r in range(self.rowCount()):
            item = self.item(r, len(HEADERS) - 1)
            if item.text() == "running":
                item.setText(status)
        self.rows_fit()

    def show_result(self, res) -> None:
        """The calibration's parameter table, with its notes as the status tooltips."""
        self.setRowCount(0)
        self.names = [p.name for p in res.parameters]
        for p in res.parameters:
            note = next((n for n in res.notes if n.startswith(f"{p.name}:")), p.meaning)
            self._add_row(p.name, [row_name(p.name, p.unit, p.per_view), _num(p.start, 4), _num(p.value, 4),
                                   _num(p.uncertainty, 2), _num(p.identifiability, 2), p.status], note)
        self.rows_fit()

    def _add_row(self, name: str, cells, note: str) -> None:
        r = self.rowCount()
        self.insertRow(r)
        for c, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(note if c in (0, len(cells) - 1) else text)
            if 0 < c < len(cells) - 1:
                item.setTextAlignment(int(Qt.AlignRight | Qt.AlignVCenter))
            self.setItem(r, c, item)

    # ------------------------------------------------------------ size
    def _widest_row(self) -> list[str]:
        """The widest texts a row can hold: the longest name, signed small numbers, the longest status word."""
        name = max((row_name(k, v.unit, k in PER_VIEW) for k, v in SPECS.items()), key=self.fontMetrics().horizontalAdvance)
        return [name, "-0.0001234", "-0.0001234", "0.00012", "0.97", "identifiable"]

    def _min_width(self) -> int:
        """Every column at its widest contents (the status wraps between words): set once, so the dock's width
        does not change with the rows and no name or number is ever cut."""
        self.setRowCount(0)
        self._add_row("", self._widest_row(), "")
        header = self.horizontalHeader()
        width = sum(max(self.sizeHintForColumn(c), header.sectionSizeHint(c)) for c in range(len(HEADERS)))
        self.setRowCount(0)
        return width + 2 * self.frameWidth()

    def rows_fit(self) -> None:
        """As tall as the header and every row (up to MAX_VISIBLE rows: more scroll)."""
        h = self.horizontalHeader().sizeHint().height() + rows_height(self, MAX_VISIBLE) + 2 * self.frameWidth()
        if h != self.height() or self.minimumHeight() != h:
            self.setFixedHeight(h)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt name
        # A narrower status column wraps its text onto more lines: the rows (and the table) grow to match.
        super().resizeEvent(event)
        self.rows_fit()
