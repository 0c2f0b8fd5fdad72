"""Nothing heavy on the GUI thread (issue 23): the start-up sample is computed in the warm-up thread, and
comparison cells and designer preview layers appear one per event-loop turn."""

import threading

import pytest

from ctbench_napari._testing import wait_for

pytestmark = pytest.mark.gui


def test_the_start_up_sample_is_computed_off_the_gui_thread(make_napari_viewer, monkeypatch):
    import napari

    import ctbench_napari
    from ctbench_napari import _samples

    _samples._sample_sinogram.cache_clear()
    _samples._phantom_array.cache_clear()
    monkeypatch.setattr(_samples, "_READY", set())
    threads = []
    real = _samples.phantom_sinogram

    def spying(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)
    monkeypatch.setattr(_samples, "phantom_sinogram", spying)
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
