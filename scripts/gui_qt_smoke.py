"""Smoke run of the napari workbench under one Qt binding: every widget opens, one reconstruction runs, a
screenshot is taken and checked not to be blank.

    QT_API=pyqt6 xvfb-run -a -s "-screen 0 1920x1080x24" python scripts/gui_qt_smoke.py --out /tmp/qt-smoke

The binding is the one qtpy picks (``QT_API``: pyqt5, pyqt6, pyside6).  Prints one JSON line (binding, Qt
version, widgets opened, the reconstruction's figures, the screenshot's path and pixel statistics) and exits
0; exits 2 when the binding is not installed, 1 on any failure (with the reason on stderr).
``tests/test_gui_qt_bindings.py`` runs it for each binding it finds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/screenshots/qt-smoke", help="folder for the screenshot (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds for the whole run")
    args = ap.parse_args(argv)
    binding = os.environ.get("QT_API", "pyqt5").lower()
    try:
        import qtpy
    except Exception as e:  # noqa: BLE001 - qtpy names the missing binding
        print(f"{binding}: {e}", file=sys.stderr)
        return 2
    if qtpy.API_NAME.lower() != binding:
        print(f"{binding} is not installed (qtpy picked {qtpy.API_NAME})", file=sys.stderr)
        return 2
    import numpy as np

    from ctbench_napari import WIDGETS, launch
    from ctbench_napari._testing import save_viewer_screenshot, wait_for

    t0 = time.perf_counter()
    viewer = launch(sample="phantom_scan", block=False)
    window = viewer.window._qt_window
    window.resize(1920, 1080)
    window.show()
    docks = {name: dock for name, dock in viewer.window.dock_widgets.items()}
    opened = sorted(n for n in WIDGETS if any(str(k).startswith(n) for k in docks))
    if opened != sorted(WIDGETS):
        print(f"widgets missing: {sorted(set(WIDGETS) - set(opened))}", file=sys.stderr)
        return 1
    recon = next(w for k, w in docks.items() if str(k).startswith("Reconstruction"))
    recon = getattr(recon, "__wrapped__", recon)
    wait_for(lambda: recon.sinogram.layer() is not None, timeout=args.timeout)
    recon.select_algorithm("sirt", n_iter=5)
    for s in recon.grid:
        s.setValue(32)
    recon.pitch.setValue(2.0)
    recon.run_button.click()
    wait_for(lambda: not recon.running and recon.last_run.get("finished") is not None, timeout=args.timeout)
    fin = recon.last_run["finished"]
    vol = fin.volume.numpy()
    if fin.stopped != "completed" or not np.isfinite(vol).all() or float(vol.std()) <= 0:
        print(f"the reconstruction did not complete sensibly: {fin.stopped}, std {float(vol.std())}", file=sys.stderr)
        return 1
    path, stats = save_viewer_screenshot(viewer, f"workbench_{binding}", Path(args.out))
    from qtpy import QtCore

    print(json.dumps({"binding": qtpy.API_NAME, "qt": QtCore.qVersion(), "widgets": opened,
                      "recon": {"algorithm": "sirt", "n_iter": fin.n_iter, "shape": list(vol.shape),
                                "mean": float(vol.mean())},
                      "screenshot": str(path), "pixels": {k: v for k, v in stats.items() if k != "shape"},
                      "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    viewer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
