"""Run one projector call on one device.

The executor is where a call meets a backend.  It owns the volume grid and
the detector shape; the windows it runs (volume slabs, view batches, pixel
tiles) are chosen by the planner when one is configured, otherwise the call
runs as a single window.
"""

from __future__ import annotations

import torch

from .base import Backend, Rays, Tile, VolumeGrid


def reference_geometry_vjp(volume, grid: VolumeGrid, z0: int, grad_sino, rays: Rays, tile: Tile):
    """d<A(g) volume, grad_sino>/d(source, center, ustep, vstep) by autograd of the reference model."""
    from .reference import ReferenceBackend

    leaves = [t.detach().to(dtype=volume.dtype).requires_grad_(True) for t in rays.tensors()]
    with torch.enable_grad():
        y = ReferenceBackend().project(volume.detach(), grid, z0, Rays(*leaves, rays.cone, rays.detector_shape),
                                       tile)
        grads = torch.autograd.grad((y * grad_sino).sum(), leaves, allow_unused=True)
    return tuple(torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves))


class LocalExecutor:
    """Runs the Joseph pair for one device as a single window."""

    def __init__(self, backend: Backend, grid: VolumeGrid, detector_shape: tuple[int, int]):
        self.backend = backend
        self.grid = grid
        self.detector_shape = tuple(detector_shape)

    def _rays_on(self, rays: Rays, like: torch.Tensor) -> Rays:
        return rays.to(device=like.device, dtype=like.dtype)

    def project(self, volume: torch.Tensor, z0: int, rays: Rays) -> torch.Tensor:
        return self.backend.project(volume, self.grid, z0, self._rays_on(rays, volume),
                                    Tile.full(self.detector_shape))

    def backproject(self, sinogram: torch.Tensor, z0: int, z1: int, rays: Rays) -> torch.Tensor:
        return self.backend.backproject(sinogram, self.grid, z0, z1, self._rays_on(rays, sinogram),
                                        Tile.full(self.detector_shape))

    def geometry_vjp(self, volume: torch.Tensor, z0: int, grad_sino: torch.Tensor, rays: Rays):
        rays_c = self._rays_on(rays, volume)
        tile = Tile.full(self.detector_shape)
        fn = getattr(self.backend, "geometry_vjp", None)
        if fn is not None:
            grads = fn(volume, self.grid, z0, grad_sino, rays_c, tile)
        else:
            grads = reference_geometry_vjp(volume, self.grid, z0, grad_sino, rays_c, tile)
        return tuple(g.to(device=t.device, dtype=t.dtype) for g, t in zip(grads, rays.tensors()))


def make_executor(backend: Backend, grid: VolumeGrid, detector_shape, options: dict) -> LocalExecutor:
    """The executor for one device; planning options (memory_budget, chunk shapes) select windows."""
    return LocalExecutor(backend, grid, detector_shape)
