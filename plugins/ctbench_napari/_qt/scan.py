"""The "Scan import" widget: a measured scan from file to a sinogram layer with geometry, and volumes to files.

Steps, top to bottom: open a file (TIFF, NeXus, raw, lab-scanner folder) as
a lazy projections layer; flat/dark-correct it with crop, binning, view
subset and ring filter into a layer of line integrals; find the centre of
rotation; attach a circular cone-beam geometry to any image layer, which
gives the sinogram layer the Reconstruction widget takes; export volume
layers as TIFF/HDF5/zarr; save the whole pipeline as a ``ctbench recon``
config.  All work is done by :mod:`ctbench.io` and
:mod:`ctbench.preprocessing`; this module only collects parameters.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from qtpy.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QGroupBox, QLineEdit, QPushButton,
                            QVBoxLayout, QWidget)

from ctbench.io import FORMATS, export_volume
from ctbench.pipeline import (AlgorithmConfig, GeometryConfig, InputConfig, OutputConfig, Prepared,
                              PreprocessConfig, RawOptions, ReconConfig, build_geometry, prepare,
                              save_config)
from ctbench.io.readers import read_scan
from ctbench.io.scan import images_to_sinogram

from .._layers import KEY, info, is_volume_candidate, kind_of, sinogram_layer
from .._scan_io import scan_layer
from .common import LayerPicker, MessageLabel, ProgressBar, add_or_update, error_text, report_errors, scroll_contents
from .common import double_spin as _spin
from .common import int_spin as _ispin
from .common import row_of as _row
from .corrections import CorrectionsBox
from .display_rule import install as install_display_rule


def _at(step: str):
    """The action belongs to ``step``: its messages appear under that step's buttons (``self.message``)."""
    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            self._step = step
            return method(self, *args, **kwargs)
        return wrapper
    return decorate


def _is_stack(layer) -> bool:
    return (layer.__class__.__name__ == "Image" and not getattr(layer, "rgb", False)
            and layer.data.ndim == 3 and kind_of(layer) not in ("sinogram", "volume", "completeness"))


class ScanImportWidget(QWidget):
    def __init__(self, napari_viewer, parent=None):
        super().__init__(parent)
        self.viewer = napari_viewer
        install_display_rule(napari_viewer)       # projections and line integrals in their pixel frame
        self.prepared: dict[str, Prepared] = {}
        self.last_centre = None
        self.last_sinogram = None
        lay = QVBoxLayout(self)

        # ------------------------------------------------------------ open
        box = QGroupBox("1. Open a scan")
        form = QFormLayout(box)
        self.path = QLineEdit()
        self.path.setPlaceholderText("folder or file: TIFF, NeXus (.nxs/.h5), raw, lab-scanner folder")
        browse = QPushButton("…")
        browse.setMaximumWidth(30)
        browse.clicked.connect(self._browse)
        form.addRow("Path", _row(self.path, browse))
        self.format = QComboBox()
        self.format.addItems(FORMATS)
        form.addRow("Format", self.format)
        self.raw_shape = QLineEdit()
        self.raw_shape.setPlaceholderText("views, rows, cols (raw only)")
        self.raw_dtype = QComboBox()
        self.raw_dtype.addItems(["uint16", "uint8", "int16", "uint32", "float32", "float64"])
        self.raw_order = QComboBox()
        self.raw_order.addItems(["little", "big"])
        self.raw_header = _ispin(0, 2 ** 30, 0)
        form.addRow("Raw shape", self.raw_shape)
        form.addRow("Raw type", _row(self.raw_dtype, self.raw_order, self.raw_header))
        self.open_button = QPushButton("Open")
        self.open_button.clicked.connect(self.open_scan)
        form.addRow(self.open_button)
        self._step_message("open", form)
        lay.addWidget(box)

        # ------------------------------------------------------ preprocess
        box = QGroupBox("2. Correct (flat/dark, -log)")
        form = QFormLayout(box)
        self.projections = LayerPicker(napari_viewer, lambda x: kind_of(x) == "projections")
        form.addRow("Projections", self.projections)
        self.row0, self.row1 = _ispin(0, 100000, 0), _ispin(0, 100000, 0, "end")
        self.col0, self.col1 = _ispin(0, 100000, 0), _ispin(0, 100000, 0, "end")
        form.addRow("Rows", _row(self.row0, self.row1))
        form.addRow("Columns", _row(self.col0, self.col1))
        self.bin = _ispin(1, 16, 1)
        self.every = _ispin(1, 1000, 1)
        form.addRow("Bin / every k-th view", _row(self.bin, self.every))
        self.use_range = QCheckBox("only")
        self.range0, self.range1 = _spin(-3600, 3600, 0, 10, 1, "°"), _spin(-3600, 3600, 360, 10, 1, "°")
        form.addRow("Angles", _row(self.use_range, self.range0, self.range1))
        self.ring = _ispin(0, 101, 0, "off")
        form.addRow("Ring filter width", self.ring)
        self.corrections = CorrectionsBox(napari_viewer, self._preview_context)
        form.addRow(self.corrections)
        self.correct_button = QPushButton("Correct")
        self.correct_button.clicked.connect(self.correct)
        form.addRow(self.correct_button)
        self._step_message("correct", form)
        lay.addWidget(box)

        # -------------------------------------------------------- geometry
        box = QGroupBox("3. Geometry (circular cone beam)")
        form = QFormLayout(box)
        self.target = LayerPicker(napari_viewer, _is_stack, prefer=lambda x: kind_of(x) == "line_integrals")
        form.addRow("Line integrals", self.target)
        self.sid, self.sdd = _spin(0.001, 1e5, 500, 10, 3, "mm"), _spin(0.001, 1e5, 1000, 10, 3, "mm")
        form.addRow("SID / SDD", _row(self.sid, self.sdd))
        self.pitch_u, self.pitch_v = _spin(1e-4, 1e3, 1.0, 0.1, 4, "mm"), _spin(1e-4, 1e3, 1.0, 0.1, 4, "mm")
        form.addRow("Pixel pitch u / v", _row(self.pitch_u, self.pitch_v))
        self.offset_u, self.offset_v = _spin(-1e4, 1e4, 0, 0.1, 4, "mm"), _spin(-1e4, 1e4, 0, 0.1, 4, "mm")
        form.addRow("Detector offset u / v", _row(self.offset_u, self.offset_v))
        self.angle_range, self.start_angle = _spin(1, 3600, 360, 10, 2, "°"), _spin(-3600, 3600, 0, 10, 2, "°")
        form.addRow("Angles if the file has none: range / start", _row(self.angle_range, self.start_angle))
        # Orientation (docs/SCANS.md): "auto" is decided by Find centre from the data.
        self.seen_from, self.rotation = QComboBox(), QComboBox()
        self.seen_from.addItems(["auto", "source", "detector"])
        self.rotation.addItems(["auto", "ccw", "cw"])
        self.seen_from.setToolTip("source: the image as a camera at the source sees the detector (most scanners, "
                                  "ASTRA); detector: as seen from behind the detector (ctbench's own images)")
        self.rotation.setToolTip("how the source turns about the object seen from above as the views go on")
        form.addRow("Image seen from / rotation", _row(self.seen_from, self.rotation))
        self.vol_d, self.vol_h, self.vol_w = (_ispin(0, 100000, 0, "auto") for _ in range(3))
        form.addRow("Volume D, H, W", _row(self.vol_d, self.vol_h, self.vol_w))
        self.voxel = _spin(0.0, 1e3, 0.0, 0.1, 4, "mm")
        self.voxel.setSpecialValueText("auto")
        form.addRow("Voxel pitch", self.voxel)
        self.centre_button = QPushButton("Find centre")
        self.centre_button.clicked.connect(self.find_centre)
        self.attach_button = QPushButton("Attach geometry")
        self.attach_button.clicked.connect(self.attach_geometry)
        self.calibrate_button = QPushButton("Calibrate…")
        self.calibrate_button.setToolTip("correct the attached geometry from the scan's own data (offset, roll, "
                                         "drift, tilts): the Calibrate widget on this sinogram")
        self.calibrate_button.clicked.connect(self.calibrate)
        form.addRow(_row(self.centre_button, self.attach_button, self.calibrate_button))
        self._step_message("geometry", form)
        lay.addWidget(box)

        # ---------------------------------------------------------- export
        box = QGroupBox("4. Export")
        form = QFormLayout(box)
        self.volume = LayerPicker(napari_viewer, lambda x: is_volume_candidate(x) and kind_of(x) not in
                                  ("projections", "line_integrals"), prefer=lambda x: kind_of(x) == "volume")
        form.addRow("Volume", self.volume)
        self.export_path = QLineEdit()
        self.export_path.setPlaceholderText("recon.tif, recon.h5 or recon.zarr")
        self.overwrite = QCheckBox("Overwrite")
        form.addRow("File", _row(self.export_path, self.overwrite))
        self.export_button = QPushButton("Export volume")
        self.export_button.clicked.connect(self.export)
        self.config_path = QLineEdit()
        self.config_path.setPlaceholderText("recon.json")
        self.config_button = QPushButton("Save recon config")
        self.config_button.clicked.connect(self.save_config)
        form.addRow(self.export_button)
        form.addRow("Config", _row(self.config_path, self.config_button))
        self._step_message("export", form)
        lay.addWidget(box)

        self.progress = ProgressBar()      # never paints the canvas inside a slot
        self.progress.setRange(0, 1)
        self.progress.hide()
        lay.addWidget(self.progress)
        lay.addStretch(1)
        self._worker = None
        # The form follows the chosen scan: SID/SDD/pixel pitch from its scan.json as soon as it is picked.
        self.projections.layer_changed.connect(self._scan_picked)
        self._scan_picked(self.projections.layer())
        self._buttons = (self.open_button, self.correct_button, self.centre_button, self.attach_button,
                         self.export_button, self.config_button)
        scroll_contents(self)     # last: the steps scroll on a short screen

    # ----------------------------------------------------------------- helpers
    def _step_message(self, step: str, form) -> None:
        """A message line under the buttons of ``step``: where the eye is after pressing one of them."""
        if not hasattr(self, "_messages"):
            self._messages: dict = {}
            self._forms: dict = {}
            self._step = step
        self._messages[step] = MessageLabel()
        self._forms[step] = form
        form.addRow(self._messages[step])

    def _progress_at_step(self) -> None:
        """The busy bar moves into the step that is working, above its message line."""
        form = self._forms[self._step]
        if self.progress.parentWidget() is form.parentWidget():
            return
        old = self.progress.parentWidget()
        layout = old.layout() if old is not None else None
        if isinstance(layout, QFormLayout):
            layout.takeRow(self.progress)           # the row goes too, no gap left behind
        elif layout is not None:
            layout.removeWidget(self.progress)
        row, _ = form.getWidgetPosition(self._messages[self._step])
        form.insertRow(max(row, 0), self.progress)

    @property
    def message(self) -> MessageLabel:
        """The message line of the step the latest action belongs to."""
        return self._messages[self._step]

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a scan", "", "Scans (*.tif *.tiff *.nxs *.h5 *.hdf5 "
                                                                       "*.raw *.bin *.json);;All files (*)")
        if path:
            self.path.setText(str(Path(path).parent) if path.endswith(".json") else path)

    def _raw_options(self) -> dict | None:
        if self.format.currentText() != "raw":
            return None
        try:
            shape = tuple(int(x) for x in self.raw_shape.text().replace("x", ",").split(","))
        except ValueError:
            raise ValueError(f"raw shape must be 'views, rows, cols', got {self.raw_shape.text()!r}") from None
        return RawOptions(shape=shape, dtype=self.raw_dtype.currentText(), byte_order=self.raw_order.currentText(),
                          header=self.raw_header.value()).model_dump()

    def _source(self, layer) -> dict:
        src = info(layer).get("source")
        if not isinstance(src, dict) or "path" not in src:
            raise ValueError(f"layer '{layer.name}' does not come from a scan file; open it with step 1")
        return src

    def preprocess_config(self) -> PreprocessConfig:
        def rng(a, b):
            return None if a.value() == 0 and b.value() == 0 else (a.value(), b.value() or 10 ** 9)
        return PreprocessConfig(rows=rng(self.row0, self.row1), cols=rng(self.col0, self.col1), bin=self.bin.value(),
                                every=self.every.value(),
                                angle_range_deg=(self.range0.value(), self.range1.value())
                                if self.use_range.isChecked() else None, ring_filter=self.ring.value(),
                                **self.corrections.keys())

    def _preview_context(self):
        """What the corrections preview needs: how to open the scan (in the worker), the other preprocessing,
        the form's pitch (used when the file has none) and the view under the slider."""
        layer = self.projections.layer()
        if layer is None:
            raise ValueError("no projections layer: open a scan first (step 1)")
        src = self._source(layer)
        pre = self.preprocess_config().model_copy(update={"zingers": None, "rings": None, "phase": None,
                                                          "beam_hardening": None})
        view = min(int(self.viewer.dims.current_step[0]), layer.data.shape[0] - 1)
        return (lambda: read_scan(src["path"], format=src["format"] if src.get("format") in FORMATS else "auto",
                                  raw=src.get("raw"))), pre, (self.pitch_u.value(), self.pitch_v.value()), view

    # ------------------------------------------------------- background work
    @property
    def busy(self) -> bool:
        return self._worker is not None

    def _start(self, fn, args: tuple, on_done, what: str):
        """Run ``fn(*args)`` in a napari thread worker; ``on_done(result)`` on the GUI thread afterwards."""
        from .common import start_worker

        if self._worker is not None:
            raise RuntimeError("the widget is still working on the previous step; wait for it to finish")
        self._progress_at_step()
        self.progress.setRange(0, 0)          # busy indicator
        self.progress.setFormat(what)
        self.progress.show()
        for b in self._buttons:
            b.setEnabled(False)
        # start_worker: errors only in the message line (no toast, no re-raise that aborts a script)
        self._worker = start_worker(fn, *args, on_return=lambda result: self._deliver(on_done, result),
                                    on_error=lambda e: self.message.error(error_text(e)),
                                    on_finished=self._finished, owner=self)
        return self._worker

    def _deliver(self, on_done, result) -> None:
        try:
            on_done(result)
        except Exception as e:  # noqa: BLE001 - shown in the widget, like report_errors
            self.message.error(error_text(e))

    def _finished(self) -> None:
        self._worker = None
        self.progress.setRange(0, 1)
        self.progress.hide()
        for b in self._buttons:
            b.setEnabled(True)

    # ----------------------------------------------------------------- actions
    @_at("open")
    @report_errors
    def open_scan(self, *_):
        self.message.clear()
        path = self.path.text().strip()
        if not path:
            raise ValueError("enter the path of a scan file or folder")
        layer = add_or_update(self.viewer, scan_layer(path, format=self.format.currentText(),
                                                      raw=self._raw_options()))
        self.projections.select(layer.name)
        self._fill_from_scan(info(layer).get("scan", {}))
        self.message.note(f"opened {layer.data.shape[0]} projections of {layer.data.shape[2]} x "
                          f"{layer.data.shape[1]} pixels ({info(layer)['source']['format']})")
        return layer

    def _scan_picked(self, layer) -> None:
        if layer is not None:
            self._fill_from_scan(info(layer).get("scan") or {})

    def _fill_from_scan(self, d: dict) -> None:
        sc = d.get("scanner", {})
        if sc.get("source_object_distance_mm"):
            self.sid.setValue(sc["source_object_distance_mm"])
        if sc.get("source_detector_distance_mm"):
            self.sdd.setValue(sc["source_detector_distance_mm"])
        if d.get("pixel_size"):
            self.pitch_u.setValue(d["pixel_size"][0])
            self.pitch_v.setValue(d["pixel_size"][1])
        o = d.get("orientation") or {}
        if o.get("image_seen_from"):
            self.seen_from.setCurrentText(o["image_seen_from"])
        if o.get("rotation_direction"):
            self.rotation.setCurrentText(o["rotation_direction"])

    @_at("correct")
    @report_errors
    def correct(self, *_):
        """Flat/dark-correct the chosen projections in a worker; a line-integrals layer appears when done."""
        self.message.clear()
        layer = self.projections.layer()
        if layer is None:
            raise ValueError("no projections layer: open a scan first (step 1)")
        src = self._source(layer)
        pre = self.preprocess_config()
        pitch = (self.pitch_u.value(), self.pitch_v.value())
        return self._start(_prepare, (src, pre, pitch), lambda prep: self._show_prepared(layer, src, pre, prep),
                           "correcting…")

    def _show_prepared(self, layer, src: dict, pre: PreprocessConfig, res):
        prep, (lo, hi) = res          # the line integrals and their window, both from the worker
        name = f"{layer.name.split(' (')[0]} line integrals"
        meta = {"kind": "line_integrals", "source": src, "preprocess": pre.model_dump(mode="json"),
                "pitch": list(prep.pitch), "shift_mm": [prep.shift_u, prep.shift_v],
                "angles_deg": None if prep.angles is None else np.degrees(prep.angles).tolist(),
                "correction": prep.correction, "scan": info(layer).get("scan", {})}
        out = add_or_update(self.viewer, (prep.images, {"name": name, "metadata": {KEY: meta}, "colormap": "gray",
                                                        "contrast_limits": (float(lo), float(hi))}, "image"))
        self.prepared[name] = prep
        self.target.select(name)
        self._fill_from_scan(info(layer).get("scan", {}))
        self.pitch_u.setValue(prep.pitch[0])
        self.pitch_v.setValue(prep.pitch[1])
        c = prep.correction
        self.message.note(f"{prep.images.shape[0]} views of {prep.images.shape[2]} x {prep.images.shape[1]} "
                          f"pixels; clipped {c.get('n_clipped', 0)} of {c.get('n_values', 0)} values, "
                          f"{c.get('n_dead_pixels', 0)} dead pixels"
                          + (f"; replaced {c['n_nonfinite_counts']} NaN/inf values by their neighbours' median"
                             if c.get("n_nonfinite_counts") else ""))
        return out

    def _angles(self, layer) -> np.ndarray:
        deg = info(layer).get("angles_deg")
        n = layer.data.shape[0]
        if deg is not None and len(deg) == n:
            return np.radians(np.asarray(deg, dtype=np.float64))
        return np.radians(self.start_angle.value() + self.angle_range.value() * np.arange(n) / n)

    def _target(self):
        layer = self.target.layer()
        if layer is None:
            raise ValueError("no image stack to attach a geometry to: correct a scan (step 2) or open one")
        return layer

    @_at("geometry")
    @report_errors
    def find_centre(self, *_):
        """Search the detector offset in a worker; fills "Detector offset u" when done."""
        self.message.clear()
        layer = self._target()
        images = np.asarray(layer.data, dtype=np.float32)
        o, file_rot = self._orientation(layer)
        args = (images, self._angles(layer), o, file_rot)
        kw = dict(pitch=self.pitch_u.value(), pitch_v=self.pitch_v.value(), sid=self.sid.value(),
                  sdd=self.sdd.value(), offset_v_mm=self.offset_v.value())
        return self._start(lambda *a: _orient(*a, **kw), args, self._show_centre, "finding the centre…")

    def _orientation(self, layer):
        """The form's orientation (the file's columns/rows) and the rotation the layer's angles follow."""
        from ctbench.io.orientation import Orientation

        fo = info(layer).get("scan", {}).get("orientation") or {}
        o = Orientation.from_dict({"image_seen_from": self.seen_from.currentText(),
                                   "rotation_direction": self.rotation.currentText()},
                                  defaults=Orientation.from_dict(fo))
        return o, fo.get("rotation_direction", "auto")

    def _show_centre(self, res) -> None:
        self.seen_from.setCurrentText(res.orientation.seen_from)
        self.rotation.setCurrentText(res.orientation.rotation)
        self.offset_u.setValue(res.centre.offset_mm)
        self.last_centre = res.centre
        self.last_orientation = res
        text = res.centre.text()
        if res.detected:
            text += f"; orientation from the data: {res.orientation.text()} (its mirror reading fits as well)"
        for w in res.warnings:
            text += f"\nwarning: {w}"
        self.message.note(text)

    def geometry_config(self) -> GeometryConfig:
        shape = (self.vol_d.value(), self.vol_h.value(), self.vol_w.value())
        return GeometryConfig(sid_mm=self.sid.value(), sdd_mm=self.sdd.value(),
                              angle_range_deg=self.angle_range.value(), start_angle_deg=self.start_angle.value(),
                              detector_offset_u_mm=self.offset_u.value(), detector_offset_v_mm=self.offset_v.value(),
                              volume_shape=shape if all(shape) else None, voxel_size_mm=self.voxel.value() or None,
                              image_seen_from=self.seen_from.currentText(),
                              rotation_direction=self.rotation.currentText())

    @_at("geometry")
    @report_errors
    def attach_geometry(self, *_):
        self.message.clear()
        layer = self._target()
        if self.sdd.value() < self.sid.value():
            raise ValueError(f"SDD ({self.sdd.value()} mm) must be at least SID ({self.sid.value()} mm)")
        from ctbench.io.handedness import ctbench_angles

        o, file_rot = self._orientation(layer)
        if not o.resolved:
            raise ValueError("the image orientation or rotation is 'auto': press Find centre to decide it from "
                             "the data, or choose it")
        args = (layer.data, o, (self.pitch_u.value(), self.pitch_v.value()), self.geometry_config(), self.sid.value(),
                self.sdd.value(), ctbench_angles(self._angles(layer), file_rot, o.rotation), self.offset_u.value(),
                f"{layer.name} sinogram",
                {"source": info(layer).get("source"), "units": "line integral", "from_layer": layer.name})
        # The geometry, the sinogram's display copy and its window are computed in a worker thread.
        return self._start(_attach, args, self._show_attached, "attaching the geometry…")

    @_at("geometry")
    @report_errors
    def calibrate(self, *_):
        """The Calibrate step: the Calibrate widget on the sinogram that Attach geometry made."""
        from .calibrate import open_calibrate

        return open_calibrate(self.viewer, self.last_sinogram)

    def _show_attached(self, res):
        geo, layer_data = res
        out = add_or_update(self.viewer, layer_data)
        self.last_sinogram = out
        self.message.note(f"{geo.describe()}: detector {geo.detector_shape} x {geo.detector_spacing} mm, offset "
                          f"{self.offset_u.value():+.3f} mm; volume {geo.volume_shape} of {geo.voxel_spacing[0]:.3g} mm "
                          "(pick it in the Reconstruction widget)")
        return out

    @_at("export")
    @report_errors
    def export(self, *_):
        self.message.clear()
        layer = self.volume.layer()
        if layer is None:
            raise ValueError("no volume layer to export")
        path = self.export_path.text().strip()
        if not path:
            raise ValueError("enter a file name ending in .tif, .h5 or .zarr")
        spacing = tuple(float(s) for s in layer.scale[-layer.data.ndim:])
        geo = info(layer).get("geometry")
        from ctbench.workbench.design import ScanGeometry
        # The output policy: never over a scan file that a layer of this viewer was read from.
        scans = [s.get(k) for lyr in self.viewer.layers if isinstance(s := info(lyr).get("source"), dict)
                 for k in ("path", "flats", "darks") if isinstance(s.get(k), str)]
        try:
            out = export_volume(path, layer.data, spacing, overwrite=self.overwrite.isChecked(), inputs=scans,
                                geometry=ScanGeometry.from_dict(geo) if isinstance(geo, dict) else None,
                                meta={"layer": layer.name, "recon": _jsonable(info(layer).get("recon"))})
        except FileExistsError as e:
            # The library's wording names its keyword; here the choice is the checkbox.
            raise FileExistsError(str(e).replace("pass overwrite=True (--overwrite)", "tick Overwrite")) from None
        self.message.note(f"wrote {out} ({layer.data.shape}, voxel {spacing} mm)")
        return out

    def recon_config(self) -> ReconConfig:
        """The current pipeline: the corrected layer's file and preprocessing, the form's geometry, the
        algorithm of the chosen volume layer (FDK if it has none) and the export file."""
        layer = self._target()
        meta = info(layer)
        src = meta.get("source")
        if not isinstance(src, dict) or "pitch" not in meta:
            raise ValueError(f"layer '{layer.name}' was not made by step 2 from a scan file; a config needs both")
        pre = PreprocessConfig(**meta["preprocess"])
        geo = self.geometry_config()
        # The form's offset is for the corrected detector; a config names the offset of the whole detector.
        o, _ = self._orientation(layer)      # a crop's shift reverses with the columns (rows) it is counted in
        su = -meta["shift_mm"][0] if o.seen_from != "auto" and o.flip_columns else meta["shift_mm"][0]
        sv = -meta["shift_mm"][1] if o.flip_rows else meta["shift_mm"][1]
        geo.detector_offset_u_mm = self.offset_u.value() - su
        geo.detector_offset_v_mm = self.offset_v.value() - sv
        geo.pixel_size_mm = tuple(p / pre.bin for p in meta["pitch"])
        vol = self.volume.layer()
        rec = info(vol).get("recon", {}) if vol is not None else {}
        algo = AlgorithmConfig(name=rec.get("algorithm", "fbp"), params=rec.get("params", {}))
        fmt = src.get("format") if src.get("format") in FORMATS else "auto"
        raw = src.get("raw")
        out = self.export_path.text().strip()
        return ReconConfig(input=InputConfig(path=src["path"], format="auto" if fmt == "scanner" else fmt,
                                             raw=RawOptions(**raw) if raw else None),
                           preprocess=pre, geometry=geo, algorithm=algo,
                           output=OutputConfig(path=out, overwrite=self.overwrite.isChecked()) if out else None)

    @_at("export")
    @report_errors
    def save_config(self, *_):
        self.message.clear()
        path = self.config_path.text().strip()
        if not path:
            raise ValueError("enter a file name for the config, e.g. recon.json")
        out = save_config(self.recon_config(), path)
        self.message.note(f"saved {out}; run it with: ctbench recon {out}")
        return out


def _orient(images, angles, orientation, file_rotation, **kw):
    """Decide an "auto" orientation from the data and find the centre (runs in a worker thread)."""
    from ctbench.io.handedness import resolve_orientation

    if orientation.flip_rows:
        images = images[:, ::-1, :]
    return resolve_orientation(images, angles, orientation, file_rotation, **kw)


def _prepare(src: dict, pre: PreprocessConfig, pitch) -> tuple[Prepared, tuple[float, float]]:
    """Reopen the scan file of a projections layer and preprocess it (runs in a worker thread)."""
    scan = read_scan(src["path"], format=src["format"] if src.get("format") in FORMATS else "auto",
                     raw=src.get("raw"))
    prep = prepare(scan, pre, None if scan.pixel_size else pitch)
    return prep, tuple(float(x) for x in np.percentile(prep.images, [0.5, 99.8]))   # the window: not on the GUI thread


def _attach(data, orientation, pitch, config, sid, sdd, angles, offset_u, name, extra):
    """The sinogram layer of an image stack with a circular cone-beam geometry (runs in a worker thread)."""
    from ctbench.io.orientation import to_ctbench_images

    images = to_ctbench_images(np.asarray(data, dtype=np.float32), orientation)
    prep = Prepared(images, None, pitch)
    geo = build_geometry(prep, config, sid, sdd, angles, offset_u)
    sino = np.ascontiguousarray(images_to_sinogram(images))
    layer_data = sinogram_layer(sino, geo, name, extra=extra)
    layer_data[1]["contrast_limits"] = tuple(float(x) for x in np.percentile(images, [0.5, 99.8]))
    return geo, layer_data


def _jsonable(x):
    import json
    try:
        json.dumps(x)
        return x
    except TypeError:
        return None
