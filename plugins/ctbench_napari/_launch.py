"""Open the workbench: a napari viewer with the ctbench widgets docked and a sample loaded."""

from __future__ import annotations

# Short names the command line accepts (``ctbench gui --sample scan``).
SAMPLE_ALIASES = {"scan": "phantom_scan", "none": None}


def open_workbench(sample: str | None = "phantom", *, block: bool = True, viewer=None):
    """The viewer of :func:`ctbench_napari.launch`; its widgets are in ``viewer.window.dock_widgets``."""
    from . import PLUGIN, SAMPLES, TAB_TITLES, WIDGETS

    sample = SAMPLE_ALIASES.get(sample, sample)
    if sample is not None and sample not in SAMPLES:
        raise ValueError(f"sample must be one of {SAMPLES} or None, got {sample!r}")
    import napari

    own = viewer is None      # the launcher's own viewer: this process is the workbench
    if own:
        quiet_qt5_notice()
    viewer = viewer or napari.Viewer(title="ctbench workbench")
    viewer.window._qt_window._ctbench_workbench = True     # samples of several layers arrive one per turn
    docks = [viewer.window.add_plugin_dock_widget(PLUGIN, name, tabify=True)[0] for name in WIDGETS]
    for dock, name in zip(docks, WIDGETS):
        dock.setWindowTitle(TAB_TITLES.get(name, name))   # "Designer", not "Trajectory designer (c..."
        dock.setToolTip(name)
    full_tab_titles(viewer)
    start_in(docks[0])   # tabbed together; a session starts in the designer
    fit_docks(viewer, docks)
    warm = warm_up_samples()
    if own:
        freeze_heap_when_warm(viewer, warm)
    if sample is not None:
        open_when_ready(viewer, sample, warm)
    if block:
        napari.run()
    return viewer


WARM_UP = None


def warm_up_samples():
    """Compute the samples in a background thread (File > Open Sample then never projects on the GUI thread)."""
    global WARM_UP
    import threading

    from ._samples import warm_up

    if WARM_UP is None or not WARM_UP.is_alive():
        WARM_UP = threading.Thread(target=_quietly, args=(warm_up,), name="ctbench-sample-warm-up", daemon=True)
        WARM_UP.start()
    return WARM_UP


def freeze_heap_when_warm(viewer, warm) -> None:
    """Freeze Python's heap once the workbench has warmed up and ``warm`` (the sample thread) has ended, so
    full garbage collections never stall the window (``_qt/warm_up.py``).  ``open_workbench`` does it for
    the viewer it creates (the process is then the workbench); a caller that passes its own viewer and owns
    the process (``benchmarks/bench_gui.py``, which measures the workbench as ``ctbench gui`` opens it) calls
    this itself."""
    from ._qt.warm_up import freeze_heap_when_warm as freeze

    freeze(viewer, lambda: not warm.is_alive())


def open_when_ready(viewer, sample: str, warm) -> None:
    """Open ``sample`` once the warm-up thread has computed it, so that the GUI thread only hands over arrays
    (a sample the warm-up does not compute, or a warm-up that ended without it, opens at once)."""
    from qtpy.QtCore import QTimer

    from . import PLUGIN
    from ._samples import is_ready

    def ready() -> bool:
        return is_ready(sample) or not warm.is_alive()

    if ready():
        viewer.open_sample(PLUGIN, sample)
        return
    timer = QTimer(viewer.window._qt_window)     # dies with the window: never opens into a closed viewer
    timer.setInterval(50)

    def check():
        if ready():
            timer.stop()
            timer.deleteLater()
            viewer.open_sample(PLUGIN, sample)
    timer.timeout.connect(check)
    timer.start()


def _quietly(fn) -> None:
    import logging

    from ._qt.common import background_priority

    background_priority()    # the samples' projections and their OpenMP threads below the GUI thread
    try:
        fn()
    except Exception:  # noqa: BLE001 - a sample that fails here fails again, with its message, when opened
        logging.getLogger("ctbench_napari").debug("sample warm-up failed", exc_info=True)


def full_tab_titles(viewer) -> None:
    """Tab bars of the docked widgets show whole titles (scroll buttons when they do not fit)."""
    from qtpy.QtCore import Qt
    from qtpy.QtWidgets import QTabBar

    for bar in viewer.window._qt_window.findChildren(QTabBar):
        bar.setElideMode(Qt.ElideNone)
        bar.setUsesScrollButtons(True)


def start_in(dock) -> None:
    """Raise ``dock`` now and again once the event loop has laid out the tabs (a later tabify raises its own)."""
    from qtpy.QtCore import QTimer

    dock.raise_()
    QTimer.singleShot(0, dock.raise_)


def fit_docks(viewer, docks) -> None:
    """Give the canvas most of the window: the side docks as narrow as their contents allow (at 1366 px the
    canvas had 449 px between a 330-pixel layer dock and a 554-pixel widget dock), set again once the
    window is laid out and whenever it is resized a lot (a laptop screen, a maximised window)."""
    import weakref

    from qtpy.QtCore import QEvent, QObject, Qt, QTimer

    window = viewer.window._qt_window
    qt_viewer = viewer.window._qt_viewer
    left = [d for d in (getattr(qt_viewer, "dockLayerControls", None), getattr(qt_viewer, "dockLayerList", None))
            if d is not None]
    # Weak references only: the filter lives as long as the window (its Qt child), and a strong reference
    # from it to the window or the docks would keep the viewer's widgets alive after the viewer closed.
    window_ref = weakref.ref(window)
    dock_refs = [weakref.ref(d) for d in docks]
    left_refs = [weakref.ref(d) for d in left[:1]]

    def fit():
        win = window_ref()
        right_docks = [d for d in (r() for r in dock_refs) if d is not None]
        left_docks = [d for d in (r() for r in left_refs) if d is not None]
        if win is None or not right_docks:
            return
        try:
            w = win.width()
            right = min(max(max(d.minimumSizeHint().width() for d in right_docks), int(0.26 * w)), 620)
            lw = max(240, min(300, int(0.18 * w)))
            win.resizeDocks(right_docks[:1], [right], Qt.Horizontal)
            if left_docks:
                win.resizeDocks(left_docks, [lw], Qt.Horizontal)
        except RuntimeError:
            pass                       # closed meanwhile

    class _OnResize(QObject):
        def eventFilter(self, obj, event):  # noqa: N802 - Qt name
            if event.type() == QEvent.Resize:
                old, new = event.oldSize().width(), event.size().width()
                if old <= 0 or abs(new - old) > 150:
                    QTimer.singleShot(0, fit)
            return False

    f = _OnResize(window)
    window.installEventFilter(f)
    window._ctbench_dock_fit = f
    QTimer.singleShot(0, fit)


def quiet_qt5_notice() -> None:
    """napari shows a toast over the canvas at every start under PyQt5 ("PyQt5 support is deprecated").  The
    workbench says it once on the terminal instead, with how to move to a Qt6 binding, and keeps the canvas
    and its scale bar clear.  Under PyQt6 or PySide6 there is nothing to say."""
    import sys

    try:
        import qtpy

        if qtpy.API_NAME != "PyQt5":
            return
        import napari._qt.qt_main_window as qmw

        if getattr(qmw, "SHOW_QT_WARNING", False):
            qmw.SHOW_QT_WARNING = False
            print('note: napari is running on PyQt5, whose support napari deprecates; for a Qt6 binding: '
                  'pip install "ctbench[gui-qt6]" (PyQt6) or "ctbench[gui-pyside6]" (PySide6)', file=sys.stderr)
    except Exception:  # noqa: BLE001 - a notice, never a reason not to start
        pass
