"""Run one projector call on one device, as the planner's windows.

The executor is where a call meets a backend.  It owns the volume grid, the
detector shape and the planning options (``memory_budget``,
``volume_chunk_shape``, ``view_chunk_size``, ``detector_chunk_shape``); per
call it asks :func:`ctbench.engine.plan.make_plan` for windows and runs them
through the backend's windowed ``project(..., out=)`` (adds into ``out``) and
``backproject(..., out=)`` (writes only the slab).

- In place (the data is on the compute device): windows are views of the
  caller's tensors; without a budget or chunk options the call is a single
  backend call, exactly as before planning existed.
- Streamed (CPU-backed data, a CUDA compute device): slabs or sinogram blocks
  go through two pinned host buffers and two device buffers; copies run on a
  side CUDA stream and overlap the kernels on the current stream.  Outputs
  are returned on the data's device.
"""

from __future__ import annotations

import torch

from .base import Backend, Rays, Tile, VolumeGrid
from .plan import Plan, make_plan

PLAN_OPTIONS = ("memory_budget", "volume_chunk_shape", "view_chunk_size", "detector_chunk_shape")


def reference_geometry_vjp(volume, grid: VolumeGrid, z0: int, grad_sino, rays: Rays, tile: Tile):
    """d<A(g) volume, grad_sino>/d(source, center, ustep, vstep) by autograd of the reference model."""
    from .reference import ReferenceBackend

    leaves = [t.detach().to(dtype=volume.dtype).requires_grad_(True) for t in rays.tensors()]
    with torch.enable_grad():
        y = ReferenceBackend().project(volume.detach(), grid, z0, Rays(*leaves, rays.cone, rays.detector_shape),
                                       tile)
        grads = torch.autograd.grad((y * grad_sino).sum(), leaves, allow_unused=True)
    return tuple(torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves))


def _tile_of(t: torch.Tensor, a: int, b: int, tile: Tile) -> torch.Tensor:
    return t[:, a:b, tile.u0:tile.u1, tile.v0:tile.v1]


class _HostToDevice:
    """Double-buffered host->device copies on a side stream.

    Window k+1 is staged into pinned memory (on the host) and copied (on the
    side stream) while the kernels of window k run on the current stream.
    Events order the reuse of each buffer: a pinned buffer is refilled after
    its copy finished, a device buffer after the kernels that read it.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, numel: int):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pinned = [torch.empty(numel, dtype=dtype, pin_memory=True) for _ in range(2)]
        self.buffers = [torch.empty(numel, dtype=dtype, device=device) for _ in range(2)]
        self.copied = [None, None]
        self.used = [None, None]
        self.slot = 1

    def upload(self, host: torch.Tensor) -> torch.Tensor:
        k = self.slot = 1 - self.slot
        n = host.numel()
        if self.copied[k] is not None:
            self.copied[k].synchronize()
        staging = self.pinned[k][:n].view(host.shape)
        staging.copy_(host)
        dst = self.buffers[k][:n].view(host.shape)
        with torch.cuda.stream(self.stream):
            if self.used[k] is not None:
                self.stream.wait_event(self.used[k])
            dst.copy_(staging, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.copied[k] = event
        torch.cuda.current_stream(self.device).wait_event(event)
        return dst

    def release(self) -> None:
        """Mark the current slot's device buffer free once the kernels queued so far are done."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self.used[self.slot] = event


class PlannedExecutor:
    """Runs the Joseph pair for one compute device as the planner's windows."""

    def __init__(self, backend: Backend, grid: VolumeGrid, detector_shape, options: dict | None = None,
                 compute_device=None):
        self.backend = backend
        self.grid = grid
        self.detector_shape = tuple(detector_shape)
        options = options or {}
        self.plan_options = {k: options.get(k) for k in PLAN_OPTIONS}
        self.compute_device = torch.device(compute_device) if compute_device is not None else None

    # ------------------------------------------------------------- planning
    def _compute_on(self, data_device: torch.device) -> tuple[torch.device, str]:
        data_device = torch.device(data_device)
        cd = self.compute_device
        if cd is None or cd == data_device:
            return data_device, "inplace"
        if cd.type == "cuda" and data_device.type == "cpu":
            return cd, "streamed"
        raise ValueError(f"this executor computes on {cd} and streams CPU-backed data only; got data on "
                         f"{data_device}")

    def plan(self, kind: str, batch: int, z0: int, z1: int, n_views: int, dtype: torch.dtype,
             data_device) -> Plan:
        """The windows of a call on tensors of ``dtype`` living on ``data_device``."""
        device, mode = self._compute_on(data_device)
        return make_plan(kind, self.grid.shape, self.detector_shape, n_views, z_range=(z0, z1), batch=batch,
                         dtype=dtype, device=device, mode=mode, **self.plan_options)

    # ------------------------------------------------------------- project
    def project(self, volume: torch.Tensor, z0: int, rays: Rays) -> torch.Tensor:
        """Projection (B, n_views, U, V) of the slab ``volume`` (B, nz, H, W) at global plane z0."""
        B, nz = volume.shape[:2]
        plan = self.plan("project", B, z0, z0 + nz, rays.n_views, volume.dtype, volume.device)
        if plan.single and plan.mode == "inplace":
            return self.backend.project(volume, self.grid, z0, rays.to(volume.device, volume.dtype),
                                        Tile.full(self.detector_shape))
        out = volume.new_zeros((B, rays.n_views, *self.detector_shape))
        self._run_project(plan, volume, z0, rays, out)
        return out

    def project_add(self, volume: torch.Tensor, z0: int, rays: Rays, out: torch.Tensor) -> torch.Tensor:
        """Add the projection of the slab ``volume`` into ``out`` (B, n_views, U, V); returns ``out``."""
        B, nz = volume.shape[:2]
        plan = self.plan("project", B, z0, z0 + nz, rays.n_views, volume.dtype, volume.device)
        self._run_project(plan, volume, z0, rays, out)
        return out

    def _run_project(self, plan: Plan, volume, z0, rays: Rays, out):
        device = plan.device
        r_all = rays.to(device, volume.dtype)
        slabs = [(s0, s1) for s0, s1 in plan.slabs() if s1 > s0]
        streamer = resident = None
        if plan.mode == "streamed":
            if len(slabs) == 1:
                resident = volume[:, slabs[0][0] - z0:slabs[0][1] - z0].to(device)
            else:
                numel = volume.shape[0] * max(s1 - s0 for s0, s1 in slabs) * self.grid.H * self.grid.W
                streamer = _HostToDevice(device, volume.dtype, numel)
        for a, b in plan.view_batches():
            r = r_all.views(a, b)
            for tile in plan.tiles():
                target = _tile_of(out, a, b, tile)
                direct = plan.mode == "inplace" and target.is_contiguous()
                acc = target if direct else torch.zeros(target.shape, dtype=out.dtype, device=device)
                for s0, s1 in slabs:
                    host = volume[:, s0 - z0:s1 - z0]
                    if plan.mode == "inplace":
                        slab = host
                    else:
                        slab = resident if resident is not None else streamer.upload(host)
                    self.backend.project(slab, self.grid, s0, r, tile, out=acc)
                    if streamer is not None:
                        streamer.release()
                if not direct:
                    target.add_(acc.to(target.device))

    # --------------------------------------------------------- backproject
    def backproject(self, sinogram: torch.Tensor, z0: int, z1: int, rays: Rays) -> torch.Tensor:
        """Backprojection (B, z1-z0, H, W) of ``sinogram`` (B, n_views, U, V) into the slab [z0, z1)."""
        B = sinogram.shape[0]
        plan = self.plan("backproject", B, z0, z1, rays.n_views, sinogram.dtype, sinogram.device)
        if plan.single and plan.mode == "inplace":
            return self.backend.backproject(sinogram, self.grid, z0, z1, rays.to(sinogram.device, sinogram.dtype),
                                            Tile.full(self.detector_shape))
        out = sinogram.new_zeros((B, z1 - z0, self.grid.H, self.grid.W))
        self._run_backproject(plan, sinogram, z0, rays, out)
        return out

    def backproject_add(self, sinogram: torch.Tensor, z0: int, z1: int, rays: Rays,
                        out: torch.Tensor) -> torch.Tensor:
        """Add the backprojection of ``sinogram`` into the slab ``out`` (B, z1-z0, H, W); returns ``out``."""
        B = sinogram.shape[0]
        plan = self.plan("backproject", B, z0, z1, rays.n_views, sinogram.dtype, sinogram.device)
        self._run_backproject(plan, sinogram, z0, rays, out)
        return out

    def _run_backproject(self, plan: Plan, sinogram, z0, rays: Rays, out):
        device = plan.device
        r_all = rays.to(device, sinogram.dtype)
        batches, tiles = plan.view_batches(), plan.tiles()
        streamer = resident = None
        if plan.mode == "streamed":
            if len(batches) == 1 and len(tiles) == 1:
                resident = sinogram.to(device)
            else:
                numel = sinogram.shape[0] * plan.view_batch * plan.tile_shape[0] * plan.tile_shape[1]
                streamer = _HostToDevice(device, sinogram.dtype, numel)
        B, H, W = out.shape[0], self.grid.H, self.grid.W
        for s0, s1 in plan.slabs():
            if s1 <= s0:
                continue
            target = out[:, s0 - z0:s1 - z0]
            direct = plan.mode == "inplace" and target.is_contiguous()
            acc = target if direct else torch.zeros((B, s1 - s0, H, W), dtype=out.dtype, device=device)
            for a, b in batches:
                r = r_all.views(a, b)
                for tile in tiles:
                    if plan.mode == "inplace":
                        block = _tile_of(sinogram, a, b, tile)
                    else:
                        block = resident if resident is not None else streamer.upload(_tile_of(sinogram, a, b, tile))
                    self.backend.backproject(block, self.grid, s0, s1, r, tile, out=acc)
                    if streamer is not None:
                        streamer.release()
            if not direct:
                target.add_(acc.to(target.device))

    # -------------------------------------------------------- geometry VJP
    def geometry_vjp(self, volume: torch.Tensor, z0: int, grad_sino: torch.Tensor, rays: Rays):
        """d<A(g) volume, grad_sino>/d(source, center, ustep, vstep): the sum of the windows' contributions."""
        B, nz = volume.shape[:2]
        plan = self.plan("project", B, z0, z0 + nz, rays.n_views, volume.dtype, volume.device)
        device = plan.device
        fn = getattr(self.backend, "geometry_vjp", None) or reference_geometry_vjp
        r_all = rays.to(device, volume.dtype)
        if plan.single:
            grads = fn(volume.to(device), self.grid, z0, grad_sino.to(device), r_all,
                       Tile.full(self.detector_shape))
            return tuple(g.to(device=t.device, dtype=t.dtype) for g, t in zip(grads, rays.tensors()))
        totals = [torch.zeros_like(t) for t in rays.tensors()]
        for a, b in plan.view_batches():
            r = r_all.views(a, b)
            for tile in plan.tiles():
                g_block = _tile_of(grad_sino, a, b, tile).to(device).contiguous()
                for s0, s1 in plan.slabs():
                    if s1 <= s0:
                        continue
                    slab = volume[:, s0 - z0:s1 - z0].to(device).contiguous()
                    grads = fn(slab, self.grid, s0, g_block, r, tile)
                    for total, g in zip(totals, grads):
                        total[a:b] += g.to(device=total.device, dtype=total.dtype)
        return tuple(totals)


# The single-window executor of earlier versions is the planned executor without options.
LocalExecutor = PlannedExecutor


def make_executor(backend: Backend, grid: VolumeGrid, detector_shape, options: dict,
                  compute_device=None) -> PlannedExecutor:
    """The executor for one device; planning options (memory_budget, chunk shapes) select windows.

    ``compute_device`` (a CUDA device) makes the executor stream CPU-backed tensors to it.
    """
    return PlannedExecutor(backend, grid, detector_shape, options, compute_device=compute_device)
