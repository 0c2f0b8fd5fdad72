"""Every worker error reaches the user as a message: a RuntimeError too (superqt drops those of generators)."""

import importlib

import pytest

import ctbench.workbench.workflow
from ctbench.workbench.design import TrajectoryDesign
from ctbench_napari import PLUGIN
from ctbench_napari._testing import wait_for

pytestmark = pytest.mark.gui
SIRT = importlib.import_module("ctbench.solvers.sirt")      # the module (ctbench.solvers.sirt is the function)
SMALL = TrajectoryDesign(kind="circular", n_views=24, sid=150.0, sdd=300.0, detector_u=32, detector_v=32,
                         pixel_u=1.5, pixel_v=1.5, volume_d=24, volume_h=24, volume_w=24, voxel_size=1.0)
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


def _fails_on_call(real, n):
    """``real`` that raises torch's OOM error on its ``n``-th call, inside the solver, as a real one would (the
    solver's ``with torch.no_grad()`` unwinds; a worker left in no-grad would break the next run in its thread)."""
    calls = [0]

    def broken(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise RuntimeError(OOM)
        return real(*args, **kwargs)
    return broken


def test_start_worker_reports_a_generators_runtime_error_and_finishes(qapp):
    from ctbench_napari._qt.common import start_worker

    seen, errors, ended = [], [], []

    def work():
        yield 1
        raise RuntimeError("shape '[3, 4]' is invalid for input of size 7")

    start_worker(work, on_yield=seen.append, on_error=errors.append, on_finished=lambda: ended.append(1))
    wait_for(lambda: ended, timeout=30)
    assert seen == [1]
    [e] = errors                      # the original exception, as a plain function worker would report it
    assert type(e) is RuntimeError and "is invalid for input of size 7" in str(e)


def _scan(viewer):
    from napari.layers import Layer

    from ctbench_napari._layers import sinogram_layer
    from ctbench_napari._samples import phantom_layer, phantom_sinogram

    viewer.add_layer(Layer.create(*phantom_layer(shape=(24, 24, 24))))
    geo, sino = phantom_sinogram(SMALL.build())
    return viewer.add_layer(Layer.create(*sinogram_layer(sino, geo, "small scan")))


def test_reconstruction_out_of_memory_mid_run_is_a_message_and_run_is_ready_again(make_napari_viewer, monkeypatch):
    viewer = make_napari_viewer()
    sino = _scan(viewer)
    _, recon = viewer.window.add_plugin_dock_widget(PLUGIN, "Reconstruction")
    recon.sinogram.select(sino.name)
    recon.select_algorithm("sirt", n_iter=50)
    # sirt's _clip runs once at the start and once per iteration: the 4th call is in iteration 3.
    monkeypatch.setattr(SIRT, "_clip", _fails_on_call(SIRT._clip, 4))
    recon.run_button.click()
    assert recon.message.level != "error", recon.message.text()
    wait_for(lambda: not recon.running, timeout=120)      # superqt alone never ended this run
    assert recon.message.level == "error" and OOM in recon.message.text(), recon.message.text()
    assert "RuntimeError" in recon.message.text()
    assert len(recon.last_run.get("progress", [])) == 2      # the iterations before the failure were shown
    assert recon.run_button.isEnabled() and recon.preview_button.isEnabled()
    assert not recon.cancel_button.isEnabled()
    assert recon.status.text() == "ready" and recon.progress.format() == "failed"
    # ...and a second run (the solver mended) completes.
    monkeypatch.undo()
    recon.select_algorithm("sirt", n_iter=3)
    recon.run_button.click()
    wait_for(lambda: not recon.running, timeout=120)
    assert recon.message.level != "error" and recon.last_run["finished"].stopped == "completed"


def test_projection_out_of_memory_mid_run_is_a_message_and_run_is_ready_again(make_napari_viewer, monkeypatch):
    viewer = make_napari_viewer()
    _scan(viewer)
    _, designer = viewer.window.add_plugin_dock_widget(PLUGIN, "Trajectory designer")
    designer.show_map.setChecked(False)
    designer.set_design(SMALL)
    designer.update_preview()
    _, proj = viewer.window.add_plugin_dock_widget(PLUGIN, "Projection")
    proj.volume.select("Shepp-Logan phantom")
    proj.scan.select("trajectory")
    # One batch of views projects, the second runs out of memory.
    monkeypatch.setattr(ctbench.workbench.workflow, "simulate", _fails_on_call(ctbench.workbench.workflow.simulate, 2))
    n_layers = len(viewer.layers)
    proj.run()
    wait_for(lambda: not proj.busy, timeout=120)
    assert proj.message.level == "error" and OOM in proj.message.text(), proj.message.text()
    assert proj.message.text().startswith("projection failed: RuntimeError")
    assert proj.run_button.isEnabled() and proj.progress.format() == "failed"
    assert len(viewer.layers) == n_layers          # no sinogram layer from a failed run
