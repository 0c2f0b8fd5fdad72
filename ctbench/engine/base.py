"""What every backend receives: the volume grid, the rays of a view range and a window.

Backends see batched 4D tensors: a volume slab ``(B, z1-z0, H, W)`` and a
sinogram block ``(B, n_views, u1-u0, v1-v0)``.  Global coordinates are always
preserved: the slab knows where it sits in the global grid, the pixel tile
where it sits on the detector.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VolumeGrid:
    """Global voxel grid: shape ``(D, H, W)`` and spacing ``(dz, dy, dx)`` in mm."""

    shape: tuple[int, int, int]
    spacing: tuple[float, float, float]

    @property
    def D(self) -> int:
        return self.shape[0]

    @property
    def H(self) -> int:
        return self.shape[1]

    @property
    def W(self) -> int:
        return self.shape[2]


@dataclass(frozen=True)
class Rays:
    """Per-view ray geometry of a view range, in the compute dtype and device.

    ``source`` is the source position (cone) or the ray direction (parallel);
    ``ustep``/``vstep`` are detector axes times pixel pitch.
    """

    source: torch.Tensor
    center: torch.Tensor
    ustep: torch.Tensor
    vstep: torch.Tensor
    cone: bool
    detector_shape: tuple[int, int]

    @property
    def n_views(self) -> int:
        return int(self.source.shape[0])

    def tensors(self):
        return self.source, self.center, self.ustep, self.vstep

    def views(self, start: int, stop: int) -> "Rays":
        return Rays(self.source[start:stop], self.center[start:stop], self.ustep[start:stop],
                    self.vstep[start:stop], self.cone, self.detector_shape)

    def to(self, device=None, dtype=None) -> "Rays":
        return Rays(*(t.to(device=device, dtype=dtype) for t in self.tensors()), self.cone, self.detector_shape)

    def detach(self) -> "Rays":
        return Rays(*(t.detach() for t in self.tensors()), self.cone, self.detector_shape)


@dataclass(frozen=True)
class Tile:
    """A detector pixel tile ``[u0, u1) x [v0, v1)``."""

    u0: int
    u1: int
    v0: int
    v1: int

    @staticmethod
    def full(detector_shape) -> "Tile":
        return Tile(0, detector_shape[0], 0, detector_shape[1])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.u1 - self.u0, self.v1 - self.v0)


def _check_out(out: torch.Tensor, like: torch.Tensor, shape) -> None:
    if (not out.is_contiguous() or out.dtype != like.dtype or out.device != like.device
            or tuple(out.shape) != tuple(shape)):
        raise ValueError(f"out must be a contiguous {like.dtype} tensor of shape {tuple(shape)} on {like.device}, "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")


def project_buffers(volume: torch.Tensor, rays: "Rays", tile: "Tile", out: torch.Tensor | None):
    """(contiguous volume, checked output, accumulate flag) of a kernel projection call."""
    vol = volume.detach().contiguous()
    shape = (vol.shape[0], rays.n_views, *tile.shape)
    accumulate = out is not None
    if out is None:
        out = torch.empty(shape, dtype=vol.dtype, device=vol.device)
    _check_out(out, vol, shape)
    return vol, out, accumulate


def backproject_buffers(sinogram: torch.Tensor, grid: "VolumeGrid", z0: int, z1: int, out: torch.Tensor | None):
    """(contiguous sinogram, checked zero-initialised or given output) of a kernel backprojection call."""
    sino = sinogram.detach().contiguous()
    shape = (sino.shape[0], z1 - z0, grid.H, grid.W)
    if out is None:
        out = torch.zeros(shape, dtype=sino.dtype, device=sino.device)
    _check_out(out, sino, shape)
    return sino, out


class Backend:
    """Interface of a kernel backend (cpu, cuda, reference)."""

    name = "abstract"

    def project(self, volume: torch.Tensor, grid: VolumeGrid, z0: int, rays: Rays, tile: Tile,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """Project the slab ``volume`` (B, nz, H, W) starting at global plane z0.

        Returns (B, n_views, nu, nv); with ``out`` given, adds into it.
        """
        raise NotImplementedError

    def backproject(self, sinogram: torch.Tensor, grid: VolumeGrid, z0: int, z1: int, rays: Rays, tile: Tile,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """Transpose of :meth:`project` for the slab [z0, z1): returns (B, z1-z0, H, W); adds into ``out``."""
        raise NotImplementedError

    def supports(self, device: torch.device) -> bool:
        raise NotImplementedError
