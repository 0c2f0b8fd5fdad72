"""Projection: simulate a scan of an image layer along a designed trajectory."""

from __future__ import annotations

import time

from qtpy.QtWidgets import (QCheckBox, QDoubleSpinBox, QFormLayout, QHBoxLayout, QLabel, QPushButton,
                            QSpinBox, QVBoxLayout, QWidget)

from ctbench.workbench.design import ScanGeometry

from .._layers import LayerError, geometry_of, is_trajectory_source, is_volume_candidate, sinogram_layer, volume_of
from .datasets import install as install_dataset_handling
from .display_rule import install as install_display_rule
from .common import LayerPicker, MessageLabel, ProgressBar, add_or_update, error_text, report_errors, scroll_contents, start_worker
from .display import show_sinogram

VIEW_BATCH = 8      # views per projection batch: the progress bar moves after each


class ProjectionWidget(QWidget):
    """Pick a volume (image layer) and a scan (trajectory preview or sinogram layer); get its sinogram.

    The image is taken as centred on the origin (ctbench's convention) with
    its layer scale as the voxel pitch in mm.  The sinogram layer shows
    views on the slider and detector rows vertically, and carries the scan
    geometry in its metadata for the reconstruction widget.
    """

    def __init__(self, napari_viewer, parent=None):
        super().__init__(parent)
        self.viewer = napari_viewer
        install_dataset_handling(napari_viewer)   # the ctbench reader wins for ctbench datasets
        install_display_rule(napari_viewer)       # every new layer in its frame (display_rule.py)
        self.last_layer = None
        self.volume = LayerPicker(napari_viewer, is_volume_candidate)
        self.scan = LayerPicker(napari_viewer, is_trajectory_source,
                                prefer=lambda x: x.metadata.get("ctbench", {}).get("kind") == "trajectory")
        self.noise = QCheckBox("Poisson noise")
        self.i0 = QDoubleSpinBox()
        self.i0.setDecimals(0)
        self.i0.setRange(0, 1e12)
        self.i0.setValue(1e4)
        self.i0.setSingleStep(1000)
        self.i0.setToolTip("unattenuated photons per detector pixel (I0): fewer photons, more noise")
        self.i0.setEnabled(False)
        self.noise.toggled.connect(self.i0.setEnabled)
        self.seed = QSpinBox()
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setValue(0)
        self.seed.setToolTip("noise seed; -1 draws a fresh one each time")
        self.run_button = QPushButton("Simulate projections")
        self.progress = ProgressBar()      # never paints the canvas inside a slot
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("%v / %m views")
        self.message = MessageLabel()

        form = QFormLayout()
        form.addRow("Volume", self.volume)
        form.addRow("Scan", self.scan)
        row = QHBoxLayout()
        row.addWidget(self.noise)
        row.addWidget(QLabel("I0 (photons/pixel)"))
        row.addWidget(self.i0, 1)
        form.addRow("Noise", row)
        form.addRow("Seed", self.seed)
        self.sinogram_button = QPushButton("Sinogram view (row vs angle)")
        self.sinogram_button.setToolTip("show the last simulated sinogram as a detector row against the view "
                                        "angle (the slider moves through the rows); Run shows the projections")
        self.sinogram_button.clicked.connect(self.show_sinogram_view)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.run_button)
        layout.addWidget(self.sinogram_button)
        layout.addWidget(self.progress)
        layout.addWidget(self.message)
        layout.addStretch(1)
        self.run_button.clicked.connect(self.run)
        self._worker = None
        scroll_contents(self)

    # --------------------------------------------------------------- inputs
    def inputs(self):
        """The chosen volume, its scan geometry on the volume's grid and the noise settings; LayerError if unusable."""
        vol_layer = self.volume.layer()
        if vol_layer is None:
            raise LayerError("pick an image layer as the volume (open File > Open Sample > ctbench for a phantom)")
        scan_layer = self.scan.layer()
        if scan_layer is None:
            raise LayerError("pick a scan: design one in the trajectory designer, or load a trajectory JSON")
        data, spacing = volume_of(vol_layer)
        geo = geometry_of(scan_layer)
        if geo.is_2d != (data.ndim == 2):
            need = "a 2D (y, x) image" if geo.is_2d else "a 3D (z, y, x) volume"
            raise LayerError(f"the scan '{scan_layer.name}' is {'2D' if geo.is_2d else '3D'} and needs {need}; "
                             f"layer '{vol_layer.name}' has {data.ndim} dimensions")
        geo = geo.with_volume(data.shape, spacing)
        i0 = float(self.i0.value()) if self.noise.isChecked() else None
        if i0 is not None and i0 <= 0:
            raise LayerError("I0 (photons per pixel) must be positive for Poisson noise")
        seed = None if self.seed.value() < 0 else int(self.seed.value())
        return vol_layer, geo, data, i0, seed

    # ------------------------------------------------------------------ run
    @report_errors
    def run(self, *_):
        """Simulate in a worker thread, one batch of views at a time; the sinogram layer appears when done."""
        if self._worker is not None:
            raise RuntimeError("a projection is running; wait for it to finish")
        vol_layer, geo, data, i0, seed = self.inputs()
        self.message.clear()
        name = f"sinogram of {vol_layer.name} ({geo.describe()}" + (f", I0={i0:g})" if i0 else ")")
        self.progress.setRange(0, geo.n_views)
        self.progress.setValue(0)
        self.progress.setFormat("%v / %m views")
        self.run_button.setEnabled(False)
        self._t0 = time.perf_counter()
        self._failed = False
        self._worker = start_worker(_simulate, geo, data, i0, seed, on_yield=self._step,
                                    on_return=lambda sino: self._show(sino, geo, name, vol_layer.name, i0, seed),
                                    on_error=self._error, on_finished=self._finished, owner=self)
        return self._worker

    def _step(self, done_total) -> None:
        done, total = done_total
        self.progress.setValue(done)
        elapsed = time.perf_counter() - self._t0
        left = elapsed / done * (total - done) if done else 0.0
        self.progress.setFormat(f"%v / %m views, {elapsed:.1f} s" + (f", about {left:.0f} s left" if done < total else ""))

    def _error(self, exc) -> None:
        self._failed = True
        self.message.error(f"projection failed: {error_text(exc)}")

    def _show(self, sino, geo: ScanGeometry, name: str, source: str, i0, seed) -> None:
        extra = {"source": f"simulated from layer '{source}'", "i0": i0, "seed": seed, "units": "line integral"}
        self.last_layer = add_or_update(self.viewer, sinogram_layer(sino, geo, name, extra=extra), keep_display=False)
        # A sinogram has its own frame (view, v, u): shown alone, 2D, middle view, fitted, percentile contrast.
        show_sinogram(self.viewer, self.last_layer)
        self.message.note(f"{name}: {geo.n_views} views of {' x '.join(map(str, geo.detector_shape))} pixels "
                          f"in {time.perf_counter() - self._t0:.1f} s")

    def _finished(self) -> None:
        self._worker = None
        if self._failed:
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self.progress.setFormat("failed")
        self.run_button.setEnabled(True)

    @property
    def busy(self) -> bool:
        return self._worker is not None

    @report_errors
    def show_sinogram_view(self, *_) -> None:
        """The chosen (or last) sinogram as a detector row against the angle."""
        from .display import sinogram_view

        layer = self.last_layer if self.last_layer is not None and self.last_layer in self.viewer.layers else \
            next((x for x in reversed(self.viewer.layers) if x.metadata.get("ctbench", {}).get("kind") == "sinogram"),
                 None)
        if layer is None:
            raise LayerError("no sinogram yet: click Run to simulate one, or open a sinogram")
        sinogram_view(self.viewer, layer)


def _simulate(geo: ScanGeometry, data, i0, seed):
    """Worker body: yields (views done, n_views) per batch, returns the sinogram as numpy."""
    import torch

    from ctbench.workbench.workflow import simulate_in_batches
    sino = yield from simulate_in_batches(geo, torch.from_numpy(data), batch=VIEW_BATCH, i0=i0, seed=seed)
    return sino.numpy()
