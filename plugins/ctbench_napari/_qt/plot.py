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

        # Ticks: every decade when the residual spans two or more; else round values of the residual itself
        # (1-2-5 steps), at least two of them, labelled with the digits their spacing needs.
        yt, labels = residual_ticks(y0, y1)
        faint = QColor(fg)
        faint.setAlpha(60)
        for lg, text in zip(yt, labels):
            y = pt(x0, lg).y()
            p.setPen(QPen(faint, 1))
            p.drawLine(QPointF(box.left(), y), QPointF(box.right(), y))
            p.setPen(QPen(fg, 1))
            p.drawText(QRectF(0, y - 7, left - 4, 14), Qt.AlignRight | Qt.AlignVCenter, text)
        xt = [t for t in nice_ticks(x0, x1, 6) if float(t).is_integer()] or [x0, x1]
        for i in xt:
            x = pt(i, y0).x()
            p.drawText(QRectF(x - 20, box.bottom() + 2, 40, 14), Qt.AlignHCenter, f"{i:.0f}")
        p.drawText(QRectF(left, 0, box.width(), top), Qt.AlignRight | Qt.AlignVCenter, "iteration →")
        p.setPen(QPen(QColor("#4fc3f7"), 2))
        p.drawPolyline(QPolygonF([pt(i, lg) for i, lg in zip(its, logs)]))
        p.end()


def residual_ticks(log_lo: float, log_hi: float) -> tuple[list[float], list[str]]:
    """Tick positions (log10 of the residual) and labels for a residual axis spanning ``[log_lo, log_hi]``:
    the decades when there are two or more, else at least two round residual values inside the range."""
    decades = [float(k) for k in range(math.ceil(log_lo), math.floor(log_hi) + 1)]
    if len(decades) >= 2:
        return decades, [f"{10 ** k:.0e}" if abs(k) > 3 else f"{10 ** k:g}" for k in decades]
    lo, hi = 10 ** log_lo, 10 ** log_hi
    ticks = []
    for n in (4, 6, 8, 12):
        ticks = [t for t in nice_ticks(lo, hi, n) if t > 0]
        if len(ticks) >= 2:
            break
    if len(ticks) < 2:                   # a flat curve: its ends
        ticks = [lo, hi] if hi > lo else [lo]
    labels = [tick_label(t, ticks) if 1e-3 <= max(ticks) < 1e5 else f"{t:.3g}" for t in ticks]
    return [math.log10(t) for t in ticks], labels


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values (1, 2 or 5 times a power of ten) inside [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return ticks


def tick_label(v: float, ticks: list[float]) -> str:
    """A tick's text with as many digits as the spacing needs, never clipped to ".000301"-like stubs."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else abs(v) or 1.0
    big = max(abs(t) for t in ticks) if ticks else abs(v)
    if big >= 1e5 or (big and big < 1e-3):
        return f"{v:.2e}"
    digits = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    return f"{v:.{digits}f}"


def tick_margin(painter, ticks: list[float]) -> int:
    """The left margin that holds the widest tick label."""
    fm = painter.fontMetrics()
    return max([fm.horizontalAdvance(tick_label(t, ticks)) for t in ticks] + [20]) + 8


class ColourBar(QWidget):
    """A horizontal colour bar: the colour map from ``lo`` to ``hi`` with ticks and a label (what colour means)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.colours: list = []          # RGBA floats, sampled along the map
        self.lo, self.hi, self.label = 0.0, 1.0, ""
        self.setMinimumHeight(46)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def set_map(self, colours, lo: float, hi: float, label: str) -> None:
        self.colours = [tuple(float(c) for c in rgba) for rgba in colours]
        self.lo, self.hi, self.label = float(lo), float(hi), str(label)
        self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt name
        p = QPainter(self)
        fg = self.palette().color(self.foregroundRole())
        left, right = 10, 10
        width = max(self.width() - left - right, 1)
        p.setPen(QPen(fg, 1))
        p.drawText(QRectF(left, 0, width, 14), Qt.AlignLeft | Qt.AlignVCenter, self.label)
        bar = QRectF(left, 16, width, 12)
        n = len(self.colours)
        for k, rgba in enumerate(self.colours):
            c = QColor.fromRgbF(*rgba[:3])
            p.fillRect(QRectF(bar.left() + k * width / n, bar.top(), width / n + 1, bar.height()), c)
        p.drawRect(bar)
        ticks = nice_ticks(self.lo, self.hi, 5)
        for t in ticks:
            x = bar.left() + (t - self.lo) / ((self.hi - self.lo) or 1) * width
            p.drawLine(QPointF(x, bar.bottom()), QPointF(x, bar.bottom() + 3))
            p.drawText(QRectF(x - 40, bar.bottom() + 3, 80, 14), Qt.AlignHCenter, tick_label(t, ticks))
        p.end()
