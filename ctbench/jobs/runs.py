"""A reconstruction run as a bridge job, seen as the workbench's event stream.

:func:`job_events` is the job twin of :func:`ctbench.workbench.workflow.reconstruct`:
it takes the same geometry, sinogram and :class:`ReconRequest`, sends the
scan to a bridge (upload, so a remote bridge works too), submits a job and
yields :class:`Started`, :class:`Progress` (with a live preview volume) and
:class:`Finished` (with the downloaded result) as they happen.  Setting
``cancel`` cancels the job; the run then finishes with ``stopped="cancelled"``
and the latest preview.  The napari plugin's background-job runner consumes it.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ..workbench.workflow import Finished, Progress, ReconRequest, Started
from .client import BridgeClient
from .events import preview_volume, to_workflow_event


def job_events(client: BridgeClient, geometry, sinogram, request: ReconRequest, *, options: dict | None = None,
               cancel: threading.Event | None = None, info: dict | None = None,
               poll: float = 0.25) -> Iterator:
    """Run ``request`` as a job of ``client``'s bridge; yield workbench events. ``info`` receives the job id."""
    from ..workbench.dataset import load_dataset, save_dataset
    from ..workbench.workflow import check_inputs

    request = request.validated()
    sinogram = check_inputs(geometry, sinogram)
    work = Path(tempfile.mkdtemp(prefix="ctbench-job-"))
    remote = None
    try:
        local = save_dataset(work / "scan.zarr", sinogram=sinogram.detach().cpu().numpy(), geometry=geometry,
                             meta={"source": "napari"})
        remote = client.upload_dataset(local, f"uploads/{uuid.uuid4().hex[:12]}.zarr")
        spec = {"request": request.to_dict(), "dataset": remote, **(options or {})}
        job = client.submit(spec)
        info = info if info is not None else {}
        info["job_id"] = job["id"]
        after, cancelled, started, last_preview, last_it = -1, False, None, None, 0
        finished_ev = None
        while True:
            if cancel is not None and cancel.is_set() and not cancelled:
                client.cancel(job["id"])
                cancelled = True
            page = client.events(job["id"], after, poll)
            for ev in page["events"]:
                after = ev["seq"]
                if ev["type"] == "finished":
                    finished_ev = ev
                    continue
                if ev["type"] == "error":
                    continue
                out = to_workflow_event(ev)
                if isinstance(out, Started):
                    started = out
                if isinstance(out, Progress):
                    last_it = out.iteration
                    if out.preview is not None:
                        last_preview = out.preview
                if out is not None:
                    yield out
            if page["terminal"] and not page["events"]:
                break
        status = client.status(job["id"])
        if status["state"] == "succeeded" and finished_ev is not None:
            dest = client.fetch(job["id"], work / "result.zarr")
            ds = load_dataset(dest)
            yield to_workflow_event(finished_ev, volume=torch.from_numpy(np.asarray(ds.volume)))
        elif status["state"] == "cancelled":
            shape = started.volume_shape if started else geometry.volume_shape
            vol = last_preview if last_preview is not None else torch.zeros(shape)
            from ..workbench.preview import grid_origin

            s = started
            yield Finished(vol, [], last_it, "cancelled", 0.0, request,
                           s.voxel_spacing if s else tuple(geometry.voxel_spacing),
                           s.origin if s else grid_origin(geometry.volume_shape, geometry.voxel_spacing),
                           f"job {job['id']} cancelled; showing its last preview")
        else:
            raise RuntimeError(f"job {job['id']} {status['state']}: {status.get('reason') or 'see its log'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if remote is not None and (job_id := (info or {}).get("job_id")) is not None:
            try:   # the uploaded scan served this job only; keep it if the job may still read it
                if client.status(job_id)["state"] in ("succeeded", "failed", "cancelled"):
                    client.delete_data(remote)
            except Exception:  # noqa: BLE001 - cleanup is best effort
                pass


__all__ = ["job_events", "preview_volume"]
