"""Data completeness: how many views of a scan see each voxel.

A voxel is *seen* by a view when the ray through the voxel centre (from the
source for a cone beam, along the view's direction for a parallel beam)
lands on the detector, i.e. inside the pixel area
``[-U/2, U/2] x [-V/2, V/2]`` pixels around the detector centre.  Counting
views per voxel is voxel-driven and exact for this definition; it needs no
projector and runs in a fraction of a second on preview-sized grids.  A
count of 0 marks voxels no ray reaches (nothing can be reconstructed there);
counts below ``n_views`` mark truncated (incomplete) data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .design import ScanGeometry
from ..geometry import Trajectory

_CHUNK = 1 << 22  # voxel x view pairs per step: bounded memory


def voxel_centres(volume_shape, voxel_spacing, dtype=torch.float64) -> torch.Tensor:
    """World coordinates ``(x, y, z)`` of every voxel centre, shape ``(D*H*W, 3)``.

    ``volume_shape`` is (D, H, W) with ``voxel_spacing`` (dz, dy, dx), or a
    2D (H, W) with (dy, dx), whose voxels lie in the plane z=0.
    """
    shape = tuple(int(s) for s in volume_shape)
    spacing = tuple(float(s) for s in voxel_spacing)
    if len(shape) == 2:
        shape, spacing = (1, *shape), (1.0, *spacing)
    D, H, W = shape
    dz, dy, dx = spacing
    z = (torch.arange(D, dtype=dtype) - (D - 1) / 2) * dz
    y = (torch.arange(H, dtype=dtype) - (H - 1) / 2) * dy
    x = (torch.arange(W, dtype=dtype) - (W - 1) / 2) * dx
    zz, yy, xx = torch.meshgrid(z, y, x, indexing="ij")
    return torch.stack([xx.reshape(-1), yy.reshape(-1), zz.reshape(-1)], dim=1)


def projection_matrices(trajectory: Trajectory, dtype=torch.float64) -> torch.Tensor:
    """Per-view ``(n_views, 3, 4)`` matrices mapping homogeneous world points to detector coordinates.

    For ``m = M @ (x, y, z, 1)`` the point projects onto the detector at
    ``(a, b) = (m[0] / m[2], m[1] / m[2])`` (mm from the detector centre along
    the u and v axes); ``m[2] > 0`` means the detector lies on the far side
    of the source.  Parallel beams have ``m[2] == 1``.  (The detector axes
    need not be orthogonal: (a, b) use the dual basis of (u, v).)
    """
    src, ctr, u, v = (t.detach().to("cpu", dtype) for t in trajectory.tensors())
    guu, guv, gvv = (u * u).sum(1, keepdim=True), (u * v).sum(1, keepdim=True), (v * v).sum(1, keepdim=True)
    det = guu * gvv - guv * guv
    ea = (gvv * u - guv * v) / det          # dual basis: ea.u = 1, ea.v = 0
    eb = (guu * v - guv * u) / det
    n = torch.linalg.cross(u, v, dim=1)
    dot = lambda a, b: (a * b).sum(1, keepdim=True)  # noqa: E731
    M = torch.zeros(trajectory.n_views, 3, 4, dtype=dtype)
    if trajectory.beam == "cone":
        k = dot(ctr - src, n)
        n = n * torch.where(k < 0, -1.0, 1.0)   # orient n from the source towards the detector
        k = k.abs()
        # hit = s + t (p - s), t = k / (n.(p - s)); (a, b) = e.(hit - c), over w = n.(p - s).
        for row, e in ((0, ea), (1, eb)):
            es = dot(e, src - ctr)
            M[:, row, :3] = es * n + k * e
            M[:, row, 3] = (-es * dot(n, src) - k * dot(e, src))[:, 0]
        M[:, 2, :3] = n
        M[:, 2, 3] = -dot(n, src)[:, 0]
    else:
        d = src
        dn = dot(d, n)
        for row, e in ((0, ea), (1, eb)):
            ed = dot(e, d) / dn
            M[:, row, :3] = e - ed * n
            M[:, row, 3] = (-dot(e, ctr) + ed * dot(ctr, n))[:, 0]
        M[:, 2, 3] = 1.0
    return M


def views_seeing(trajectory: Trajectory, points: torch.Tensor, detector_shape, detector_spacing) -> torch.Tensor:
    """For each world point ``(N, 3)``, the number of views whose detector it projects onto (int32)."""
    if not isinstance(trajectory, Trajectory):
        raise TypeError(f"trajectory must be a ctbench Trajectory, got {type(trajectory).__name__}")
    ds = tuple(int(v) for v in (detector_shape if isinstance(detector_shape, (tuple, list)) else (detector_shape,)))
    sp = (tuple(float(v) for v in detector_spacing) if isinstance(detector_spacing, (tuple, list))
          else (float(detector_spacing),) * len(ds))
    half_u = ds[0] * sp[0] / 2
    half_v = (ds[1] * sp[1] if len(ds) > 1 else sp[0]) / 2
    M = projection_matrices(trajectory)
    if trajectory.beam == "parallel":
        bad = (trajectory.source.detach().to("cpu", torch.float64)
               * torch.linalg.cross(trajectory.detector_u.detach(), trajectory.detector_v.detach(), dim=1)
               .to("cpu", torch.float64)).sum(1).abs() < 1e-12
    else:
        bad = torch.zeros(trajectory.n_views, dtype=torch.bool)
    hom = torch.cat([points.to(torch.float64), torch.ones(points.shape[0], 1, dtype=torch.float64)], dim=1).T
    count = torch.zeros(points.shape[0], dtype=torch.int32)
    per = max(1, _CHUNK // max(points.shape[0], 1))
    for i0 in range(0, trajectory.n_views, per):
        sl = slice(i0, min(i0 + per, trajectory.n_views))
        m = M[sl] @ hom                                   # (views, 3, N)
        w = m[:, 2]
        seen = (w > 0) & (m[:, 0].abs() <= half_u * w)
        if trajectory.ndim == 3:   # 2D scans: every point of the plane z=0 meets the single row
            seen &= m[:, 1].abs() <= half_v * w
        seen &= ~bad[sl, None]
        count += seen.sum(0, dtype=torch.int32)
    return count


def completeness_map(geometry: ScanGeometry, volume_shape=None, voxel_spacing=None) -> torch.Tensor:
    """Views per voxel on the geometry's grid (or another grid), as an int32 tensor.

    The result has the volume's shape, (D, H, W) or (H, W) for 2D scans.
    Pass a coarser ``volume_shape``/``voxel_spacing`` covering the same box
    (see :func:`coarse_grid`) for an interactive preview.
    """
    shape = geometry.volume_shape if volume_shape is None else tuple(int(s) for s in volume_shape)
    spacing = geometry.voxel_spacing if voxel_spacing is None else tuple(float(s) for s in voxel_spacing)
    if len(shape) != len(geometry.volume_shape) or len(spacing) != len(shape):
        raise ValueError(f"volume_shape {shape} and voxel_spacing {spacing} must match the scan's "
                         f"{len(geometry.volume_shape)}D grid")
    pts = voxel_centres(shape, spacing)
    return views_seeing(geometry.trajectory, pts, geometry.detector_shape, geometry.detector_spacing).reshape(shape)


def coarse_grid(volume_shape, voxel_spacing, max_size: int = 40) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """A grid of at most ``max_size`` voxels per axis covering the same box."""
    if max_size < 1:
        raise ValueError(f"max_size must be a positive integer, got {max_size!r}")
    shape, spacing = [], []
    for n, d in zip(volume_shape, voxel_spacing):
        m = min(int(n), max_size)
        shape.append(m)
        spacing.append(float(n) * float(d) / m)
    return tuple(shape), tuple(spacing)


@dataclass(frozen=True)
class CompletenessSummary:
    """Fractions of voxels by how many views see them."""

    n_views: int
    full: float         # seen by every view
    partial: float      # seen by some views, not all
    unreached: float    # seen by none

    def __str__(self) -> str:
        return (f"{100 * self.full:.1f}% of voxels seen by all {self.n_views} views, "
                f"{100 * self.partial:.1f}% by some, {100 * self.unreached:.1f}% by none")


def summarize(counts: torch.Tensor, n_views: int) -> CompletenessSummary:
    """Summarise a completeness map (from :func:`completeness_map`)."""
    total = max(counts.numel(), 1)
    full = int((counts >= n_views).sum())
    none = int((counts == 0).sum())
    return CompletenessSummary(int(n_views), full / total, (total - full - none) / total, none / total)

