"""Start-up warm-up: one-time costs of what the workbench draws, paid when it opens instead of in an action.

Measured with ``bench_gui.py --stalls --trace-stacks``, two of them landed in the
middle of user actions:

- the scale bar's label: napari draws text from glyphs it renders on first use
  (a Qt font at 256 pt, a signed-distance field in numpy, tens of ms a glyph)
  and the bar first appears on the first 2D slice of a volume, the quick
  preview's or a result's, so that click paid for every digit it showed;
- the difference images' PiYG colour map: napari builds it from vispy's and
  matplotlib's tables on first use (every vispy colour map, cubehelix included).

Glyphs go into napari's one font atlas shared by every canvas, so they are
loaded once per process: one glyph per event-loop turn on the GUI thread (the
atlas is an OpenGL texture fed from that thread).  Colour maps are registered
in napari's table, which has its own lock, in a background thread.
"""

from __future__ import annotations

import threading

from .common import Steps, log, qt_window, unwrap

# What napari's scale bar writes: a length ("0.5", "20", "1e+03") and its unit ("pixel", "mm", "µm", ...).
SCALE_BAR_GLYPHS = "ÅÉÑŐjgpqy0123456789.e+- ixlmµnk"   # the first nine: vispy measures every line by them
COLORMAPS = ("PiYG",)        # the difference images' (compare.DIFFERENCE_COLORMAP)

_COLORMAP_THREAD = None


def install(viewer) -> None:
    """Warm up what ``viewer`` will draw (once per viewer; glyphs already loaded are skipped)."""
    real = unwrap(viewer)
    window = qt_window(real)
    if window is None or getattr(window, "_ctbench_warm_up", None) is not None:
        return
    from qtpy.QtCore import QObject

    # The steps' owner is a child of the window: it dies with the window (no step runs on a closed viewer),
    # and a step still queued when the viewer closes holds that child, not the window.
    steps = Steps(QObject(window))
    window._ctbench_warm_up = steps
    _start_colormaps()
    font = _scale_bar_font(real)
    if font is not None:
        steps.run([_glyph_step(font, c) for c in SCALE_BAR_GLYPHS],
                  on_error=lambda e: log.debug("glyph warm-up failed: %s", e))


def pending(viewer) -> int:
    """Warm-up steps not yet run on the GUI thread for ``viewer`` (0 when done or never installed)."""
    steps = getattr(qt_window(viewer), "_ctbench_warm_up", None)
    return steps.pending if steps is not None else 0


def colormaps_ready(timeout: float | None = None) -> bool:
    """Whether the colour-map thread has finished (waiting up to ``timeout`` seconds)."""
    t = _COLORMAP_THREAD
    if t is None:
        return False
    t.join(timeout)
    return not t.is_alive()


def _glyph_step(font, char: str):
    def step():
        font[char]           # renders and stores the glyph when missing (napari's QtTextureFont)
    return step


def _scale_bar_font(viewer):
    """napari's texture font of the canvas's text (the scale bar's), or None where napari has no such font."""
    try:
        info = viewer.window._qt_viewer.canvas.font_info
        info = info() if callable(info) else info      # a method in napari 0.9
        return info.font_manager.get_font(info.face)
    except Exception:  # noqa: BLE001 - another napari version: no warm-up, nothing else changes
        log.debug("no napari font to warm up", exc_info=True)
        return None


def _start_colormaps() -> None:
    global _COLORMAP_THREAD
    if _COLORMAP_THREAD is not None:
        return
    _COLORMAP_THREAD = threading.Thread(target=_colormaps, name="ctbench-colormap-warm-up", daemon=True)
    _COLORMAP_THREAD.start()


def _colormaps() -> None:
    try:
        from napari.utils.colormaps import ensure_colormap

        for name in COLORMAPS:
            ensure_colormap(name)
    except Exception:  # noqa: BLE001 - the colour map is then built on first use, as without the warm-up
        log.debug("colour-map warm-up failed", exc_info=True)
