"""The Calibrate step's parameter table and convergence plot under Xvfb: every row visible and whole, tick
labels that fit their boxes in the widget's font, a plot that redraws on each step without resizing anything,
a panel that fits the 1080-pixel workbench, and worker errors that reach the user as a message."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from ctbench.calibration.result import ParameterEstimate
from ctbench_napari import PLUGIN

pytestmark = pytest.mark.gui


def _turns(n: int = 3) -> None:
    from qtpy.QtWidgets import QApplication
    for _ in range(n):
        QApplication.processEvents()


def _rows(n: int) -> list[ParameterEstimate]:
    """Rows as the solver writes them: estimated, held, at a bound, cancelled before their stage, per-view."""
    rows = [ParameterEstimate("offset_u", "px", 3.2991, 0.0, (-20, 20), 0.0089, 1.0, "estimated"),
            ParameterEstimate("roll", "deg", -0.4512, 0.0, (-5, 5), 0.0031, 0.97, "estimated"),
            ParameterEstimate("pitch", "deg", None, 0.0, (-10, 10), None, 0.012, "not identifiable"),
            ParameterEstimate("axis_tilt", "deg", -0.0001234, 0.0, (-5, 5), 0.00012, 0.5, "at bound"),
            ParameterEstimate("sdd", "mm", None, 0.0, (-50, 50), None, None, "not reached"),
            ParameterEstimate("shift_u", "px", 1.49, 0.0, (-20, 20), 0.11, None, "estimated", per_view=True),
            ParameterEstimate("shift_v", "px", 0.73, 0.0, (-20, 20), 0.09, None, "estimated", per_view=True),
            ParameterEstimate("offset_v", "px", None, 0.0, (-20, 20), None, 0.004, "not identifiable")]
    return rows[:n]


def _result(n: int):
    return SimpleNamespace(parameters=_rows(n), notes=["pitch: not determined by this scan (...); held at its start"])


def assert_table_shows_every_row(table) -> None:
    """Viewport against the rows' total height, no scroll bar, and every cell's text inside its cell."""
    from qtpy.QtCore import QRect, Qt
    from qtpy.QtGui import QFontMetrics

    n = table.rowCount()
    total = sum(table.rowHeight(r) for r in range(n))
    assert table.viewport().height() >= total, (table.viewport().height(), total)
    assert table.verticalScrollBar().maximum() == 0
    assert table.horizontalScrollBar().maximum() == 0
    assert table.horizontalHeader().length() <= table.viewport().width() + 1
    fm = QFontMetrics(table.font())
    header = table.horizontalHeader()
    for c in range(table.columnCount()):
        text = table.horizontalHeaderItem(c).text()
        assert fm.horizontalAdvance(text) <= header.sectionSize(c), f"header '{text}' is cut"
    for r in range(n):
        for c in range(table.columnCount()):
            item = table.item(r, c)
            rect = table.visualItemRect(item)
            text = item.text()
            if c == table.columnCount() - 1:     # the status wraps between words: each word and all lines fit
                assert all(fm.horizontalAdvance(w) < rect.width() for w in text.split()), text
                need = fm.boundingRect(QRect(0, 0, rect.width() - 8, 10_000), int(Qt.TextWordWrap), text)
                assert need.height() <= rect.height(), (text, need.height(), rect.height())
            else:
                assert fm.horizontalAdvance(text) < rect.width(), f"'{text}' is cut ({rect.width()} px)"


@pytest.mark.parametrize("n", [1, 3, 5, 8])
def test_parameter_table_shows_every_freed_parameter(make_napari_viewer, n):
    from ctbench_napari._qt.calibrate import CalibrateWidget

    viewer = make_napari_viewer(show=True)
    _, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Calibrate")
    assert isinstance(w, CalibrateWidget)
    free = [p.name for p in _rows(n)]
    w.table.start_run(free)                         # before the first step: one row each, "running"
    _turns()
    assert [w.table.item(r, 0).text().split(" ")[0] for r in range(n)] == free
    assert {w.table.item(r, 5).text() for r in range(n)} == {"running"}
    assert_table_shows_every_row(w.table)
    # a progress step fills the estimates (per-view shifts as their RMS over the views)
    w.table.show_state({"offset_u": 2.5, "roll": 0.25}, {"shift_u": [3.0, -4.0]})
    assert w.table.item(0, 2).text() == "2.5"
    if n >= 6:
        assert w.table.item(5, 2).text() == f"{math.sqrt(12.5):.4g}"
    w.table.show_result(_result(n))
    _turns()
    assert w.table.rowCount() == n
    assert_table_shows_every_row(w.table)
    if n >= 3:
        assert w.table.item(2, 5).text() == "not identifiable" and w.table.item(2, 2).text() == "–"
        assert "not determined" in w.table.item(2, 5).toolTip()     # the solver's note on the row
    # the panel laid out narrower (its minimum width) keeps whole names: the status wraps, rows grow
    w.scroll_area.resize(w.scroll_area.minimumWidth(), 900)
    _turns()
    assert_table_shows_every_row(w.table)


def test_workbench_with_the_calibrate_step_fits_1080_pixels(make_napari_viewer, monkeypatch):
    """Docked with the others (as Scan import's Calibrate step docks it) with eight rows and a long plot: the
    window's minimum height stays within 1000 px, and at 1920x1080 the table and the plot are in view without
    scrolling the panel."""
    import napari
    from qtpy.QtCore import QPoint

    import ctbench_napari

    monkeypatch.setattr(napari, "Viewer", make_napari_viewer)
    viewer = ctbench_napari.launch("phantom_scan", block=False)
    window = viewer.window._qt_window
    window.show()
    dock, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Calibrate", tabify=True)
    dock.show()
    dock.raise_()
    w.table.show_result(_result(8))
    for i in range(1, 40):
        w.plot.add(i, 0.05 * 0.8 ** i, "binned ×2" if i < 25 else "full resolution")
    _turns()
    assert window.minimumSizeHint().height() <= 1000, window.minimumSizeHint().height()
    dock.raise_()                                   # after launch's own deferred raise of the designer
    window.resize(1920, 1080)
    _turns(5)
    assert dock.isVisible() and w.isVisible()
    view = w.scroll_area.viewport()
    assert w.scroll_area.verticalScrollBar().value() == 0
    for part in (w.table, w.plot):
        bottom = part.mapTo(view, QPoint(0, part.height())).y()
        assert 0 < bottom <= view.height(), (type(part).__name__, bottom, view.height())
    assert_table_shows_every_row(w.table)
    assert window.height() <= 1080
    hint = window.minimumSizeHint()                 # and a 1366x768 laptop: the panel scrolls there
    assert hint.width() <= 1366 and hint.height() <= 768, (hint.width(), hint.height())
    window.resize(1366, 768)
    _turns(5)
    assert window.height() <= 768 and w.scroll_area.verticalScrollBar().maximum() > 0


SERIES = {
    "flat, tiny (the '.0016' case)": [0.00165, 0.00163, 0.0016, 0.00137, 0.00131, 0.00131, 0.0013],
    "falls three decades": [0.03 * 0.6 ** i for i in range(15)],
    "one step": [0.02],
    "constant": [0.004] * 5,
    "large": [2.4e6, 1.9e6, 1.85e6],
    "just under a decade": [0.09, 0.05, 0.02, 0.0095],
}


def _label_value(text: str) -> float:
    return float(text.replace("−", "-"))


def assert_ticks_fit(plot) -> None:
    """Every tick label inside the widget, wide and tall enough for its text in the plot's font, clear of the
    axes and of each other, and reading its tick's value; axis labels that fit; stage names above the axes."""
    from qtpy.QtCore import QRectF
    from qtpy.QtGui import QFontMetrics

    fm = QFontMetrics(plot.font())
    losses = [v for _, v in plot.points]
    lay = plot.plot_layout(fm)
    whole = QRectF(0, 0, plot.width(), plot.height())
    spans_decade = max(losses) / min(losses) >= 10
    assert lay.log == spans_decade
    assert len(lay.yticks) >= 2 and len(lay.xticks) >= 1
    texts = [t.text for t in lay.yticks]
    assert len(set(texts)) == len(texts), texts                     # no two ticks read the same
    exponent = 0
    if "×10" in lay.ylabel:
        sup = lay.ylabel.split("×10")[1].rstrip(")")
        exponent = int(sup.translate(str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")))
    for t in lay.yticks + lay.xticks:
        assert fm.horizontalAdvance(t.text) <= t.rect.width(), (t.text, t.rect.width())
        assert fm.height() <= t.rect.height() + 0.5
        assert whole.contains(t.rect), (t.text, t.rect, whole)
    for t in lay.yticks:                                             # left of the axes, reading the tick's value
        assert t.rect.right() < lay.box.left()
        assert _label_value(t.text) * 10.0 ** exponent == pytest.approx(t.value, rel=0.02)
        assert not t.text.startswith(".")
    for group in (lay.yticks, lay.xticks):                           # no label runs into another
        for a, b in zip(group, group[1:]):
            assert not a.rect.intersects(b.rect), (a.text, b.text)
    for ty in lay.yticks:
        for tx in lay.xticks:
            assert not ty.rect.intersects(tx.rect), (ty.text, tx.text)
    assert fm.horizontalAdvance(lay.ylabel) <= lay.ylabel_rect.height()   # the rotated y label fits the axis
    assert lay.ylabel_rect.right() <= min(t.rect.left() for t in lay.yticks)
    assert fm.horizontalAdvance(plot.xlabel) <= lay.xlabel_rect.width()
    # stages: named in the band above the axes (no legend over the curve), boundaries inside the axes
    assert len(lay.stages) == len(plot.stage_starts)
    for (x, text, rect), (_, name) in zip(lay.stages, plot.stage_starts):   # whole, or elided to fit its span
        assert text == name or text == "" or (text.endswith("…") and name.startswith(text[:-1])), (text, name)
    for k, (x, text, rect) in enumerate(lay.stages):
        assert rect.bottom() <= lay.box.top() and rect.top() >= lay.title_rect.bottom() - 1
        assert fm.horizontalAdvance(text) <= rect.width() + 1
        if k:
            assert lay.box.left() < x < lay.box.right()


@pytest.mark.parametrize("name", list(SERIES))
def test_convergence_plot_tick_labels_fit_and_read_true(make_napari_viewer, name):
    viewer = make_napari_viewer(show=True)
    _, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Calibrate")
    losses = SERIES[name]
    split = max(1, len(losses) // 2)
    for i, v in enumerate(losses, start=1):
        w.plot.add(i, v, "binned ×2" if i <= split else "full resolution")
    _turns()
    assert_ticks_fit(w.plot)
    assert len(w.plot.plot_layout().stages) == (2 if len(losses) > 1 else 1)


def test_convergence_plot_redraws_every_step_without_growing_the_window(make_napari_viewer):
    viewer = make_napari_viewer(show=True)
    _, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Calibrate")
    window = viewer.window._qt_window
    _turns()
    sizes = (w.plot.size(), w.size(), window.size(), window.minimumSizeHint(), w.scroll_area.widget().sizeHint())
    for i in range(1, 31):
        before = w.plot.paints
        w.plot.add(i, 0.1 * 0.7 ** i, "binned ×2" if i < 20 else "full resolution")
        _turns()
        assert w.plot.paints > before, f"step {i} was not drawn"
    assert len(w.plot.points) == 30
    assert (w.plot.size(), w.size(), window.size(), window.minimumSizeHint(),
            w.scroll_area.widget().sizeHint()) == sizes


def test_worker_errors_cancel_and_structureless_scans_reach_the_user(make_napari_viewer, monkeypatch):
    """A scan with no structure is refused by the worker's data checks before any work; an error inside the
    worker (here the before/after reconstruction) ends the run with the error in the panel's message, and the
    panel is ready again; a cancelled run shows its estimate so far without reconstructing."""
    from napari.layers import Layer

    import ctbench.solvers
    from ctbench.workbench.design import ScanGeometry
    from ctbench_napari._layers import sinogram_layer
    from ctbench_napari._testing import wait_for
    from selfcal_scans import cone_scan, misaligned

    P, ells = cone_scan(size=16, views=24, det=16)
    y, _ = misaligned(P, ells, {"offset_u": 1.0})
    geo = ScanGeometry(P.trajectory, P.detector_shape, P.detector_spacing, P.global_volume_shape, P.voxel_spacing)
    viewer = make_napari_viewer()
    viewer.add_layer(Layer.create(*sinogram_layer(np.zeros_like(y.numpy()), geo, "empty scan")))
    viewer.add_layer(Layer.create(*sinogram_layer(y.numpy(), geo, "scan")))
    _, w = viewer.window.add_plugin_dock_widget(PLUGIN, "Calibrate")
    for name, box in w.checks.items():
        box.setChecked(name == "offset_u")
    w.coarse_iters.setValue(1)
    w.fine_iters.setValue(1)
    w.sinogram.select("empty scan")
    w.run()
    wait_for(lambda: not w.running, timeout=60)
    assert w.message.level == "error" and "the scan has no structure" in w.message.text()
    assert w.table.item(0, 5).text() == "failed" and not w.plot.points
    assert w.run_button.isEnabled() and not w.apply_button.isEnabled()
    w.sinogram.select("scan")
    results = []
    w.finished.connect(results.append)
    w.run()
    w.run()                                   # a second press while it runs: told, and the run goes on
    assert w.running and w.message.level == "error" and "a calibration is running" in w.message.text()
    assert w.table.item(0, 5).text() == "running"
    wait_for(lambda: not w.running, timeout=120)
    assert w.message.level != "error", w.message.text()
    assert [r.stopped for r in results] == ["completed"]
    n_layers = len(viewer.layers)             # with its before/after layers
    w.coarse_iters.setValue(30)
    cancel_at_once = [True]
    w.runner.event.connect(lambda ev: w.runner.cancel() if cancel_at_once[0] and ev[0] == "state" else None)
    w.run()
    wait_for(lambda: not w.running, timeout=120)
    res = results[-1]
    assert res.stopped == "cancelled" and len(w.plot.points) < 30
    assert w.message.text().startswith("cancelled after") and len(viewer.layers) == n_layers
    assert w.table.item(0, 0).text() == "offset_u [px]" and w.table.item(0, 2).text() != "…"
    cancel_at_once[0] = False
    w.coarse_iters.setValue(1)

    def broken_cgls(*_a, **_k):
        raise RuntimeError("out of memory while reconstructing")

    monkeypatch.setattr(ctbench.solvers, "cgls", broken_cgls)
    w.run()
    assert w.message.level != "error", w.message.text()
    wait_for(lambda: not w.running, timeout=120)
    assert w.message.level == "error" and "out of memory while reconstructing" in w.message.text()
    assert w.run_button.isEnabled() and not w.cancel_button.isEnabled() and not w.apply_button.isEnabled()
    assert len(w.plot.points) >= 1            # the steps before the failure stay on the plot
