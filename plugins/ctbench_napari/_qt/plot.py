"""A small residual-vs-iteration plot drawn with QPainter (log scale, no plotting library)."""

from __future__ import annotations

import math

from qtpy.QtCore import QPointF, QRectF, Qt
from qtpy.QtGui import QColor, QPainter, QPen, QPolygonF
from qtpy.QtWidgets import QSizePolicy, QWidget


class ResidualPlot(QWidget):
    """Residual norm per iteration on a log axis; cheap enough to redraw every iteration."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.points: list[tuple[int, float]] = []
        self.title = "residual ‖Ax − b‖"
        self.setMinimumHeight(110)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def clear(self) -> None:
        self.points = []
        self.update()

    def add(self, iteration: int, residual: float | None) -> None:
        if residual is None or not math.isfinite(residual) or residual <= 0:
            return
        self.points.append((int(iteration), float(residual)))
        self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt name
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        fg = self.palette().color(self.foregroundRole())
        w, h = self.width(), self.height()
        left, right, top, bottom = 46, 8, 16, 18
        box = QRectF(left, top, max(w - left - right, 1), max(h - top - bottom, 1))
        p.setPen(QPen(fg, 1))
        p.drawRect(box)
        p.drawText(QRectF(left, 0, box.width(), top), Qt.AlignLeft | Qt.AlignVCenter, self.title)
        if not self.points:
            p.drawText(box, Qt.AlignCenter, "no iterations yet")
            p.end()
            return
        its = [i for i, _ in self.points]
        logs = [math.log10(r) for _, r in self.points]
        x0, x1 = min(its), max(max(its), min(its) + 1)
        y0, y1 = min(logs), max(logs)
        if y1 - y0 < 1e-6:
            y0, y1 = y0 - 0.5, y1 + 0.5

        def pt(i, lg):
            return QPointF(box.left() + (i - x0) / (x1 - x0) * box.width(),
                           box.bottom() - (lg - y0) / (y1 - y0) * box.height())

        p.drawText(QRectF(0, top - 6, left - 4, 14), Qt.AlignRight, f"{10 ** y1:.3g}")
        p.drawText(QRectF(0, box.bottom() - 8, left - 4, 14), Qt.AlignRight, f"{10 ** y0:.3g}")
        p.drawText(QRectF(left, box.bottom() + 2, box.width(), 14), Qt.AlignRight, f"iteration {its[-1]}")
        p.setPen(QPen(QColor("#4fc3f7"), 2))
        p.drawPolyline(QPolygonF([pt(i, lg) for i, lg in zip(its, logs)]))
        p.end()
