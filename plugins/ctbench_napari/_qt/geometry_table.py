"""The Calibrate comparison's table: each geometry (nominal, calibrated, exact where known) in the scan's frame.

The parameter table above it gives what the calibration changed, relative to the geometry the sinogram
carried; this one gives each geometry's detector offsets and roll measured in the scan's frame (the detector
centre against the ray through the rotation axis, ``ctbench.workbench.geometry_summary``) and the
reprojection misfit of its reconstruction against the measured sinogram, so that "0.09 px" and "2.40 px"
never stand side by side without saying what they are relative to.
"""

from __future__ import annotations

from qtpy.QtCore import Qt
from qtpy.QtWidgets import QHeaderView, QLabel, QSizePolicy, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from ctbench.workbench.geometry_summary import alignment_of

from .forms import rows_height

COLUMNS = ("geometry", "offset_u [px]", "offset_v [px]", "roll [deg]", "misfit")
TIPS = ("which geometry the row describes",
        "detector centre along u, relative to the ray through the rotation axis (the scan's frame)",
        "detector centre along v, relative to the ray through the rotation axis at the source's height",
        "detector rotation in its plane: the u axis out of the plane normal to the rotation axis",
        "reprojection misfit |P x - y|² / |y|² of the geometry's reconstruction against the measured sinogram "
        "(lower: the geometry explains the data better)")
ROW_NAMES = {"nominal": "nominal (attached)", "calibrated": "calibrated", "exact": "exact (truth.json)"}
CAPTION = ("Each geometry in the scan's frame (offsets from the rotation axis); the parameter table above gives "
           "the calibration's changes from the attached geometry.")


class GeometryTable(QWidget):
    """Rows: the geometries compared; columns: offsets and roll in the scan's frame, misfit against the data."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.caption = QLabel(CAPTION)
        self.caption.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        for c, tip in enumerate(TIPS):
            self.table.horizontalHeaderItem(c).setToolTip(tip)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        for c in range(1, len(COLUMNS)):
            header.setSectionResizeMode(c, QHeaderView.ResizeToContents)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.caption)
        lay.addWidget(self.table)
        self.values: dict = {}
        self.hide()

    def show(self, geometries=None, misfit=None) -> None:  # noqa: D401 - also QWidget.show()
        """Fill the rows (``geometries``: {key: ScanGeometry}; ``misfit``: {key: float}) and show the table."""
        if geometries is not None:
            self.table.setRowCount(0)
            self.values = {}
            for key, geo in geometries.items():
                a = alignment_of(geo.trajectory, geo.detector_spacing)
                m = (misfit or {}).get(key)
                self.values[key] = {**a.as_dict(), "misfit": m}
                cells = [ROW_NAMES.get(key, key), f"{a.offset_u:+.3f}", f"{a.offset_v:+.3f}", f"{a.roll:+.3f}",
                         "–" if m is None else f"{m:.4g}"]
                r = self.table.rowCount()
                self.table.insertRow(r)
                for c, text in enumerate(cells):
                    item = QTableWidgetItem(text)
                    if c:
                        item.setTextAlignment(int(Qt.AlignRight | Qt.AlignVCenter))
                    item.setToolTip(TIPS[c])
                    self.table.setItem(r, c, item)
            h = self.table.horizontalHeader().sizeHint().height() + rows_height(self.table, 4) + \
                2 * self.table.frameWidth() + 2
            self.table.setFixedHeight(h)
        super().show()
