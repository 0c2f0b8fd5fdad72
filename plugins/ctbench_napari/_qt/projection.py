"""Projection: simulate a scan of an image layer along a designed trajectory."""

from __future__ import annotations

from qtpy.QtWidgets import (QCheckBox, QDoubleSpinBox, QFormLayout, QHBoxLayout, QProgressBar, QPushButton,
                            QSpinBox, QVBoxLayout, QWidget)

from ctbench.workbench.design import ScanGeometry

from .._layers import LayerError, geometry_of, is_trajectory_source, is_volume_candidate, sinogram_layer, volume_of
from .common import LayerPicker, MessageLabel, add_or_update, error_text, report_errors


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
        self.i0.setToolTip("unattenuated photons per detector pixel (I0)")
        self.seed = QSpinBox()
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setValue(0)
        self.seed.setToolTip("noise seed; -1 draws a fresh one each time")
        self.run_button = QPushButton("Simulate projections")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.message = MessageLabel()

        form = QFormLayout()
        form.addRow("Volume", self.volume)
        form.addRow("Scan", self.scan)
        row = QHBoxLayout()
        row.addWidget(self.noise)
        row.addWidget(self.i0, 1)
        form.addRow("Noise", row)
        form.addRow("Seed", self.seed)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.run_button)
        layout.addWidget(self.progress)
        layout.addWidget(self.message)
        layout.addStretch(1)
        self.run_button.clicked.connect(self.run)
        self._worker = None

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
        """Simulate in a worker thread; the sinogram layer appears when it is done."""
        from napari.qt.threading import create_worker

        if self._worker is not None:
            raise RuntimeError("a projection is running")
        vol_layer, geo, data, i0, seed = self.inputs()
        self.message.clear()
        name = f"sinogram of {vol_layer.name} ({geo.describe()}" + (f", I0={i0:g})" if i0 else ")")
        self.progress.setRange(0, 0)  # busy
        self.run_button.setEnabled(False)
        worker = create_worker(_simulate, geo, data, i0, seed, _start_thread=False)
        worker.returned.connect(lambda sino: self._show(sino, geo, name, vol_layer.name, i0, seed))
        worker.errored.connect(lambda e: self.message.error(error_text(e)))
        worker.finished.connect(self._finished)
        self._worker = worker
        worker.start()
        return worker

    def _show(self, sino, geo: ScanGeometry, name: str, source: str, i0, seed) -> None:
        extra = {"source": f"simulated from layer '{source}'", "i0": i0, "seed": seed, "units": "line integral"}
        self.last_layer = add_or_update(self.viewer, sinogram_layer(sino, geo, name, extra=extra), keep_display=False)
        # A sinogram reads as views on the slider and detector images in the canvas: 2D display.
        self.viewer.dims.ndisplay = 2
        self.message.note(f"{name}: {geo.n_views} views of {' x '.join(map(str, geo.detector_shape))} pixels")

    def _finished(self) -> None:
        self._worker = None
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self.run_button.setEnabled(True)

    @property
    def busy(self) -> bool:
        return self._worker is not None


def _simulate(geo: ScanGeometry, data, i0, seed):
    import torch

    from ctbench.workbench.workflow import simulate
    return simulate(geo, torch.from_numpy(data), i0=i0, seed=seed).numpy()
