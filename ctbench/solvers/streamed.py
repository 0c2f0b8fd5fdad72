"""Solvers that stream between block stores: FDK/FBP from a sinogram store into a volume store.

The windows come from the storage layer's planner (:func:`ctbench.storage.streaming.plan_into`):
each view batch is pre-weighted and ramp-filtered once, then backprojected slab by slab, so
memory stays within the plan whatever the store size (docs/LARGE_VOLUMES.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..engine.fdk_kernels import weighted_backproject
from ..engine.plan import Plan
from ..storage import ZarrStore, check_store
from ..atomic_files import pid_alive
from ..storage.completion import same_location
from ..storage.streaming import StoreWindows, axis0, plan_into, run_inputs, start_output
from . import analytic
from .filtering import check_filter, check_oversample
from .weights import detector_padding, orbit_of, redundancy_weights


def fdk_into(projector, sinogram_store, volume_store, *, filter: str = "ram-lak", cutoff: float = 1.0,
             padding: float = 2.0, oversample: int = 1, short_scan="auto", displaced="auto", backend: str = "auto",
             scratch=None, resume: bool = False) -> Plan:
    """FDK (cone beam, fan 2D: every geometry :func:`ctbench.solvers.fdk` takes) or FBP (parallel beams)
    from a sinogram store into a volume store.

    The same reconstruction as :func:`ctbench.solvers.fdk` / :func:`~ctbench.solvers.fbp` (same
    keyword arguments), computed in the plan's windows: each view batch is pre-weighted and
    ramp-filtered once, then backprojected through the voxel-driven FDK kernel into one z-slab at a
    time, and each slab is written once.  When the filtered projections do not fit the budget in one
    batch they go to ``scratch`` (a block store of shape (n_views, (U'-1)*oversample+1, V), or
    (n_views, (U'-1)*oversample+1) for 2D scans, in the sinogram's dtype, with U' the detector's columns
    plus the padding of a displaced detector, :func:`~ctbench.solvers.weights.detector_padding`; default a temporary zarr
    store next to a zarr output (``.<name>.fdk-scratch-<pid>-*``; in the system temp folder for
    other outputs), removed at the end, and by the next call if this process was killed).  The
    output carries a completion record; ``resume=True`` continues an interrupted call with the
    same inputs, writing only the missing slabs.  Runs on the CPU.  Returns the plan.
    """
    m = check_oversample(oversample)
    plan = plan_into(projector, "fdk", volume_store, sinogram_store, fdk_padding=padding, fdk_oversample=m)
    filter = check_filter(filter)
    who = "fdk" if projector.beam == "cone" else "fbp"
    orbit = orbit_of(projector, require="circular", who=who)
    arc, parker = redundancy_weights(orbit, short_scan, who=who, displaced=displaced)
    pad = detector_padding(orbit, displaced)
    weights = (arc * analytic.view_scale(orbit)).to(plan.dtype)
    win = StoreWindows(projector)
    grid = projector.grid
    batches = plan.view_batches()
    n_views = projector.projection_shape[0]
    um = (win.U + sum(pad) - 1) * m + 1
    scratch_shape = (n_views, um) if projector.is_2d else (n_views, um, win.V)
    if scratch is not None and len(batches) > 1:
        check_store(scratch, "scratch", scratch_shape, (plan.dtype,))
        for other, name in ((volume_store, "volume_store"), (sinogram_store, "sinogram_store")):
            if scratch is other or same_location(scratch, other):
                raise ValueError(f"scratch must be a store of its own; it is the same store as {name}")
    out = start_output(volume_store, "fdk",
                       run_inputs(projector, sinogram_store, plan.dtype, filter=filter, cutoff=cutoff,
                                  padding=padding, oversample=m, short_scan=short_scan,
                                  **({} if displaced == "auto" else {"displaced": displaced})),
                       [win.volume(s0, s1) for s0, s1 in plan.slabs()], resume)

    def filtered(a: int, b: int) -> torch.Tensor:
        """Pre-weighted, ramp-filtered views [a, b) as (b-a, (U-1)*m+1, V)."""
        raw = win.as_block(sinogram_store.read(win.sinogram(a, b)), a, b)
        part = orbit.views(a, b)
        return analytic.filtered_views(projector, part, raw, 0, b - a, filter=filter, cutoff=cutoff, padding=padding,
                                  parker=None if parker is None else parker[a:b], oversample=m, pad=pad)[0]

    def backproject_slabs(blocks):
        for s0, s1 in plan.slabs():
            target = axis0(win.volume(s0, s1), volume_store)
            if out.is_done(*target):
                continue
            acc = torch.zeros((s1 - s0, win.H, win.W), dtype=plan.dtype)
            for (a, b), block in blocks():
                rays = analytic.fdk_rays(projector, plan.dtype, torch.device("cpu"), a, b, m, pad)
                weighted_backproject(block, rays, grid, weights[a:b], z0=s0, z1=s1, out=acc, backend=backend)
                del block
            volume_store.write(win.volume(s0, s1), win.slab_value(acc[None]))
            del acc
            out.mark_done(*target)

    def as_scratch(block: torch.Tensor) -> torch.Tensor:
        return block.reshape(block.shape[0], um) if projector.is_2d else block

    tmp = None
    try:
        with torch.no_grad():
            if len(batches) == 1:
                a, b = batches[0]
                resident = filtered(a, b)
                backproject_slabs(lambda: [((a, b), resident)])
            else:
                if scratch is None:
                    tmp = make_scratch_folder(volume_store)
                    scratch = ZarrStore.create(f"{tmp}/filtered.zarr", scratch_shape, plan.dtype,
                                               chunks=(plan.view_batch, *scratch_shape[1:]))
                for a, b in batches:
                    scratch.write(win.sinogram(a, b), as_scratch(filtered(a, b)))

                def from_scratch():
                    for a, b in batches:
                        yield (a, b), scratch.read(win.sinogram(a, b)).to("cpu").reshape(b - a, um, win.V)

                backproject_slabs(from_scratch)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    out.finish()
    return plan


SCRATCH_TAG = ".fdk-scratch-"


def make_scratch_folder(volume_store) -> str:
    """A fresh scratch folder next to a zarr output (same disk, found again after a kill), else in temp.

    Scratch folders of this output whose process is gone (killed runs) are removed first.
    """
    loc = volume_store.location() if callable(getattr(volume_store, "location", None)) else None
    if not isinstance(loc, str):
        return tempfile.mkdtemp(prefix="ctbench-fdk-")
    out = Path(loc.rstrip("/"))
    prefix = f".{out.name}{SCRATCH_TAG}"
    for old in out.parent.glob(prefix + "*"):
        pid = old.name[len(prefix):].split("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=out.parent)
