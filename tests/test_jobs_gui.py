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

SMALL = TrajectoryDesign(kind="circular", n_views=20, sid=64.0, sdd=128.0, detector_u=24, detector_v=20,
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
