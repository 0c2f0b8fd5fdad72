"""Nothing heavy on the GUI thread (issue 23): the start-up sample is computed in the warm-up thread, and
comparison cells and designer preview layers appear one per event-loop turn."""

import sys
import threading
import time

import pytest

from ctbench_napari._testing import wait_for

pytestmark = pytest.mark.gui


def _spy_on_sample_projection(_samples, monkeypatch):
    """Empty the sample caches and record the thread of every sample projection (the list returned)."""
    _samples._sample_sinogram.cache_clear()
    _samples._phantom_array.cache_clear()
    monkeypatch.setattr(_samples, "_READY", set())
    threads = []
    real = _samples.phantom_sinogram

    def spying(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)
    monkeypatch.setattr(_samples, "phantom_sinogram", spying)
    return threads


def test_the_start_up_sample_is_computed_off_the_gui_thread(make_napari_viewer, monkeypatch):
    import napari

    import ctbench_napari
    from ctbench_napari import _launch, _samples

    # A warm-up thread of an earlier launch (it runs below the GUI thread's priority, so it may still be
    # going) would be reused and fill the caches this test empties: let it end first.
    if _launch.WARM_UP is not None:
        _launch.WARM_UP.join(120)
    threads = _spy_on_sample_projection(_samples, monkeypatch)
    monkeypatch.setattr(napari, "Viewer", make_napari_viewer)
    monkeypatch.setattr(napari, "run", lambda *a, **k: None)
    viewer = ctbench_napari.launch("phantom_scan")
    wait_for(lambda: len(viewer.layers) == 2, timeout=120)
    assert [x.name for x in viewer.layers] == ["Shepp-Logan phantom", "Shepp-Logan cone-beam scan"]
    assert threads and threading.main_thread() not in threads          # projected in the warm-up thread


def test_steps_run_one_per_event_loop_turn_and_a_new_run_drops_the_old(qtbot):
    from qtpy.QtWidgets import QWidget

    from ctbench_napari._qt.common import Steps

    owner = QWidget()
    qtbot.addWidget(owner)
    steps = Steps(owner)
    done = []
    steps.run([lambda: done.append(1), lambda: done.append(2), lambda: done.append(3)])
    assert done == [1] and steps.pending == 2            # the first now, the others later
    wait_for(lambda: steps.pending == 0, timeout=5)
    assert done == [1, 2, 3]
    steps.run([lambda: done.append(4), lambda: done.append(5)])
    steps.run([lambda: done.append(6), lambda: done.append(7)])   # replaces the older chain
    wait_for(lambda: steps.pending == 0, timeout=5)
    assert done == [1, 2, 3, 4, 6, 7]
    errors = []
    steps.run([lambda: 1 / 0, lambda: done.append(8)], on_error=errors.append)
    assert isinstance(errors[0], ZeroDivisionError) and steps.pending == 0 and 8 not in done
    steps.run([lambda: done.append(9), lambda: done.append(10)], later=True)
    assert 9 not in done and steps.pending == 2              # later: the first step after this turn too
    wait_for(lambda: steps.pending == 0, timeout=5)
    assert done[-2:] == [9, 10]


def test_comparison_cells_appear_one_per_turn(make_napari_viewer):
    import numpy as np

    viewer = make_napari_viewer()
    from ctbench_napari import PLUGIN

    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    layers = [viewer.add_image(np.random.default_rng(k).random((8, 8, 8), np.float32), name=f"v{k}",
                               metadata={"ctbench": {"kind": "volume"}}) for k in range(3)]
    for x in layers:
        x.visible = False
    seen = []
    for x in layers:
        x.events.visible.connect(lambda e, x=x: seen.append((x.name, x.visible)))
    recon.comparison.compare(layers=layers)
    first = [x.name for x in layers if x.visible]
    assert len(first) == 1 and recon.comparison.busy                 # one cell now, the others later
    wait_for(lambda: not recon.comparison.busy, timeout=30)
    assert all(x.visible for x in layers) and viewer.canvas.grid.enabled
    assert [n for n, v in seen if v][:3] == [first[0], *[x.name for x in layers if x.name != first[0]]][:3]


def test_progress_bar_changes_are_painted_by_the_event_loop_not_inside_the_slot(qtbot):
    # QProgressBar.setValue/setRange repaint() at once, which in napari's window also draws the OpenGL canvas
    # inside the progress slot; the widgets' bar leaves the paint to the event loop.
    from qtpy.QtCore import QEvent, QObject
    from qtpy.QtWidgets import QProgressBar

    from ctbench_napari._qt.common import ProgressBar

    class Paints(QObject):
        n = 0

        def eventFilter(self, obj, event):  # noqa: N802 - Qt name
            if event.type() == QEvent.Paint:
                self.n += 1
            return False

    def paints_during(bar, change) -> tuple[int, int]:
        qtbot.addWidget(bar)
        bar.setRange(0, 100)
        bar.resize(300, 30)
        bar.show()
        qtbot.waitExposed(bar)
        qtbot.wait(50)
        counter = Paints()
        bar.installEventFilter(counter)
        change(bar)
        at_once = counter.n
        qtbot.waitUntil(lambda: counter.n > at_once, timeout=5000)
        return at_once, counter.n

    def change(bar):
        bar.setValue(40)
        bar.setRange(0, 200)
        bar.setMaximum(50)

    assert paints_during(QProgressBar(), change)[0] >= 1          # Qt's own bar paints inside the call
    at_once, later = paints_during(ProgressBar(), change)
    assert at_once == 0 and later >= 1                            # ours: painted once the event loop runs
    bar = ProgressBar()
    bar.setRange(0, 10)
    bar.setValue(7)
    assert (bar.value(), bar.maximum()) == (7, 10) and bar.updatesEnabled()


def test_the_warm_up_loads_the_scale_bar_glyphs_and_colormaps_before_any_action(make_napari_viewer,
                                                                                 monkeypatch):
    import numpy as np
    from napari._vispy.utils import qt_font
    from napari.utils.colormaps import AVAILABLE_COLORMAPS

    from ctbench_napari import PLUGIN
    from ctbench_napari._qt import warm_up
    from ctbench_napari._qt.display import scale_bar, show_result

    viewer = make_napari_viewer(show=True)
    viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")     # docking installs the warm-up
    wait_for(lambda: warm_up.pending(viewer) == 0, timeout=60)
    assert warm_up.background_ready(timeout=60) and "PiYG" in AVAILABLE_COLORMAPS
    # The first layer's units and the first Vectors layer's features table cost nothing in an action.
    assert warm_up.unit_registry_built() and "pandas" in sys.modules
    font = warm_up._scale_bar_font(viewer)
    assert set(warm_up.SCALE_BAR_GLYPHS) <= set(font._glyphs)
    loaded = []
    real = qt_font.QtTextureFont._load_char
    monkeypatch.setattr(qt_font.QtTextureFont, "_load_char", lambda self, c: (loaded.append(c), real(self, c)))
    layer = viewer.add_image(np.random.default_rng(0).random((16, 16, 16), np.float32), name="result",
                             metadata={"ctbench": {"kind": "volume"}})
    show_result(viewer, layer)            # the first 2D slice of a volume: the scale bar appears
    assert scale_bar(viewer).visible
    for _ in range(5):
        viewer.window._qt_viewer.canvas._scene_canvas.render()      # draws the bar's label
    assert loaded == []                    # no glyph rendered inside the action


def test_the_workbench_freezes_the_heap_once_warm_and_unfreezes_when_its_window_goes(make_napari_viewer):
    """A full collection walked the whole heap (0.2 s, GIL held) in the middle of actions: once the warm-up is
    done the objects alive are frozen (never walked, never collected); later garbage is still collected."""
    import gc
    import weakref

    from qtpy.QtCore import QEvent
    from qtpy.QtWidgets import QApplication

    from ctbench_napari import PLUGIN
    from ctbench_napari._qt import warm_up

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    gc.unfreeze()
    try:
        viewer = make_napari_viewer(show=True)
        viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")     # docking installs the warm-up
        gate = threading.Event()           # stands for the launcher's sample thread
        warm_up.freeze_heap_when_warm(viewer, gate.is_set)
        early = gc.get_freeze_count()
        assert early > 10000               # what is alive now is frozen at once (the warm-up's collections)
        wait_for(lambda: warm_up.pending(viewer) == 0 and warm_up.background_ready(0), timeout=120)
        end = time.perf_counter() + 3 * warm_up.FREEZE_POLL_MS / 1000
        wait_for(lambda: time.perf_counter() > end, timeout=10)
        assert not warm_up.heap_frozen(viewer) and gc.get_freeze_count() <= early   # waits for the sample thread
        before = cycle()                   # garbage made before the final freeze
        gate.set()
        wait_for(lambda: warm_up.heap_frozen(viewer), timeout=10)
        assert gc.get_freeze_count() > early
        after = cycle()                    # garbage made after it
        gc.collect()
        assert after() is None             # still collected
        assert before() is not None        # frozen: out of the collector's reach
        viewer.close()                     # at once, before the window is deleted (a leak check collects)
        assert gc.get_freeze_count() == 0
        QApplication.sendPostedEvents(None, QEvent.DeferredDelete)      # the window is destroyed
        gc.collect()
        assert before() is None            # collectable again once the workbench is gone
    finally:
        gc.unfreeze()


def test_the_frozen_workbench_runs_full_collections_when_the_event_loop_is_idle(make_napari_viewer):
    """Python's own full collections came inside the turns that add a layer: while the workbench is on
    screen its trigger is raised and the same collections run from a timer once the loop is calm; garbage
    in cycles is still collected without anyone calling gc.collect, and Python's thresholds come back when
    the window goes."""
    import gc
    import weakref

    from ctbench_napari import PLUGIN
    from ctbench_napari._qt import warm_up

    class Node:
        pass

    python_thresholds = gc.get_threshold()
    gc.unfreeze()
    try:
        viewer = make_napari_viewer(show=True)
        viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
        warm_up.freeze_heap_when_warm(viewer)
        wait_for(lambda: warm_up.heap_frozen(viewer), timeout=120)
        guard = viewer.window._qt_window._ctbench_heap_freeze
        assert gc.get_threshold()[2] == warm_up.FULL_GC_THRESHOLD          # Python's trigger raised
        assert gc.get_threshold()[:2] == python_thresholds[:2]
        a, b = Node(), Node()
        a.other, b.other = b, a                 # garbage only a full collection finds once it is old
        ref = weakref.ref(a)
        del b
        for _ in range(3):                      # age it (alive) into the oldest generation, then drop it
            gc.collect(1)
        del a
        junk = [[{}] for _ in range(20 * python_thresholds[0] * python_thresholds[1])]   # middle collections
        del junk
        assert gc.get_count()[2] >= python_thresholds[2] and ref() is not None
        wait_for(lambda: ref() is None, timeout=30)                 # collected by the idle timer
        assert guard.idle_collections >= 1
        viewer.close()
        assert gc.get_threshold() == python_thresholds                # Python's own again
    finally:
        gc.unfreeze()
        gc.set_threshold(*python_thresholds)


def test_the_background_warm_up_builds_the_unit_registry_napari_gives_every_layer(monkeypatch):
    """pint parses its unit definitions when the lazy registry is first used: the first layer of a session
    paid 0.4-0.5 s of it inside an action; the warm-up thread builds it instead."""
    import pint

    from ctbench_napari._qt import warm_up

    app = pint.get_application_registry()
    monkeypatch.setattr(app, "_registry", pint.registry.LazyRegistry())     # a fresh, unbuilt registry
    monkeypatch.setattr(warm_up, "_BACKGROUND_THREAD", None)
    assert not warm_up.unit_registry_built()
    warm_up._start_background()
    assert warm_up._BACKGROUND_THREAD is not threading.current_thread()
    assert warm_up.background_ready(timeout=120)
    assert warm_up.unit_registry_built() and "pandas" in sys.modules
    assert str(app.Unit("mm")) == "millimeter"      # the application registry works after the warm-up


def test_open_sample_during_the_warm_up_waits_in_the_warm_up_thread_then_fills_the_layers(make_napari_viewer,
                                                                                          monkeypatch):
    import numpy as np

    from ctbench_napari import PLUGIN
    from ctbench_napari._layers import display_to_sinogram
    from ctbench_napari import _samples

    viewer = make_napari_viewer()
    viewer.window._qt_window._ctbench_workbench = True        # as ctbench gui opens it (samples are staged)
    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    real = _samples.phantom_sinogram
    threads = _spy_on_sample_projection(_samples, monkeypatch)
    gate = threading.Event()
    real_warm_up = _samples.warm_up

    def warm_up_after_the_click():
        gate.wait(60)
        real_warm_up()
    _samples._WARMING.set()              # the workbench's warm-up has started and not reached the sample
    try:
        added = viewer.open_sample(PLUGIN, "phantom_scan")     # File > Open Sample, on the GUI thread
        assert [x.name for x in added] == ["Shepp-Logan phantom", "Shepp-Logan cone-beam scan"]
        assert all(x.data.shape == (1, 1, 1) and x.metadata["ctbench"]["loading"] for x in added)
        assert threads == [] and recon.sinogram.layer() is None   # nothing computed; not offered as data
        worker = threading.Thread(target=warm_up_after_the_click)
        worker.start()
        gate.set()
        sino_layer = viewer.layers["Shepp-Logan cone-beam scan"]
        wait_for(lambda: sino_layer.data.shape == (120, 96, 96), timeout=300)
        worker.join(300)
    finally:
        _samples._WARMING.clear()
    assert threads and threading.main_thread() not in threads          # projected in the warm-up thread
    _, expected = real()
    np.testing.assert_allclose(display_to_sinogram(sino_layer.data, sino_layer.metadata["ctbench"]["axes"]),
                               expected, rtol=1e-6)
    assert "loading" not in sino_layer.metadata["ctbench"] and recon.sinogram.layer() is not None
    assert viewer.layers["Shepp-Logan phantom"].data.shape == (64, 64, 64) and len(viewer.layers) == 2
    assert sino_layer.visible and not viewer.layers["Shepp-Logan phantom"].visible    # the display rule
    assert sino_layer.contrast_limits[1] > sino_layer.contrast_limits[0] > -1e-6


def test_a_sample_of_two_layers_arrives_one_layer_per_turn_in_the_workbench(make_napari_viewer):
    from ctbench_napari import PLUGIN

    plain = make_napari_viewer()
    assert [x.name for x in plain.open_sample(PLUGIN, "phantom_scan")] == \
        ["Shepp-Logan phantom", "Shepp-Logan cone-beam scan"]          # a script's viewer: both at once
    viewer = make_napari_viewer()
    viewer.window._qt_window._ctbench_workbench = True                   # as ctbench gui opens it
    viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")      # (docked widgets apply the display rule)
    import time

    from qtpy.QtCore import QTimer

    # A timer due while napari adds the first layer (as a user's click, or bench_gui's probe) runs before
    # the second layer is added: the two adds are two turns.  The sleep stands for napari's per-layer work.
    viewer.layers.events.inserted.connect(lambda _e: time.sleep(0.1))
    seen = []
    QTimer.singleShot(20, lambda: seen.append(len(viewer.layers)))
    added = viewer.open_sample(PLUGIN, "phantom_scan")
    assert [x.name for x in added] == ["Shepp-Logan phantom"] and len(viewer.layers) == 1
    wait_for(lambda: len(viewer.layers) == 2, timeout=30)
    assert seen == [1]
    wait_for(lambda: not viewer.layers["Shepp-Logan phantom"].visible, timeout=30)   # the rule: a turn later
    sino = viewer.layers["Shepp-Logan cone-beam scan"]
    assert sino.metadata["ctbench"]["kind"] == "sinogram" and sino.data.shape == (120, 96, 96)
    assert sino.visible and not viewer.layers["Shepp-Logan phantom"].visible     # the display rule still applies


def test_the_drop_filter_sees_only_the_canvas_events_not_every_event_of_the_application(make_napari_viewer,
                                                                                        monkeypatch, recwarn):
    # An application-wide Python event filter takes every Qt event through Python and the GIL, so the event
    # loop waits on a solver thread that holds it: the filter sits on the viewer's drop targets only.
    from qtpy.QtCore import QEvent, QObject
    from qtpy.QtWidgets import QApplication

    from ctbench_napari import PLUGIN
    from ctbench_napari._qt import datasets

    viewer = make_napari_viewer()
    viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    # the widget sees napari's public-only proxy: finding the drop targets must not read its private parts
    assert not [w for w in recwarn.list if issubclass(w.category, FutureWarning)], \
        [str(w.message) for w in recwarn.list]
    seen = []
    real = datasets._DropFilter.eventFilter
    monkeypatch.setattr(datasets._DropFilter, "eventFilter",
                        lambda self, obj, event: (seen.append(id(obj)), real(self, obj, event))[1])
    elsewhere = QObject()
    QApplication.sendEvent(elsewhere, QEvent(QEvent.User))
    assert id(elsewhere) not in seen
    canvas = viewer.window._qt_viewer.canvas.native
    QApplication.sendEvent(canvas, QEvent(QEvent.User))
    assert id(canvas) in seen
    del canvas


def _turn_counter(qtbot):
    """A 0 ms repeating timer: its count tells which turn of the event loop something happened in."""
    from qtpy.QtCore import QTimer

    turns = [0]
    timer = QTimer()
    timer.setInterval(0)
    timer.timeout.connect(lambda: turns.__setitem__(0, turns[0] + 1))
    timer.start()
    return turns, timer


def test_the_runner_delivers_a_fast_runs_events_one_per_turn_in_order_with_only_the_newest_preview(qtbot):
    import torch

    from ctbench.workbench.workflow import Finished, Progress, ReconRequest
    from ctbench_napari._qt.runner import LocalRunner

    runner = LocalRunner()
    got, done = [], []
    turns, timer = _turn_counter(qtbot)
    runner.event.connect(lambda ev: got.append((turns[0], ev)))
    runner.done.connect(lambda: done.append(turns[0]))
    previews = [torch.full((2, 2, 2), float(k)) for k in range(1, 5)]
    emitted = threading.Event()

    def events(cancel):
        for k, p in enumerate(previews, 1):
            yield Progress(k, 4, 1.0 / k, 0.1 * k, preview=p)
        yield Finished(previews[-1], [1.0, 0.5, 0.33, 0.25], 4, "completed", 0.5, ReconRequest("sirt", {}),
                       (1.0, 1.0, 1.0), (0.0, 0.0, 0.0))
        emitted.set()

    runner.start(events)
    assert runner.running
    assert emitted.wait(30)                 # the worker has emitted everything, all of it queued
    wait_for(lambda: not runner.running, timeout=30)
    timer.stop()
    evs = [ev for _t, ev in got]
    assert [getattr(ev, "iteration", "end") for ev in evs] == [1, 2, 3, 4, "end"]     # every event, in order
    assert [ev.residual for ev in evs[:4]] == [1.0, 0.5, 1.0 / 3, 0.25]              # plot points all kept
    shown = [ev.preview for ev in evs[:4] if ev.preview is not None]
    # The newest preview always arrives: the last progress event keeps its estimate, the final value.
    assert shown and shown[-1] is previews[-1] and float(shown[-1][0, 0, 0]) == 4.0
    assert isinstance(evs[-1], Finished)
    seen = [t for t, _ev in got] + done
    assert all(b > a for a, b in zip(seen, seen[1:]))     # one per turn; done a turn after the result


def test_the_runner_delivers_a_failure_after_the_events_before_it_and_done_last(qtbot):
    from ctbench.workbench.workflow import Progress
    from ctbench_napari._qt.runner import LocalRunner

    runner = LocalRunner()
    order = []
    runner.event.connect(lambda ev: order.append(("event", ev.iteration)))
    runner.failed.connect(lambda e: order.append(("failed", str(e))))
    runner.done.connect(lambda: order.append(("done",)))

    def events(cancel):
        yield Progress(1, 3, 0.5, 0.1)
        raise ValueError("sinogram contains NaN")

    runner.start(events)
    wait_for(lambda: not runner.running, timeout=30)
    assert order == [("event", 1), ("failed", "sinogram contains NaN"), ("done",)]


def test_a_worker_quit_before_its_first_step_ends_its_count_once(qtbot):
    """A generator worker quit before it runs never enters its generator (superqt checks the abort first):
    its count must still end, or the idle collector (which waits for the workers) would never run again."""
    from ctbench_napari._qt import common

    base = common.live_workers()

    def gen():
        yield 1

    wrapped, ended = common._at_background_priority(gen)
    assert common.live_workers() == base + 1
    unstarted = wrapped()            # made and dropped without a step, as an aborted worker's
    del unstarted
    ended()                          # the worker's finished signal
    assert common.live_workers() == base
    ended()
    assert list(wrapped()) == [1]    # a generator that does run ends the same count: never twice
    assert common.live_workers() == base

    release = threading.Event()
    workers = [common.start_worker(release.wait, 30) for _ in range(2)]
    quitter = common.start_worker(gen)
    quitter.quit()                   # before or after its first step: either way it ends its count
    release.set()
    wait_for(lambda: common.live_workers() == base, timeout=30)
    assert all(w is not None for w in workers)


def test_the_idle_collector_waits_for_workers_and_steps_and_keeps_a_gap(qtbot):
    """A full collection at a calm moment of an action (a worker running, a Steps chain between turns)
    would sit in front of the action's next result or the user's Cancel: it waits until both are done, and
    two idle collections are at least IDLE_GC_GAP_S apart."""
    import gc

    from qtpy.QtWidgets import QWidget

    from ctbench_napari._qt import common, warm_up

    python_thresholds = gc.get_threshold()
    window = QWidget()
    qtbot.addWidget(window)
    try:
        guard = warm_up._HeapFreeze(window, lambda: True)
        wait_for(lambda: guard.frozen and guard.idle_timer is not None, timeout=30)
        steps = common.Steps(window)
        steps.run([common.next_turn, common.next_turn, common.next_turn])
        assert common.steps_pending() >= 2 and warm_up.busy_elsewhere()
        wait_for(lambda: steps.pending == 0, timeout=30)
        release = threading.Event()
        worker = common.start_worker(release.wait, 60)
        wait_for(lambda: common.live_workers() >= 1, timeout=30)
        assert warm_up.busy_elsewhere()
        junk = [[{}] for _ in range(20 * python_thresholds[0] * python_thresholds[1])]   # a full one due
        del junk
        assert gc.get_count()[2] >= guard.thresholds[2]
        qtbot.wait(int(3 * warm_up.IDLE_TICKS * warm_up.IDLE_GC_MS))     # calm, but the worker runs
        assert guard.idle_collections == 0
        release.set()
        wait_for(lambda: guard.idle_collections == 1, timeout=30)       # it runs once the worker ends
        assert worker is not None
        junk = [[{}] for _ in range(20 * python_thresholds[0] * python_thresholds[1])]
        del junk
        assert gc.get_count()[2] >= guard.thresholds[2]
        assert guard._last_collection > 0
        guard._last_collection = time.perf_counter()     # as if one had just run: the next one waits
        qtbot.wait(int(3 * warm_up.IDLE_TICKS * warm_up.IDLE_GC_MS))
        assert guard.idle_collections == 1
        guard._last_collection -= warm_up.IDLE_GC_GAP_S
        wait_for(lambda: guard.idle_collections == 2, timeout=30)
    finally:
        window.close()
        gc.unfreeze()
        gc.set_threshold(*python_thresholds)


def test_a_worker_leaves_a_thread_of_qts_pool_free_for_image_conversions(qtbot):
    """QImage conversions (napari's screenshot) run in Qt's global pool while the GUI thread holds the GIL;
    workers that filled the pool and waited for the GIL hung the window for good."""
    from qtpy.QtCore import QThreadPool

    from ctbench_napari._qt.common import start_worker

    pool = QThreadPool.globalInstance()
    # Pool threads of earlier tests' workers (or napari's) that are still ending are not ctbench's to count.
    wait_for(lambda: pool.activeThreadCount() == 0, timeout=30)
    release = threading.Event()
    workers = [start_worker(release.wait, 30) for _ in range(pool.maxThreadCount() + 1)]
    try:
        # Qt counts a pool thread as active until it takes the pool's lock again after its task, and a
        # thread that once ran a worker stays niced (background_priority): under load a thread that has
        # just finished something else (a segment of an image conversion) counted for a while, and
        # "6 > 6" failed with 4 workers.  Wait until exactly the workers are running, then check.
        wait_for(lambda: pool.activeThreadCount() == len(workers), timeout=30)
        assert pool.maxThreadCount() > pool.activeThreadCount()         # a thread to spare
        free = threading.Event()
        pool.start(free.set)       # what a conversion segment would be: it runs now, not after the workers
        assert free.wait(10)
    finally:
        release.set()
        wait_for(lambda: pool.activeThreadCount() == 0, timeout=30)


def test_a_comparison_grid_is_built_once_at_its_final_shape_while_its_cells_appear(make_napari_viewer,
                                                                                   monkeypatch):
    """napari rebuilds every view box and camera of the grid when its shape changes; cells shown one per
    turn changed it at 2, 3 and 5 cells.  Held at the final shape, it is built once."""
    import numpy as np
    from napari._vispy.canvas import VispyCanvas

    from ctbench_napari import PLUGIN
    from ctbench_napari._qt.compare import auto_grid_shape

    rebuilds = []
    real = VispyCanvas._init_or_update_grid

    def counting(self):
        shape = self.viewer.canvas.grid.actual_shape(self.viewer.layers)
        if self.grid.grid_size != shape:
            rebuilds.append(shape)
        return real(self)
    monkeypatch.setattr(VispyCanvas, "_init_or_update_grid", counting)
    viewer = make_napari_viewer()
    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    layers = [viewer.add_image(np.random.default_rng(k).random((8, 8, 8), np.float32), name=f"v{k}",
                               visible=False, metadata={"ctbench": {"kind": "volume"}}) for k in range(5)]
    recon.comparison.compare(layers=layers)
    wait_for(lambda: not recon.comparison.busy, timeout=30)
    grid = viewer.canvas.grid
    assert all(x.visible for x in layers) and grid.enabled
    assert rebuilds == [auto_grid_shape(5)] == [(2, 3)]          # once, at the final shape
    assert tuple(grid.shape) == (-1, -1)                          # napari's automatic shape again ...
    assert grid.actual_shape(viewer.layers) == (2, 3)             # ... which is the same
    assert sorted(c for c, _name in recon.comparison.cell_list) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


def _two_volumes(viewer):
    import numpy as np

    rng = np.random.default_rng(3)
    ref = viewer.add_image(rng.random((20, 24, 28), np.float32), name="phantom", scale=(1.0, 1.0, 1.0),
                           translate=(-9.5, -11.5, -13.5), metadata={"ctbench": {"kind": "volume"}})
    res = viewer.add_image(3 * rng.random((20, 24, 28), np.float32) - 1, name="result", scale=(1.0, 1.0, 1.0),
                           translate=(-9.5, -11.5, -13.5), metadata={"ctbench": {"kind": "volume"}})
    viewer.dims.ndisplay = 3
    viewer.scene.camera.zoom = 0.05
    return ref, res


def test_a_result_shown_in_steps_ends_as_shown_at_once(make_napari_viewer):
    """show_result's steps (one napari update per event-loop turn): contrast and visibility first, still in
    3D; then the 2D switch; then sliders, central slice and camera; the end state is show_result's at once."""
    import numpy as np

    from ctbench.workbench.metrics import percentile_window
    from ctbench_napari._qt.display import fit_camera, show_result, show_result_steps

    stepped = make_napari_viewer(show=True)
    at_once = make_napari_viewer(show=True)
    ref_s, res_s = _two_volumes(stepped)
    ref_o, res_o = _two_volumes(at_once)
    for v in (stepped, at_once):
        v.window._qt_window.resize(1000, 800)
    wait_for(lambda: tuple(stepped.canvas.size) == tuple(at_once.canvas.size), timeout=10)
    steps = show_result_steps(stepped, res_s)
    assert len(steps) == 3
    steps[0]()
    np.testing.assert_allclose(res_s.contrast_limits, percentile_window(res_s.data), rtol=1e-5)
    assert not ref_s.visible and res_s.visible and stepped.dims.ndisplay == 3     # nothing else yet
    steps[1]()
    assert stepped.dims.ndisplay == 2 and stepped.dims.axis_labels == ("z", "y", "x")
    steps[2]()
    show_result(at_once, res_o)
    assert stepped.dims.point[0] == pytest.approx(0.0, abs=0.6)          # the central slice
    assert tuple(stepped.dims.point) == tuple(at_once.dims.point)
    assert tuple(map(tuple, stepped.dims.range)) == tuple(map(tuple, at_once.dims.range))
    assert tuple(res_s.contrast_limits) == tuple(res_o.contrast_limits)
    assert [x.visible for x in stepped.layers] == [x.visible for x in at_once.layers] == [False, True]
    assert stepped.scene.camera.zoom == pytest.approx(at_once.scene.camera.zoom, rel=1e-6)
    assert tuple(stepped.scene.camera.center) == pytest.approx(tuple(at_once.scene.camera.center))
    zoom = stepped.scene.camera.zoom
    fit_camera(stepped, [res_s])
    assert stepped.scene.camera.zoom == pytest.approx(zoom)              # fitted already


def test_the_quick_preview_shows_its_result_one_update_per_turn(make_napari_viewer, monkeypatch):
    """The Reconstruction widget hands show_result's steps to its Steps one by one (each its own turn), and
    the preview ends displayed: its layer alone, 2D, central slice, percentile contrast."""
    import numpy as np

    from ctbench.workbench.metrics import percentile_window
    from ctbench_napari import PLUGIN
    from ctbench_napari._qt import common

    runs = []
    real_run, real_extend = common.Steps.run, common.Steps.extend

    def counting_run(self, steps, on_error=None, later=False):
        steps = list(steps)
        runs.append(len(steps))
        return real_run(self, steps, on_error, later)

    def counting_extend(self, steps):       # a one-pass result's display steps follow the step making its layer
        steps = list(steps)
        runs[-1] += len(steps)
        return real_extend(self, steps)
    monkeypatch.setattr(common.Steps, "run", counting_run)
    monkeypatch.setattr(common.Steps, "extend", counting_extend)
    viewer = make_napari_viewer(show=True)
    viewer.open_sample(PLUGIN, "phantom_scan")
    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    recon.sinogram.select("Shepp-Logan cone-beam scan")
    viewer.dims.ndisplay = 3
    recon.select_algorithm("fbp")
    runs.clear()
    recon.preview_button.click()
    wait_for(lambda: not recon.running, timeout=120)
    assert recon.message.level != "error", recon.message.text()
    assert runs and max(runs) >= 6     # model + sliders, the add, contrast + visibility, 2D, placement, result_added
    layer = viewer.layers[recon.last_run["name"]]
    assert [x.name for x in viewer.layers if x.visible] == [layer.name]
    assert viewer.dims.ndisplay == 2
    np.testing.assert_allclose(layer.contrast_limits, percentile_window(np.asarray(layer.data)), rtol=1e-4)
    assert np.asarray(layer.data).any()


def test_bench_gui_trace_turns_names_the_step_inside_the_longest_gap(make_napari_viewer):
    """``bench_gui.py --trace-turns``: the step that blocked the event loop is named, with its time, in the
    longest gap of the probe; the hooks are undone on close."""
    import importlib.util
    from pathlib import Path

    from ctbench_napari._qt import common

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gui.py"
    spec = importlib.util.spec_from_file_location("bench_gui_under_test", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    viewer = make_napari_viewer(show=True)
    original_run = common.Steps.run
    probe = bench.StallProbe()
    turns = bench.TurnTrace(probe)
    try:
        def slow_step():
            time.sleep(0.15)

        steps = common.Steps(viewer.window._qt_window)
        stall, _wall = probe.measure(lambda: steps.run([common.next_turn, slow_step]), settle_s=0.5)
        held = turns.take()["longest_gap_held"]
    finally:
        turns.close()
    assert stall >= 130
    step = [x for x in held if "step " in x and "slow_step" in x]
    assert step, held
    assert int(step[0].rsplit(" ", 2)[-2]) >= 150        # "+N ms step ...slow_step 150 ms"
    assert common.Steps.run is original_run and probe.gap_hook is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_workers_run_at_a_lower_cpu_priority_than_the_gui_thread(qapp):
    """A solver and its OpenMP threads took every core during a run and the GUI thread waited for the CPU:
    every worker started through common.start_worker lowers its own thread's priority first (a generator
    worker stays a generator worker), and the GUI thread keeps its own."""
    import os

    from ctbench_napari._qt import common

    main_nice = os.getpriority(os.PRIO_PROCESS, os.getpid())
    expected = min(19, main_nice + common.BACKGROUND_NICE)
    seen = {}

    def plain():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def generator():
        yield os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return "done"

    common.start_worker(plain, on_return=lambda v: seen.setdefault("plain", v))
    common.start_worker(generator, on_yield=lambda v: seen.setdefault("generator", v),
                        on_return=lambda v: seen.setdefault("returned", v))
    wait_for(lambda: len(seen) == 3, timeout=30)
    assert seen == {"plain": expected, "generator": expected, "returned": "done"}
    assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == main_nice            # the GUI thread's own
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_nice


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_a_process_a_worker_starts_keeps_the_normal_priority(qapp):
    """A child inherits its thread's nice value, and a worker's is raised for good: the detached job bridge
    a worker starts goes through common.SPAWNER, whose thread has the GUI thread's priority."""
    import os
    import subprocess

    from ctbench_napari._qt import common

    main_nice = os.getpriority(os.PRIO_PROCESS, os.getpid())
    seen = {}

    def work():
        direct = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True,
                                text=True, check=True).stdout.strip()
        proc = common.SPAWNER.popen([sys.executable, "-c", "import os; print(os.nice(0))"],
                                    stdout=subprocess.PIPE, text=True)
        spawned = proc.communicate(timeout=60)[0].strip()
        return int(direct), int(spawned)

    common.start_worker(work, on_return=lambda v: seen.setdefault("nice", v))
    wait_for(lambda: "nice" in seen, timeout=60)
    direct, spawned = seen["nice"]
    assert direct == min(19, main_nice + common.BACKGROUND_NICE)     # what a plain Popen in a worker gets
    assert spawned == main_nice


def test_steps_extend_adds_steps_to_the_running_chain_one_per_turn(qtbot):
    from qtpy.QtWidgets import QWidget

    from ctbench_napari._qt.common import Steps

    owner = QWidget()
    qtbot.addWidget(owner)
    steps = Steps(owner)
    done = []

    def make():                  # a step that makes something and then queues the steps that use it
        done.append("made")
        steps.extend([lambda: done.append("shown"), lambda: done.append("told")])
        assert done == ["first", "made"]          # the extension does not run inside the step
    steps.run([lambda: done.append("first"), make])
    wait_for(lambda: steps.pending == 0, timeout=5)
    assert done == ["first", "made", "shown", "told"]


def _run_and_watch(recon, viewer, button):
    """Click ``button`` and report which layers existed right after the click and when Started arrived."""
    from ctbench.workbench.workflow import Started

    seen = {}
    recon.runner.event.connect(lambda ev: seen.setdefault("at_started", [x.name for x in viewer.layers])
                               if isinstance(ev, Started) else None)
    before = [x.name for x in viewer.layers]
    button.click()
    seen["after_click"] = [x.name for x in viewer.layers]
    wait_for(lambda: not recon.running, timeout=300)
    assert recon.message.level != "error", recon.message.text()
    return before, seen


def test_a_one_pass_run_adds_its_layer_with_the_result_not_in_the_click(make_napari_viewer):
    """FDK/FBP: their only frame is the result, so their layer is added with it, in a turn after Finished
    (not as zeros in the click: a new layer and the click's own work in one turn stalled past 250 ms). It ends
    as before: the result's data, named after the run, percentile contrast, a 2D central slice, listed."""
    import numpy as np

    from ctbench.workbench.metrics import percentile_window
    from ctbench_napari import PLUGIN

    viewer = make_napari_viewer(show=True)
    viewer.open_sample(PLUGIN, "phantom_scan")
    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    recon.sinogram.select("Shepp-Logan cone-beam scan")
    recon.select_algorithm("fbp")
    before, seen = _run_and_watch(recon, viewer, recon.run_button)
    name = recon.last_run["name"]
    assert name.startswith("FBP") and name not in before
    assert seen["after_click"] == before and seen["at_started"] == before     # nothing added until the result
    layer = viewer.layers[name]
    fin = recon.last_run["finished"]
    np.testing.assert_array_equal(np.asarray(layer.data), fin.volume.numpy().astype(np.float32))
    np.testing.assert_allclose(layer.contrast_limits, percentile_window(np.asarray(layer.data)), rtol=1e-4)
    assert layer.metadata["ctbench"]["kind"] == "volume" and "running" not in layer.metadata["ctbench"]
    assert layer.metadata["ctbench"]["recon"]["algorithm"] == "fbp"
    assert recon.results == [layer] and recon.result_list.item(0).text() == name
    assert [x.name for x in viewer.layers if x.visible] == [name] and viewer.dims.ndisplay == 2
    assert viewer.dims.point[0] == pytest.approx(0.0, abs=0.6)             # the central slice of z (mm)
    lo, hi = viewer.dims.range[0][:2]
    assert (lo, hi) == pytest.approx((-31.5, 31.5), abs=0.6)                # the slider spans the result


def test_an_iterative_run_adds_its_layer_before_its_worker_starts_not_in_the_click(make_napari_viewer):
    """SIRT: the live layer comes in the turns after the click, before the worker starts (napari's work
    then never waits for the solver's GIL), is there at Started, takes the live previews and ends holding
    the result."""
    import numpy as np

    from ctbench_napari import PLUGIN

    viewer = make_napari_viewer(show=True)
    viewer.open_sample(PLUGIN, "phantom_scan")
    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    recon.sinogram.select("Shepp-Logan cone-beam scan")
    recon.select_algorithm("sirt", n_iter=6)
    recon.preview_every.setValue(2)
    before, seen = _run_and_watch(recon, viewer, recon.run_button)
    name = recon.last_run["name"]
    assert seen["after_click"] == before                                   # not in the click
    assert name in seen["at_started"] and name not in before               # there by Started
    assert recon.n_live_updates >= 1
    layer = viewer.layers[name]
    np.testing.assert_array_equal(np.asarray(layer.data), recon.last_run["finished"].volume.numpy())
    assert recon.results == [layer] and layer.visible and viewer.dims.ndisplay == 2


def test_the_first_layer_leaves_the_layer_controls_width_and_the_canvas_size_alone(make_napari_viewer):
    """The warm-up gives the empty layer-controls dock the width an image layer's controls give it and the
    slider row one slider's height, so the first layer (a volume, a 2D slice with a z slider) does not
    shrink the canvas (napari painted it twice inside that add_image); the final width is napari's own (a
    viewer without ctbench has the same), and the stand-in page leaves once a layer came."""
    import numpy as np

    from ctbench_napari import PLUGIN
    from ctbench_napari._qt import warm_up

    viewer = make_napari_viewer(show=True)
    viewer.window._qt_window.resize(1600, 1000)
    viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    wait_for(lambda: warm_up.pending(viewer) == 0, timeout=120)
    # napari's own width, with the colour maps the warm-up registered (each image's box lists them all)
    plain = make_napari_viewer(show=True)
    plain.add_image(np.zeros((8, 8, 8), np.float32))
    wait_for(lambda: plain.window._qt_viewer.controls.width() > 0, timeout=10)
    container = viewer.window._qt_viewer.controls
    canvas = viewer.window._qt_viewer.canvas.native
    assert container.count() == 2          # napari's empty page and the stand-in
    wait_for(lambda: container.width() == plain.window._qt_viewer.controls.width() and canvas.width() > 100,
             timeout=10)
    _spin(0.3)
    width, height = canvas.width(), canvas.height()
    with _resizes_of(canvas) as resizes:
        viewer.add_image(np.zeros((8, 8, 8), np.float32))
        wait_for(lambda: container.count() == 2 and type(container.currentWidget()).__name__ == "QtImageControls",
                 timeout=10)                   # empty page + the layer's: the stand-in left
        _spin(0.3)
    assert viewer.dims.nsteps[0] == 8 and viewer.dims.ndisplay == 2      # a z slider came with the layer
    assert canvas.width() == width and canvas.height() == height          # the canvas kept its size
    # ... also inside the add: napari makes three sliders, one row each, before it hides two; the window
    # was laid out with three rows then (the canvas shrank by two and grew back a turn later).
    assert resizes == []
    assert container.width() == plain.window._qt_viewer.controls.width()


class _ResizeLog:
    def __init__(self, widget):
        from qtpy.QtCore import QEvent, QObject

        log = self.sizes = []

        class Filter(QObject):
            def eventFilter(self, obj, event):  # noqa: N802 - Qt name
                if event.type() == QEvent.Resize:
                    log.append((event.oldSize().width(), event.oldSize().height(), event.size().width(),
                                event.size().height()))
                return False
        self.widget, self.filter = widget, Filter()

    def __enter__(self):
        self.widget.installEventFilter(self.filter)
        return self.sizes

    def __exit__(self, *exc):
        self.widget.removeEventFilter(self.filter)


def _resizes_of(widget) -> _ResizeLog:
    """``with _resizes_of(w) as sizes``: every resize of ``w`` meanwhile, as (old w, old h, new w, new h)."""
    return _ResizeLog(widget)


def test_the_designers_completeness_map_in_3d_leaves_the_layer_controls_width_alone(make_napari_viewer):
    """The completeness map's colour map has a long name, and napari lists every registered map in each
    image's colour-map box: its first controls (in 3D) widened the dock by 42 px inside the designer's
    first preview (the canvas shrank and was painted there).  The warm-up's stand-in page is made with
    that map, in 3D, so the dock has that width before any layer."""
    import numpy as np

    from ctbench_napari import PLUGIN
    from ctbench_napari._layers import completeness_layer
    from ctbench_napari._qt import warm_up

    viewer = make_napari_viewer(show=True)
    viewer.window._qt_window.resize(1600, 1000)
    viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    wait_for(lambda: warm_up.pending(viewer) == 0, timeout=120)
    viewer.add_image(np.zeros((8, 8, 8), np.float32))     # a sample: the stand-in page leaves
    wait_for(lambda: container.count() == 2 if (container := viewer.window._qt_viewer.controls) else False,
             timeout=10)
    viewer.dims.ndisplay = 3
    _spin(0.3)
    canvas = viewer.window._qt_viewer.canvas.native
    width = viewer.window._qt_viewer.controls.width()
    data, kwargs, _ = completeness_layer(np.full((4, 4, 4), 3.0), 10, (1.0, 1.0, 1.0))
    with _resizes_of(canvas) as resizes:
        viewer.add_image(data, **kwargs)
        _spin(0.3)
    assert type(viewer.window._qt_viewer.controls.currentWidget()).__name__ == "QtImageControls"
    assert viewer.window._qt_viewer.controls.width() == width and resizes == []


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    wait_for(lambda: time.perf_counter() > end, timeout=seconds + 10)


def test_the_sliders_a_new_layer_needs_are_given_before_it_is_added(make_napari_viewer):
    """After a single-slice preview the z slider is hidden; a volume result brings it back and shrank the
    canvas inside its add_layer.  ``prepare_sliders_for`` shows the slider (and resizes) first, with the
    preview still shown; the add then changes neither the sliders nor the canvas."""
    import numpy as np
    from napari.layers import Image

    from ctbench_napari._qt.display import apply_frame_range, prepare_sliders_for

    viewer = make_napari_viewer(show=True)
    viewer.window._qt_window.resize(1200, 900)
    kw = {"scale": (1.0, 1.0, 1.0), "translate": (-31.5, -31.5, -31.5)}
    hidden = viewer.add_image(np.ones((64, 64, 64), np.float32), name="older volume", **kw)
    hidden.visible = False
    viewer.add_image(np.ones((1, 64, 64), np.float32), name="preview", scale=(1.0, 1.0, 1.0),
                     translate=(0.0, -31.5, -31.5))
    apply_frame_range(viewer)
    canvas = viewer.window._qt_viewer.canvas.native
    _spin(0.3)
    assert viewer.dims.nsteps[0] == 1               # the preview alone: one slice, no z slider
    alone = canvas.height()
    result = Image(np.zeros((64, 64, 64), np.float32), name="result", **kw)
    prepare_sliders_for(viewer, result)
    _spin(0.3)
    assert viewer.dims.nsteps[0] == 64 and canvas.height() < alone          # the slider now, before the add
    assert [x.name for x in viewer.layers if x.visible] == ["preview"]
    ranges, height = tuple(viewer.dims.range), canvas.height()
    viewer.add_layer(result)
    _spin(0.3)
    assert tuple(viewer.dims.range) == ranges and canvas.height() == height


def test_bench_gui_plugin_tree_measures_the_plugin_of_another_tree(tmp_path):
    """``bench_gui.py --plugin-tree DIR``: ctbench_napari (and its submodules) come from DIR, ahead of the
    editable install's import hook (PYTHONPATH alone lost to it); a folder without the package is refused."""
    import subprocess
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gui.py"
    pkg = tmp_path / "plugins" / "ctbench_napari"
    (pkg / "_qt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("TREE = 'other'\n")
    (pkg / "_qt" / "__init__.py").write_text("")
    (pkg / "_qt" / "common.py").write_text("TREE = 'other common'\n")
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('b', {str(bench)!r})\n"
            "b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)\n"
            f"b._use_plugin_tree({str(tmp_path / 'plugins')!r})\n"
            "import ctbench_napari, ctbench_napari._qt.common as c\n"
            "print(ctbench_napari.TREE, '|', c.TREE)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "other | other common"
    bad = subprocess.run([sys.executable, str(bench), "--plugin-tree", str(tmp_path), "--stalls"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "expected a folder holding ctbench_napari/" in bad.stderr


def _viewer_with_a_sirt_ready(make_napari_viewer):
    """A viewer with the phantom + scan sample and a Reconstruction widget set to SIRT 3 on its scan; the
    layer names before any run."""
    from ctbench_napari import PLUGIN

    viewer = make_napari_viewer(show=True)
    viewer.open_sample(PLUGIN, "phantom_scan")
    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    recon.sinogram.select("Shepp-Logan cone-beam scan")
    recon.select_algorithm("sirt", n_iter=3)
    return viewer, recon, [x.name for x in viewer.layers]


def test_cancel_before_an_iterative_runs_worker_starts_leaves_nothing_running(make_napari_viewer):
    """Cancel in the turns between the click and the worker's start: no worker starts, no empty layer stays,
    the buttons are back; the next run works."""
    viewer, recon, before = _viewer_with_a_sirt_ready(make_napari_viewer)
    recon.run_button.click()
    assert recon.running and not recon.runner.running          # its layer first, the worker after
    recon.cancel_button.click()
    assert not recon.running and not recon.runner.running
    _spin(0.5)
    assert not recon.runner.running and "started" not in recon.last_run
    assert [x.name for x in viewer.layers] == before
    assert recon.run_button.isEnabled() and not recon.cancel_button.isEnabled()
    recon.run_button.click()
    wait_for(lambda: not recon.running, timeout=300)
    assert recon.last_run["finished"] is not None and recon.last_run["name"] in viewer.layers


def test_an_estimate_due_when_its_window_closes_waits_until_it_is_shown_again(qtbot):
    """A closed workbench's debounced estimate started its worker after the window was gone (inside the
    next test, where it took a thread of Qt's pool): hidden, the estimate waits; shown again, it runs."""
    from ctbench_napari._qt.estimate import EstimateLabel

    class Settings:
        running = False
        asked = 0

        def problem_geometry(self):
            Settings.asked += 1
            raise ValueError("no sinogram chosen")

    label = EstimateLabel(Settings())
    qtbot.addWidget(label)
    label.show()
    qtbot.waitExposed(label)
    label.schedule()
    label.hide()                               # the window closes with the estimate due
    qtbot.wait(3 * label._timer.interval())
    assert Settings.asked == 0 and not label._timer.isActive()
    label.show()
    wait_for(lambda: Settings.asked == 1, timeout=30)
    assert "no sinogram chosen" in label.text()


def test_the_designers_new_preview_layers_are_added_hidden_and_shown_a_step_later(make_napari_viewer):
    """A new layer's add (napari's model, visual, controls) and its first 3D frame were one turn; each new
    preview layer now comes hidden (its add draws nothing) and the next step shows it.  A later preview
    updates the layers in place and leaves their visibility to the user."""
    import numpy as np

    from ctbench.workbench.design import TrajectoryDesign
    from ctbench_napari._qt.designer import TrajectoryDesignerWidget, _preview_data

    viewer = make_napari_viewer(show=True)
    w = TrajectoryDesignerWidget(viewer)
    shape = {"detector_u": 16, "detector_v": 16, "volume_d": 8, "volume_h": 8, "volume_w": 8}
    geometry = TrajectoryDesign(n_views=12, **shape).build()
    data = _preview_data(geometry, True, 8)
    names = [kw["name"] for _, kw, _ in data["layers"]] + ["trajectory: completeness"]
    seen = set()
    for step in w._preview_steps(geometry, data):
        before = set(viewer.layers)
        step()
        for layer in set(viewer.layers) - before:      # added by this step: hidden until the next one
            assert not layer.visible, layer.name
            seen.add(layer.name)
    assert seen == set(names) and all(viewer.layers[n].visible for n in names) and w.n_updates == 1
    layer = viewer.layers["trajectory: completeness"]
    layer.visible = False                       # the user hides the map; the next preview keeps it hidden
    later = TrajectoryDesign(n_views=24, **shape).build()
    data = _preview_data(later, True, 8)
    for step in w._preview_steps(later, data):
        step()
    assert viewer.layers["trajectory: completeness"] is layer and not layer.visible
    assert all(viewer.layers[n].visible for n in names[:-1])
    np.testing.assert_array_equal(layer.data, data["completeness"][0])    # updated in place


def test_the_workbench_adds_a_sample_layer_hidden_and_shows_it_in_a_later_turn(make_napari_viewer):
    """A layer's add and its first draw (shaders, the slice's upload, a lazy stack's file read) were one
    turn; in the workbench each sample layer comes hidden and the next turn shows it and applies the
    display rule (elsewhere napari adds samples as they are: see the test above)."""
    from ctbench_napari import PLUGIN

    viewer = make_napari_viewer()
    viewer.window._qt_window._ctbench_workbench = True                   # as ctbench gui opens it
    viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    changes = []
    viewer.layers.events.inserted.connect(
        lambda e: (changes.append((e.value.name, e.value.visible)),
                   e.value.events.visible.connect(lambda _v, x=e.value: changes.append((x.name, x.visible)))))
    added = viewer.open_sample(PLUGIN, "lab_scan")
    assert [x.visible for x in added] == [False]           # as napari added it, in this turn
    wait_for(lambda: added[0].visible, timeout=30)         # shown by a later turn
    assert changes == [("lab scan (raw counts)", False), ("lab scan (raw counts)", True)]
    changes.clear()
    viewer.open_sample(PLUGIN, "phantom_scan")
    wait_for(lambda: "Shepp-Logan cone-beam scan" in viewer.layers and viewer.layers["Shepp-Logan cone-beam scan"]
             .visible, timeout=30)
    _spin(0.3)
    assert changes[:2] == [("Shepp-Logan phantom", False), ("Shepp-Logan phantom", True)]
    assert ("Shepp-Logan cone-beam scan", False) in changes
    # the display rule, applied as each one was shown: one frame at a time, the last sample's scan on top
    assert [x.name for x in viewer.layers if x.visible] == ["Shepp-Logan cone-beam scan"]


def test_an_iterative_runs_layer_is_added_hidden_and_shown_a_turn_later_and_cancel_then_removes_it(
        make_napari_viewer):
    """The live layer's add and its first draw are turns of their own (napari's add and the first draw were one
    turn and one window repaint): the layer arrives hidden, with no worker yet; a Cancel in the next turn
    removes it (no hidden layer stays); an uncancelled run keeps it hidden while its worker starts (an all-zero
    layer on top would blacken the canvas) and shows it with its first preview or its result."""
    from qtpy.QtCore import QTimer

    viewer, recon, before = _viewer_with_a_sirt_ready(make_napari_viewer)
    arrived = []

    def inserted(event, cancel):
        arrived.append((event.value.name, event.value.visible, recon.runner.running))
        if cancel:
            QTimer.singleShot(0, recon.cancel_button.click)       # the turn after the add, before the show
    hook = lambda e: inserted(e, cancel=True)          # noqa: E731
    viewer.layers.events.inserted.connect(hook)
    recon.run_button.click()
    wait_for(lambda: not recon.running, timeout=60)
    viewer.layers.events.inserted.disconnect(hook)
    _spin(0.5)
    assert arrived == [(recon.last_run["name"], False, False)]                 # hidden, no worker yet
    assert [x.name for x in viewer.layers] == before and "started" not in recon.last_run
    arrived.clear()
    hook = lambda e: inserted(e, cancel=False)         # noqa: E731
    viewer.layers.events.inserted.connect(hook)
    at_start = []                  # the live layer as the worker starts (no preview can have come yet)
    real_start = recon.runner.start

    def start(*args, **kwargs):
        live = recon.last_run["name"]
        at_start.append((live in viewer.layers, live in viewer.layers and viewer.layers[live].visible))
        return real_start(*args, **kwargs)
    recon.runner.start = start
    recon.run_button.click()
    name = recon.last_run["name"]
    wait_for(lambda: not recon.running, timeout=300)
    assert at_start == [(True, False)]                   # there before the worker, hidden: nothing to draw yet
    assert arrived == [(name, False, False)]
    assert viewer.layers[name].visible and recon.results[-1].name == name
