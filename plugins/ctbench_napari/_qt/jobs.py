"""Background jobs in napari: the Jobs panel and the reconstruction widget's "run as background job" choice.

:class:`JobRunner` is a :class:`~ctbench_napari._qt.runner.Runner` whose
events come from a job bridge (:func:`ctbench.jobs.runs.job_events`): the
reconstruction widget shows progress, live preview and residuals and
cancels exactly as for a local run.  A local bridge is started on demand.
:class:`JobsPanel` lists every job of a bridge (also those from the command
line or another napari window), with state, progress and log, and loads a
finished result as a layer with its geometry and parameters.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from qtpy.QtCore import QTimer
from qtpy.QtWidgets import (QAbstractItemView, QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                            QLineEdit, QPlainTextEdit, QPushButton, QSpinBox, QTableWidget, QTableWidgetItem,
                            QVBoxLayout, QWidget)

from .._job_text import jobs_missing, machine_ranks, readable_log, result_name
from .common import MessageLabel, error_text, is_deleted, scroll_contents
from .runner import LocalRunner

JOBS_EXTRA = 'pip install "ctbench[jobs]"'


def bridge_client(url: str = "", token_file: str = ""):
    """A client of the bridge at ``url`` (with ``token_file``), or of the local one, started if needed."""
    from ctbench.jobs.client import BridgeClient, ensure_local_bridge

    from .common import SPAWNER

    if url.strip():
        return BridgeClient(url.strip(), token_file=token_file.strip() or None)
    # Called in workers, which run below normal priority: the detached bridge (and its jobs) must not.
    return ensure_local_bridge(popen=SPAWNER.popen)


class JobRunner(LocalRunner):
    """Runs reconstructions as bridge jobs; quick previews (any other factory) still run locally."""

    def __init__(self, options, parent=None):
        super().__init__(parent)
        self._options = options          # () -> (url, token_file, job options dict)
        self.info: dict = {}

    def job_events(self, geometry, sinogram, request):
        """The event factory of a job run (what ``reconstruct`` is for a local run).

        Until the job's first event, a watcher thread posts its start-up phases (uploading, queued, launching
        N ranks, with the seconds so far) so the bar and status say what is happening."""
        from ctbench.jobs.runs import job_events

        url, token_file, options = self._options()
        self.info = {}
        info = self.info
        ranks = int(options.get("nproc", 1))

        def make(cancel):
            yield JobPhase(f"uploading the scan ({_mib(sinogram)} MiB) to the "
                           f"{'bridge at ' + url.strip() if url.strip() else 'local bridge'}…")
            client = bridge_client(url, token_file)
            first = threading.Event()
            watcher = threading.Thread(target=self._watch_start_up, args=(url, token_file, info, first, cancel,
                                                                          ranks),
                                       name="ctbench-job-start-up", daemon=True)
            watcher.start()
            try:
                for ev in job_events(client, geometry, sinogram, request, options=options, cancel=cancel,
                                     info=info):
                    first.set()
                    yield ev
            finally:
                first.set()
                client.close()
        return make

    def _watch_start_up(self, url, token_file, info, first, cancel, ranks) -> None:
        """Post the job's phase every half second until its first event arrives (runs in its own thread)."""
        import time

        t0 = time.perf_counter()
        client = None
        try:
            while not first.wait(0.5) and not cancel.is_set():
                job_id = info.get("job_id")
                if job_id is None:
                    continue
                if client is None:
                    client = bridge_client(url, token_file)
                state = client.status(job_id).get("state")
                secs = time.perf_counter() - t0
                if state == "queued":
                    text = f"job {job_id[:8]} queued: waiting for the bridge to start it ({secs:.0f} s)"
                elif state == "running":
                    text = (f"job {job_id[:8]}: launching {ranks} rank{'s' if ranks > 1 else ''} (torchrun), "
                            f"then loading the scan and the kernels… {secs:.0f} s")
                else:
                    break
                if first.is_set():
                    break
                self.post(JobPhase(text))
        except Exception:  # noqa: BLE001 - the phases are a courtesy; the run's own events carry any error
            pass
        finally:
            if client is not None:
                client.close()


class JobPhase:
    """A background job's start-up phase, in words, for the reconstruction widget's status and bar."""

    def __init__(self, phase: str):
        self.phase = phase


def _mib(sinogram) -> str:
    try:
        return f"{sinogram.numel() * sinogram.element_size() / 2**20:.1f}"
    except AttributeError:
        return "?"


class BackgroundJobChoice(QGroupBox):
    """The "Run as background job" box of the reconstruction widget: ranks, partition, devices, bridge."""

    def __init__(self, recon_widget, parent=None):
        super().__init__("Run as background job (torchrun, via the job bridge)", parent)
        self.recon = recon_widget
        self.setCheckable(True)
        self.setChecked(False)
        self.nproc = QSpinBox()
        self.nproc.setRange(1, machine_ranks())     # a local bridge runs the ranks on this machine
        self.nproc.setValue(min(2, machine_ranks()))
        self.nproc.setToolTip(f"torchrun processes; at most {machine_ranks()} here (this machine's cores, or its "
                              "GPUs); a remote bridge (Bridge URL) allows up to 256")
        self.partition = QComboBox()
        self.partition.addItems(["views", "space"])
        self.devices = QLineEdit()
        self.devices.setPlaceholderText("default: one GPU per rank if present, else CPU")
        self.url = QLineEdit()
        self.url.setPlaceholderText("local bridge (started on demand)")
        self.token_file = QLineEdit()
        self.token_file.setPlaceholderText("token file of a remote bridge")
        form = QFormLayout(self)
        form.addRow("Ranks", self.nproc)
        form.addRow("Partition", self.partition)
        form.addRow("Devices", self.devices)
        form.addRow("Bridge URL", self.url)
        form.addRow("Token file", self.token_file)
        self.runner = JobRunner(self.options, recon_widget)
        self.toggled.connect(self._toggled)
        self.url.textChanged.connect(self._bound_ranks)
        missing = jobs_missing()
        if missing:                  # the jobs extra is not installed: one line, no traceback later
            self.setEnabled(False)
            self.setToolTip(f"background jobs need {missing}: {JOBS_EXTRA}")

    def _bound_ranks(self, url: str) -> None:
        self.nproc.setMaximum(256 if url.strip() else machine_ranks())

    @property
    def enabled(self) -> bool:
        return self.isChecked()

    def options(self):
        devices = [d.strip() for d in self.devices.text().split(",") if d.strip()] or None
        opts = {"nproc": int(self.nproc.value()), "partition": self.partition.currentText()}
        name = self.recon.job_name() if hasattr(self.recon, "job_name") else ""
        if name:
            opts["name"] = name[:200]
        if devices:
            opts["devices"] = devices
        return self.url.text(), self.token_file.text(), opts

    def _toggled(self, on: bool) -> None:
        try:
            self.recon.set_runner(self.runner if on else LocalRunner(self.recon))
        except RuntimeError as e:     # a run is in progress: keep the current runner
            self.blockSignals(True)
            self.setChecked(not on)
            self.blockSignals(False)
            self.recon.message.error(error_text(e))


class JobsPanel(QWidget):
    """Jobs of a bridge: state, progress, log; cancel, delete, load a result as a layer.

    Without a bridge the panel says so ("no bridge running") and offers Start
    local bridge; it keeps polling quietly (a file read) and never raises a
    toast or traceback.  Every bridge call runs in a worker thread.
    """

    COLUMNS = ("id", "state", "algorithm", "ranks", "progress", "name")
    NO_BRIDGE = "no bridge running"

    def __init__(self, napari_viewer, parent=None, *, refresh_ms: int = 2000):
        super().__init__(parent)
        from .display_rule import install as install_display_rule

        self.viewer = napari_viewer
        install_display_rule(napari_viewer)       # loaded results in their frame
        self.url = QLineEdit()
        self.url.setPlaceholderText("local bridge")
        self.token_file = QLineEdit()
        self.token_file.setPlaceholderText("token file (remote bridge)")
        self.bridge_state = QLabel("looking for a bridge…")
        self.bridge_state.setWordWrap(True)
        self.start_bridge_button = QPushButton("Start local bridge")
        self.start_bridge_button.hide()
        self.table = QTableWidget(0, len(self.COLUMNS))
        self.table.setHorizontalHeaderLabels(list(self.COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setMinimumHeight(120)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(2000)
        self.log.setMinimumHeight(80)
        self.message = MessageLabel()
        self.refresh_button = QPushButton("Refresh")
        self.cancel_button = QPushButton("Cancel")
        self.log_button = QPushButton("Show log")
        self.load_button = QPushButton("Load result")
        self.delete_button = QPushButton("Delete")
        form = QFormLayout()
        form.addRow("Bridge URL", self.url)
        form.addRow("Token file", self.token_file)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        state_row = QHBoxLayout()
        state_row.addWidget(self.bridge_state, 1)
        state_row.addWidget(self.start_bridge_button)
        layout.addLayout(state_row)
        layout.addWidget(self.table)
        row = QHBoxLayout()
        for b in (self.refresh_button, self.cancel_button, self.log_button, self.load_button, self.delete_button):
            row.addWidget(b)
        layout.addLayout(row)
        layout.addWidget(self.message)
        layout.addWidget(self.log)
        self.jobs: list[dict] = []
        self.loaded: list = []
        self.bridge_found: bool | None = None    # None until the first look
        self.refresh_button.clicked.connect(self.refresh)
        self.cancel_button.clicked.connect(self.cancel_selected)
        self.log_button.clicked.connect(self.show_log)
        self.load_button.clicked.connect(self.load_selected)
        self.delete_button.clicked.connect(self.delete_selected)
        self.start_bridge_button.clicked.connect(self.start_local_bridge)
        self._busy = 0
        self._job_buttons = (self.cancel_button, self.log_button, self.load_button, self.delete_button)
        self.timer = QTimer(self)
        self.timer.setInterval(refresh_ms)
        self.timer.timeout.connect(self._auto_refresh)
        self.missing = jobs_missing()
        if self.missing:
            self._without_jobs_extra()
        else:
            self.timer.start()
            QTimer.singleShot(0, self._first_look)   # before the panel is shown (a bound slot: not after close)
        scroll_contents(self)

    def _without_jobs_extra(self) -> None:
        """The jobs extra is not installed: one line saying how to get it; no polling, no traceback."""
        self.bridge_found = False
        self.bridge_state.setText(f"Background jobs need {self.missing}, which is not installed: {JOBS_EXTRA}")
        self.start_bridge_button.hide()
        for b in (self.refresh_button, *self._job_buttons):
            b.setEnabled(False)

    def _first_look(self) -> None:
        self.refresh(quiet=True)

    # ------------------------------------------------------------- plumbing
    POLL_TIMEOUT_S = 3.0     # a poll that hangs (a bridge that accepts and never answers) ends soon

    def client(self, timeout: float = 10.0):
        """A client of the bridge named in the form (or the local one); BridgeNotFound if none is known."""
        from ctbench.jobs.client import BridgeClient

        return BridgeClient(self.url.text().strip() or None, token_file=self.token_file.text().strip() or None,
                            timeout=timeout)

    def _in_thread(self, work, done, *, quiet: bool = False) -> None:
        """``work()`` in a worker thread, ``done(result)`` on the GUI thread; errors in the message line only."""
        from .common import start_worker

        self._busy += 1

        def failed(e):
            if is_deleted(self):
                return          # the panel was closed while the bridge answered
            if isinstance(e, ModuleNotFoundError):
                self.missing = e.name or "a package of the jobs extra"
                self.timer.stop()
                self._without_jobs_extra()
            elif _no_bridge(e):
                self._set_bridge(False, e)
            elif not quiet:
                self.message.error(error_text(e))

        def deliver(result):
            if is_deleted(self):
                return
            try:
                done(result)
            except Exception as e:  # noqa: BLE001 - a display problem shows in the panel
                self.message.error(error_text(e))

        start_worker(work, on_return=deliver, on_error=failed, on_finished=self._idle, owner=self)

    def _idle(self) -> None:
        self._busy = max(0, self._busy - 1)

    @property
    def busy(self) -> bool:
        return self._busy > 0

    def _set_bridge(self, found: bool, why=None) -> None:
        self.bridge_found = found
        self.start_bridge_button.setEnabled(True)
        if found:
            self.bridge_state.setText(f"bridge: {self._where()}")
            self.start_bridge_button.hide()
        else:
            remote = bool(self.url.text().strip())
            detail = f" at {self.url.text().strip()}" if remote else ""
            self.bridge_state.setText(f"{self.NO_BRIDGE}{detail}: start one here, or run "
                                      "'ctbench bridge serve' in a terminal")
            self.start_bridge_button.setVisible(not remote)
            self.jobs = []
            self.table.setRowCount(0)
        for b in self._job_buttons:
            b.setEnabled(found)

    def _where(self) -> str:
        return self.url.text().strip() or "local"

    def selected(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows()
        return self.jobs[rows[0].row()] if rows else (self.jobs[-1] if self.jobs else None)

    def select(self, job_id: str) -> None:
        for i, j in enumerate(self.jobs):
            if j["id"] == job_id:
                self.table.selectRow(i)

    # --------------------------------------------------------------- actions
    def _auto_refresh(self) -> None:
        if self.isVisible() and not self.busy and not self.missing:
            self.refresh(quiet=True)

    def refresh(self, *_, quiet: bool = False) -> None:
        timeout = self.POLL_TIMEOUT_S if quiet else 10.0

        def work():
            with self.client(timeout) as c:
                return c.list()
        self._in_thread(work, self._show_jobs, quiet=quiet)

    def start_local_bridge(self, *_) -> None:
        """Start the local bridge (detached: it outlives this window) and list its jobs."""
        self.bridge_state.setText("starting a local bridge…")
        self.start_bridge_button.setEnabled(False)

        def work():
            with bridge_client() as c:
                return c.list()

        def done(jobs):
            self._show_jobs(jobs)
            self.message.note("local bridge started")

        self._in_thread(work, done)

    def _show_jobs(self, jobs: list[dict]) -> None:
        self._set_bridge(True)
        keep = (self.selected() or {}).get("id")
        self.jobs = jobs
        self.table.setRowCount(len(jobs))
        for i, j in enumerate(jobs):
            p = j.get("progress") or {}
            prog = f"{p['iteration']}/{p['n_iter']}" if p else ""
            if p.get("eta") is not None and j["state"] == "running":
                prog += f"  eta {p['eta']:.0f} s"
            cells = (j["id"], j["state"], j["spec"]["request"]["algorithm"], str(j["spec"]["nproc"]), prog,
                     j.get("name") or "")
            for k, text in enumerate(cells):
                self.table.setItem(i, k, QTableWidgetItem(text))
        if keep:
            self.select(keep)
        # An error stays until the user dismisses it or acts again: a refresh every 2 s must not wipe it.

    def cancel_selected(self, *_) -> None:
        job = self.selected()
        if job is None:
            return

        def work():
            with self.client() as c:
                c.cancel(job["id"])

        def done(_):
            self.message.note(f"job {job['id']} cancelled")   # deliberate: a note, never a traceback
            self.refresh()
        self._in_thread(work, done)

    def delete_selected(self, *_) -> None:
        job = self.selected()
        if job is None:
            return

        def work():
            with self.client() as c:
                c.delete(job["id"])
        self._in_thread(work, lambda _: self.refresh())

    def show_log(self, *_) -> None:
        job = self.selected()
        if job is None:
            return

        def work():
            with self.client() as c:
                text, _ = c.logs(job["id"])
                st = c.status(job["id"])
            return text, st

        def done(res):
            text, st = res
            self.log.setPlainText(readable_log(text, st))
        self._in_thread(work, done)

    def load_selected(self, *_) -> None:
        """Download the selected job's result and add it as a layer (geometry and parameters in its metadata).

        Download and load run in a worker thread, through the one result loader
        (:func:`ctbench_napari._io.result_layers`) that the reconstruction widget's job runs use too.
        """
        from .._io import result_layers

        job = self.selected()
        if job is None:
            return
        if job["state"] != "succeeded":
            self.message.error(f"job {job['id']} is {job['state']}: only a succeeded job has a result")
            return
        dest = Path(tempfile.mkdtemp(prefix="ctbench-result-")) / f"job-{job['id']}.zarr"

        def work():
            with self.client() as c:
                path = c.fetch(job["id"], dest)
            return path, result_layers(path), job

        self._in_thread(work, self._add_result)

    def _add_result(self, res) -> None:
        from napari.layers import Layer

        from .display import show_result

        path, layer_data, job = res
        for data in layer_data:
            kw = dict(data[1])
            kw["name"] = result_name(job, kw.get("name", ""), [x.name for x in self.viewer.layers])
            layer = self.viewer.add_layer(Layer.create(data[0], kw, data[2]))
            self.loaded.append(layer)
            if layer.metadata.get("ctbench", {}).get("kind") == "volume":
                show_result(self.viewer, layer, limits=tuple(layer.contrast_limits))
        self.message.note(f"loaded the result of job {job['id']} as '{self.loaded[-1].name}'" if self.loaded
                          else f"loaded {path.name}")


def _no_bridge(e: BaseException) -> bool:
    """No bridge known, or the known one does not answer (a stale bridge.json after a crash or reboot)."""
    try:
        import httpx

        from ctbench.jobs.client import BridgeNotFound
    except ImportError:         # without the jobs extra there is no bridge to talk to
        return True
    return isinstance(e, (BridgeNotFound, httpx.TransportError))
