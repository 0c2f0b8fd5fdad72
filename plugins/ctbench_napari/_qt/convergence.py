"""The Calibrate step's convergence plot: the misfit per outer iteration, stages marked, readable ticks.

Drawn with QPainter like the other plots (plot.py's tick helpers).  The y axis
is logarithmic when the misfit spans a decade or more, linear otherwise, and a
linear axis of very small or large numbers shares one exponent in its label
("misfit (×10⁻³)") instead of printing ".0016".  Every tick label gets a box
measured with the widget's font, so the margins grow with the labels; the
stage names sit in a band above the axes (never over the curve), and the plot
has a fixed height, so a redraw never resizes the panel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from qtpy.QtCore import QPointF, QRectF, Qt
from qtpy.QtGui import QColor, QFontMetrics, QPainter, QPen, QPolygonF
from qtpy.QtWidgets import QSizePolicy, QWidget

from .plot import nice_ticks, tick_label

CURVE = "#4fc3f7"
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
BOX_HEIGHT = 120           # pixels of the axes box itself


@dataclass
class Tick:
    value: float
    text: str
    rect: QRectF           # where the text is drawn (wide and tall enough for it in the widget's font)


@dataclass
class PlotLayout:
    """Where everything goes for the current points and size (what paintEvent draws; tests measure it)."""

    box: QRectF
    log: bool
    lo: float                      # y range (log10 of the misfit on a log axis)
    hi: float
    x0: float
    x1: float
    yticks: list[Tick] = field(default_factory=list)
    xticks: list[Tick] = field(default_factory=list)
    ylabel: str = ""
    ylabel_rect: QRectF = field(default_factory=QRectF)
    xlabel_rect: QRectF = field(default_factory=QRectF)
    title_rect: QRectF = field(default_factory=QRectF)
    stages: list[tuple[float, str, QRectF]] = field(default_factory=list)   # (boundary x, name, name's box)

    def at(self, iteration: float, y: float) -> QPointF:
        """Widget coordinates of a point (``y`` as on the axis: log10 of the misfit on a log axis)."""
        return QPointF(self.box.left() + (iteration - self.x0) / (self.x1 - self.x0) * self.box.width(),
                       self.box.bottom() - (y - self.lo) / ((self.hi - self.lo) or 1.0) * self.box.height())


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values for a log axis over [lo, hi] (values, not logs): decades, or 1-2-5 steps in a short range."""
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    decades = [10.0 ** k for k in range(k0, k1 + 1) if lo * (1 - 1e-9) <= 10.0 ** k <= hi * (1 + 1e-9)]
    if len(decades) >= 3:
        step = max(1, math.ceil(len(decades) / 5))      # at most about five labels
        return decades[::step]
    return [m * 10.0 ** k for k in range(k0, k1 + 1) for m in (1, 2, 5)
            if lo * (1 - 1e-9) <= m * 10.0 ** k <= hi * (1 + 1e-9)]


def log_label(v: float) -> str:
    """0.001 -> "0.001", 2e-5 -> "2e-5", 3e6 -> "3e6": plain where short, else mantissa and exponent."""
    if 1e-3 <= v < 1e4:
        return f"{v:g}"
    m, e = f"{v:.0e}".split("e")
    return f"{m}e{int(e)}"


def shared_exponent(ticks: list[float]) -> int:
    """The power of ten a linear axis's labels share (0 when plain numbers read well)."""
    big = max((abs(t) for t in ticks), default=0.0)
    if big == 0:
        return 0
    e = math.floor(math.log10(big))
    return e if e < -2 or e > 3 else 0


class ConvergencePlot(QWidget):
    """Misfit against outer iteration; ``add`` once per progress step (it only schedules a repaint)."""

    def __init__(self, title: str = "relative misfit |Ax − y|² / |y|²", ylabel: str = "misfit",
                 xlabel: str = "outer iteration", parent=None):
        super().__init__(parent)
        self.title, self.ylabel, self.xlabel = title, ylabel, xlabel
        self.points: list[tuple[int, float]] = []
        self.stage_starts: list[tuple[int, str]] = []      # (first iteration of a stage, its name)
        self.paints = 0                                     # paint events drawn (tests count redraws)
        line = self.fontMetrics().height()
        # title, stage band, box, x tick labels, x label: a fixed height, so redraws never resize the panel
        self.setFixedHeight(BOX_HEIGHT + 4 * line + 14)
        self.setMinimumWidth(240)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def clear(self) -> None:
        self.points, self.stage_starts = [], []
        self.update()

    def add(self, iteration: int, loss: float | None, stage: str | None = None) -> None:
        """One outer iteration's misfit; a ``stage`` name unlike the previous one starts a new marked stage."""
        if loss is None or not math.isfinite(loss) or loss <= 0:
            return
        self.points.append((int(iteration), float(loss)))
        if stage is not None and (not self.stage_starts or self.stage_starts[-1][1] != stage):
            self.stage_starts.append((int(iteration), str(stage)))
        self.update()

    # ------------------------------------------------------------ layout
    def plot_layout(self, fm: QFontMetrics | None = None) -> PlotLayout | None:
        """Axes, ticks, labels and stage marks for the current points and size; None without points."""
        if not self.points:
            return None
        fm = fm or self.fontMetrics()
        line = fm.height()
        its = [i for i, _ in self.points]
        losses = [v for _, v in self.points]
        x0, x1 = float(min(its)), float(max(max(its), min(its) + 1))
        vmin, vmax = min(losses), max(losses)
        log = vmax / vmin >= 10.0
        ylabel = self.ylabel
        if log:
            values = log_ticks(vmin, vmax)
            span = math.log10(vmax) - math.log10(vmin)
            lo, hi = math.log10(vmin) - 0.04 * span, math.log10(vmax) + 0.04 * span   # ticks off the edges
            ys = [(math.log10(v), log_label(v)) for v in values]
            ylabel += " (log scale)"
        else:
            pad = (vmax - vmin) * 0.08 or abs(vmax) * 0.05 or 1.0
            lo, hi = vmin - pad, vmax + pad
            values = next(t for n in (4, 5, 7, 10) if len(t := nice_ticks(lo, hi, n)) >= 3 or n == 10)
            e = shared_exponent(values)
            scaled = [v / 10.0 ** e for v in values]
            ys = [(v, tick_label(s, scaled)) for v, s in zip(values, scaled)]
            if e:
                ylabel += f" (×10{str(e).translate(SUPERSCRIPT)})"
        label_w = max(fm.horizontalAdvance(t) for _, t in ys)
        # left: the rotated axis label, a gap, the widest tick label, a gap, the tick mark
        left = line + 4 + label_w + 6
        top = 2 * line + 6
        right = max(10, fm.horizontalAdvance(f"{int(x1)}") // 2 + 4)   # the last x label stays inside
        box = QRectF(left, top, max(self.width() - left - right, 1), BOX_HEIGHT)
        lay = PlotLayout(box, log, lo, hi, x0, x1, ylabel=ylabel,
                         ylabel_rect=QRectF(0, box.top(), line, box.height()),
                         xlabel_rect=QRectF(box.left(), box.bottom() + 3 + line, box.width(), line),
                         title_rect=QRectF(4, 0, self.width() - 8, line + 2))
        for v, t in ys:
            y = lay.at(x0, v).y()
            lay.yticks.append(Tick(10.0 ** v if log else v, t, QRectF(line + 4, y - line / 2, label_w + 2, line)))
        for v in [t for t in nice_ticks(x0, x1, 6) if float(t).is_integer()] or [x0, x1]:
            t = f"{v:.0f}"
            w = fm.horizontalAdvance(t) + 4
            x = lay.at(v, lo).x()
            # kept clear of the lowest y label (which ends 4 px left of the axes)
            lay.xticks.append(Tick(v, t, QRectF(max(x - w / 2, box.left() - 3), box.bottom() + 3, w, line)))
        # Stages: a dashed line half-way between the last iteration of one stage and the first of the next,
        # and the stage's name centred over its span in the band between the title and the axes.
        starts = self.stage_starts
        for k, (first, name) in enumerate(starts):
            a = box.left() if k == 0 else lay.at(first - 0.5, lo).x()
            b = box.right() if k + 1 == len(starts) else lay.at(starts[k + 1][0] - 0.5, lo).x()
            text = fm.elidedText(name, Qt.ElideRight, int(max(b - a - 4, 0)))
            lay.stages.append((a, text, QRectF(a + 2, line + 3, max(b - a - 4, 0), line)))
        return lay

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt name
        self.paints += 1
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        fg = self.palette().color(self.foregroundRole())
        p.setPen(QPen(fg, 1))
        lay = self.plot_layout(p.fontMetrics())
        line = p.fontMetrics().height()
        if lay is None:
            p.drawText(QRectF(4, 0, self.width() - 8, line + 2), Qt.AlignLeft | Qt.AlignVCenter, self.title)
            p.drawText(QRectF(0, line, self.width(), self.height() - line), Qt.AlignCenter, "no iterations yet")
            p.end()
            return
        box = lay.box
        p.drawText(lay.title_rect, Qt.AlignLeft | Qt.AlignVCenter, self.title)
        p.drawRect(box)
        faint = QColor(fg)
        faint.setAlpha(60)

        for t in lay.yticks:
            y = t.rect.center().y()
            p.setPen(QPen(faint, 1))
            p.drawLine(QPointF(box.left(), y), QPointF(box.right(), y))
            p.setPen(QPen(fg, 1))
            p.drawLine(QPointF(box.left() - 3, y), QPointF(box.left(), y))
            p.drawText(t.rect, Qt.AlignRight | Qt.AlignVCenter, t.text)
        for t in lay.xticks:
            x = t.rect.center().x()
            p.drawLine(QPointF(x, box.bottom()), QPointF(x, box.bottom() + 3))
            p.drawText(t.rect, Qt.AlignHCenter | Qt.AlignTop, t.text)
        p.drawText(lay.xlabel_rect, Qt.AlignHCenter | Qt.AlignTop, self.xlabel)
        p.save()                                  # the y label, rotated, centred along the axis
        r = lay.ylabel_rect
        p.translate(r.center())
        p.rotate(-90)
        p.drawText(QRectF(-r.height() / 2, -r.width() / 2, r.height(), r.width()), Qt.AlignCenter,
                   p.fontMetrics().elidedText(lay.ylabel, Qt.ElideRight, int(r.height())))
        p.restore()
        dashed = QPen(fg, 1, Qt.DashLine)
        for k, (x, name, rect) in enumerate(lay.stages):
            if k:
                p.setPen(dashed)
                p.drawLine(QPointF(x, box.top() - line - 3), QPointF(x, box.bottom()))
            p.setPen(QPen(fg, 1))
            p.drawText(rect, Qt.AlignHCenter | Qt.AlignVCenter, name)
        p.setPen(QPen(QColor(CURVE), 2))
        ys = [math.log10(v) if lay.log else v for _, v in self.points]
        pts = [lay.at(i, y) for (i, _), y in zip(self.points, ys)]
        if len(pts) == 1:
            p.setBrush(QColor(CURVE))
            p.drawEllipse(pts[0], 2.5, 2.5)
        else:
            p.drawPolyline(QPolygonF(pts))
        p.end()
