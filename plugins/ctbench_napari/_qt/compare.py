"""Quantitative comparison of reconstructions: labelled grid, metrics against a reference, difference images,
a line profile and a histogram, shared contrast, and a single view that restores what was visible."""

from __future__ import annotations

import functools

import numpy as np
from qtpy.QtCore import QPointF, QRectF, Qt
from qtpy.QtGui import QColor, QPainter, QPen, QPolygonF
from qtpy.QtWidgets import (QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QHeaderView, QLabel, QPushButton,
                            QSizePolicy, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ctbench.workbench import metrics

from .._layers import KEY, LayerError, info, kind_of
from .common import LayerPicker, Steps, next_turn, report_errors, rows_height, same_layer, unwrap
from .cell_labels import overlay_of
from .display import prepare_sliders_for, set_contrast, set_visible, show_frame_steps
from .plot import ColourBar, nice_ticks, tick_label, tick_margin

LINKED_ATTRIBUTES = ("contrast_limits", "colormap", "gamma")
MASKS = {"all": "whole grid", "support": "support of the reference", "cylinder": "inscribed cylinder"}
COLOURS = ["#f0f0f0", "#4fc3f7", "#ffb74d", "#81c784", "#e57373", "#ba68c8"]


def _is_volume(layer) -> bool:
    return (layer.__class__.__name__ == "Image" and kind_of(layer) in (None, "volume") and not getattr(layer, "rgb", False)
            and layer.data.ndim in (2, 3) and not info(layer).get("difference"))


def _is_reference_like(layer) -> bool:
    """Volumes that are not reconstructions (phantoms, ground truth) are the natural reference."""
    return "recon" not in info(layer)


class CurvePlot(QWidget):
    """A few labelled curves on shared axes, drawn with QPainter (profiles, histograms).

    Title above the axes, round ticks on both axes with labels that fit their
    margin, and the legend in its own rows below the axes (never over a curve).
    """

    def __init__(self, title: str, xlabel: str, parent=None):
        super().__init__(parent)
        self.title, self.xlabel = title, xlabel
        self.curves: list[tuple[str, np.ndarray, np.ndarray]] = []
        self.setMinimumHeight(self._height(0))
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def _height(self, n_curves: int) -> int:
        line = self.fontMetrics().height()
        return 140 + 3 * line + (line + 2) * max(n_curves, 1)

    def set_curves(self, curves) -> None:
        self.curves = [(str(n), np.asarray(x, float), np.asarray(y, float)) for n, x, y in curves]
        self.setMinimumHeight(self._height(len(self.curves)))
        self.updateGeometry()
        self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt name
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        fg = self.palette().color(self.foregroundRole())
        line = p.fontMetrics().height()
        legend_h = (line + 2) * max(len(self.curves), 1)
        top, right, bottom = line + 4, 10, 2 * line + 8 + legend_h
        p.setPen(QPen(fg, 1))
        if not self.curves:
            p.drawText(QRectF(8, 0, self.width() - 16, top), Qt.AlignLeft | Qt.AlignVCenter, self.title)
            p.drawText(QRectF(8, top, self.width() - 16, self.height() - top), Qt.AlignCenter,
                       "compare results to see this")
            p.end()
            return
        x0 = min(float(c[1].min()) for c in self.curves)
        x1 = max(float(c[1].max()) for c in self.curves)
        y0 = min(float(np.nanmin(c[2])) for c in self.curves)
        y1 = max(float(np.nanmax(c[2])) for c in self.curves)
        x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
        yt, xt = nice_ticks(y0, y1, 4), nice_ticks(x0, x1, 5)
        left = tick_margin(p, yt)
        box = QRectF(left, top, max(self.width() - left - right, 1), max(self.height() - top - bottom, 1))
        p.drawText(QRectF(left, 0, box.width(), top), Qt.AlignLeft | Qt.AlignVCenter, self.title)
        p.drawRect(box)

        def px(x):
            return box.left() + (x - x0) / (x1 - x0) * box.width()

        def py(y):
            return box.bottom() - (y - y0) / (y1 - y0) * box.height()

        for t in yt:
            p.drawLine(QPointF(box.left() - 3, py(t)), QPointF(box.left(), py(t)))
            p.drawText(QRectF(0, py(t) - line / 2, left - 5, line), Qt.AlignRight | Qt.AlignVCenter,
                       tick_label(t, yt))
        for t in xt:
            p.drawLine(QPointF(px(t), box.bottom()), QPointF(px(t), box.bottom() + 3))
            p.drawText(QRectF(px(t) - 40, box.bottom() + 3, 80, line), Qt.AlignHCenter, tick_label(t, xt))
        p.drawText(QRectF(left, box.bottom() + 3 + line, box.width(), line), Qt.AlignHCenter, self.xlabel)
        fm = p.fontMetrics()
        for k, (name, xs, ys) in enumerate(self.curves):
            colour = QColor(COLOURS[k % len(COLOURS)])
            p.setPen(QPen(colour, 1.5))
            pts = [QPointF(px(x), py(y)) for x, y in zip(xs, ys)]
            p.drawPolyline(QPolygonF(pts))
            y = box.bottom() + 8 + 2 * line + (line + 2) * k   # the legend: below the axes, one row a curve
            p.setPen(QPen(colour, 3))
            p.drawLine(QPointF(left, y + line / 2), QPointF(left + 18, y + line / 2))
            p.setPen(QPen(fg, 1))
            p.drawText(QRectF(left + 24, y, box.width() - 24, line), Qt.AlignLeft | Qt.AlignVCenter,
                       fm.elidedText(name, Qt.ElideMiddle, int(box.width() - 24)))
        p.end()


class ComparePanel(QGroupBox):
    """Compare results: grid cells labelled with layer names, metrics, difference, profile, histogram.

    Layer visibility, contrast and the grid change on the GUI thread (cheap);
    metrics, profiles, histograms and difference images are computed in worker
    threads and land in the table, plots and layers when they are ready.
    """

    def __init__(self, viewer, results_source, parent=None):
        super().__init__("Compare", parent)
        self.viewer = viewer
        self.source = results_source          # the reconstruction widget (checked_results())
        self.message = results_source.message
        self.reference = LayerPicker(viewer, self._is_reference_candidate, prefer=_is_reference_like)
        self.reference.setToolTip("the volume the results are measured against (e.g. the phantom); only "
                                  "volumes on the grid of the results are offered")
        self.mask = QComboBox()
        for key, label in MASKS.items():
            self.mask.addItem(label, key)
        self.mask.setCurrentIndex(self.mask.findData("cylinder"))
        self.mask.setToolTip("where the metrics are computed")
        self.compare_button = QPushButton("Compare side by side")
        self.compare_button.setToolTip("grid of the reference and the checked results, labelled, with shared "
                                       "camera and contrast; metrics, profile and histogram below")
        self.difference_button = QPushButton("Difference images")
        self.difference_button.setToolTip("add result − reference for each checked result (signed colour map, "
                                          "colour bar below)")
        self.single_button = QPushButton("Single view")
        self.single_button.setToolTip("leave the grid; show again what was visible before comparing")
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["result", "RMSE", "PSNR (dB)", "SSIM"])
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(True)
        self.table.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        for c in (1, 2, 3):
            header.setSectionResizeMode(c, QHeaderView.ResizeToContents)
        self._fit_table()
        self.profile = CurvePlot("line profile (central row of the slice)", "x (mm)")
        self.histogram = CurvePlot("histogram inside the mask", "value")
        self.colour_bar = ColourBar()
        self.colour_bar.hide()
        # The grid cells' names in a Qt label, not as vispy text in each cell: under software OpenGL the
        # first draw of each cell's text (and its box) stalled the GUI thread for seconds.
        self.cells = QLabel()
        self.cells.setWordWrap(True)
        self.cells.setTextFormat(Qt.RichText)
        self.cells.setToolTip("what each grid cell shows (row, column: layer name)")
        self.cells.hide()
        form = QFormLayout()
        form.addRow("Reference", self.reference)
        form.addRow("Metrics inside", self.mask)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        row = QHBoxLayout()
        for b in (self.compare_button, self.difference_button, self.single_button):
            row.addWidget(b)
        layout.addLayout(row)
        layout.addWidget(self.cells)
        layout.addWidget(self.table)
        layout.addWidget(self.colour_bar)
        layout.addSpacing(6)
        layout.addWidget(self.profile)
        layout.addSpacing(6)
        layout.addWidget(self.histogram)
        self._saved_visibility: dict | None = None
        self.compared: list = []
        self.cell_list: list = []        # ((row, column), layer name) of each grid cell, as listed
        self.last_metrics: dict[str, metrics.Metrics] = {}
        self._generation = 0
        self._pending = 0
        self.steps = Steps(self)        # layers shown one per event-loop turn (one new layer per frame)
        self.compare_button.clicked.connect(lambda: self.compare())
        self.difference_button.clicked.connect(lambda: self.differences())
        self.single_button.clicked.connect(lambda: self.single_view())
        self.viewer.dims.events.point.connect(self._slice_moved)
        if hasattr(results_source, "result_added"):
            results_source.result_added.connect(lambda *_: self.reference.refresh())

    def _is_reference_candidate(self, layer) -> bool:
        """A volume on the grid of the results (any volume while there are none): never an unrelated image.
        A source that knows its reference (Calibrate: the exact geometry's reconstruction) decides alone."""
        own = getattr(self.source, "reference_candidate", None)
        if own is not None:
            return bool(own(layer))
        if not _is_volume(layer):
            return False
        results = [x for x in getattr(self.source, "results", []) if x in self.viewer.layers]
        return not results or tuple(np.shape(layer.data)) in {tuple(np.shape(x.data)) for x in results}

    @property
    def busy(self) -> bool:
        """Whether metrics, plots or difference images are still being computed or shown."""
        return self._pending > 0 or self.steps.pending > 0

    def _fit_table(self) -> None:
        """The table is as tall as its rows (every metric row visible; it scrolls beyond 8 rows)."""
        h = self.table.horizontalHeader().height() + rows_height(self.table, 8) + 2 * self.table.frameWidth() + 2
        self.table.setFixedHeight(max(h, 60))

    def _show_error(self, e) -> None:
        from .common import error_text
        self.message.error(error_text(e))

    def _in_thread(self, work, done) -> None:
        from .common import error_text, is_deleted, start_worker

        self._pending += 1

        def deliver(res):
            if is_deleted(self):
                return      # closed while the numbers were computed
            try:
                done(res)
            except Exception as e:  # noqa: BLE001 - a display problem shows in the widget
                self.message.error(error_text(e))

        def finished():
            self._pending = max(0, self._pending - 1)

        start_worker(work, on_return=deliver, on_error=lambda e: self.message.error(error_text(e)),
                     on_finished=finished, owner=self)

    # ------------------------------------------------------------ actions
    @report_errors
    def compare(self, *_, layers=None) -> list:
        """Grid of the reference and the chosen results: labelled cells, one camera, shared contrast."""
        chosen = list(layers) if layers is not None else self.source.checked_results()
        ref = self.reference.layer()
        if ref is not None and ref in chosen:
            chosen.remove(ref)
        if len(chosen) + (ref is not None) < 2:
            raise LayerError("check at least two results, or one result and a reference, to compare "
                             "(run two reconstructions first)")
        shown = ([ref] if ref is not None else []) + chosen
        if self._saved_visibility is None:
            self._saved_visibility = {id(unwrap(x)): (unwrap(x), x.visible) for x in self.viewer.layers}
        self.steps.cancel()
        for layer in self.viewer.layers:
            set_visible(layer, same_layer(layer, shown[0]) or (layer.visible and layer in shown))
        # Shared contrast: the reference's window (the phantom's), else the first result's own limits.
        window = tuple(ref.contrast_limits) if ref is not None else tuple(chosen[0].contrast_limits)
        self.viewer.layers.unlink_layers(shown, LINKED_ATTRIBUTES)
        for layer in shown:
            set_contrast(layer, window)
            layer.colormap = shown[0].colormap
        self.viewer.layers.link_layers(shown, LINKED_ATTRIBUTES)
        grid = _grid(self.viewer)
        grid.stride = 1
        hold_grid_shape(self.viewer, len(shown))
        self.compared = shown
        self._update_numbers()
        # The cells appear one per frame: a layer drawn for the first time builds its shaders, and under
        # software OpenGL five of them in one frame block the event loop for seconds.  The grid itself (its
        # view boxes and cameras) is built in a turn of its own, after the click's layer changes.
        hidden = [x for x in shown if not x.visible]
        steps = [functools.partial(set_visible, x, True) for x in hidden]
        self.show_cells(shown)                         # names listed at once; positions once all are shown
        self.steps.run([next_turn, functools.partial(setattr, grid, "enabled", True), *steps,
                        *show_frame_steps(self.viewer, shown, ndisplay=2),
                        lambda: release_grid_shape(self.viewer), functools.partial(self.show_cells, shown)],
                       on_error=self._show_error, later=True)      # the grid two turns after the click
        self.message.note("one camera for all cells; contrast, colormap and gamma are shared"
                          + (f"; metrics against '{ref.name}' inside the {self.mask.currentText()}" if ref else ""))
        return shown

    @report_errors
    def differences(self, *_) -> None:
        """Add ``result − reference`` layers (signed colour map, symmetric limits, a colour bar) in a worker."""
        ref = self.reference.layer()
        if ref is None:
            raise LayerError("pick a reference volume to subtract (e.g. the phantom)")
        chosen = self.source.checked_results()
        if not chosen:
            raise LayerError("check the results to subtract the reference from")
        b = np.asarray(ref.data)
        jobs = []
        for layer in chosen:
            a = np.asarray(layer.data)
            if a.shape != b.shape:
                raise LayerError(f"'{layer.name}' is on a {a.shape} grid and the reference '{ref.name}' on "
                                 f"{b.shape}; differences need the same grid")
            jobs.append((layer, a))
        ref_name = ref.name

        def work():
            out = []
            for layer, a in jobs:
                d = np.asarray(a, np.float32) - np.asarray(b, np.float32)
                m = float(np.percentile(np.abs(d), 99.5)) or 1e-6
                out.append((layer, d, m))
            return out

        made = {}

        def model(layer, d, m):
            # The layer's model and the sliders it will need, in a turn before its add (see _add_steps in
            # reconstruction.py): the add then changes no geometry.  Short cell label; full names in the metadata.
            from napari.layers import Image

            name = f"difference: {_short(layer.name)}"
            meta = {KEY: {"kind": "volume", "difference": {"result": layer.name, "reference": ref_name}}}
            # Hidden until its own turn (show): napari's add (controls, visual, selection) and the layer's
            # first draw were one turn and one repaint together.
            made[name] = Image(d, name=name, scale=layer.scale, translate=layer.translate, units=layer.units,
                               multiscale=False,
                               colormap=DIFFERENCE_COLORMAP, contrast_limits=(-m, m), metadata=meta,
                               visible=False)
            prepare_sliders_for(self.viewer, made[name])

        def add(layer, d, m):
            name = f"difference: {_short(layer.name)}"
            if name in self.viewer.layers:
                self.viewer.layers.remove(name)
            self.differences_added.append(self.viewer.add_layer(made.pop(name)))

        def show(*_):
            new = self.differences_added[-1]
            if new in self.viewer.layers:
                set_visible(new, True)

        def kept_results():
            # The results stay in the grid, the reference leaves it: result − reference already says how each
            # result departs from it, and with n results beside their n differences the grid keeps the shape
            # of the comparison (reference + 2 results and 2 results + 2 differences are both 2 x 2), so no
            # grid rebuild (every view box and camera, 0.2-0.6 s under software OpenGL) happens in any turn.
            return [x for x in self.compared if x in self.viewer.layers and not same_layer(x, ref)]

        def grid_for(out):
            # The grid of the final cells, held before any cell changes (see hold_grid_shape).
            hold_grid_shape(self.viewer, len(kept_results()) + len(out))
            _grid(self.viewer).enabled = True

        def start(out):
            if self._saved_visibility is None:
                self._saved_visibility = {id(unwrap(x)): (unwrap(x), x.visible) for x in self.viewer.layers}
            kept = kept_results()
            for x in self.viewer.layers:
                set_visible(x, x in kept)

        def done(out):
            # One new layer per frame (see compare): its model, its add and its first draw in turns of their
            # own; then the grid is fitted and the key shown.
            self.steps.cancel()
            each = [f for x in out for f in (functools.partial(model, *x), functools.partial(add, *x), show)]
            self.steps.run([functools.partial(grid_for, out), functools.partial(start, out), *each,
                            lambda: release_grid_shape(self.viewer), functools.partial(finish, out)],
                           on_error=self._show_error)

        def finish(out):
            # The frame (visibility, 2D, slice and camera) one napari update per turn, then the cell list and
            # the key: together they were one turn of a draw and the dock's relayout.
            shown = kept_results() + self.differences_added
            self.steps.extend([*show_frame_steps(self.viewer, shown, ndisplay=2),
                               functools.partial(self.show_cells, shown), functools.partial(key, out)])

        def key(out):
            added = self.differences_added
            m = max(x[2] for x in out)
            self.colour_bar.set_map(added[0].colormap.map(np.linspace(0, 1, 64)), -m, m,
                                    f"difference (result − reference), 1/mm: {DIFFERENCE_COLORMAP} colour map")
            self.colour_bar.show()
            self.message.note(f"{len(added)} difference image(s): green where the result is above the "
                              "reference, pink below (colour bar below the table)")

        self.differences_added = []
        self._in_thread(work, done)

    def single_view(self, *_) -> None:
        """Leave grid mode, unlink, hide the cell list and restore the visibility from before comparing."""
        self.steps.cancel()
        _grid(self.viewer).enabled = False
        release_grid_shape(self.viewer)
        self.cells.clear()
        self.cells.hide()
        self.cell_list = []
        overlay = overlay_of(self.viewer)
        if overlay is not None:
            overlay.hide()
        if self.compared:
            alive = [x for x in self.compared if x in self.viewer.layers]
            if len(alive) > 1:
                self.viewer.layers.unlink_layers(alive, LINKED_ATTRIBUTES)
        saved = self._saved_visibility or {}
        for layer in self.viewer.layers:
            key = id(unwrap(layer))
            if key in saved and saved[key][0] is unwrap(layer):
                set_visible(layer, saved[key][1])
            elif info(layer).get("difference"):
                set_visible(layer, False)      # made while comparing: it belongs to the grid, not the single view
        self._saved_visibility = None
        self.compared = []
        self.colour_bar.hide()
        visible = [x for x in self.viewer.layers if x.visible]
        if visible:
            self.viewer.fit_to_view(layers=visible)

    def show_cells(self, shown) -> None:
        """List the grid cells in reading order (row, column: name) in the Qt label above the table."""
        import html

        cells = sorted((_cell(self.viewer, layer) or (0, i), layer.name) for i, layer in enumerate(shown))
        self.cell_list = cells
        items = [f"<b>{r + 1},{c + 1}</b>&nbsp;{html.escape(name)}" for (r, c), name in self.cell_list]
        self.cells.setText("<b>Grid cells</b> (row, column): " + " &nbsp;·&nbsp; ".join(items))
        self.cells.show()
        grid = _grid(self.viewer)
        overlay = overlay_of(self.viewer)
        if overlay is not None:
            if grid.enabled:        # each cell's name in its corner, on the canvas
                overlay.show(cells, grid.actual_shape(list(self.viewer.layers)))
            else:
                overlay.hide()

    # ------------------------------------------------------------ numbers
    def _mask(self, ref_data: np.ndarray):
        return _mask_for(self.mask.currentData(), ref_data)

    def _update_numbers(self) -> None:
        """Metrics, profile and histogram of the compared layers, computed in a worker thread."""
        ref = self.reference.layer()
        results = [x for x in self.compared if not same_layer(x, ref)]
        self._generation += 1
        gen = self._generation
        mask_key = self.mask.currentData()
        ref_data = None if ref is None else np.asarray(ref.data)
        items = [(x.name, np.asarray(x.data)) for x in results]
        plots = self._plot_inputs()

        def work():
            rows, found = [], {}
            if ref_data is not None:
                b = np.asarray(ref_data, np.float64)
                mask = _mask_for(mask_key, b)
                for name, data in items:
                    if data.shape != b.shape:
                        rows.append((name, ["other grid"] * 3))
                        continue
                    m = metrics.compare(np.asarray(data, np.float64), b, mask)
                    found[name] = m
                    rows.append((name, [f"{m.rmse:.3g}", f"{m.psnr:.2f}", f"{m.ssim:.3f}"]))
            return rows, found, _plot_curves(*plots)

        def done(res):
            if gen != self._generation:
                return          # a newer comparison is on its way
            rows, found, curves = res
            self.last_metrics = found
            self.table.setRowCount(0)
            for name, values in rows:
                self._row(name, values)
            self._fit_table()
            self._show_curves(curves)

        self._in_thread(work, done)

    def _row(self, name, values) -> None:
        r = self.table.rowCount()
        self.table.insertRow(r)
        for c, v in enumerate([name, *values]):
            item = QTableWidgetItem(v)
            item.setToolTip(name if c == 0 else v)
            self.table.setItem(r, c, item)

    def _current_index(self, layer) -> int | None:
        """The z index of ``layer`` at the viewer's current z (None for a 2D layer)."""
        if np.ndim(layer.data) == 2:
            return None
        z = self.viewer.dims.point[self.viewer.dims.ndim - 3]
        k = int(round((z - layer.translate[0]) / layer.scale[0]))
        return int(np.clip(k, 0, layer.data.shape[0] - 1))

    def _plot_inputs(self):
        """What the plots need, read on the GUI thread (layer state), computed on in a worker."""
        if not self.compared:
            return [], None, None, None
        lo, hi = self.compared[0].contrast_limits
        ref = self.reference.layer()
        entries = [(x.name, np.asarray(x.data), self._current_index(x), float(x.translate[-1]), float(x.scale[-1]))
                   for x in self.compared]
        return entries, (float(lo), float(hi)), self.mask.currentData(), \
            None if ref is None else np.asarray(ref.data)

    def _show_curves(self, curves) -> None:
        profiles, hists = curves
        self.profile.set_curves(profiles)
        self.histogram.set_curves(hists)

    def _update_plots(self) -> None:
        plots = self._plot_inputs()
        gen = self._generation

        def done(curves):
            if gen == self._generation:
                self._show_curves(curves)
        self._in_thread(lambda: _plot_curves(*plots), done)

    def _slice_moved(self, *_):
        if self.compared and all(x in self.viewer.layers for x in self.compared):
            self._update_plots()


DIFFERENCE_COLORMAP = "PiYG"


def _mask_for(key, ref_data: np.ndarray):
    if key == "support":
        return metrics.support_mask(ref_data, 0.05)
    if key == "cylinder":
        return metrics.cylinder_mask(ref_data.shape, 0.95)
    return None


def _plot_curves(entries, window, mask_key, ref_data):
    """(profiles, histograms) of the compared layers: pure numpy, runs in a worker thread."""
    if not entries:
        return [], []
    lo, hi = window
    mask = _mask_for(mask_key, np.asarray(ref_data)) if ref_data is not None else None
    profiles, hists = [], []
    for name, data, k, x0, dx in entries:
        plane = data if k is None else data[k]
        row = (plane.shape[0] - 1) / 2
        dist, vals = metrics.line_profile(plane, (row, 0), (row, plane.shape[1] - 1), n=plane.shape[1])
        profiles.append((name, x0 + dist * dx, vals))
        m = mask if mask is not None and mask.shape == data.shape else None
        counts, edges = metrics.histogram(data, bins=64, value_range=(lo, hi), mask=m)
        hists.append((name, (edges[:-1] + edges[1:]) / 2, counts))
    return profiles, hists


def _short(name: str, n: int = 32) -> str:
    return name if len(name) <= n else name[:n - 1] + "…"


def _cell(viewer, layer) -> tuple[int, int] | None:
    """(row, column) of ``layer``'s grid cell, or None when the grid cannot say (hidden, older napari)."""
    grid = _grid(viewer)
    try:
        index = list(viewer.layers).index(layer)
        try:
            pos = grid.position(index, viewer.layers)
        except TypeError:             # napari before 0.6: position(index, n_layers)
            pos = grid.position(index, len(viewer.layers))
    except (ValueError, AttributeError):
        return None
    pos = tuple(int(v) for v in pos)
    return None if pos[0] < 0 else pos


def auto_grid_shape(n_cells: int) -> tuple[int, int]:
    """(rows, columns) napari's grid picks for ``n_cells`` cells (its ``actual_shape`` with shape (-1, -1))."""
    n = max(int(n_cells), 1)
    cols = int(np.ceil(np.sqrt(n)))
    return int(np.ceil(n / cols)), cols


def hold_grid_shape(viewer, n_cells: int) -> None:
    """Fix the grid at the shape of its final ``n_cells`` while cells appear one per turn.

    napari rebuilds every view box and camera of the grid whenever its shape changes, and with an automatic
    shape every cell shown (1 -> 2 -> 4 cells) or layer added changed it: one rebuild per step, 0.2-0.4 s
    each under software OpenGL.  Held, the cells fill a grid built once; ``release_grid_shape`` then
    hands the shape back to napari, which computes the same one."""
    grid = _grid(viewer)
    shape = auto_grid_shape(n_cells)
    if tuple(grid.shape) != shape:
        grid.shape = shape


def release_grid_shape(viewer) -> None:
    """The grid's shape back to napari's automatic one (-1, -1)."""
    grid = _grid(viewer)
    if tuple(grid.shape) != (-1, -1):
        grid.shape = (-1, -1)


def _grid(viewer):
    """The viewer's grid model (``viewer.canvas.grid`` since napari 0.9, ``viewer.grid`` before)."""
    canvas = getattr(viewer, "canvas", None)
    return canvas.grid if canvas is not None and hasattr(canvas, "grid") else viewer.grid
