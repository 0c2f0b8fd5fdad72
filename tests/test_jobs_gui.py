"""The background-job path of the napari widgets, under Xvfb, against a real local bridge and torchrun ranks."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch

from ctbench.workbench.design import TrajectoryDesign
from ctbench.workbench.workflow import ReconRequest, run
from ctbench_napari import PLUGIN
from ctbench_napari._testing import wait_for

pytestmark = [pytest.mark.gui, pytest.mark.distributed]

# The detector sees only the middle of the 16 mm grid (10 rows of 2 mm at magnification 2): the first and
# last z planes meet no ray and reconstruct to exact zeros, the all-zero chunks a job's result must still hold.
SMALL = TrajectoryDesign(kind="circular", n_views=20, sid=64.0, sdd=128.0, detector_u=24, detector_v=10,
                         pixel_u=2.0, pixel_v=2.0, volume_d=16, volume_h=16, volume_w=16, voxel_size=1.0)


@pytest.fixture
def local_bridge_dir(tmp_path, monkeypatch):
    """Where the widget's on-demand bridge lives; the bridge it starts is stopped afterwards."""
    state = tmp_path / "bridge"
    monkeypatch.setenv("CTBENCH_BRIDGE_STATE_DIR", str(state))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield state
    info = state / "bridge.json"
    if info.exists():
        from ctbench.jobs.client import BridgeClient
        try:
            with BridgeClient(state_dir=state) as c:
                for j in c.list():
                    if j["state"] in ("queued", "running"):
                        c.cancel(j["id"], wait=15)
        finally:
            os.kill(json.loads(info.read_text())["pid"], signal.SIGTERM)


def test_reconstruction_as_a_background_job_updates_the_layer_and_the_jobs_panel_loads_it(
        make_napari_viewer, local_bridge_dir):
    from test_gui_reconstruction import _run, _workbench

    viewer = make_napari_viewer()
    _, proj, recon = _workbench(viewer, SMALL)
    for s in recon.grid:
        s.setValue(16)
    recon.select_algorithm("cgls", n_iter=4)
    recon.preview_every.setValue(1)
    recon.background.setChecked(True)
    recon.background.nproc.setValue(2)
    assert recon.runner is recon.background.runner

    fin = _run(recon, timeout=240)
    assert fin is not None and fin.stopped == "completed" and fin.n_iter == 4
    assert recon.n_live_updates >= 1                    # the live preview reached the layer
    assert len(recon.last_run["progress"]) == 4
    job_id = recon.background.runner.info["job_id"]
    assert not any((local_bridge_dir / "data" / "uploads").iterdir())   # the uploaded scan is cleaned up

    # The same request run in this process: the job's result equals it up to float32 round-off.
    _, geo, sino = recon.problem_inputs()
    ref = run(geo, torch.from_numpy(np.ascontiguousarray(sino)), ReconRequest("cgls", {"n_iter": 4}))
    np.testing.assert_allclose(fin.volume.numpy(), ref.volume.numpy(), rtol=1e-4,
                               atol=1e-4 * float(ref.volume.abs().max()))
    np.testing.assert_allclose(fin.residuals, ref.residuals, rtol=1e-4)
    assert not ref.volume[0].any() and not ref.volume[-1].any() and ref.volume[8].any()   # zero planes exist
    layer = recon.results[-1]
    np.testing.assert_array_equal(layer.data, fin.volume.numpy())
    assert layer.metadata["ctbench"]["recon"]["algorithm"] == "cgls"

    # The Jobs panel lists it and loads its result as a layer with geometry and parameters.
    _, panel = viewer.window.add_plugin_dock_widget(PLUGIN, "Jobs")
    panel.refresh()
    wait_for(lambda: any(j["id"] == job_id for j in panel.jobs), timeout=30)
    panel.select(job_id)
    assert panel.selected()["state"] == "succeeded"
    panel.load_selected()
    wait_for(lambda: panel.loaded, timeout=60)
    loaded = panel.loaded[0]
    np.testing.assert_allclose(loaded.data, fin.volume.numpy(), rtol=1e-6)
    meta = loaded.metadata["ctbench"]
    assert meta["geometry"] is not None
    assert meta["recon"]["params"] == {"n_iter": 4} and meta["recon"]["nproc"] == 2


def test_jobs_panel_without_a_bridge_is_calm_and_starts_a_local_one(make_napari_viewer, local_bridge_dir):
    """No bridge: a clear state and a Start button, no toast and no error after several polls; the button
    starts the local bridge and the panel then lists its (empty) job table."""
    from napari.utils.notifications import notification_manager

    viewer = make_napari_viewer()
    seen = []
    notification_manager.notification_ready.connect(seen.append)
    _, panel = viewer.window.add_plugin_dock_widget(PLUGIN, "Jobs")
    panel.timer.setInterval(50)
    panel.show()
    wait_for(lambda: panel.bridge_found is False, timeout=30)
    for _ in range(5):       # several quiet polls
        panel.refresh(quiet=True)
        wait_for(lambda: not panel.busy, timeout=30)
    assert panel.NO_BRIDGE in panel.bridge_state.text()
    assert not panel.start_bridge_button.isHidden() and not panel.load_button.isEnabled()
    assert panel.message.level == "" and not seen
    panel.refresh()          # a deliberate Refresh says the same, calmly
    wait_for(lambda: not panel.busy, timeout=30)
    assert panel.message.level == "" and not seen

    panel.start_bridge_button.click()
    wait_for(lambda: panel.bridge_found is True, timeout=90)
    assert panel.jobs == [] and panel.start_bridge_button.isHidden() and panel.load_button.isEnabled()
    assert (local_bridge_dir / "bridge.json").exists() and not seen
