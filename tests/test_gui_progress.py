"""Honest progress in the Reconstruction widget (issue 23): per-subset progress of OS-SIRT, computed in the
run's worker thread and shown on the GUI thread, and the memory/time estimate shown before Run."""

import threading

import pytest

from ctbench.workbench import estimate
from ctbench_napari._testing import wait_for

from test_gui_reconstruction import _run, _workbench

pytestmark = pytest.mark.gui


def test_os_sirt_shows_every_subset_of_every_pass_from_the_worker_thread(make_napari_viewer, monkeypatch):
    import ctbench_napari._qt.reconstruction as rec

    threads = []
    real = rec.reconstruct

    def spying(*args, on_subset=None, **kwargs):
        def hook(ev):
            threads.append(threading.current_thread())
            on_subset(ev)
        return real(*args, on_subset=hook if on_subset else None, **kwargs)
    monkeypatch.setattr(rec, "reconstruct", spying)

    viewer = make_napari_viewer()
    _, _, recon = _workbench(viewer)
    texts, formats = [], []
    real_status, real_format = recon.status.setText, recon.progress.setFormat
    monkeypatch.setattr(recon.status, "setText", lambda t: (texts.append(t), real_status(t)))
    monkeypatch.setattr(recon.progress, "setFormat", lambda t: (formats.append(t), real_format(t)))
    recon.select_algorithm("os_sirt", n_iter=3, n_subsets=5, nonneg=True)
    finished = _run(recon)
    assert finished.stopped == "completed" and finished.n_iter == 3
    # The subsets ran in the worker, never on the GUI thread; all 15 reached the widget, in order.
    assert len(threads) == 15 and threading.main_thread() not in threads
    assert [(p, k) for p, k, _, _ in recon.last_run["subsets"]] == [(p, k) for p in (1, 2, 3) for k in range(1, 6)]
    shown = [t for t in texts if t.startswith("subset")]
    assert shown[0].startswith("subset 1/5 of pass 1/3") and any(t.startswith("subset 3/5 of pass 1/3") for t in shown)
    # Before the first pass ends the bar already moves and gives a time left (not "0 / 5" for a whole pass).
    assert any(f.startswith("subset 2/5 of pass 1/3") and "left" in f for f in formats)
    assert any(t.startswith("pass 1/3") for t in texts)          # the pass itself, with its residual
    assert recon.progress.value() == 3 and recon.progress.maximum() == 3   # back to passes when done


def test_estimate_before_run_is_the_planners_memory_and_follows_the_settings(make_napari_viewer):
    viewer = make_napari_viewer()
    _, _, recon = _workbench(viewer)
    recon.select_algorithm("sirt", n_iter=10, nonneg=True)
    label = recon.estimate
    label.refresh()
    wait_for(lambda: not label.busy and label.last is not None and label.last.n_iter == 10, timeout=60)
    geo = recon.problem_geometry()
    expected = estimate.estimate_run(geo, recon.request("full"))   # same measured pair (cached per shape)
    assert label.text() == f"Estimate for Run, {expected.summary()}"
    data, state, kernel = estimate.memory_of(geo, "sirt")
    assert label.last.peak_bytes == data + state + kernel
    # A setting changes: the estimate follows by itself (debounced), without a click.
    n = label.n_estimates
    recon.forms.currentWidget().set_value("n_iter", 40)
    wait_for(lambda: label.n_estimates > n and not label.busy, timeout=60)
    assert label.last.n_iter == 40 and "40 iteration(s)" in label.text()
    assert label.last.seconds > expected.seconds
    recon.grid[0].setValue(16)                       # half the planes: less memory
    wait_for(lambda: not label.busy and label.last is not None and label.last.data_bytes < data, timeout=60)
    # No sinogram: the label says so instead of a number.
    recon.sinogram.setCurrentIndex(-1)
    label.refresh()
    assert "no sinogram" in label.text() and label.last is None
