"""Reconstruction: FBP/FDK, SIRT, CGLS, TV with live preview, residual plot, cancel and comparison."""

from __future__ import annotations

import functools
import re
import time

import numpy as np
from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import (QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QListWidget,
                            QListWidgetItem, QPushButton, QSizePolicy, QSpinBox, QStackedWidget,
                            QVBoxLayout, QWidget)

from ctbench.workbench.applicability import unusable_reason
from ctbench.workbench.workflow import (ALGORITHMS, Finished, Progress, ReconRequest, Started, SubsetProgress,
                                        reconstruct)

from .._layers import KEY, UNITS, LayerError, geometry_of, has_geometry, is_sinogram, placement, sinogram_of
from .datasets import install as install_dataset_handling
from .display_rule import install as install_display_rule, reveal
from .common import (LayerPicker, MessageLabel, ParamForm, ProgressBar, Steps, error_text,
                     report_errors, scroll_contents, set_placement)
from .compare import ComparePanel
from .display import prepare_sliders_for, show_result_steps
from .estimate import EstimateLabel
from .plot import ResidualPlot
from .runner import LocalRunner, Runner

PREVIEW_MODES = {"auto": "Auto (exact slice if possible)", "slice": "Central slice", "binned": "2x binned volume"}


def _is_image(layer) -> bool:
    return layer.__class__.__name__ == "Image"


def _is_usable_sinogram(layer) -> bool:
    return _is_image(layer) and is_sinogram(layer) and has_geometry(layer)


def _short(name: str, n: int = 40) -> str:
    """A source name for result names: without its parenthesised details, at most ``n`` characters."""
    name = re.sub(r"\s*\(.*\)$", "", name) or name
    return name if len(name) <= n else name[: n - 1] + "…"


class ReconstructionWidget(QWidget):
    """Reconstruct a sinogram layer (its geometry comes from the layer's metadata).

    Runs go through a :class:`~ctbench_napari._qt.runner.Runner`: the
    default runs locally in a napari thread worker; a jobs panel can hand
    in another runner (e.g. a background GPU job) through :meth:`set_runner`.
    """

    result_added = Signal(object)     # the finished result layer

    def __init__(self, napari_viewer, parent=None, runner: Runner | None = None):
        super().__init__(parent)
        self.viewer = napari_viewer
        install_dataset_handling(napari_viewer)   # the ctbench reader wins for ctbench datasets
        install_display_rule(napari_viewer)       # every new layer in its frame (display_rule.py)
        self.runner: Runner = runner or LocalRunner(self)
        self.results: list = []          # result layers of this widget, oldest first
        self.live_layer = None
        self.n_live_updates = 0
        self._run: dict = {}
        # A result's data goes into its layer in one turn, its display (frame, slice, camera, contrast) in the
        # next: each is a napari update of its own, and together they stalled the window past 250 ms.
        self.display_steps = Steps(self)

        # --- inputs
        self.sinogram = LayerPicker(napari_viewer, _is_usable_sinogram)
        self.sinogram.setToolTip("sinogram layers with a ctbench geometry (simulated, opened from a dataset, or a sample)")
        self.algorithm = QComboBox()
        self.forms = QStackedWidget()
        for key, algo in ALGORITHMS.items():
            self.algorithm.addItem(algo.label, key)
            form = ParamForm(algo.params)
            form.setToolTip(algo.description)
            self.forms.addWidget(form)
        self.grid = [QSpinBox() for _ in range(3)]
        for s in self.grid:
            s.setRange(1, 100000)
            s.setValue(64)
        self.pitch = QDoubleSpinBox()
        self.pitch.setDecimals(4)
        self.pitch.setRange(1e-4, 1e4)
        self.pitch.setValue(1.0)
        self.preview_every = QSpinBox()
        self.preview_every.setRange(0, 100000)
        self.preview_every.setValue(5)
        self.preview_every.setToolTip("update the live preview every this many iterations (0: never)")
        self.preview_mode = QComboBox()
        for key, label in PREVIEW_MODES.items():
            self.preview_mode.addItem(label, key)

        # --- actions and feedback
        self.preview_button = QPushButton("Quick preview")
        self.preview_button.setToolTip("reconstruct only the central slice (or a 2x-binned volume) to tune parameters")
        self.run_button = QPushButton("Run")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = ProgressBar()      # never paints the canvas inside a slot
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("")            # no numbers before the first run
        self.plot = ResidualPlot()
        self.estimate = EstimateLabel(self)       # memory and time of a Run, before it runs
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.message = MessageLabel()
        self.result_list = QListWidget()
        self.result_list.setMaximumHeight(90)
        self.comparison = ComparePanel(napari_viewer, self)
        self.compare_button = self.comparison.compare_button
        self.single_button = self.comparison.single_button

        form = QFormLayout()
        form.addRow("Sinogram", self.sinogram)
        form.addRow("Algorithm", self.algorithm)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.forms)
        grid_box = QGroupBox("Volume grid")
        g = QFormLayout(grid_box)
        row = QHBoxLayout()
        for label, s in zip("DHW", self.grid):
            row.addWidget(QLabel(label))
            row.addWidget(s)
        g.addRow("Voxels", row)
        g.addRow("Voxel pitch (mm)", self.pitch)
        layout.addWidget(grid_box)
        opts = QFormLayout()
        opts.addRow("Live preview every", self.preview_every)
        opts.addRow("Quick preview", self.preview_mode)
        layout.addLayout(opts)
        from .jobs import BackgroundJobChoice   # "run as background job": ranks, partition, devices, bridge
        self.background = BackgroundJobChoice(self)
        layout.addWidget(self.background)
        row = QHBoxLayout()
        for b in (self.preview_button, self.run_button, self.cancel_button):
            row.addWidget(b)
        layout.addLayout(row)
        layout.addWidget(self.estimate)
        layout.addWidget(self.progress)
        layout.addWidget(self.plot)
        layout.addWidget(self.status)
        layout.addWidget(self.message)
        layout.addWidget(QLabel("Results (check to compare)"))
        layout.addWidget(self.result_list)
        layout.addWidget(self.comparison)
        layout.addStretch(1)

        self.algorithm.currentIndexChanged.connect(self._algorithm_changed)
        self.sinogram.layer_changed.connect(self._sinogram_changed)
        self.preview_button.clicked.connect(self.quick_preview)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        napari_viewer.layers.events.removed.connect(self._layer_removed)
        for i in range(self.forms.count()):
            self.forms.widget(i).changed.connect(self.estimate.schedule)
        for w in (*self.grid, self.pitch):
            w.valueChanged.connect(self.estimate.schedule)
        self.algorithm.currentIndexChanged.connect(self.estimate.schedule)
        self.sinogram.layer_changed.connect(self.estimate.schedule)
        self.set_runner(self.runner)
        self._algorithm_changed(self.algorithm.currentIndex())
        self._sinogram_changed(self.sinogram.layer())
        scroll_contents(self)

    # ---------------------------------------------------------------- setup
    def set_runner(self, runner: Runner) -> None:
        """Use another runner (same event interface), e.g. one that drives a background job."""
        if self.runner is not runner and self.runner.running:
            raise RuntimeError("cannot switch runners while a reconstruction is running")
        connected = getattr(self, "_connected_runner", None)    # disconnect only what was connected (PySide6
        if connected is not None:                                  # warns on anything else)
            for sig, slot in ((connected.event, self._on_event), (connected.failed, self._on_failed),
                              (connected.done, self._on_done)):
                try:
                    sig.disconnect(slot)
                except (TypeError, RuntimeError):
                    pass
        self._connected_runner = runner
        self.runner = runner
        runner.event.connect(self._on_event)
        runner.failed.connect(self._on_failed)
        runner.done.connect(self._on_done)

    def _algorithm_changed(self, index: int) -> None:
        # A stacked widget is as tall as its tallest page: let only the shown page count.
        for i in range(self.forms.count()):
            page = self.forms.widget(i)
            policy = QSizePolicy.Preferred if i == index else QSizePolicy.Ignored
            page.setSizePolicy(policy, policy)
        self.forms.setCurrentIndex(index)
        self.forms.adjustSize()
        algo = ALGORITHMS[self.algorithm.itemData(index)]
        self.plot.setVisible(algo.iterative)
        self.preview_every.setEnabled(algo.iterative)

    def select_algorithm(self, name: str, **params) -> None:
        """Choose an algorithm and set some of its parameters (for scripts and tests)."""
        i = self.algorithm.findData(name)
        if i < 0:
            raise ValueError(f"unknown algorithm {name!r}; choose from {list(ALGORITHMS)}")
        self.algorithm.setCurrentIndex(i)
        self.forms.currentWidget().set_values(params)

    def _update_algorithms(self, geo) -> None:
        """Disable the algorithms this scan cannot use, with the reason as their tooltip."""
        model = self.algorithm.model()
        for i in range(self.algorithm.count()):
            key = self.algorithm.itemData(i)
            reason = unusable_reason(key, geo) if geo is not None else None
            item = model.item(i)
            item.setEnabled(reason is None)
            self.algorithm.setItemData(i, reason or ALGORITHMS[key].description, Qt.ToolTipRole)
        if geo is not None and unusable_reason(self.algorithm.currentData(), geo) is not None:
            for i in range(self.algorithm.count()):
                if model.item(i).isEnabled():
                    self.algorithm.setCurrentIndex(i)
                    break

    def algorithm_reason(self, name: str) -> str | None:
        """Why the algorithm is disabled for the chosen sinogram (None when it is enabled)."""
        i = self.algorithm.findData(name)
        return None if self.algorithm.model().item(i).isEnabled() else self.algorithm.itemData(i, Qt.ToolTipRole)

    def _sinogram_changed(self, layer) -> None:
        if layer is None or not is_sinogram(layer):
            self._update_algorithms(None)
            return
        try:
            geo, _ = sinogram_of(layer)
        except LayerError:
            return
        self._update_algorithms(geo)
        shape = geo.volume_shape if not geo.is_2d else (1, *geo.volume_shape)
        for s, n in zip(self.grid, shape):
            s.setValue(int(n))
        self.grid[0].setEnabled(not geo.is_2d)
        self.pitch.setValue(float(geo.voxel_spacing[-1]))

    # ------------------------------------------------------------- requests
    def request(self, mode: str = "full") -> ReconRequest:
        key = self.algorithm.currentData()
        return ReconRequest(key, self.forms.currentWidget().values(), mode).validated()

    def problem_inputs(self):
        """Geometry on the chosen grid and the sinogram of the chosen layer; LayerError if unusable."""
        layer = self.sinogram.layer()
        if layer is None:
            raise LayerError("no sinogram to reconstruct: simulate one in the Projection widget, or open "
                             "File > Open Sample > ctbench")
        geo, sino = sinogram_of(layer)
        return layer, self._on_grid(geo), sino

    def problem_geometry(self):
        """The geometry a Run would use (chosen layer, chosen grid), without reading the sinogram."""
        layer = self.sinogram.layer()
        if layer is None:
            raise LayerError("no sinogram chosen")
        return self._on_grid(geometry_of(layer))

    def _on_grid(self, geo):
        reason = unusable_reason(self.algorithm.currentData(), geo)
        if reason is not None:
            raise LayerError(reason)
        D, H, W = (s.value() for s in self.grid)
        p = float(self.pitch.value())
        return geo.with_volume((H, W), (p, p)) if geo.is_2d else geo.with_volume((D, H, W), (p, p, p))

    # ------------------------------------------------------------------ runs
    @report_errors
    def run(self, *_):
        """Full reconstruction in the background with live preview."""
        return self._start("full")

    @report_errors
    def quick_preview(self, *_):
        """Reconstruct the central slice (or a binned volume) with the current parameters."""
        return self._start(self.preview_mode.currentData())

    def _start(self, mode: str):
        import torch

        if self.running:
            raise RuntimeError("a reconstruction is running; cancel it first")
        layer, geo, sino = self.problem_inputs()
        request = self.request(mode)
        self.message.clear()
        self.plot.clear()
        self.n_live_updates = 0
        every = int(self.preview_every.value())
        self._run = {"request": request, "geometry": geo, "source": layer.name, "t0": time.perf_counter(),
                     "finished": None}
        sino_t = torch.from_numpy(np.ascontiguousarray(sino))
        # The run's layer is not added in the click: a new napari layer (its visual, controls, selection, a
        # canvas paint and the window's repaint) and the click's own work in one turn stalled the window
        # past 250 ms.  A full iterative run adds it in the turns after the click, before its worker starts
        # (added while a solver runs, napari's Python work would wait for the GIL); a one-pass run (FBP,
        # FDK: its only frame is the result) adds it with the result, in a turn after Finished; a quick
        # preview reuses its layer (made at Started the first time).
        self.live_layer = None
        self._run["name"] = self._layer_name(request, layer.name)
        self.progress.setRange(0, 0)
        self.progress.setFormat("%v / %m")
        self.status.setText(f"{request.title()}: starting…")
        self._set_running(True)
        job = getattr(self.runner, "job_events", None) if mode == "full" else None   # background job (jobs.py)
        # Ordered-subset methods report every subset from inside a pass, in the worker thread; ``post`` queues
        # them on the GUI thread in order with the other events.
        post = getattr(self.runner, "post", self.runner.event.emit)     # in order with the paced events
        on_subset = post if request.algorithm in ("os_sirt", "os_tv") else None

        def start():
            self.runner.start(job(geo, sino_t, request) if job else
                              lambda cancel: reconstruct(geo, sino_t, request, preview_every=every, cancel=cancel,
                                                         on_subset=on_subset))
        if mode == "full" and request.spec.iterative:
            name, shape, recon = self._run["name"], geo.volume_shape, {"request": request.to_dict()}
            meta = {KEY: {"kind": "volume", "running": True, "recon": recon}}
            added = self._add_steps(
                name,
                lambda: _image(np.zeros(shape, np.float32), name, meta, placement(shape, geo.voxel_spacing, None)),
                lambda: self._live_layer(name, shape, geo.voxel_spacing, None, recon),
                lambda layer: setattr(self, "live_layer", layer), show=False)
            # Hidden until its first live preview (or its result): an all-zero layer on top would blacken the
            # canvas until then, and for the whole run when previews are rare.
            self.display_steps.run([*added, start], on_error=self._not_started, later=True)
        else:
            start()
        return request

    def _add_steps(self, name, make, reuse, then, show: bool = True) -> list:
        """A run's layer in three turns: its model (``make()``, hidden) and the sliders it will need (a slider
        that appears resizes the canvas), then the add, which then changes no geometry and draws nothing new,
        then (``show``) its first draw; ``reuse()`` where a layer of that name already exists (a preview's);
        ``then(layer)`` once the layer is in the viewer (still hidden).  napari's add (the layer's
        controls, visual and selection) and the layer's first draw were one turn and one window repaint,
        0.3-0.5 s on a loaded 2-core machine; the display steps that follow a result make it visible."""
        made = {}

        def prepare():
            if name not in self.viewer.layers:
                made["layer"] = make()
                made["layer"].visible = False
                prepare_sliders_for(self.viewer, made["layer"])

        def add():
            if "layer" in made and name not in self.viewer.layers:
                made["added"] = self.viewer.add_layer(made.pop("layer"))
                then(made["added"])       # at once: a Cancel before the next turn must find (and remove) it
            else:
                then(reuse())

        def shown():
            layer = made.pop("added", None)
            if layer is not None and layer in self.viewer.layers:
                reveal(self.viewer, layer)
        return [prepare, add, shown] if show else [prepare, add]

    def _not_started(self, exc=None) -> None:
        """A run given up before its worker started (cancelled, or a failing step): nothing is left running
        and no empty layer stays behind."""
        layer, self.live_layer = self.live_layer, None
        if layer is not None and layer in self.viewer.layers:
            self.viewer.layers.remove(layer)
        if exc is not None:
            self.message.error(f"{self._run['request'].title()} failed: {error_text(exc)}")
        self._set_running(False)
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("failed" if exc is not None else "cancelled")
        self.status.setText("ready")

    def cancel(self, *_) -> None:
        """Stop the run after the current iteration; its estimate so far stays as a layer."""
        if self.runner.running:
            self.runner.cancel()
            self.status.setText("cancelling…")
        elif self.display_steps.pending and "started" not in self._run and self._run.get("finished") is None:
            self.display_steps.cancel()      # still adding its layer: the worker never starts
            self._not_started()

    def job_name(self) -> str:
        """The name a background job of the current run is listed under: method, parameters and input."""
        return self._run.get("name", "")

    @property
    def running(self) -> bool:
        """A run is going, or its last events are still being shown."""
        return self.runner.running or self.display_steps.pending > 0

    @property
    def last_run(self) -> dict:
        """The latest run: its request, and the Started / Progress (iteration, elapsed, residual) / Finished events."""
        return self._run

    def _set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.preview_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)

    # ---------------------------------------------------------------- events
    def _layer_name(self, request: ReconRequest, source: str = "") -> str:
        """Algorithm, key parameters and source sinogram: ``FBP filter=hann | phantom scan``, unique."""
        base = request.title() + (f" | {_short(source)}" if source else "")
        if request.mode != "full":
            return f"preview: {base}"
        name, k = base, 2
        while name in self.viewer.layers:
            name, k = f"{base} ({k})", k + 1
        return name

    def _on_event(self, event) -> None:
        try:
            if isinstance(event, Started):
                self._on_started(event)
            elif isinstance(event, SubsetProgress):
                self._on_subset(event)
            elif isinstance(event, Progress):
                self._on_progress(event)
            elif isinstance(event, Finished):
                self._on_finished(event)
            elif getattr(event, "phase", None):          # a background job's start-up (jobs.JobPhase)
                self.status.setText(event.phase)
                if "started" not in self._run:
                    self.progress.setRange(0, 0)          # busy: nothing to count yet
                    self.progress.setFormat(event.phase)
        except Exception as e:  # noqa: BLE001 - a display problem must not kill the run silently
            self.message.error(error_text(e))

    def _live_layer(self, name, shape, spacing, origin, recon: dict, data=None, limits=None, meta=None):
        """The layer of a run: zeros (the running estimate to come) or ``data``; reused when it exists (cheap),
        else added, with ``limits`` as its contrast window when known (napari then computes none)."""
        given = data is not None
        data = data if given else np.zeros(shape, dtype=np.float32)
        kw = placement(data.shape, spacing, origin)
        meta = meta or {KEY: {"kind": "volume", "running": True, "recon": recon}}
        if name in self.viewer.layers:
            layer = self.viewer.layers[name]
            if given or layer.data.shape != data.shape:
                layer.data = data
            set_placement(layer, kw["scale"], kw["translate"])    # unchanged: no dims recomputation
            layer.metadata = meta
            return layer
        return self.viewer.add_layer(_image(data, name, meta, kw, limits))

    def _on_started(self, ev: Started) -> None:
        self.progress.setRange(0, ev.n_iter)
        self.progress.setValue(0)
        self._run["started"] = ev
        name = self.live_layer.name if self.live_layer is not None else \
            self._run.get("name") or self._layer_name(ev.request, self._run.get("source", ""))
        self._run["name"] = name
        if ev.request.spec.iterative:      # a one-pass run's layer comes with its result (_on_finished)
            self.live_layer = self._live_layer(name, ev.volume_shape, ev.voxel_spacing, ev.origin,
                                               {"request": ev.request.to_dict()})
        note = f" ({ev.note})" if ev.note else ""
        self.status.setText(f"{ev.request.title()}{note}: running…")

    def _on_subset(self, ev: SubsetProgress) -> None:
        """Inside a pass of OS-SIRT / OS-TV: the bar counts subset updates, the ETA is the measured time per
        subset times the subsets left."""
        subsets = self._run.setdefault("subsets", [])
        subsets.append((ev.iteration, ev.subset, ev.n_subsets, ev.elapsed))
        self._run["n_subsets"] = ev.n_subsets
        total = ev.n_iter * ev.n_subsets
        done = (ev.iteration - 1) * ev.n_subsets + ev.subset
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        left = subset_eta_seconds(subsets, total)
        eta = f", about {_duration(left)} left" if done < total else ""
        self._run["eta"] = eta
        where = f"subset {ev.subset}/{ev.n_subsets} of pass {ev.iteration}/{ev.n_iter}"
        self.progress.setFormat(where + (f", {_duration(left)} left" if done < total else ""))
        self.status.setText(f"{where}, {ev.elapsed:.1f} s{eta}")

    def _on_progress(self, ev: Progress) -> None:
        views = getattr(ev, "views", None)
        if views is not None:
            # FBP/FDK: progress per batch of views, with the time left.
            done, total = views
            self._run.setdefault("views", []).append(done)
            self._run["n_views"] = total
            self.progress.setRange(0, total)
            self.progress.setValue(done)
            left = ev.elapsed / done * (total - done) if done else 0.0
            self.progress.setFormat("%v / %m views" + (f", {_duration(left)} left" if done < total else ""))
            self.status.setText(f"{self._run['request'].title()}: {done} of {total} views, {ev.elapsed:.1f} s")
            return
        if self._run.get("views") and not self._run["request"].spec.iterative:
            return      # the closing event of a view-batched FBP: the bar keeps "N / N views"
        self._run.setdefault("progress", []).append((ev.iteration, ev.elapsed, ev.residual))
        per_pass = int(self._run.get("n_subsets") or 1)    # the bar counts subsets for ordered-subset methods
        self.progress.setMaximum(max(ev.n_iter * per_pass, 1))
        self.progress.setValue(ev.iteration * per_pass)
        self.plot.add(ev.iteration, ev.residual)
        res = f", residual {ev.residual:.4g}" if ev.residual is not None else ""
        eta = ""
        what = "pass" if per_pass > 1 else "iteration"
        if ev.iteration < ev.n_iter and ev.iteration > 0:
            if per_pass > 1:     # the finer clock: time per subset update
                left = subset_eta_seconds(self._run["subsets"], ev.n_iter * per_pass)
                self.progress.setFormat(f"pass {ev.iteration}/{ev.n_iter}, {_duration(left)} left")
            else:
                left = eta_seconds(self._run["progress"], ev.n_iter)
                self.progress.setFormat(f"%v / %m, {_duration(left)} left")
            eta = f", about {_duration(left)} left"
        self._run["eta"] = eta
        self.status.setText(f"{what} {ev.iteration}/{ev.n_iter}{res}, {ev.elapsed:.1f} s{eta}")
        if ev.preview is not None and self.live_layer is not None:
            data = ev.preview.numpy().astype(np.float32, copy=False)
            self.live_layer.data = data
            if self.n_live_updates == 0:
                self.display_steps.run(self._display_steps(self.live_layer), later=True,
                                       on_error=lambda e: self.message.error(error_text(e)))
            self.n_live_updates += 1

    def _on_finished(self, ev: Finished) -> None:
        self._run["finished"] = ev
        shown = getattr(ev, "display", None) or {}     # made in the worker thread (runner.for_display)
        data = shown.get("data")
        if data is None:
            data = ev.volume.numpy().astype(np.float32, copy=False)
        g = self._run.get("geometry")
        meta = {KEY: {"kind": "volume", "voxel_spacing": list(ev.voxel_spacing),
                      "recon": {**ev.metadata(), "source": self._run.get("source"), "request": ev.request.to_dict()},
                      "geometry": g.to_dict() if g is not None else None}}
        if ev.stopped == "cancelled":
            self.progress.setFormat(f"{ev.n_iter} / {self.progress.maximum()} (cancelled)")
            if ev.n_iter == 0 or shown.get("empty"):
                self._nothing_computed(ev)
                return

        def result(layer):
            if layer.metadata is not meta:
                layer.metadata = meta
            if ev.stopped == "cancelled":
                layer.name = f"{layer.name} (cancelled at {ev.n_iter})"
            if ev.request.mode == "full":
                self._add_result(layer)
            # A new result: its own 2D central slice, camera fitted to it, contrast from its percentiles, one
            # napari update per turn (display.show_result_steps); then the comparison hears of it.
            return [*self._display_steps(layer, shown.get("window")),
                    functools.partial(self.result_added.emit, layer)]

        on_error = lambda e: self.message.error(error_text(e))   # noqa: E731
        layer = self.live_layer
        if layer is not None:          # an iterative run's layer: its data now, its display from the next turn
            layer.data = data
            self.display_steps.run(result(layer), on_error=on_error, later=True)
        else:
            # A one-pass run (or a job that sent no Started): its layer is made from the result, in a turn
            # of its own after this one, with the window computed in the worker; its display follows.
            # First the layer's model and the sliders it will need (a slider appearing resizes the canvas), so
            # that the turn adding it changes no geometry.
            name = self._run.get("name") or self._layer_name(ev.request, self._run.get("source", ""))
            added = self._add_steps(
                name, lambda: _image(data, name, meta, placement(data.shape, ev.voxel_spacing, ev.origin),
                                     shown.get("window")),
                # a preview's layer of the same name: reused
                lambda: self._live_layer(name, data.shape, ev.voxel_spacing, ev.origin, {}, data=data, meta=meta),
                lambda layer: self.display_steps.extend(result(layer)), show=False)   # its display shows it
            self.display_steps.run(added, on_error=on_error, later=True)
        note = f" ({ev.note})" if ev.note else ""
        self.status.setText(f"{ev.request.title()}{note}: {ev.stopped} after {ev.n_iter} iteration(s) "
                            f"in {ev.elapsed:.2f} s")

    def _nothing_computed(self, ev: Finished) -> None:
        """A run cancelled before it computed anything (or a job whose estimate never left the bridge): no
        result layer, nothing offered for comparison, and the message says so."""
        layer, self.live_layer = self.live_layer, None
        if layer is not None and layer in self.viewer.layers:
            self.viewer.layers.remove(layer)
        self._run["no_result"] = True
        self.status.setText(f"{ev.request.title()}: cancelled after {ev.n_iter} iteration(s)")
        self.message.note("cancelled before a first estimate was computed: no result was added")

    def _display_steps(self, layer, window=None) -> list:
        """``show_result``'s steps for ``layer``, each skipped once the user has removed the layer."""
        def guarded(step):
            def run():
                if layer in self.viewer.layers:
                    step()
            return run
        return [guarded(s) for s in show_result_steps(self.viewer, layer, limits=window)]

    def _on_failed(self, exc) -> None:
        # The one error path: the message once (no toast), status and progress back to idle.
        self._run["failed"] = exc
        self.message.error(f"{self._run['request'].title() if self._run.get('request') else 'run'} failed: "
                           f"{error_text(exc)}")
        self.status.setText("ready")
        layer = self.live_layer
        if layer is not None and self._run.get("finished") is None and not self.n_live_updates:
            # Nothing was computed: do not leave an empty layer behind.
            if layer in self.viewer.layers:
                self.viewer.layers.remove(layer)
            self.live_layer = None

    def _record_rates(self) -> None:
        """What a completed full run took on this machine: the next estimate of that method starts from it."""
        ev, geo = self._run.get("finished"), self._run.get("geometry")
        if ev is None or geo is None or ev.stopped != "completed" or ev.request.mode != "full":
            return
        if getattr(self.runner, "job_events", None) is not None:
            return                      # a background job ran elsewhere, at another rate
        from ctbench.workbench.estimate import record_run

        progress = [(i, t) for i, t, _ in self._run.get("progress", [])]
        record_run(geo, ev.request.algorithm, progress, float(ev.elapsed))

    def _on_done(self) -> None:
        self._record_rates()
        self._set_running(False)
        self.estimate.schedule()       # settings may have changed during the run
        ev = self._run.get("finished")
        started = self._run.get("started")
        total = started.n_iter if started is not None else (ev.n_iter if ev else 1)
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(ev.n_iter if ev else 0)
        if ev is None:
            self.progress.setFormat("failed" if self._run.get("failed") is not None else "%v / %m")
        elif self._run.get("views") and not ev.request.spec.iterative:
            n = self._run["n_views"]
            self.progress.setRange(0, n)
            self.progress.setValue(n)
            self.progress.setFormat("%v / %m views")
        elif ev.stopped == "cancelled":
            self.progress.setFormat(f"{ev.n_iter} / {total} (cancelled)")
        else:
            self.progress.setFormat("%v / %m")
        self.live_layer = None

    # ----------------------------------------------------------- comparison
    def _add_result(self, layer) -> None:
        self.results.append(layer)
        item = QListWidgetItem(layer.name)
        item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
        item.setCheckState(Qt.Unchecked)
        self.result_list.addItem(item)
        # The two newest results are checked: one click compares them.
        for i in range(self.result_list.count()):
            it = self.result_list.item(i)
            it.setCheckState(Qt.Checked if i >= self.result_list.count() - 2 else Qt.Unchecked)

    def _layer_removed(self, event) -> None:
        layer = event.value
        if layer in self.results:
            i = self.results.index(layer)
            self.results.pop(i)
            self.result_list.takeItem(i)

    def checked_results(self) -> list:
        return [self.results[i] for i in range(self.result_list.count())
                if self.result_list.item(i).checkState() == Qt.Checked and i < len(self.results)]

    def compare(self, *_, layers=None) -> list:
        """Grid view of the checked results (see :class:`ComparePanel`)."""
        return self.comparison.compare(layers=layers)

    def single_view(self, *_) -> None:
        """Leave the grid and restore what was visible before comparing."""
        self.comparison.single_view()


def _image(data, name: str, meta: dict, placed: dict, limits=None):
    """The napari image layer of a run (not yet added): gray, one scale level, ``limits`` as its window when
    known (napari then computes none)."""
    from napari.layers import Image

    kw = dict(placed)
    if limits is not None and limits[1] > limits[0]:
        kw["contrast_limits"] = [float(limits[0]), float(limits[1])]
    kw.setdefault("units", UNITS)
    return Image(data, name=name, colormap="gray", metadata=meta, multiscale=False, **kw)


def eta_seconds(progress: list, n_iter: int) -> float:
    """Time left from the measured time per iteration: the iterations after the first (which also pays the
    set-up: operators, filters, kernel caches) when there are any, else the first one."""
    it, elapsed = progress[-1][0], progress[-1][1]
    first = next(((i, t) for i, t, _ in progress if i >= 1), None)
    if first is not None and it > first[0]:
        per = (elapsed - first[1]) / (it - first[0])
    else:
        per = elapsed / max(it, 1)
    return max(per, 0.0) * (n_iter - it)


def subset_eta_seconds(subsets: list, total: int) -> float:
    """Time left from the measured time per subset update: between the first update (which also pays the
    set-up: weights, kernel caches) and the latest when there are two, else the first one's."""
    (p0, k0, n, t0), (p1, k1, _, t1) = subsets[0], subsets[-1]
    first, last = (p0 - 1) * n + k0, (p1 - 1) * n + k1
    per = (t1 - t0) / (last - first) if last > first else t1 / max(last, 1)
    return max(per, 0.0) * (total - last)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
