"""Background reconstruction jobs: spec, SQLite job table, torchrun launcher, worker, HTTP bridge, client.

Layering (docs/ARCHITECTURE.md): the napari plugin and the command line talk to a bridge
through :mod:`.client`; the bridge (:mod:`.service`, :mod:`.scheduler`) keeps
jobs in :mod:`.store` and starts each one with :mod:`.launcher` as a
``torchrun`` process tree running :mod:`.worker`, which consumes the same
solver generators and emits the same events (:mod:`ctbench.workbench.workflow`)
as a local run.  See docs/JOBS.md.
"""

__all__ = ["JobSpec"]


def __getattr__(name: str):
    # loaded on first use (PEP 562): ``ctbench --help`` registers the job commands without torch
    if name == "JobSpec":
        from .spec import JobSpec
        return JobSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
