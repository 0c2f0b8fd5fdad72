"""The corrections part of the Scan import widget: zingers, ring method, Paganin, beam hardening, and a preview.

A group box with the four corrections' parameters (:meth:`CorrectionsBox.keys`
gives them as recon-config keys) and a **Preview** button that runs
:func:`ctbench.pipeline.corrections_preview.correction_preview` in a napari thread
worker on the view under the slider (and one detector row over all views
when a ring method is on) and shows before | after side by side in a
"correction preview" layer.  The Scan import widget supplies the scan, the
rest of its preprocessing and the view through a callback.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from qtpy.QtWidgets import QCheckBox, QComboBox, QFormLayout, QGroupBox, QLineEdit, QPushButton

from .common import MessageLabel, add_or_update, double_spin, error_text, start_worker
from .common import int_spin as _ispin

PREVIEW = "correction preview"
PREVIEW_ROW = "correction preview (sinogram row)"


class CorrectionsBox(QGroupBox):
    """``context()`` returns ``(open_scan, preprocess_config, fallback_pitch, view)`` for the preview (the scan
    is opened in the worker; the pitch is used when the file gives none)."""

    def __init__(self, napari_viewer, context: Callable, parent=None):
        super().__init__("Corrections", parent)
        self.viewer = napari_viewer
        self.context = context
        form = QFormLayout(self)
        # One labelled field a row (the dock is narrow): a method's fields show only while it is on.
        self.form = form
        self.zingers = QCheckBox("Remove zingers")
        self.z_threshold = double_spin(1e-4, 100, 0.1, decimals=4)
        self.z_threshold.setToolTip("a value this much above its neighbourhood's median (relative) is a zinger")
        self.z_size = _ispin(3, 15, 3)
        self.z_size.setToolTip("the median filter's width in pixels")
        form.addRow(self.zingers)
        form.addRow("Zinger threshold", self.z_threshold)
        form.addRow("Zinger filter size (px)", self.z_size)
        self.rings = QComboBox()
        self.rings.addItems(["off", "sorting", "wavelet"])
        self.r_size = _ispin(3, 201, 21)
        self.r_level = _ispin(1, 8, 3)
        self.r_sigma = double_spin(0.1, 50, 1.0, decimals=2)
        form.addRow("Ring removal", self.rings)
        form.addRow("Sorting filter size (px)", self.r_size)
        form.addRow("Wavelet levels", self.r_level)
        form.addRow("Wavelet damping σ", self.r_sigma)
        self.phase = QCheckBox("Paganin phase retrieval")
        self.p_ratio = double_spin(1e-3, 1e6, 300, decimals=2)
        self.p_energy = double_spin(0.1, 1000, 25, decimals=2, suffix="keV")
        self.p_distance = double_spin(1e-3, 1e6, 100, decimals=3, suffix="mm")
        form.addRow(self.phase)
        form.addRow("δ/β ratio", self.p_ratio)
        form.addRow("Energy", self.p_energy)
        form.addRow("Propagation distance", self.p_distance)
        self._method_rows = {self.zingers: (self.z_threshold, self.z_size), self.phase: (self.p_ratio, self.p_energy,
                                                                                        self.p_distance)}
        for box in self._method_rows:
            box.toggled.connect(self._show_rows)
        self.rings.currentIndexChanged.connect(self._show_rows)
        self.hardening = QLineEdit()
        self.hardening.setPlaceholderText("beam hardening c1, c2, … (empty: off)")
        form.addRow("Beam hardening", self.hardening)
        self.preview_button = QPushButton("Preview")
        self.preview_button.clicked.connect(self.preview)
        form.addRow(self.preview_button)
        self.message = MessageLabel()
        form.addRow(self.message)
        self._worker = None
        self.last_preview = None
        self._show_rows()

    def _show_rows(self, *_) -> None:
        """Each method's fields only while the method is on (its label with it)."""
        for box, fields in self._method_rows.items():
            for f in fields:
                self._row_visible(f, box.isChecked())
        method = self.rings.currentText()
        self._row_visible(self.r_size, method == "sorting")
        self._row_visible(self.r_level, method == "wavelet")
        self._row_visible(self.r_sigma, method == "wavelet")

    def _row_visible(self, field, on: bool) -> None:
        field.setVisible(on)
        label = self.form.labelForField(field)
        if label is not None:
            label.setVisible(on)

    # ----------------------------------------------------------------- keys
    def keys(self) -> dict:
        """The recon-config keys of the chosen corrections (validated by PreprocessConfig)."""
        out: dict = {}
        if self.zingers.isChecked():
            out["zingers"] = {"threshold": self.z_threshold.value(), "size": self.z_size.value()}
        method = self.rings.currentText()
        if method == "sorting":
            out["rings"] = {"method": "sorting", "size": self.r_size.value()}
        elif method == "wavelet":
            out["rings"] = {"method": "wavelet", "level": self.r_level.value(), "sigma": self.r_sigma.value()}
        if self.phase.isChecked():
            out["phase"] = {"delta_beta": self.p_ratio.value(), "energy_kev": self.p_energy.value(),
                            "distance_mm": self.p_distance.value()}
        text = self.hardening.text().strip()
        if text:
            try:
                c = [float(x) for x in text.replace(";", ",").split(",") if x.strip()]
            except ValueError:
                raise ValueError(f"beam hardening coefficients must be numbers 'c1, c2, …', got {text!r}") from None
            out["beam_hardening"] = {"coefficients": c}
        return out

    # -------------------------------------------------------------- preview
    @property
    def busy(self) -> bool:
        return self._worker is not None

    def preview(self, *_):
        """Before/after of the current view (and a sinogram row for ring methods), computed in a worker."""
        self.message.clear()
        if self._worker is not None:
            return None
        try:
            open_scan, pre, pitch, view = self.context()
            pre = type(pre)(**(pre.model_dump() | self.keys()))
        except Exception as e:  # noqa: BLE001 - shown in the box
            self.message.error(error_text(e))
            return None
        self.preview_button.setEnabled(False)
        self._worker = start_worker(_preview, open_scan, pre, pitch, view, on_return=self._show,
                                    on_error=lambda e: self.message.error(error_text(e)), on_finished=self._done, owner=self)
        return self._worker

    def _done(self) -> None:
        self._worker = None
        self.preview_button.setEnabled(True)

    def _show(self, pv) -> None:
        self.last_preview = pv
        img = pv.side_by_side("view")
        lo, hi = (float(x) for x in np.percentile(img, [0.5, 99.8]))
        add_or_update(self.viewer, (img, {"name": PREVIEW, "colormap": "gray", "contrast_limits": (lo, hi or lo + 1)},
                                    "image"))
        parts = [f"view {pv.view}: before | after"]
        if pv.sinogram_before is not None:
            s = pv.side_by_side("sinogram")
            lo, hi = (float(x) for x in np.percentile(s, [0.5, 99.8]))
            add_or_update(self.viewer, (s, {"name": PREVIEW_ROW, "colormap": "gray",
                                            "contrast_limits": (lo, hi or lo + 1)}, "image"))
            parts.append(f"row {pv.row} over all views: before | after")
        z = pv.report.get("zingers")
        if z:
            parts.append(f"{z['n_replaced']} zinger values replaced in this view")
        self.message.note("; ".join(parts))


def _preview(open_scan, pre, pitch, view):
    """Open the scan and compute the preview (runs in the worker thread)."""
    from ctbench.pipeline.corrections_preview import correction_preview

    scan = open_scan()
    return correction_preview(scan, pre, view=view, pixel_size=None if scan.pixel_size else pitch)
