"""Helpers for the GUI tests and the GUI benchmark: screenshots with pixel checks, waiting on widgets."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

SCREENSHOT_DIR = Path(__file__).resolve().parents[2] / "tests" / "screenshots"
DOC_IMAGES_ENV = "CTBENCH_WRITE_DOC_IMAGES"


def doc_images_dir() -> Path:
    """Where a test writes the screenshots the docs show: ``docs/images`` only when ``CTBENCH_WRITE_DOC_IMAGES=1``
    asks to refresh them (the test run never changes tracked files otherwise), else ``tests/screenshots/docs``."""
    if os.environ.get(DOC_IMAGES_ENV) == "1":
        return Path(__file__).resolve().parents[2] / "docs" / "images"
    return SCREENSHOT_DIR / "docs"


def pixel_stats(image: np.ndarray) -> dict:
    """Numbers that tell a real picture from a blank one: spread, distinct colours, non-background share."""
    rgb = np.asarray(image)[..., :3].astype(np.float64)
    flat = rgb.reshape(-1, 3)
    # The most common colour is the background; count pixels that differ from it.
    q = (flat // 8).astype(np.int64)
    keys = q[:, 0] * 1024 + q[:, 1] * 32 + q[:, 2]
    values, counts = np.unique(keys, return_counts=True)
    background = values[np.argmax(counts)]
    return {"std": float(flat.std()), "colours": int(values.size),
            "foreground": float((keys != background).mean()), "shape": tuple(rgb.shape[:2])}


def assert_not_blank(image: np.ndarray, *, min_std: float = 8.0, min_colours: int = 8,
                     min_foreground: float = 0.01) -> dict:
    """Raise AssertionError if an RGB(A) screenshot is (nearly) one flat colour."""
    s = pixel_stats(image)
    assert s["std"] >= min_std, f"screenshot looks blank: pixel std {s['std']:.2f} < {min_std}"
    assert s["colours"] >= min_colours, f"screenshot has only {s['colours']} distinct colours"
    assert s["foreground"] >= min_foreground, f"only {100 * s['foreground']:.2f}% of pixels differ from the background"
    return s


def qimage_to_array(qimage) -> np.ndarray:
    """An RGBA uint8 array of a QImage (e.g. ``widget.grab().toImage()``).

    The 32-bit formats a grab gives are reordered here in numpy: Qt's ``convertToFormat`` splits a
    large image over the global QThreadPool and waits for it while PyQt holds the GIL, so with the
    pool's threads running Python workers (the comparison panel's metrics, say) it deadlocks."""
    from qtpy.QtGui import QImage

    fmt = qimage.format()
    argb = fmt in (QImage.Format_RGB32, QImage.Format_ARGB32, QImage.Format_ARGB32_Premultiplied)
    img = qimage if argb or fmt == QImage.Format_RGBA8888 else qimage.convertToFormat(QImage.Format_RGBA8888)
    w, h = img.width(), img.height()
    ptr = img.constBits()
    ptr.setsize(img.sizeInBytes() if hasattr(img, "sizeInBytes") else img.byteCount())
    arr = np.frombuffer(ptr, np.uint8).reshape(h, img.bytesPerLine() // 4, 4)[:, :w]
    if argb:  # 0xAARRGGBB words: B, G, R, A bytes on a little-endian machine
        order = [2, 1, 0, 3] if sys.byteorder == "little" else [1, 2, 3, 0]
        arr = arr[..., order]
        if fmt == QImage.Format_RGB32:
            arr[..., 3] = 255
    return arr.copy()


def save_viewer_screenshot(viewer, name: str, directory: Path | None = None, *, canvas_only: bool = False) -> tuple[Path, dict]:
    """Save the viewer (window with docked widgets, or the canvas only) as PNG and check it is not blank."""
    from qtpy.QtWidgets import QApplication

    directory = Path(directory or SCREENSHOT_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    for _ in range(3):
        QApplication.processEvents()
    img = viewer.screenshot(path=str(path), canvas_only=canvas_only, flash=False)
    return path, assert_not_blank(img)


def save_widget_screenshot(widget, name: str, directory: Path | None = None) -> tuple[Path, dict]:
    """Save one widget as PNG and check it is not blank."""
    directory = Path(directory or SCREENSHOT_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    pix = widget.grab()
    pix.save(str(path))
    return path, assert_not_blank(qimage_to_array(pix.toImage()), min_std=4.0)


def wait_for(condition, timeout: float = 30.0, interval_ms: int = 10) -> float:
    """Run the Qt event loop until ``condition()`` is true; the seconds it took. TimeoutError otherwise."""
    from qtpy.QtCore import QCoreApplication, QEventLoop, QTimer

    t0 = time.perf_counter()
    while not condition():
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"condition not met within {timeout} s")
        loop = QEventLoop()
        QTimer.singleShot(interval_ms, loop.quit)
        loop.exec_() if hasattr(loop, "exec_") else loop.exec()
        QCoreApplication.processEvents()
    return time.perf_counter() - t0
