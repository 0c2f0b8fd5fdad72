"""Calibrate: correct a sinogram layer's geometry from its own data (ctbench.calibration).

Choose the parameters, run in a thread worker (progress, cancel), read the
parameter table and the convergence plot, compare reconstructions before and
after in the comparison panel, and apply the calibrated geometry to the layer.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from qtpy.QtCore import Signal
from qtpy.QtWidgets import QCheckBox, QFormLayout, QGridLayout, QGroupBox, QHBoxLayout, QPushButton, QSpinBox, QVBoxLayout, QWidget

from ctbench.calibration import ALL, SPECS, calibrate_iterations
from ctbench.calibration.parameters import GLOBAL, STAGE, check_free
from ctbench.workbench.design import ScanGeometry

from .._layers import (KEY, LayerError, has_geometry, info, is_sinogram, is_volume_candidate, sinogram_of,
                       volume_layer, volume_of)
from ctbench.workbench.geometry_summary import truth_of

from .common import LayerPicker, MessageLabel, ProgressBar, Steps, report_errors, scroll_contents, unwrap
from .compare import ComparePanel
from .convergence import ConvergencePlot
from .geometry_table import GeometryTable
from .param_table import ParameterTable
from .runner import LocalRunner

DEFAULT_FREE = ("offset_u", "roll", "shift_u", "shift_v")
RESULT_KEYS = ("nominal", "calibrated", "exact")
RESULT_NAMES = {"nominal": "nominal geometry (before calibration)", "calibrated": "calibrated geometry",
                "exact": "exact geometry (truth.json)"}
RECON_ITERATIONS = 12      # CGLS iterations of the before/after reconstructions


def _misfit(P, x, y) -> float:
    """Relative reprojection misfit |P x - y|^2 / |y|^2: a figure that needs no phantom."""
    with torch.no_grad():
        return float((P.project(x) - y).double().square().sum() / y.double().square().sum())


def planned_steps(free, n_outer) -> int:
    """Outer iterations the solver plans: every parameter stage at the coarsest level, then one pass per finer
    level (ctbench.calibration.solver's schedule); a level that converges early ends sooner."""
    stages = {STAGE.get(k, 0) for k in free if k in GLOBAL} | {0}
    return n_outer[0] * len(stages) + sum(n_outer[1:])


def stage_name(binning: int, stage: int) -> str:
    """The convergence plot's name for a level and parameter stage (the misfit jumps where they change)."""
    where = f"binned ×{binning}" if binning > 1 else "full resolution"
    return where + {0: "", 1: " + tilts", 2: " + tilts, sdd"}.get(stage, f" + stage {stage}")


def _is_known_candidate(layer) -> bool:
    """3D image layers, except this widget's own before/after reconstructions (they must not take the choice)."""
    recon = info(layer).get("recon")
    return is_volume_candidate(layer) and layer.data.ndim == 3 and not (isinstance(recon, dict) and
                                                                        "calibration" in recon)


def known_object_of(layer, geo: ScanGeometry) -> torch.Tensor:
    """A known-object layer as the calibration's ``known_object``: a volume on the scan's reconstruction grid
    (its shape and voxel size); LayerError naming the layer and what was expected otherwise."""
    data, scale = volume_of(layer)
    want = tuple(int(n) for n in geo.volume_shape)
    if data.shape != want:
        raise LayerError(f"known object '{layer.name}' has shape {data.shape}; the scan's volume grid is {want} "
                         "(z, y, x): give the object on that grid")
    spacing = tuple(float(d) for d in geo.voxel_spacing)
    if any(abs(a - b) > 1e-3 * b for a, b in zip(scale, spacing)):
        raise LayerError(f"known object '{layer.name}' has voxels of {tuple(round(a, 6) for a in scale)} mm (its "
                         f"layer scale); the scan's grid has {tuple(round(b, 6) for b in spacing)} mm: the voxel "
                         "size fixes the absolute scale, so it must be the grid's")
    if not np.isfinite(data).all():
        raise LayerError(f"known object '{layer.name}' has non-finite values")
    return torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))


def _events(P, geo: ScanGeometry, sino: np.ndarray, free, n_outer, cancel, known=None, truth=None):
    """Worker generator: calibration states, then ("result", result, volumes, geometry, misfit).

    ``volumes`` holds the reconstructions on the nominal (the sinogram's attached) geometry, the calibrated
    one and, when ``truth`` (a scan's truth.json) is given and fits the data, the exact one; ``misfit`` the
    reprojection misfit of each against the measured sinogram.  The data checks (finite values, structure)
    run here, off the GUI thread: they read the whole sinogram.  A cancelled run skips the reconstructions
    (``volumes`` is None)."""
    from ctbench.solvers import cgls

    y = torch.from_numpy(np.ascontiguousarray(sino, dtype=np.float32))
    gen = calibrate_iterations(P, y, free, levels=(2, 1), n_outer=n_outer, known_object=known, cancel=cancel)
    while True:
        try:
            state = next(gen)
        except StopIteration as stop:
            result = stop.value
            break
        yield ("state", state)
    cal_geo = ScanGeometry(result.trajectory.to(dtype=torch.float32), geo.detector_shape, geo.detector_spacing,
                           geo.volume_shape, geo.voxel_spacing)
    if result.stopped != "completed":
        yield ("result", result, None, cal_geo, None)
        return
    geometries = {"nominal": geo, "calibrated": cal_geo}
    if truth is not None:
        from ctbench.workbench.geometry_summary import exact_trajectory

        exact = exact_trajectory(geo.trajectory, geo.detector_spacing, truth)
        geometries["exact"] = ScanGeometry(exact.to(dtype=torch.float32), geo.detector_shape, geo.detector_spacing,
                                           geo.volume_shape, geo.voxel_spacing)
    volumes, misfit = {}, {}
    for key, g in geometries.items():
        yield ("status", f"reconstructing on the {key} geometry ({RECON_ITERATIONS} CGLS iterations)")
        Q = P if key == "nominal" else g.projector(backend="cpu")
        x = cgls(Q, y, RECON_ITERATIONS).volume
        volumes[key], misfit[key] = x.numpy(), _misfit(Q, x, y)
    if "exact" in misfit and misfit["exact"] > misfit["nominal"]:
        # The truth does not describe this scan as imported (another frame, flips): not exact after all.
        volumes.pop("exact"), misfit.pop("exact"), geometries.pop("exact")
        yield ("status", "truth.json does not fit this scan as imported (its misfit is above the nominal "
               "geometry's): left out of the comparison")
    yield ("result", result, volumes, {k: g for k, g in geometries.items() if k in volumes}, misfit)


def open_calibrate(viewer, layer) -> "CalibrateWidget":
    """Show the Calibrate dock widget (one per viewer) with ``layer`` picked: Scan import's Calibrate step."""
    if layer is None or layer not in viewer.layers:
        raise LayerError("no sinogram with a geometry yet: press Attach geometry first (step 3)")
    if not (is_sinogram(layer) and has_geometry(layer)):
        raise LayerError(f"layer '{layer.name}' is not a sinogram with a ctbench geometry")
    from .. import PLUGIN

    dock, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Calibrate", tabify=True)
    dock.setWindowTitle("Calibrate")     # the tab reads like the others (launch names its docks so)
    dock.show()
    dock.raise_()
    w.sinogram.select(layer.name)
    w.message.note(f"'{layer.name}' from Scan import: choose the parameters and press Calibrate")
    return w


class CalibrateWidget(QWidget):
    """Self-calibration of a sinogram layer with a ctbench geometry."""

    finished = Signal(object)    # the CalibrationResult

    def __init__(self, napari_viewer, parent=None):
        super().__init__(parent)
        self.viewer = napari_viewer
        self.message = MessageLabel()
        self.sinogram = LayerPicker(napari_viewer, lambda l: is_sinogram(l) and has_geometry(l))
        self.sinogram.setToolTip("a sinogram layer with a ctbench geometry (projection widget, Scan import, dataset)")
        self.checks: dict[str, QCheckBox] = {}
        grid = QGridLayout()
        for i, name in enumerate(ALL):
            box = QCheckBox(name)
            box.setToolTip(f"{SPECS[name].meaning} ({SPECS[name].unit})")
            box.setChecked(name in DEFAULT_FREE)
            self.checks[name] = box
            grid.addWidget(box, i // 3, i % 3)
        params = QGroupBox("Free parameters")
        params.setLayout(grid)
        # A known object (a calibration phantom, a reference scan on the same grid) fixes the absolute scale:
        # only then can pitch, sdd and offset_v be calibrated.  Opt-in: a new image layer must not switch it on.
        self.use_known = QCheckBox("Known object")
        self.use_known.setToolTip("reproject this volume instead of reconstructing: the object is known (its "
                                  "voxel size fixes the scale), so offset_v, pitch and sdd become identifiable")
        self.known = LayerPicker(napari_viewer, _is_known_candidate)
        self.known.setToolTip("an image layer on the scan's volume grid (shape and voxel size), e.g. a phantom or "
                              "a reference reconstruction opened from a TIFF, HDF5 or zarr file")
        self.known.setEnabled(False)
        self.use_known.toggled.connect(self.known.setEnabled)
        known_row = QHBoxLayout()
        known_row.addWidget(self.use_known)
        known_row.addWidget(self.known, 1)
        self.coarse_iters = QSpinBox()
        self.coarse_iters.setRange(1, 50)
        self.coarse_iters.setValue(8)
        self.fine_iters = QSpinBox()
        self.fine_iters.setRange(1, 50)
        self.fine_iters.setValue(3)
        self.run_button = QPushButton("Calibrate")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.apply_button = QPushButton("Apply to layer")
        self.apply_button.setToolTip("replace the sinogram layer's geometry with the calibrated one")
        self.apply_button.setEnabled(False)
        self.progress = ProgressBar()
        self.progress.setFormat("step %v of %m")
        self.plot = ConvergencePlot()
        self.plot.setToolTip("the misfit after each outer iteration; dashed lines: a new level (binning) or "
                             "parameter stage, where the misfit is measured anew")
        self.table = ParameterTable()
        self.geometries = GeometryTable()
        self.result = None
        self.layers: dict = {}      # before the comparison panel: it asks for this widget's layers as it is built
        self.misfit: dict = {}
        self._target = None
        self.comparison = ComparePanel(napari_viewer, self)
        form = QFormLayout()
        form.addRow("Sinogram", self.sinogram)
        form.addRow("Outer iterations, binned x2", self.coarse_iters)
        form.addRow("Outer iterations, full", self.fine_iters)
        form.addRow(known_row)
        buttons = QHBoxLayout()
        for b in (self.run_button, self.cancel_button, self.apply_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(params)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.message)
        layout.addWidget(self.table)
        layout.addWidget(self.plot)
        layout.addWidget(self.geometries)
        layout.addWidget(self.comparison)
        layout.addStretch(1)
        scroll_contents(self)       # the comparison below makes the panel tall: it scrolls, the window fits
        self.runner = LocalRunner(self)
        self.runner.event.connect(self._event)
        self.runner.failed.connect(self._failed)
        self.runner.done.connect(self._done)
        self.steps = Steps(self)    # the result reaches the screen one step per event-loop turn
        self.run_button.clicked.connect(lambda: self.run())
        self.cancel_button.clicked.connect(lambda: self.runner.cancel())
        self.apply_button.clicked.connect(lambda: self.apply())

    # ------------------------------------------------------------ actions
    @property
    def running(self) -> bool:
        """A calibration in progress, or its result still being shown."""
        return self.runner.running or self.steps.pending > 0

    def free(self) -> tuple[str, ...]:
        return tuple(n for n, b in self.checks.items() if b.isChecked())

    @property
    def results(self) -> list:
        """This widget's reconstructions (nominal, calibrated, exact when known) still in the viewer."""
        return [self.layers[k] for k in RESULT_KEYS if k in self.layers and self.layers[k] in self.viewer.layers]

    def checked_results(self) -> list:
        """The layers the comparison shows: nominal and calibrated (the exact one is its reference)."""
        return [self.layers[k] for k in ("nominal", "calibrated") if k in self.layers]

    def reference_candidate(self, layer) -> bool:
        """The comparison's reference: the reconstruction on the exact geometry, and nothing else (an
        unrelated phantom or another scan's volume is never the truth of this one)."""
        exact = self.layers.get("exact")
        return exact is not None and unwrap(layer) is unwrap(exact)

    @report_errors
    def run(self, *_) -> None:
        if self.running:        # before anything is reset: the running calibration keeps its table and plot
            raise LayerError("a calibration is running: wait for it to finish or press Cancel")
        layer = self.sinogram.layer()
        if layer is None:
            raise LayerError("pick a sinogram layer with a ctbench geometry first")
        geo, sino = sinogram_of(layer)
        if geo.is_2d:
            raise LayerError("calibration needs a 3D scan (a detector with rows); this layer is 2D")
        free = self.free()
        n_outer = (self.coarse_iters.value(), self.fine_iters.value())
        known = None
        if self.use_known.isChecked():
            obj = self.known.layer()
            if obj is None:
                raise LayerError("Known object is ticked but no volume layer is chosen: open the object's volume "
                                 "(on the scan's grid) as an image layer, or untick Known object")
            known = known_object_of(obj, geo)
        # Parameter errors (too few views for a parameter, sdd in a parallel beam) surface here at once; the
        # checks that read the whole sinogram (finite, structure) run in the worker and come back as its error.
        P = geo.projector(backend="cpu")
        check_free(free, beam=P.beam, n_views=P.n_views)
        src = info(layer).get("source")
        truth = truth_of(src.get("path")) if isinstance(src, dict) else None
        self._target = layer
        self.result = None
        self.steps.cancel()
        self.plot.clear()
        self.table.start_run(free)
        self.progress.setRange(0, planned_steps(free, n_outer))
        self.progress.setValue(0)
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.apply_button.setEnabled(False)
        self.message.note(f"calibrating {', '.join(free)}" + (f" against the known object '{obj.name}'" if known
                                                              is not None else "") + " …")
        # A RuntimeError in the worker (torch's out-of-memory) reaches runner.failed: common.start_worker.
        self.runner.start(lambda cancel: _events(P, geo, sino, free, n_outer, cancel, known, truth))

    def _event(self, ev) -> None:
        kind = ev[0]
        if kind == "state":
            s = ev[1]
            self.plot.add(s.iteration, s.loss, stage_name(s.binning, s.extra.get("stage", 0)))
            self.table.show_state(s.parameters, s.shifts)
            self.progress.setValue(min(self.progress.maximum(), s.iteration))
            vals = ", ".join(f"{k} {v:.3g}" for k, v in s.parameters.items())
            self.message.note(f"step {s.iteration} (binning {s.binning}): misfit {s.loss:.3g}; {vals}")
        elif kind == "status":
            self.message.note(ev[1])
        elif kind == "result":
            _, res, volumes, geometries, misfit = ev
            cal_geo = geometries if isinstance(geometries, ScanGeometry) else geometries["calibrated"]
            self.result, self.calibrated_geometry, self.misfit = res, cal_geo, misfit
            if volumes is None:          # cancelled: the estimate so far, no reconstructions
                self.table.show_result(res)
                self.apply_button.setEnabled(True)
                self.message.note(f"{res.stopped} after {len(res.loss_history)} steps: the table holds the "
                                  "estimate so far (parameters whose stage was not reached are held at their "
                                  "start); Apply to layer stores it")
                self.finished.emit(res)
                return
            self.progress.setValue(self.progress.maximum())
            # One step per turn: a new layer builds its shaders when first drawn (software OpenGL: a long frame
            # each), so the table, each layer and the comparison land in separate frames.
            for key in [k for k in self.layers if k not in volumes]:     # an exact layer of an earlier run
                old = self.layers.pop(key)
                if old in self.viewer.layers:
                    self.viewer.layers.remove(old)
            adds = [functools.partial(self._add_volume, key, volumes[key], geometries[key]) for key in RESULT_KEYS
                    if key in volumes]
            self.steps.run([functools.partial(self.table.show_result, res), *adds,
                            functools.partial(self.geometries.show, geometries, misfit),
                            lambda: self.comparison.compare(layers=self.checked_results()),
                            functools.partial(self._show_result, res, misfit)],
                           on_error=lambda e: (self.message.error(f"showing the calibration failed: {e}"),
                                               self._done()))

    def _failed(self, e) -> None:
        self.table.stop_run("failed")
        self.message.error(f"calibration failed: {e}")

    def _show_result(self, res, misfit) -> None:
        self.apply_button.setEnabled(True)
        exact = (f"; exact geometry (truth.json) {misfit['exact']:.3g}, the comparison's reference"
                 if "exact" in misfit else "")
        self.message.note(f"{res.stopped}: the reprojection misfit of the reconstruction falls from "
                          f"{misfit['nominal']:.3g} (nominal geometry) to {misfit['calibrated']:.3g} (calibrated)"
                          + exact + ("; " + res.notes[0] if res.notes else ""))
        self._done()
        self.finished.emit(res)

    def _done(self) -> None:
        """The worker ended (or the result is shown): the buttons are ready again once both are over."""
        self.cancel_button.setEnabled(self.runner.running)
        self.run_button.setEnabled(not self.running)

    def _add_volume(self, key, vol, cal_geo) -> None:
        from napari.layers import Layer

        # Added hidden: the comparison shows the layers one per turn (a first draw builds shaders), in 2D.
        data, kw, _ = volume_layer(vol, cal_geo.voxel_spacing, f"{self._target.name}: {RESULT_NAMES[key]}",
                                   geometry=cal_geo,
                                   extra={"recon": {"algorithm": "cgls", "n_iter": RECON_ITERATIONS,
                                                    "calibration": key}}, visible=False)
        old = self.layers.get(key)
        if old is not None and old in self.viewer.layers:
            self.viewer.layers.remove(old)
        self.layers[key] = self.viewer.add_layer(Layer.create(data, kw, "image"))

    @report_errors
    def apply(self, *_) -> None:
        """Store the calibrated geometry in the sinogram layer (the other widgets then use it)."""
        if self.result is None or self._target is None:
            raise LayerError("run a calibration first")
        meta = dict(self._target.metadata)
        info = dict(meta.get(KEY, {}))
        info["geometry"] = self.calibrated_geometry.to_dict()
        info["calibration"] = {p.name: p.value for p in self.result.parameters}
        meta[KEY] = info
        self._target.metadata = meta
        self.message.note(f"'{self._target.name}' now carries the calibrated geometry")
