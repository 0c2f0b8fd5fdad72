"""GUI benchmark (issues 4 and 23): quick-preview time, and the longest GUI-thread stall of each user action.

``--stalls`` (issue 23): a 20 ms QTimer probe runs on the GUI thread while a
user action happens in a real napari viewer (all ctbench widgets docked, as
``ctbench gui`` opens them); the longest gap between two ticks, minus the
interval, is the action's stall (goal: none over 250 ms).  Actions: opening
the phantom_scan and lab_scan samples, a designer edit, the FBP quick preview,
a full FDK and SIRT run and the time after them, Compare side by side,
Difference images, 3 s of a long SIRT run and its Cancel, Scan import's Correct and Attach geometry, and the Jobs
panel docked without a bridge.  ``--label`` names the code measured (e.g.
"before"/"after"; ``--plugin-tree DIR`` measures the napari plugin found in DIR,
e.g. ``git archive BASE plugins | tar -x -C /tmp/base`` and ``--plugin-tree
/tmp/base/plugins``: an editable install's import hook wins over PYTHONPATH);
records go to ``results/bench_gui_stalls.jsonl``.
``--trace-paints`` counts each action's canvas paints and names where the
longest ran; ``--trace-turns`` lists what ran inside each action's longest gap
(ctbench steps, runner events and the display rule, napari's sample opening,
layer models and insertions, rebuilds, paints, main-window repaints, garbage
collections, with their times); ``--trace-stacks`` samples the GUI thread's stack every 10 ms
while it stalls; ``--profile-stalls`` runs cProfile on the GUI thread between
two probe ticks and keeps the functions of each action's longest gap
(cumulative and own ms; cProfile slows Python, so use it to name causes, not
for the figures).  The workbench's start-up warm-up is recorded as an action
of its own, before the others, so its stalls are not hidden.

Workload: the ``phantom_scan`` sample of the napari plugin (64^3 Shepp-Logan
phantom of 1 mm voxels; circular cone beam, 120 views, SID 200 mm, SDD 400 mm,
96x96 detector of 1.5 mm pixels).  Measured:

- ``path="widget"``: in a real napari viewer, the Reconstruction widget's
  "Quick preview" click until the preview layer holds the result (the event
  loop runs; this includes the thread hand-off and the layer update).  Needs
  a display: without ``$DISPLAY`` the script re-runs itself under
  ``xvfb-run`` when available, else records ``{"skipped": ...}``.
- ``path="core"``: the same preview through ``ctbench.workbench.workflow.run`` without
  any GUI, and the full reconstruction it stands in for (``mode="full"``), so
  the speed-up is a number.

FDK/FBP previews reconstruct the central slice (exact); SIRT/CGLS/TV previews
of a cone-beam scan run on the 2x-binned problem (half the views).  Each
figure is the best of ``--repeats`` runs after one warm-up run.

Output: JSON lines on stdout, appended to ``--out``: a header with the
machine, then one line per (path, algorithm, mode).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = "gui"
GOAL_S = 1.0
CASES = [("fbp", {"filter": "ram-lak"}), ("sirt", {"n_iter": 20, "nonneg": True}),
         ("cgls", {"n_iter": 10}), ("tv", {"n_iter": 20, "lam": 0.01, "nonneg": True})]


def _header(run_id: str, args) -> dict:
    import torch

    return {"bench": BENCH, "run_id": run_id, "kind": "header",
            "machine": {"cpu": platform.processor() or platform.machine(), "nproc": os.cpu_count(),
                        "torch_threads": torch.get_num_threads(),
                        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                        "python": platform.python_version(), "platform": platform.platform()},
            "workload": "napari sample phantom_scan: 64^3, 120 views, 96x96 detector",
            "args": {k: str(v) for k, v in vars(args).items()}, "goal_s": GOAL_S}


def _best(fn, repeats: int) -> tuple[float, object]:
    """Best time of ``repeats`` calls after a warm-up (kernel caches, FFT plans), with that call's result."""
    fn()
    best, best_out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        t = time.perf_counter() - t0
        if t < best:
            best, best_out = t, out
    return best, best_out


def core_records(run_id: str, repeats: int, full: bool, full_iterative: bool) -> list[dict]:
    import torch

    from ctbench.workbench.workflow import ReconRequest, run
    from ctbench_napari._samples import phantom_sinogram

    geo, sino = phantom_sinogram()
    sino = torch.from_numpy(sino)
    records = []
    for algorithm, params in CASES:
        req = ReconRequest(algorithm, params, "auto")
        t, fin = _best(lambda: run(geo, sino, req), repeats)
        rec = {"bench": BENCH, "run_id": run_id, "path": "core", "algorithm": algorithm, "params": params,
               "mode": "preview", "preview": fin.note, "shape": list(fin.volume.shape), "seconds": t,
               "meets_goal": t < GOAL_S}
        if full and (algorithm == "fbp" or full_iterative):
            tf, _ = _best(lambda: run(geo, sino, ReconRequest(algorithm, params)), 1)
            rec.update(full_seconds=tf, speedup=tf / t)
        records.append(rec)
    return records


def widget_records(run_id: str, repeats: int) -> list[dict]:
    import napari
    from qtpy.QtWidgets import QApplication

    from ctbench_napari import PLUGIN
    from ctbench_napari._testing import wait_for

    viewer = napari.Viewer(show=True)
    try:
        viewer.open_sample(PLUGIN, "phantom_scan")
        _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
        recon.sinogram.select("Shepp-Logan cone-beam scan")
        records = []
        for algorithm, params in CASES:
            recon.select_algorithm(algorithm, **params)

            def click():
                recon.preview_button.click()
                wait_for(lambda: not recon.running, timeout=300)
                if recon.message.level == "error":
                    raise RuntimeError(recon.message.text())
                return recon.last_run["finished"]

            t, fin = _best(click, repeats)
            QApplication.processEvents()
            records.append({"bench": BENCH, "run_id": run_id, "path": "widget", "algorithm": algorithm,
                            "params": params, "mode": "preview", "preview": fin.note,
                            "shape": list(fin.volume.shape), "seconds": t, "solver_seconds": fin.elapsed,
                            "meets_goal": t < GOAL_S})
        return records
    finally:
        viewer.close()


STALL_GOAL_MS = 250.0


class StallProbe:
    """A 20 ms QTimer on the GUI thread; the longest gap between two ticks beyond the interval is the stall.

    Self-contained (no ctbench import), so the same probe measures older versions of the plugin."""

    def __init__(self, interval_ms: int = 20):
        from qtpy.QtCore import QTimer

        self.interval = interval_ms / 1000
        self.timer = QTimer()
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)
        self.last = None
        self.worst = 0.0
        self.timer_active = False
        self.profiler = None          # --profile-stalls: a cProfile of the GUI thread between two ticks
        self.worst_profile = None

    def _tick(self):
        now = time.perf_counter()
        prof = self.profiler
        if prof is not None:
            prof.disable()
        if self.last is not None:
            gap = now - self.last - self.interval
            if prof is not None and gap > self.worst:
                self.worst_profile = prof      # what the GUI thread ran in the longest gap so far
            if self.gap_hook is not None and self.timer_active:
                self.gap_hook(self.last, now, gap)
            self.worst = max(self.worst, gap)
        if prof is not None and self.timer_active:
            import cProfile

            self.profiler = cProfile.Profile()
            self.profiler.enable()
        self.last = now

    def measure(self, action, settle_s: float = 0.5) -> tuple[float, float]:
        """(longest stall in ms, wall time in s) of ``action()`` plus ``settle_s`` of event loop after it."""

        self.worst, self.last = 0.0, time.perf_counter()
        self.worst_profile = None
        self.timer.start()
        self.timer_active = True
        if self.profiling:
            import cProfile

            self.profiler = cProfile.Profile()
            self.profiler.enable()
        t0 = time.perf_counter()
        try:
            action()
            _spin(settle_s)
            self._tick()
        finally:
            self.timer_active = False
            self.timer.stop()
            if self.profiler is not None:
                self.profiler.disable()
                self.profiler = None
        return 1000 * self.worst, time.perf_counter() - t0

    profiling = False
    gap_hook = None      # --trace-turns: called with (previous tick, this tick, gap) on every tick

    def take_profile(self, top: int = 10) -> dict:
        """The functions the GUI thread spent the longest gap in (cumulative ms under cProfile, which slows
        Python down: compare the entries with each other, not with the stall)."""
        prof, self.worst_profile = self.worst_profile, None
        if prof is None:
            return {}
        import pstats

        stats = pstats.Stats(prof).stats
        total = sum(tt for (_cc, _nc, tt, _ct, _callers) in stats.values())
        rows = []
        for (filename, line, name), (_cc, nc, tt, ct, _callers) in stats.items():
            if "bench_gui" in filename or "_testing" in filename or "cProfile" in filename:
                continue
            where = f"{Path(filename).parent.name}/{Path(filename).name}:{line} {name}" if filename != "~" \
                else name
            rows.append((ct, tt, nc, where))
        cum = sorted(rows, reverse=True)[:top]
        own = sorted(rows, key=lambda r: r[1], reverse=True)[:top]
        return {"profiled_ms": round(1000 * total, 1),
                "profile_cumulative": [f"{1000 * ct:.0f} ms {where} (x{nc})" for ct, _tt, nc, where in cum],
                "profile_own": [f"{1000 * tt:.0f} ms {where} (x{nc})" for _ct, tt, nc, where in own]}


class PaintTrace:
    """Counts the canvas paints (vispy's paintGL) during each action, their time and the longest one, and
    names the slot (a ctbench or napari frame) that ran each paint synchronously.

    Under Xvfb the canvas is drawn by Mesa's software rasteriser, so one paint of a volume or a grid can
    take longer than the 250 ms goal by itself: this tells a paint-bound stall from Python work."""

    def __init__(self):
        import importlib

        importlib.import_module("vispy.app.backends._pyqt5")   # loads vispy's Qt backend module, patched below

        self.cls = sys.modules["vispy.app.backends._qt"].CanvasBackendDesktop
        self.original = self.cls.paintGL
        self.paints: list[tuple[float, str]] = []
        self.size = None
        trace = self

        def paintGL(canvas):   # noqa: N802 - Qt name
            import traceback

            t0 = time.perf_counter()
            try:
                return trace.original(canvas)
            finally:
                dt = time.perf_counter() - t0
                frames = [f for f in traceback.extract_stack()[:-1]
                          if "ctbench_napari" in f.filename and "_testing" not in f.filename]
                where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} {frames[-1].name}" if frames \
                    else "event loop"
                size = (canvas.width(), canvas.height())
                if trace.size is not None and size != trace.size:
                    where += f" (canvas resized {trace.size[0]}x{trace.size[1]} -> {size[0]}x{size[1]})"
                trace.size = size
                trace.paints.append((dt, where))
        self.cls.paintGL = paintGL

    def take(self) -> dict:
        paints, self.paints = self.paints, []
        if not paints:
            return {"paints": 0}
        worst = max(paints)
        return {"paints": len(paints), "paint_ms": round(1000 * sum(p[0] for p in paints), 1),
                "longest_paint_ms": round(1000 * worst[0], 1), "longest_paint_in": worst[1],
                "paints_in": sorted({p[1] for p in paints if p[1] != "event loop"})}

    def close(self) -> None:
        self.cls.paintGL = self.original


class StackSampler:
    """Where the GUI thread is while it stalls: a background thread looks every 10 ms and, when the probe's
    last tick is over 60 ms old, records the GUI thread's stack.

    The stack is read with ``faulthandler.dump_traceback`` (plain reads of the interpreter's frames, the GIL
    held throughout), not ``sys._current_frames`` + ``traceback``: those build frame objects for the GUI
    thread's running frames and release the GIL while ``linecache`` stats files, and runs sampled that way
    segfaulted in napari's layer-list paint (3 of 5), runs without the sampler never (0 of 5); with this one 0 of 5.

    Per action it names the code the GUI thread spent its stalled samples in, by the innermost frames of
    ctbench, napari, vispy, Qt glue and numpy/torch, so a stall in Python work is told from one in a paint
    (a paint shows as vispy's ``paintGL``/``on_draw``) or from waiting for the GIL held by a worker."""

    PERIOD = 0.010
    STALE = 0.060

    def __init__(self, probe: "StallProbe"):
        import threading

        self.probe = probe
        self.main = threading.main_thread().ident
        self.samples: list[str] = []
        self._stop = threading.Event()
        self._dump = tempfile.TemporaryFile("w+")     # faulthandler writes to a file descriptor
        self.thread = threading.Thread(target=self._loop, name="bench-stack-sampler", daemon=True)
        self.thread.start()

    def _main_stack(self) -> list:
        """The GUI thread's frames, outermost first, as (filename, lineno, name) records."""
        import collections
        import faulthandler
        import re

        f = self._dump
        f.seek(0)
        f.truncate()
        faulthandler.dump_traceback(f, all_threads=True)
        f.flush()
        f.seek(0)
        head = f"0x{self.main:016x}"
        frames, inside = [], False
        frame = collections.namedtuple("Frame", "filename lineno name")
        for line in f.read().splitlines():
            if line.startswith(("Thread ", "Current thread ")):
                inside = head in line
            elif inside and (m := re.match(r'\s+File "(.*)", line (\d+) in (.*)', line)):
                frames.append(frame(m.group(1), int(m.group(2)), m.group(3)))
        return frames[::-1]

    @staticmethod
    def _where(stack) -> str:
        keep = [f for f in stack if any(k in f.filename for k in ("ctbench", "napari", "vispy", "superqt",
                                                                   "numpy", "torch", "qtpy"))]
        own = [f for f in keep if "ctbench" in f.filename and "_testing" not in f.filename
               and "bench_gui" not in f.filename]
        inner = keep[-3:] if keep else stack[-2:]
        parts = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}" for f in inner]
        head = f"{Path(own[-1].filename).name}:{own[-1].lineno} {own[-1].name} > " if own and own[-1] not in inner \
            else ""
        return head + " > ".join(parts)

    def _loop(self) -> None:
        while not self._stop.wait(self.PERIOD):
            last = self.probe.last
            if last is None or not self.probe.timer_active or time.perf_counter() - last < self.STALE:
                continue
            stack = self._main_stack()
            if stack:
                self.samples.append(self._where(stack))

    def take(self, top: int = 4) -> dict:
        from collections import Counter

        samples, self.samples = self.samples, []
        if not samples:
            return {"stalled_samples": 0}
        return {"stalled_samples": len(samples), "stalled_sample_ms": int(1000 * self.PERIOD),
                "stalled_in": [f"{n}x {w}" for w, n in Counter(samples).most_common(top)]}

    def close(self) -> None:
        self._stop.set()


class TurnTrace:
    """What ran inside each action's longest gap of the probe, turn by turn: the ctbench steps
    (``common.Steps``), runner events and display rule, napari's sample opening, layer models and
    insertions (``open_sample``, ``Image()``, ``add_layer``), scene-graph and grid rebuilds, new layer
    controls and visuals, the canvas paints, the main window's repaints (Qt's UpdateRequest, the OpenGL canvas composed
    in) and Python's garbage collections, each with its start (ms after the gap began) and its time.

    Only slots over 10 ms are kept; nested entries (a napari method inside a step) are listed too, so the
    times of one gap may add up to more than the gap.  Where the measured version lacks a hooked name
    (an older plugin or napari), that entry is simply not traced."""

    MIN_S = 0.010
    GAP_S = 0.060

    def __init__(self, probe: "StallProbe"):
        import gc

        self.log: list[tuple[float, float, str]] = []
        self.gaps: list[tuple[float, float, float]] = []
        self._undo: list = []
        self._gc_t0 = None
        probe.gap_hook = self._gap
        self.probe = probe
        self._hook_ctbench()
        self._hook("napari._qt.qt_main_window", "_QtMainWindow", "event", self._window_event)
        for name in ("_update_scenegraph", "_init_or_update_grid", "add_layer_visual_mapping"):
            self._hook("napari._vispy.canvas", "VispyCanvas", name, f"napari {name}")
        self._hook("napari._qt.layer_controls.qt_layer_controls_container", "QtLayerControlsContainer", "_add",
                   "napari layer controls")
        self._hook("vispy.app.backends._qt", "CanvasBackendDesktop", "paintGL", "canvas paint")
        # Where a new layer's time goes: napari's sample menu, the layer model, its insertion (visual,
        # controls, selection, dims), and the display rule that puts it in its frame.
        self._hook("napari.components.viewer_model", "ViewerModel", "open_sample", "napari open_sample")
        self._hook("napari.components.viewer_model", "ViewerModel", "add_layer", "napari add_layer")
        self._hook("napari.layers.image.image", "Image", "__init__", "napari Image()")
        self._hook_function("ctbench_napari._qt.display_rule", "apply", "ctbench display rule")
        gc.callbacks.append(self._gc)

    def _gap(self, t0: float, t1: float, gap: float) -> None:
        if gap > self.GAP_S:
            self.gaps.append((t0, t1, gap))

    def _gc(self, phase, info) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._gc_t0 = now
        elif self._gc_t0 is not None and now - self._gc_t0 > self.MIN_S:
            self.log.append((self._gc_t0, now, f"garbage collection gen {info['generation']}"))

    def _timed(self, fn, label):
        trace = self

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                if t1 - t0 > trace.MIN_S:
                    trace.log.append((t0, t1, label(args) if callable(label) else label))
        return timed

    def _hook(self, module: str, cls: str, name: str, label) -> None:
        import importlib

        try:
            owner = getattr(importlib.import_module(module), cls)
            original = owner.__dict__[name]
        except (ImportError, AttributeError, KeyError):
            return
        setattr(owner, name, self._timed(original, label))
        self._undo.append((owner, name, original))

    def _hook_function(self, module: str, name: str, label) -> None:
        """A module-level function, called through its module's globals (absent in older versions: skipped)."""
        import importlib

        try:
            owner = importlib.import_module(module)
            original = owner.__dict__[name]
        except (ImportError, KeyError):
            return
        setattr(owner, name, self._timed(original, label))
        self._undo.append((owner, name, original))

    @staticmethod
    def _window_event(args) -> str:
        kind = int(args[1].type()) if len(args) > 1 else -1
        return "main window repaint" if kind == 77 else f"main window event {kind}"     # 77: UpdateRequest

    def _hook_ctbench(self) -> None:
        try:
            from ctbench_napari._qt import common
        except ImportError:
            return
        steps_cls = getattr(common, "Steps", None)
        if steps_cls is not None:
            original_run = steps_cls.__dict__["run"]
            trace = self

            def run(steps_self, steps, *args, **kwargs):
                return original_run(steps_self, [trace._timed(s, "step " + _callable_name(s)) for s in steps],
                                    *args, **kwargs)
            steps_cls.run = run
            self._undo.append((steps_cls, "run", original_run))
        try:
            from ctbench_napari._qt import runner
        except ImportError:
            return
        cls = getattr(runner, "LocalRunner", None)
        if cls is not None and "_deliver_one" in cls.__dict__:
            self._hook("ctbench_napari._qt.runner", "LocalRunner", "_deliver_one",
                       lambda a: "runner " + (type(a[0]._queue[0]).__name__.lstrip("_") if a and a[0]._queue
                                              else "idle"))

    def take(self) -> dict:
        gaps, log = self.gaps, self.log
        self.gaps, self.log = [], []
        if not gaps:
            return {"longest_gap_held": []}
        g0, g1, _gap = max(gaps, key=lambda g: g[2])
        inside = sorted((t0, t1, what) for t0, t1, what in log if t1 > g0 and t0 < g1)
        return {"longest_gap_held": [f"+{1000 * (t0 - g0):.0f} ms {what} {1000 * (t1 - t0):.0f} ms"
                                     for t0, t1, what in inside]}

    def close(self) -> None:
        import gc

        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)
        self.probe.gap_hook = None


def _callable_name(fn) -> str:
    f = getattr(fn, "func", fn)           # functools.partial
    return getattr(f, "__qualname__", type(f).__name__).replace(".<locals>", "")


def _spin(seconds: float) -> None:
    from ctbench_napari._testing import wait_for

    end = time.perf_counter() + seconds
    try:
        wait_for(lambda: time.perf_counter() >= end, timeout=seconds + 60)
    except TimeoutError:
        pass


class _Done(Exception):
    """Raised after the action ``--until`` names: the actions after it are skipped."""


def stall_records(run_id: str, label: str, trace_paints: bool = False, trace_stacks: bool = False,
                  profile: bool = False, trace_turns: bool = False, until: str | None = None) -> list[dict]:
    import napari
    import napari._qt.qt_main_window as qmw

    from ctbench_napari import PLUGIN, WIDGETS
    from ctbench_napari._testing import wait_for

    qmw.SHOW_QT_WARNING = False
    os.environ.setdefault("CTBENCH_BRIDGE_STATE_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) /
                                                          f"ctbench-bench-no-bridge-{os.getpid()}"))
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1920, 1080)
    t0 = time.perf_counter()
    try:   # the workbench as `ctbench gui --sample none` opens it (versions with the launcher)
        from ctbench_napari._launch import open_workbench

        open_workbench(None, block=False, viewer=viewer)
    except (ImportError, TypeError):
        for n in WIDGETS:
            viewer.window.add_plugin_dock_widget(PLUGIN, n, tabify=True)
    widgets = {n: w for k, w in viewer.window.dock_widgets.items() for n in WIDGETS if str(k).startswith(n)}
    probe = StallProbe()
    probe.profiling = profile
    paints = PaintTrace() if trace_paints else None
    stacks = StackSampler(probe) if trace_stacks else None
    turns = TurnTrace(probe) if trace_turns else None
    records = []
    def record(action: str, fn, settle_s: float = 0.5, **extra):
        try:
            if paints is not None:
                paints.take()
            if stacks is not None:
                stacks.take()
            if turns is not None:
                turns.take()
            stall, wall = probe.measure(fn, settle_s)
            rec = {"stall_ms": round(stall, 1), "wall_s": round(wall, 2), "meets_goal": stall <= STALL_GOAL_MS}
            if paints is not None:
                rec.update(paints.take())
            if stacks is not None:
                rec.update(stacks.take())
            if turns is not None:
                rec.update(turns.take())
            if profile:
                rec.update(probe.take_profile())
        except Exception as e:  # noqa: BLE001 - an action the measured version lacks is recorded as such
            rec = {"error": f"{type(e).__name__}: {e}"}
        records.append({"bench": BENCH, "run_id": run_id, "kind": "stall", "label": label, "action": action,
                        "loadavg": list(os.getloadavg()), **rec, **extra})
        print(json.dumps(records[-1]), flush=True)
        if until and action.startswith(until):
            raise _Done

    def busy(w) -> bool:
        return bool(getattr(w, "busy", False) or getattr(w, "running", False))

    import ctbench_napari._launch as launch
    warm = getattr(launch, "WARM_UP", None)
    try:
        from ctbench_napari._qt import warm_up as gui_warm_up
    except ImportError:        # versions without the GUI warm-up
        gui_warm_up = None

    # As `ctbench gui` runs it: its process freezes the heap once warm (versions with that step).
    freeze = getattr(launch, "freeze_heap_when_warm", None)
    if freeze is not None and warm is not None:
        freeze(viewer, warm)

    def warmed() -> bool:
        return (warm is None or not warm.is_alive()) and (gui_warm_up is None or gui_warm_up.pending(viewer) == 0) \
            and (freeze is None or gui_warm_up.heap_frozen(viewer))

    if warm is not None or gui_warm_up is not None:
        # A user who acts after the workbench's start-up work is done; the start-up's own stalls are recorded.
        record("(start-up warm-up: samples in a thread, GUI warm-up one step per turn)",
               lambda: wait_for(warmed, timeout=300), settle_s=0.2)
        records[-1]["wall_since_open_s"] = round(time.perf_counter() - t0, 2)

    try:
        _spin(2.0)
        def open_sample(name, layer):       # until its last layer is in (the workbench adds one per turn)
            def go():
                viewer.open_sample(PLUGIN, name)
                wait_for(lambda: layer in viewer.layers and not (viewer.layers[layer].metadata.get("ctbench") or {})
                         .get("loading"), timeout=120)
            return go
        record("open sample phantom_scan", open_sample("phantom_scan", "Shepp-Logan cone-beam scan"))
        record("open sample lab_scan", open_sample("lab_scan", "lab scan (raw counts)"))
        designer = widgets["Trajectory designer"]

        def edit():
            n = designer.n_updates
            designer.form.editors["n_views"].setValue(designer.form.editors["n_views"].value() + 10)
            wait_for(lambda: designer.n_updates > n and not busy(designer), timeout=120)
        record("designer edit", edit)
        record("designer edit (again)", edit)
        recon = widgets["Reconstruction"]
        recon.sinogram.select("Shepp-Logan cone-beam scan")

        def click(button, what):
            def go():
                recon.select_algorithm(*what[:1], **what[1])
                getattr(recon, f"{button}_button").click()
                wait_for(lambda: not recon.running, timeout=600)
            return go
        record("quick preview FBP", click("preview", ("fbp", {})))
        record("FDK run (and 3 s after)", click("run", ("fbp", {})), settle_s=3.0)
        record("SIRT 10 run (and 3 s after)", click("run", ("sirt", {"n_iter": 10})), settle_s=3.0)

        def compare():
            recon.compare_button.click()
            wait_for(lambda: not busy(recon.comparison), timeout=300)
        record("compare side by side", compare)

        def differences():
            recon.comparison.difference_button.click()
            wait_for(lambda: not busy(recon.comparison), timeout=300)
        record("difference images", differences)
        recon.comparison.single_view()

        def long_run():      # the event loop during a solve (was a 0.6 s gap assertion in a GUI test)
            recon.select_algorithm("sirt", n_iter=100000)
            recon.run_button.click()
            _spin(3.0)
        record("during a long SIRT run (3 s)", long_run, settle_s=0.0)

        def cancel():
            recon.cancel_button.click()
            wait_for(lambda: not recon.running, timeout=120)
        record("cancel the long run", cancel)
        scan = widgets["Scan import"]
        scan.projections.select("lab scan (raw counts)")

        def correct():
            scan.correct_button.click()
            wait_for(lambda: not scan.busy, timeout=600)
        record("scan import: correct", correct)

        def attach():
            scan.attach_button.click()
            wait_for(lambda: not scan.busy, timeout=600)
        record("scan import: attach geometry", attach)
        jobs = widgets.get("Jobs")     # older versions did not dock it (and aborted a script without a bridge)
        if jobs is not None:
            jobs.timer.setInterval(200)
            record("jobs panel without a bridge (5 s)", lambda: None, settle_s=5.0)
    except _Done:
        pass
    finally:
        if turns is not None:      # before the paint trace: it wraps that trace's paintGL
            turns.close()
        if paints is not None:
            paints.close()
        if stacks is not None:
            stacks.close()
        viewer.close()
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "bench_gui.jsonl"))
    p.add_argument("--no-out", action="store_true", help="print only")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-full", action="store_true", help="skip the full FDK reconstruction used for the speed-up")
    p.add_argument("--full-iterative", action="store_true", help="also time full iterative runs (slow)")
    p.add_argument("--no-widget", action="store_true", help="skip the napari measurement")
    p.add_argument("--widget-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-id", default=None, help=argparse.SUPPRESS)
    p.add_argument("--stalls", action="store_true", help="measure the longest GUI-thread stall of each action")
    p.add_argument("--label", default="current", help="name of the code version measured by --stalls")
    p.add_argument("--trace-paints", action="store_true",
                   help="with --stalls: count the canvas paints of each action and name where the longest ran")
    p.add_argument("--trace-turns", action="store_true",
                   help="name the steps, runner events, napari rebuilds, paints, repaints and garbage collections "
                        "inside each action's longest gap")
    p.add_argument("--trace-stacks", action="store_true",
                   help="with --stalls: sample the GUI thread's stack while it stalls and name where it was")
    p.add_argument("--profile-stalls", action="store_true",
                   help="with --stalls: cProfile the GUI thread and keep, per action, the functions of its "
                        "longest gap (slows Python: for finding causes, not for the figures)")
    p.add_argument("--until", default=None,
                   help="with --stalls: stop after the first action whose name starts with this (e.g. 'designer "
                        "edit (again)')")
    p.add_argument("--plugin-tree", default=None,
                   help="import ctbench_napari from this folder (another version's plugins/), not the installed one")
    args = p.parse_args(argv)
    if args.plugin_tree:
        _use_plugin_tree(args.plugin_tree)
    run_id = args.run_id or _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if args.stalls:
        return _stalls_main(args, run_id)

    records: list[dict] = []
    if not args.widget_only:
        records.append(_header(run_id, args))
        records += core_records(run_id, args.repeats, not args.no_full, args.full_iterative)
    if not args.no_widget:
        if os.environ.get("DISPLAY") or args.widget_only:
            records += widget_records(run_id, args.repeats)
        elif shutil.which("xvfb-run"):
            # No display: measure the widget path in a child process under a virtual X server.
            cmd = ["xvfb-run", "-a", sys.executable, __file__, "--widget-only", "--no-out", "--run-id", run_id,
                   "--repeats", str(args.repeats)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                records.append({"bench": BENCH, "run_id": run_id, "path": "widget",
                                "skipped": f"xvfb-run failed: {proc.stderr.strip()[-300:]}"})
            records += [json.loads(ln) for ln in lines]
        else:
            records.append({"bench": BENCH, "run_id": run_id, "path": "widget",
                            "skipped": "no display and no xvfb-run"})
    text = "\n".join(json.dumps(r) for r in records)
    print(text)
    if not args.no_out and not args.widget_only:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write(text + "\n")
    return 0


def _use_plugin_tree(folder: str) -> None:
    """Make ``import ctbench_napari`` find the package in ``folder`` (ahead of an editable install's hook)."""
    import importlib.machinery

    folder = str(Path(folder).resolve())
    if not (Path(folder) / "ctbench_napari" / "__init__.py").is_file():
        raise SystemExit(f"--plugin-tree: expected a folder holding ctbench_napari/, got {folder!r}")

    class _PluginTree:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "ctbench_napari":
                return importlib.machinery.PathFinder.find_spec(name, [folder])
            if name.startswith("ctbench_napari."):
                return importlib.machinery.PathFinder.find_spec(name, path)
            return None
    sys.meta_path.insert(0, _PluginTree)


def _stalls_main(args, run_id: str) -> int:
    """--stalls: under a display (re-run under xvfb-run at 1920x1080 when there is none), JSON lines out."""
    if not os.environ.get("DISPLAY"):
        if not shutil.which("xvfb-run"):
            print(json.dumps({"bench": BENCH, "kind": "stall", "skipped": "no display and no xvfb-run"}))
            return 0
        cmd = ["xvfb-run", "-a", "-s", "-screen 0 1920x1080x24", sys.executable, __file__, "--stalls",
               "--label", args.label, "--run-id", run_id, "--out", args.out] + (["--no-out"] if args.no_out else []) \
            + (["--trace-paints"] if args.trace_paints else []) + (["--trace-stacks"] if args.trace_stacks else []) \
            + (["--trace-turns"] if args.trace_turns else []) \
            + (["--plugin-tree", args.plugin_tree] if args.plugin_tree else []) \
            + (["--profile-stalls"] if args.profile_stalls else []) \
            + (["--until", args.until] if args.until else [])
        return subprocess.run(cmd).returncode
    records = [{**_header(run_id, args), "kind": "stall-header", "label": args.label,
                "goal_ms": STALL_GOAL_MS}] + stall_records(run_id, args.label, args.trace_paints,
                                                                  args.trace_stacks, args.profile_stalls,
                                                                  args.trace_turns, args.until)
    if not args.no_out:
        out = Path(args.out).with_name("bench_gui_stalls.jsonl")
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write("\n".join(json.dumps(r) for r in records) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
