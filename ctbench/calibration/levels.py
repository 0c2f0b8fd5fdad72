"""Coarse-to-fine levels: the scan binned by a factor, with its projector and geometry model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..projector import Projector
from .model import GeometryModel

__all__ = ["Level", "make_level", "resample_volume"]


@dataclass
class Level:
    binning: int
    sinogram: torch.Tensor          # (n_views, U // f, V // f)
    model: GeometryModel            # parameters in full-resolution pixels
    volume_shape: tuple[int, int, int]
    voxel_spacing: tuple[float, float, float]
    detector_shape: tuple[int, int]
    detector_spacing: tuple[float, float]
    backend: str

    def projector(self, trajectory) -> Projector:
        return Projector(trajectory, self.volume_shape, self.detector_shape, beam=self.model.beam,
                         detector_spacing=self.detector_spacing, voxel_spacing=self.voxel_spacing,
                         backend=self.backend)


def make_level(projector: Projector, sinogram: torch.Tensor, f: int, volume_factor: int = 1) -> Level:
    """Bin the detector ``f x f`` (trailing pixels that do not fill a bin are dropped) and the volume by
    ``f * volume_factor``: a volume coarser than the detector has several rays per voxel, so it cannot
    absorb a geometry error by fitting every ray (with as many voxels as rays, any geometry fits)."""
    U, V = projector.detector_shape
    Ub, Vb = U // f, V // f
    if Ub < 4 or Vb < 4:
        raise ValueError(f"levels: binning {f} leaves a {Ub}x{Vb} detector; use smaller binning factors")
    du, dv = projector.detector_spacing
    nominal = projector.trajectory.detach()
    if f > 1:
        n = sinogram.shape[0]
        y = sinogram[:, :Ub * f, :Vb * f].reshape(n, Ub, f, Vb, f).mean(dim=(2, 4))
        # the kept pixels' centre moves when trailing pixels are dropped
        src, ctr, u, v = nominal.tensors()
        ctr = ctr + ((Ub * f - U) / 2) * du * u + ((Vb * f - V) / 2) * dv * v
        nominal = nominal.replace(detector_center=ctr)
    else:
        y = sinogram
    D, H, W = projector.global_volume_shape
    dz, dy, dx = projector.voxel_spacing
    shape = tuple(max(1, s // (f * volume_factor)) for s in (D, H, W))
    spacing = tuple(sp * s / b for sp, s, b in zip((dz, dy, dx), (D, H, W), shape))
    return Level(f, y.contiguous(), GeometryModel(nominal, (du, dv)), shape, spacing, (Ub, Vb),
                 (du * f, dv * f), projector.backend_name)


def resample_volume(x: torch.Tensor, shape) -> torch.Tensor:
    """Trilinear resampling of a volume to another grid over the same box (a warm start)."""
    if tuple(x.shape) == tuple(shape):
        return x
    return F.interpolate(x[None, None], size=tuple(shape), mode="trilinear", align_corners=False)[0, 0]

