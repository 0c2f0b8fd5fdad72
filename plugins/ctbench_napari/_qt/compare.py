"""Quantitative comparison of reconstructions: labelled grid, metrics against a reference, difference images,
a line profile and a histogram, shared contrast, and a single view that restores what was visible."""

from __future__ import annotations

import numpy as np
from qtpy.QtCore import QPointF, QRectF, Qt
from qtpy.QtGui import QColor, QPainter, QPen, QPolygonF
from qtpy.QtWidgets import (QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QHeaderView, QPushButton, QSizePolicy,
                            QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ctbench.workbench import metrics

from .._layers import KEY, LayerError, info, kind_of
from .common import LayerPicker, report_errors, same_layer, unwrap
from .display import set_contrast, show_frame

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
    """A few labelled curves on shared axes, drawn with QPainter (profiles, histograms)."""

    def __init__(self, title: str, xlabel: str, parent=None):
        super().__init__(parent)
        self.title, self.xlabel = title, xlabel
        self.curves: list[tuple[str, np.ndarray, np.ndarray]] = []
        self.setMinimumHeight(120)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def set_curves(self, curves) -> None:
        self.curves = [(str(n), np.asarray(x, float), np.asarray(y, float)) for n, x, y in curves]
        self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt name
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        fg = self.palette().color(self.foregroundRole())
        left, right, top, bottom = 62, 8, 16, 18
        box = QRectF(left, top, max(self.width() - left - right, 1), max(self.height() - top - bottom, 1))
        p.setPen(QPen(fg, 1))
        p.drawRect(box)
        p.drawText(QRectF(left, 0, box.width(), top), Qt.AlignLeft | Qt.AlignVCenter, self.title)
        if not self.curves:
            p.drawText(box, Qt.AlignCenter, "compare results to see this")
            p.end()
            return
        x0 = min(float(c[1].min()) for c in self.curves)
        x1 = max(float(c[1].max()) for c in self.curves)
        y0 = min(float(np.nanmin(c[2])) for c in self.curves)
        y1 = max(float(np.nanmax(c[2])) for c in self.curves)
        x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
        p.drawText(QRectF(0, top - 6, left - 4, 14), Qt.AlignRight, _fmt(y1))
        p.drawText(QRectF(0, box.bottom() - 8, left - 4, 14), Qt.AlignRight, _fmt(y0))
        p.drawText(QRectF(left, box.bottom() + 2, box.width(), 14), Qt.AlignLeft, f"{x0:.3g}")
        p.drawText(QRectF(left, box.bottom() + 2, box.width(), 14), Qt.AlignHCenter, self.xlabel)
        p.drawText(QRectF(left, box.bottom() + 2, box.width(), 14), Qt.AlignRight, f"{x1:.3g}")
        for k, (name, xs, ys) in enumerate(self.curves):
            colour = QColor(COLOURS[k % len(COLOURS)])
            p.setPen(QPen(colour, 1.5))
            pts = [QPointF(box.left() + (x - x0) / (x1 - x0) * box.width(),
                           box.bottom() - (y - y0) / (y1 - y0) * box.height()) for x, y in zip(xs, ys)]
            p.drawPolyline(QPolygonF(pts))
            p.drawText(QRectF(box.left() + 4, box.top() + 2 + 13 * k, box.width() - 8, 13), Qt.AlignRight,
                       name if len(name) <= 34 else name[:33] + "…")
        p.end()


class ComparePanel(QGroupBox):
    """Compare results: grid cells labelled with layer names, metrics, difference, profile, histogram."""

    def __init__(self, viewer, results_source, parent=None):
        super().__init__("Compare", parent)
        self.viewer = viewer
        self.source = results_source          # the reconstruction widget (checked_results())
        self.message = results_source.message
        self.reference = LayerPicker(viewer, _is_volume, prefer=_is_reference_like)
        self.reference.setToolTip("the volume the results are measured against (e.g. the phantom)")
        self.mask = QComboBox()
        for key, label in MASKS.items():
            self.mask.addItem(label, key)
        self.mask.setCurrentIndex(self.mask.findData("cylinder"))
        self.mask.setToolTip("where the metrics are computed")
        self.compare_button = QPushButton("Compare side by side")
        self.compare_button.setToolTip("grid of the reference and the checked results, labelled, with shared "
                                       "camera and contrast; metrics, profile and histogram below")
        self.difference_button = QPushButton("Difference images")
        self.difference_button.setToolTip("add result − reference for each checked result (blue below, red above)")
        self.single_button = QPushButton("Single view")
        self.single_button.setToolTip("leave the grid; show again what was visible before comparing")
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["result", "RMSE", "PSNR (dB)", "SSIM"])
        self.table.verticalHeader().setVisible(False)
        self.table.setMaximumHeight(110)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        for c in (1, 2, 3):
            header.setSectionResizeMode(c, QHeaderView.ResizeToContents)
        self.profile = CurvePlot("line profile (central row of the slice)", "x (mm)")
        self.histogram = CurvePlot("histogram inside the mask", "value")
        form = QFormLayout()
        form.addRow("Reference", self.reference)
        form.addRow("Metrics inside", self.mask)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        row = QHBoxLayout()
        for b in (self.compare_button, self.difference_button, self.single_button):
            row.addWidget(b)
        layout.addLayout(row)
        layout.addWidget(self.table)
        layout.addWidget(self.profile)
        layout.addWidget(self.histogram)
        self._saved_visibility: dict | None = None
        self.compared: list = []
        self.last_metrics: dict[str, metrics.Metrics] = {}
        self.compare_button.clicked.connect(lambda: self.compare())
        self.difference_button.clicked.connect(lambda: self.differences())
        self.single_button.clicked.connect(lambda: self.single_view())
        self.viewer.dims.events.point.connect(self._slice_moved)

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
        for layer in self.viewer.layers:
            layer.visible = layer in shown
        # Shared contrast: the reference's window (the phantom's), else the first result's percentiles.
        window = tuple(ref.contrast_limits) if ref is not None else metrics.percentile_window(np.asarray(chosen[0].data))
        self.viewer.layers.unlink_layers(shown, LINKED_ATTRIBUTES)
        for layer in shown:
            set_contrast(layer, window)
            layer.colormap = shown[0].colormap
        self.viewer.layers.link_layers(shown, LINKED_ATTRIBUTES)
        for layer in shown:
            _label(layer)                              # each grid cell says what it shows
        grid = _grid(self.viewer)
        grid.stride = 1
        grid.enabled = True
        show_frame(self.viewer, shown, ndisplay=2)
        self.compared = shown
        self._update_numbers()
        self.message.note("one camera for all cells; contrast, colormap and gamma are shared"
                          + (f"; metrics against '{ref.name}' inside the {self.mask.currentText()}" if ref else ""))
        return shown

    @report_errors
    def differences(self, *_) -> list:
        """Add ``result − reference`` layers (symmetric diverging colormap) for the checked results."""
        ref = self.reference.layer()
        if ref is None:
            raise LayerError("pick a reference volume to subtract (e.g. the phantom)")
        added = []
        for layer in self.source.checked_results():
            a, b = np.asarray(layer.data, np.float32), np.asarray(ref.data, np.float32)
            if a.shape != b.shape:
                raise LayerError(f"'{layer.name}' is on a {a.shape} grid and the reference '{ref.name}' on "
                                 f"{b.shape}; differences need the same grid")
            d = a - b
            name = f"difference: {layer.name} − {ref.name}"
            m = float(np.percentile(np.abs(d), 99.5)) or 1e-6
            meta = {KEY: {"kind": "volume", "difference": {"result": layer.name, "reference": ref.name}}}
            if name in self.viewer.layers:
                self.viewer.layers.remove(name)
            new = self.viewer.add_image(d, name=name, scale=layer.scale, translate=layer.translate,
                                        colormap="PiYG", contrast_limits=(-m, m), metadata=meta)
            _label(new)
            added.append(new)
        if not added:
            raise LayerError("check the results to subtract the reference from")
        grid = _grid(self.viewer)
        shown = [x for x in self.compared if x in self.viewer.layers] + added
        if self._saved_visibility is None:
            self._saved_visibility = {id(unwrap(x)): (unwrap(x), x.visible) for x in self.viewer.layers
                                      if x not in added}
        for layer in self.viewer.layers:
            layer.visible = layer in shown
        grid.enabled = True
        show_frame(self.viewer, shown, ndisplay=2)
        self.message.note(f"{len(added)} difference image(s): green where the result is above the reference, "
                          "pink below")
        return added

    def single_view(self, *_) -> None:
        """Leave grid mode, unlink, hide the cell labels and restore the visibility from before comparing."""
        _grid(self.viewer).enabled = False
        for layer in self.viewer.layers:
            layer.name_overlay.visible = False
        if self.compared:
            alive = [x for x in self.compared if x in self.viewer.layers]
            if len(alive) > 1:
                self.viewer.layers.unlink_layers(alive, LINKED_ATTRIBUTES)
        saved = self._saved_visibility or {}
        for layer in self.viewer.layers:
            key = id(unwrap(layer))
            if key in saved and saved[key][0] is unwrap(layer):
                layer.visible = saved[key][1]
        self._saved_visibility = None
        self.compared = []
        visible = [x for x in self.viewer.layers if x.visible]
        if visible:
            self.viewer.fit_to_view(layers=visible)

    # ------------------------------------------------------------ numbers
    def _mask(self, ref_data: np.ndarray):
        key = self.mask.currentData()
        if key == "support":
            return metrics.support_mask(ref_data, 0.05)
        if key == "cylinder":
            return metrics.cylinder_mask(ref_data.shape, 0.95)
        return None

    def _update_numbers(self) -> None:
        ref = self.reference.layer()
        results = [x for x in self.compared if not same_layer(x, ref)]
        self.last_metrics = {}
        self.table.setRowCount(0)
        if ref is not None:
            b = np.asarray(ref.data, np.float64)
            mask = self._mask(b)
            for layer in results:
                a = np.asarray(layer.data, np.float64)
                if a.shape != b.shape:
                    self._row(layer.name, ["other grid"] * 3)
                    continue
                m = metrics.compare(a, b, mask)
                self.last_metrics[layer.name] = m
                self._row(layer.name, [f"{m.rmse:.3g}", f"{m.psnr:.2f}", f"{m.ssim:.3f}"])
        self._update_plots()

    def _row(self, name, values) -> None:
        r = self.table.rowCount()
        self.table.insertRow(r)
        for c, v in enumerate([name, *values]):
            self.table.setItem(r, c, QTableWidgetItem(v))

    def _current_plane(self, layer) -> np.ndarray:
        """The 2D slice of ``layer`` at the viewer's current z."""
        data = np.asarray(layer.data)
        if data.ndim == 2:
            return data
        z = self.viewer.dims.point[self.viewer.dims.ndim - 3]
        k = int(round((z - layer.translate[0]) / layer.scale[0]))
        return data[int(np.clip(k, 0, data.shape[0] - 1))]

    def _update_plots(self) -> None:
        if not self.compared:
            self.profile.set_curves([])
            self.histogram.set_curves([])
            return
        profiles, hists = [], []
        lo, hi = self.compared[0].contrast_limits
        ref = self.reference.layer()
        mask = self._mask(np.asarray(ref.data)) if ref is not None else None
        for layer in self.compared:
            plane = self._current_plane(layer)
            row = (plane.shape[0] - 1) / 2
            dist, vals = metrics.line_profile(plane, (row, 0), (row, plane.shape[1] - 1), n=plane.shape[1])
            x = layer.translate[-1] + dist * layer.scale[-1]
            profiles.append((layer.name, x, vals))
            data = np.asarray(layer.data)
            m = mask if mask is not None and mask.shape == data.shape else None
            counts, edges = metrics.histogram(data, bins=64, value_range=(lo, hi), mask=m)
            hists.append((layer.name, (edges[:-1] + edges[1:]) / 2, counts))
        self.profile.set_curves(profiles)
        self.histogram.set_curves(hists)

    def _slice_moved(self, *_):
        if self.compared and all(x in self.viewer.layers for x in self.compared):
            self._update_plots()


def _fmt(v: float) -> str:
    """Short axis numbers: counts as integers, small values with 3 significant digits."""
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _label(layer) -> None:
    """Show the layer's name in its grid cell, small and boxed so it reads over the image."""
    overlay = layer.name_overlay
    overlay.font_size = 7
    overlay.box = True
    overlay.visible = True


def _grid(viewer):
    """The viewer's grid model (``viewer.canvas.grid`` since napari 0.9, ``viewer.grid`` before)."""
    canvas = getattr(viewer, "canvas", None)
    return canvas.grid if canvas is not None and hasattr(canvas, "grid") else viewer.grid
