"""Trajectory designer: a form for every trajectory generator with a live 3D preview."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qtpy.QtCore import QTimer
from qtpy.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QHBoxLayout, QLabel, QPushButton, QSpinBox,
                            QVBoxLayout, QWidget)

from ctbench.workbench.completeness import coarse_grid, completeness_map, summarize
from ctbench.workbench.design import (DESIGN_PARAMETERS, TRAJECTORY_KINDS, DesignError, ScanGeometry, TrajectoryDesign,
                            design_of, scan_from_trajectory)
from ctbench.geometry import Trajectory

from .._layers import completeness_layer, trajectory_layers
from .datasets import install as install_dataset_handling
from .display_rule import install as install_display_rule
from .common import (MessageLabel, ParamForm, Steps, add_or_update, error_text, is_deleted, report_errors,
                     scroll_contents)
from .display import VOLUME_FRAME, frame_of, oblique_3d, set_visible, show_frame
from .plot import ColourBar

PREFIX = "trajectory"


def _preview_data(geometry: ScanGeometry, show_map: bool, grid: int) -> dict:
    """Everything the preview shows, computed without touching Qt (runs in a worker thread)."""
    data = {"layers": trajectory_layers(geometry, PREFIX), "completeness": None, "summary": geometry.describe()}
    if show_map:
        shape, spacing = coarse_grid(geometry.volume_shape, geometry.voxel_spacing, grid)
        counts = completeness_map(geometry, shape, spacing)
        data["completeness"] = completeness_layer(counts, geometry.n_views, spacing, f"{PREFIX}: completeness")
        data["summary"] = f"{geometry.describe()}. Completeness: {summarize(counts, geometry.n_views)}."
    return data


class TrajectoryDesignerWidget(QWidget):
    """Design a scan; the viewer shows its source path, detector frames, volume box and completeness.

    The preview follows every change of the form (debounced).  Bad values
    (SDD < SID, zero views, ...) are explained below the form and leave the
    last valid preview in place.
    """

    def __init__(self, napari_viewer, parent=None):
        super().__init__(parent)
        self.viewer = napari_viewer
        install_dataset_handling(napari_viewer)   # the ctbench reader wins for ctbench datasets
        install_display_rule(napari_viewer)       # every new layer in its frame (display_rule.py)
        self.geometry: ScanGeometry | None = None
        self.n_updates = 0
        self._first_preview = True
        self._generation = 0     # the newest preview request; older background results are dropped
        self._pending = 0
        self._hidden_layer = None   # a new preview layer added hidden, shown by the next step
        self.steps = Steps(self)  # preview layers put in one per event-loop turn (one new layer per frame)

        self.kind = QComboBox()
        for key, (label, _beam, _nd) in TRAJECTORY_KINDS.items():
            self.kind.addItem(label, key)
        self.form = ParamForm(DESIGN_PARAMETERS)
        self.form.set_values(TrajectoryDesign().to_dict())
        self.auto = QCheckBox("Update the preview while editing")
        self.auto.setChecked(True)
        self.grid_size = QSpinBox()
        self.grid_size.setRange(4, 256)
        self.grid_size.setValue(40)
        self.grid_size.setToolTip("completeness is computed on a grid of at most this many voxels per axis")
        self.show_map = QCheckBox("Completeness map")
        self.show_map.setChecked(True)
        self.update_button = QPushButton("Update preview")
        self.save_button = QPushButton("Save JSON…")
        self.load_button = QPushButton("Load JSON…")
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        # Keys for what colour means: the preview's lines and the completeness map (views per voxel).
        self.legend = QLabel(
            "<span style='color:#ffd23f'>━</span> source path &nbsp; "
            "<span style='color:#ff7f50'>━</span> central rays &nbsp; "
            "<span style='color:#4fc3f7'>━</span> detector &nbsp; "
            "<span style='color:#b0ff57'>━</span> volume box")
        self.legend.setWordWrap(True)
        self.legend.hide()
        self.map_bar = ColourBar()
        self.map_bar.hide()
        self.message = MessageLabel()

        layout = QVBoxLayout(self)
        row = QHBoxLayout()
        row.addWidget(QLabel("Trajectory"))
        row.addWidget(self.kind, 1)
        layout.addLayout(row)
        layout.addWidget(self.form)
        row = QHBoxLayout()
        row.addWidget(self.show_map)
        row.addWidget(QLabel("grid ≤"))
        row.addWidget(self.grid_size)
        layout.addLayout(row)
        layout.addWidget(self.auto)
        row = QHBoxLayout()
        for b in (self.update_button, self.save_button, self.load_button):
            row.addWidget(b)
        layout.addLayout(row)
        layout.addWidget(self.summary)
        layout.addWidget(self.legend)
        layout.addWidget(self.map_bar)
        layout.addWidget(self.message)
        layout.addStretch(1)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(150)
        self._timer.timeout.connect(self.request_preview)
        self.kind.currentIndexChanged.connect(self._kind_changed)
        self.form.changed.connect(self._schedule)
        self.grid_size.valueChanged.connect(self._schedule)
        self.show_map.toggled.connect(self._schedule)
        self.update_button.clicked.connect(self.request_preview)
        self.save_button.clicked.connect(self._save_dialog)
        self.load_button.clicked.connect(self._load_dialog)
        self._show_rows()        # no preview layers until the user designs (an edit or Update preview)
        scroll_contents(self)

    # ------------------------------------------------------------------ form
    def design(self) -> TrajectoryDesign:
        """The form's current values (not yet checked)."""
        return TrajectoryDesign(kind=self.kind.currentData(), **self.form.values())

    def set_design(self, design: TrajectoryDesign) -> None:
        """Fill the form from a design; the preview follows."""
        self.form.blockSignals(True)
        try:
            self.form.set_values({k: v for k, v in design.to_dict().items() if k != "kind"})
        finally:
            self.form.blockSignals(False)
        i = self.kind.findData(design.kind)
        if i == self.kind.currentIndex():
            self._schedule()
        self.kind.setCurrentIndex(i)

    def _kind_changed(self, *_):
        self._show_rows()
        self._schedule()

    def _show_rows(self) -> None:
        d = self.design()
        for p in DESIGN_PARAMETERS:
            self.form.set_row_visible(p.name, d.uses(p.name))

    def _schedule(self, *_):
        if self.auto.isChecked():
            self._timer.start()

    # --------------------------------------------------------------- preview
    def request_preview(self, *_) -> None:
        """Rebuild the preview in a worker thread (edits and the Update button): the GUI never waits for it.

        Results of older requests that finish late are dropped, so the newest form always wins.
        """
        from .common import start_worker

        self._timer.stop()
        self._generation += 1
        gen, design, show_map, grid = self._generation, self.design(), self.show_map.isChecked(), \
            self.grid_size.value()

        def work():
            try:
                geometry = design.build()
            except DesignError as e:
                return gen, e, None
            return gen, geometry, _preview_data(geometry, show_map, grid)

        def done(res):
            g, geometry, data = res
            if g != self._generation:
                return                              # a newer edit is on its way
            if isinstance(geometry, DesignError):
                self.message.error(str(geometry))
                return
            # One layer per frame: a layer drawn for the first time builds its shaders (seconds for five
            # under software OpenGL); the last step counts the update.
            self.steps.run(self._preview_steps(geometry, data), on_error=lambda e: self.message.error(error_text(e)))

        self._pending += 1
        start_worker(work, on_return=lambda r: self._guard(done, r),
                     on_error=lambda e: self.message.error(error_text(e)), on_finished=self._one_done, owner=self)

    def _guard(self, fn, arg) -> None:
        if is_deleted(self):
            return          # closed while the preview was computed
        try:
            fn(arg)
        except Exception as e:  # noqa: BLE001 - shown in the widget like report_errors
            self.message.error(error_text(e))

    def _one_done(self) -> None:
        self._pending = max(0, self._pending - 1)

    @property
    def busy(self) -> bool:
        """Whether a preview is being computed in the background or put into the viewer."""
        return self._pending > 0 or self.steps.pending > 0

    @report_errors
    def update_preview(self, *_) -> ScanGeometry | None:
        """Build the scan from the form and refresh the preview layers now (scripts and tests)."""
        self._timer.stop()
        self._generation += 1          # a background preview still running is older than this one
        self.steps.cancel()
        try:
            geometry = self.design().build()
        except DesignError as e:
            self.message.error(str(e))
            return None
        self.show_geometry(geometry)
        return geometry

    def show_geometry(self, geometry: ScanGeometry) -> None:
        """Preview layers for any scan (also one loaded from JSON without a designer form)."""
        self._apply_preview(geometry, _preview_data(geometry, self.show_map.isChecked(), self.grid_size.value()))

    def _apply_preview(self, geometry: ScanGeometry, data: dict) -> None:
        """Put computed preview layers into the viewer now (scripts, tests, Load JSON)."""
        for step in self._preview_steps(geometry, data):
            step()

    def _preview_steps(self, geometry: ScanGeometry, data: dict) -> list:
        """The GUI-thread steps that show a computed preview: only layer updates happen here."""
        import functools

        first_3d = self._first_preview and not geometry.is_2d
        steps = []
        if first_3d:
            steps.append(self._enter_3d)      # before the layers arrive: they are built once, in 3D
        for layer_data in data["layers"]:
            steps += [functools.partial(self._put_layer, layer_data), self._reveal_new_layer]
        steps.append(functools.partial(self._show_completeness, data))
        steps.append(self._reveal_new_layer)
        steps.append(functools.partial(self._finish_preview, geometry, data))
        return steps

    def _put_layer(self, layer_data, keep_display: bool = True) -> None:
        """Update the preview layer of that name in place, or add it hidden for ``_reveal_new_layer``.

        A new layer's turn holds napari's whole add (model, visual, controls page, layer-list row) and then
        the window's repaint; drawn at once, its first 3D frame (building the visual's shaders) came in that
        same turn: 0.45 s for the completeness map and 0.15-0.22 s for the first line layer at load 4-5.
        Hidden, the add draws nothing of it; the next step shows it."""
        data, kwargs, ltype = layer_data
        new = kwargs["name"] not in self.viewer.layers
        layer = add_or_update(self.viewer, (data, {**kwargs, "visible": False}, ltype) if new else layer_data,
                              keep_display=keep_display)
        self._hidden_layer = layer if new else None

    def _enter_3d(self) -> None:
        for layer in self.viewer.layers:
            if frame_of(layer) != VOLUME_FRAME:
                set_visible(layer, False)
        self.viewer.dims.ndisplay = 3

    def _show_completeness(self, data: dict) -> None:
        name = f"{PREFIX}: completeness"
        self._hidden_layer = None
        if data["completeness"] is not None:
            self._put_layer(data["completeness"], keep_display=False)
        elif name in self.viewer.layers:
            self.viewer.layers.remove(name)

    def _reveal_new_layer(self) -> None:
        layer, self._hidden_layer = self._hidden_layer, None
        if layer is not None and layer in self.viewer.layers:
            layer.visible = True

    def _finish_preview(self, geometry: ScanGeometry, data: dict) -> None:
        self.message.clear()
        self.geometry = geometry
        name = f"{PREFIX}: completeness"
        self.summary.setText(data["summary"])
        self.legend.show()
        if data["completeness"] is not None and name in self.viewer.layers:
            layer = self.viewer.layers[name]
            n = geometry.n_views
            self.map_bar.set_map(layer.colormap.map(np.linspace(0, 1, 64)), 0, n,
                                 "completeness: views that see each voxel (red: none, clear: all)")
            self.map_bar.show()
        else:
            self.map_bar.hide()
        if self._first_preview:
            self._first_preview = False
            layers = [x for x in self.viewer.layers if x.name.startswith(PREFIX)]
            if geometry.is_2d:
                show_frame(self.viewer, layers, ndisplay=2)
            else:
                # The volume frame in 3D, seen obliquely: a helix climbs, a saddle bends (not a circle from above).
                show_frame(self.viewer, layers, ndisplay=3)
                oblique_3d(self.viewer, layers)
        self.n_updates += 1

    # ------------------------------------------------------------------ JSON
    @report_errors
    def save(self, path) -> Path:
        """Save the current trajectory as ctbench trajectory JSON (the form rides along in its meta)."""
        geometry = self.design().build()
        path = Path(path)
        geometry.trajectory.save(path)
        self.message.note(f"saved {path.name}")
        return path

    @report_errors
    def load(self, path) -> ScanGeometry:
        """Load a trajectory JSON; a designer-made one restores the form, others are shown as they are."""
        traj = Trajectory.load(path)
        design = design_of(traj)
        if design is not None:
            self.set_design(design)
            return self.update_preview()
        geometry = scan_from_trajectory(traj)
        self.show_geometry(geometry)
        self.message.note(f"{Path(path).name} has no designer form: showing it with a "
                          f"{geometry.detector_shape} detector and a {geometry.volume_shape} grid")
        return geometry

    def _save_dialog(self):
        path, _ = QFileDialog.getSaveFileName(self, "Save trajectory", "trajectory.json", "JSON (*.json)")
        if path:
            self.save(path)

    def _load_dialog(self):
        path, _ = QFileDialog.getOpenFileName(self, "Load trajectory", "", "JSON (*.json)")
        if path:
            self.load(path)
