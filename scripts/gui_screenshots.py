"""Screenshots of every workbench panel at 1920x1080 for docs/GUI.md (run under Xvfb).

    xvfb-run -a -s "-screen 0 1920x1080x24" python scripts/gui_screenshots.py [--out docs/images/gui]

Opens the workbench as ``ctbench gui`` does, walks the journeys a user takes
(designer, projection, sinogram view, reconstruction, comparison, difference
images, scan import, jobs without a bridge) and saves the whole window after
each step.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "images" / "gui"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("CTBENCH_BRIDGE_STATE_DIR", tempfile.mkdtemp(prefix="ctbench-no-bridge-"))

    import napari
    import napari._qt.qt_main_window as qmw
    from qtpy.QtWidgets import QApplication

    from ctbench.workbench.design import TrajectoryDesign
    from ctbench_napari._launch import open_workbench
    from ctbench_napari._testing import assert_not_blank, wait_for

    qmw.SHOW_QT_WARNING = False
    viewer = napari.Viewer(title="ctbench workbench", show=True)
    window = viewer.window._qt_window
    window.showMaximized()
    window.resize(1920, 1080)
    open_workbench("phantom_scan", block=False, viewer=viewer)
    wait_for(lambda: len(viewer.layers) >= 2, timeout=300)   # the start-up sample arrives from its thread
    docks = {str(k).split(" (")[0]: w for k, w in viewer.window.dock_widgets.items()}

    def tab(name):
        w = docks[name]
        parent = w.parentWidget()
        while parent is not None and type(parent).__name__ != "QtViewerDockWidget":
            parent = parent.parentWidget()
        (parent or w).raise_()
        settle()

    def settle(s=0.6):
        try:
            wait_for(lambda: False, timeout=s)
        except TimeoutError:
            pass
        QApplication.processEvents()

    def shot(name):
        settle()
        img = viewer.screenshot(canvas_only=False, flash=False)
        assert_not_blank(img)
        from imageio.v3 import imwrite
        imwrite(out / f"{name}.png", img)
        print("saved", out / f"{name}.png", img.shape, flush=True)

    designer = docks["Trajectory designer"]
    tab("Trajectory designer")
    designer.set_design(TrajectoryDesign(kind="helical", n_views=90, sid=200.0, sdd=400.0, detector_u=96,
                                         detector_v=64, pixel_u=1.5, pixel_v=1.5, volume_d=64, volume_h=64,
                                         volume_w=64, voxel_size=1.0, z_range=40.0, n_turns=2.0))
    designer.request_preview()
    wait_for(lambda: designer.geometry is not None and not designer.busy, timeout=120)
    shot("designer")

    proj = docks["Projection"]
    tab("Projection")
    proj.volume.select("Shepp-Logan phantom")
    proj.scan.select("trajectory")
    proj.run()
    wait_for(lambda: not proj.busy, timeout=300)
    shot("projection")
    proj.show_sinogram_view()
    shot("sinogram_view")

    recon = docks["Reconstruction"]
    tab("Reconstruction")
    recon.sinogram.select("Shepp-Logan cone-beam scan")
    # OS-SIRT in its first pass: per-subset progress with the time left, and the estimate before Run.
    recon.select_algorithm("os_sirt", n_iter=200, n_subsets=8, nonneg=True)
    wait_for(lambda: not recon.estimate.busy and recon.estimate.last is not None, timeout=300)
    recon.run()
    wait_for(lambda: len(recon.last_run.get("subsets", [])) >= 3 or not recon.running, timeout=600)
    shot("reconstruction_os_sirt")
    recon.cancel()
    wait_for(lambda: not recon.running, timeout=600)
    for layer in recon.results[-1:]:
        viewer.layers.remove(layer)
    recon.select_algorithm("sirt", n_iter=20, nonneg=True)
    recon.run()
    wait_for(lambda: not recon.running, timeout=600)
    shot("reconstruction")
    recon.select_algorithm("fbp")
    recon.run()
    wait_for(lambda: not recon.running, timeout=600)
    recon.comparison.reference.select("Shepp-Logan phantom")
    recon.compare()
    wait_for(lambda: not recon.comparison.busy, timeout=300)
    recon.scroll_area.ensureWidgetVisible(recon.comparison.table)
    shot("compare")
    recon.comparison.differences()
    wait_for(lambda: not recon.comparison.busy, timeout=300)
    recon.scroll_area.ensureWidgetVisible(recon.comparison.colour_bar)
    shot("compare_difference")
    recon.comparison.single_view()

    scan = docks["Scan import"]
    tab("Scan import")
    viewer.open_sample("ctbench", "lab_scan")
    settle()
    scan.projections.select("lab scan (raw counts)")
    scan.correct()
    wait_for(lambda: not scan.busy, timeout=600)
    scan.attach_geometry()
    wait_for(lambda: not scan.busy, timeout=600)
    shot("scan_import")

    tab("Jobs")
    jobs = docks["Jobs"]
    wait_for(lambda: jobs.bridge_found is not None, timeout=120)
    shot("jobs_no_bridge")
    viewer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
