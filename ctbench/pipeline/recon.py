"""``ctbench recon CONFIG.json``: read a scan, correct it, find its geometry, reconstruct, write the volume.

The config is described in :mod:`ctbench.pipeline.config`.  Every run streams
(:mod:`ctbench.pipeline.streamed`): the scan is read and corrected a chunk
of views at a time into a work store beside the output, the volume is
reconstructed slab by slab within the memory budget, and a run killed at any
moment resumes where it stopped when started again.  The same run serves the
command line, the napari "Scan import" widget (which saves its current
settings as such a config) and scripts::

    cfg = load_config("recon.json")
    report = run_recon(cfg)

The output follows :mod:`ctbench.output_policy`, checked before the scan is
read: it may not be, contain or lie inside the scan, its flats or darks, or
the trajectory it uses; ``overwrite`` replaces only what ctbench wrote,
``force`` anything else.  The output appears only when it is complete.
"""

from __future__ import annotations

from .config import ReconConfig
from .progress import Progress


def run_recon(cfg: ReconConfig, *, log=None, progress: Progress | None = None, cancel=None,
              return_volume: bool = True) -> dict:
    """Run a config end to end; returns a JSON-able report (the written path under ``"output"``).

    ``log`` receives one line per step; ``progress`` (a :class:`~ctbench.pipeline.progress.Progress`) the
    stages' done/total, rate and ETA; ``cancel`` (an Event or a callable) stops the run between two chunks
    (:class:`~ctbench.pipeline.progress.Cancelled`), keeping what it finished for a later run.  The report's
    ``"volume"`` holds the volume as a tensor when ``return_volume`` (the command line does without), and
    ``"geometry_object"`` its :class:`~ctbench.workbench.design.ScanGeometry`; neither is JSON.
    """
    from .streamed import run_streamed

    if progress is None:
        progress = Progress(cancel=cancel)
    elif cancel is not None:
        progress.cancel = cancel
    return run_streamed(cfg, log=log, progress=progress, return_volume=return_volume)
