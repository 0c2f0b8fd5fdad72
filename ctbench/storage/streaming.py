"""Projector calls between block stores, window by window, in bounded memory.

- :func:`project_into`: for each view batch, the projections of the volume's
  z-slabs (read one at a time from the volume store) are summed into one
  view-batch buffer, which is then written to the sinogram store.
- :func:`backproject_into`: for each z-slab, the backprojections of the view
  batches (read one at a time) are summed into one slab buffer, which is
  then written to the volume store.

One slab and one view batch are resident at a time (plus the stores' chunk
staging), so peak memory is the plan's ``peak_bytes`` whatever the store
size.  Everything is checked, and the plan made, before the first write: a
store of the wrong shape or dtype, or a budget too small for one window,
raises before any output is touched.  Windows are aligned to the stores'
chunks where the budget allows, so each write replaces whole chunks (and
every chunk write is atomic in :class:`~ctbench.storage.zarr_store.ZarrStore`).

The output store carries a completion record (:mod:`ctbench.storage.completion`):
the windows planned, those written (each marked after its data), the inputs
(projector configuration, input store) and, last, "complete".  A killed run
leaves a store whose unwritten windows raise on read; ``resume=True`` writes
only those, ``resume=False`` (the default) redoes every window.
"""

from __future__ import annotations

import torch

from ..engine import get_backend
from ..engine.executor import make_executor
from ..engine.plan import Plan, make_plan
from .base import check_store, normalize_window, staging_bytes
from .completion import OutputRun, same_location, store_identity, store_location

_FLOATS = (torch.float32, torch.float64)


# ---------------------------------------------------------------- checking
def _check_projector(projector) -> None:
    if getattr(projector, "world_size", 1) > 1:
        raise ValueError(f"streaming between stores runs in one process; this projector is distributed "
                         f"(world_size={projector.world_size}); use the distributed disk solver instead")


def _check_stores(projector, volume_store, sinogram_store) -> torch.dtype:
    _check_projector(projector)
    check_store(volume_store, "volume_store", projector.volume_shape, _FLOATS)
    check_store(sinogram_store, "sinogram_store", projector.projection_shape, _FLOATS)
    if volume_store.dtype != sinogram_store.dtype:
        raise TypeError(f"volume_store is {volume_store.dtype} but sinogram_store is {sinogram_store.dtype}; "
                        "both stores must have the same dtype")
    if volume_store is sinogram_store or same_location(volume_store, sinogram_store):
        raise ValueError(f"volume_store and sinogram_store must be different stores; both are "
                         f"{store_location(volume_store) or volume_store!r} (the output would alias the input and overwrite it)")
    return volume_store.dtype


def _store_windows(projector):
    """(slab depth, view batch) -> the window shapes in store axes (2D scans have no z axis)."""
    _, H, W = projector.grid.shape
    U, V = projector.detector_shape
    if projector.is_2d:
        return (lambda nz: (H, W)), (lambda nb: (nb, U))
    return (lambda nz: (nz, H, W)), (lambda nb: (nb, U, V))


def plan_into(projector, kind: str, volume_store, sinogram_store, *, fdk_padding=None, fdk_oversample=None) -> Plan:
    """The windows of a store-to-store call (``kind`` "project", "backproject" or "fdk"), checked."""
    dtype = _check_stores(projector, volume_store, sinogram_store)
    opts = projector.options
    vol_window, sino_window = _store_windows(projector)

    def staging(nz: int, nb: int) -> tuple[int, int]:
        vol = (volume_store, vol_window(nz))
        sino = (sinogram_store, sino_window(nb))
        source, target = (vol, sino) if kind == "project" else (sino, vol)
        return staging_bytes(*source, write=False), staging_bytes(*target, write=True)

    align = (1 if projector.is_2d else int(volume_store.chunks[0]), int(sinogram_store.chunks[0]))
    return make_plan(kind, projector.grid.shape, projector.detector_shape, projector.projection_shape[0],
                     z_range=(projector.volume_slice.start, projector.volume_slice.stop), batch=1, dtype=dtype,
                     device="cpu", mode="store", memory_budget=opts.get("memory_budget"),
                     volume_chunk_shape=opts.get("volume_chunk_shape"), view_chunk_size=opts.get("view_chunk_size"),
                     store_staging=staging, store_align=align, fdk_padding=fdk_padding,
                     fdk_oversample=fdk_oversample)


# ------------------------------------------------------------------ pieces
def compute_device(projector, device=None) -> torch.device:
    """Where the windows are computed: ``device``, else the projector's first device, else the CPU."""
    if device is None:
        devices = projector.options.get("devices")
        if devices:
            from ..engine.devices import parse_devices
            device = parse_devices(devices)[0]
        else:
            device = "cpu"
    return torch.device(device)


def _executor(projector, device: torch.device):
    """An executor that takes CPU windows and computes on ``device`` (streaming them if it is a GPU)."""
    if device.type == "cpu":
        return projector._executor(device)
    backend = get_backend(projector.backend_name, device)
    if not backend.supports(device):
        raise ValueError(f"device {device} cannot run backend {backend.name!r}")
    return make_executor(backend, projector.grid, projector.detector_shape, projector.options, compute_device=device)


class StoreWindows:
    """Store windows and the (1, nz, H, W) / (1, n, U, V) views of what they hold."""

    def __init__(self, projector):
        self.p = projector
        self.zoff = projector.volume_slice.start
        _, self.H, self.W = projector.grid.shape
        self.U, self.V = projector.detector_shape

    def volume(self, s0: int, s1: int):
        if self.p.is_2d:
            return (slice(None), slice(None))
        return (slice(s0 - self.zoff, s1 - self.zoff), slice(None), slice(None))

    def sinogram(self, a: int, b: int):
        return (slice(a, b), slice(None)) if self.p.is_2d else (slice(a, b), slice(None), slice(None))

    def as_slab(self, t: torch.Tensor, s0: int, s1: int) -> torch.Tensor:
        return t.to("cpu").reshape(1, s1 - s0, self.H, self.W)

    def as_block(self, t: torch.Tensor, a: int, b: int) -> torch.Tensor:
        return t.to("cpu").reshape(1, b - a, self.U, self.V)

    def slab_value(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(self.H, self.W) if self.p.is_2d else t[0]

    def block_value(self, t: torch.Tensor, a: int, b: int) -> torch.Tensor:
        return t.reshape(b - a, self.U) if self.p.is_2d else t[0]


# --------------------------------------------------------- completion records
def run_inputs(projector, source_store, dtype: torch.dtype, **options) -> dict:
    """What an output depends on: the projector's configuration, the input store and the options."""
    from ..distributed.fingerprint import config_digest
    return {"projector": config_digest(projector, dtype), "source": store_identity(source_store),
            "options": {k: (v if isinstance(v, (int, float, str, bool, type(None))) else repr(v))
                        for k, v in sorted(options.items())}}


def axis0(window, store) -> tuple[int, int]:
    w = normalize_window(window, store.shape)[0]
    return w.start, w.stop


def start_output(store, operation: str, inputs: dict, windows, resume: bool) -> OutputRun:
    """The completion record of a call writing ``windows`` (store windows) into ``store``."""
    return OutputRun(store, operation, inputs, [axis0(w, store) for w in windows], resume=resume)


# ------------------------------------------------------------------- loops
def project_into(projector, volume_store, sinogram_store, *, device=None, resume: bool = False) -> Plan:
    """Project ``volume_store`` into ``sinogram_store``, one view batch at a time; returns the plan.

    ``resume=True`` continues an interrupted call with the same inputs, writing only
    the view batches its completion record does not mark done.
    """
    plan = plan_into(projector, "project", volume_store, sinogram_store)
    ex = _executor(projector, compute_device(projector, device))
    rays = projector._rays(None, plan.dtype, torch.device("cpu")).detach()
    win = StoreWindows(projector)
    out = start_output(sinogram_store, "project", run_inputs(projector, volume_store, plan.dtype),
                       [win.sinogram(a, b) for a, b in plan.view_batches()], resume)
    with torch.no_grad():
        for a, b in plan.view_batches():
            target = axis0(win.sinogram(a, b), sinogram_store)
            if out.is_done(*target):
                continue
            acc = torch.zeros((1, b - a, win.U, win.V), dtype=plan.dtype)
            r = rays.views(a, b)
            for s0, s1 in plan.slabs():
                slab = win.as_slab(volume_store.read(win.volume(s0, s1)), s0, s1)
                ex.project_add(slab, s0, r, acc)
                del slab  # before the next read: one slab resident at a time
            sinogram_store.write(win.sinogram(a, b), win.block_value(acc, a, b))
            del acc
            out.mark_done(*target)
    out.finish()
    return plan


def backproject_into(projector, sinogram_store, volume_store, *, device=None, resume: bool = False) -> Plan:
    """Backproject ``sinogram_store`` into ``volume_store``, one z-slab at a time; returns the plan.

    ``resume=True`` continues an interrupted call with the same inputs (see :func:`project_into`).
    """
    plan = plan_into(projector, "backproject", volume_store, sinogram_store)
    ex = _executor(projector, compute_device(projector, device))
    rays = projector._rays(None, plan.dtype, torch.device("cpu")).detach()
    win = StoreWindows(projector)
    out = start_output(volume_store, "backproject", run_inputs(projector, sinogram_store, plan.dtype),
                       [win.volume(s0, s1) for s0, s1 in plan.slabs()], resume)
    with torch.no_grad():
        for s0, s1 in plan.slabs():
            target = axis0(win.volume(s0, s1), volume_store)
            if out.is_done(*target):
                continue
            acc = torch.zeros((1, s1 - s0, win.H, win.W), dtype=plan.dtype)
            for a, b in plan.view_batches():
                block = win.as_block(sinogram_store.read(win.sinogram(a, b)), a, b)
                ex.backproject_add(block, s0, s1, rays.views(a, b), acc)
                del block
            volume_store.write(win.volume(s0, s1), win.slab_value(acc))
            del acc
            out.mark_done(*target)
    out.finish()
    return plan
