"""Quick previews: reconstruct the central slice, or a 2x-binned problem, in about a second.

Both previews build a smaller *problem* (a projector and the sinogram it
explains) that the ordinary solvers run on unchanged:

- :func:`slice_problem` keeps the full scan but a volume of one plane, the
  slab ``[k, k+1)`` of the global grid with global coordinates preserved
  (the projector's slab window, the same mechanism that serves the
  ``space`` partition).  Voxel-driven direct methods (FDK/FBP) give exactly
  the slice of the full reconstruction.  Iterative methods give it exactly
  when the scan is *slab-separable*, i.e. no ray that meets the slice meets
  another plane: 2D scans, and parallel beams rotating about z whose
  detector rows sit at voxel-plane heights.  Then only the detector rows
  that meet the slice are kept, so an iteration costs a few rows' worth.
- :func:`binned_problem` bins the detector 2x2 (mean of line integrals),
  keeps every other view and halves the grid (voxels twice the pitch): a
  coarse version of the whole problem, for cone beams and iterative methods.

:func:`choose_mode` picks the exact slice when it exists (and, for iterative
methods, is small enough to be quick) and the binned problem otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .design import ScanGeometry

MODES = ("auto", "slice", "binned")
DIRECT = ("fbp",)   # algorithm names (ctbench.workflow) whose reconstruction is voxel-driven


class PreviewError(ValueError):
    """A preview mode that cannot give a faithful result for this scan and algorithm."""


@dataclass
class Problem:
    """A (possibly reduced) reconstruction problem and where its grid sits in the world.

    ``origin`` is the world position (z, y, x) in mm of the centre of voxel
    ``[0, 0, 0]`` of the reconstructed array (``(y, x)`` for 2D scans);
    ``voxel_spacing`` its pitch, so a viewer can place it over the full grid.
    """

    projector: object
    sinogram: torch.Tensor
    geometry: ScanGeometry
    volume_shape: tuple[int, ...]
    voxel_spacing: tuple[float, ...]
    origin: tuple[float, ...]
    mode: str
    note: str = ""


def grid_origin(volume_shape, voxel_spacing) -> tuple[float, ...]:
    """World position of voxel 0's centre of a grid centred on the origin."""
    return tuple(-(n - 1) / 2 * d for n, d in zip(volume_shape, voxel_spacing))


def full_problem(geometry: ScanGeometry, sinogram: torch.Tensor, backend: str = "auto") -> Problem:
    """The problem as given (the full reconstruction)."""
    return Problem(geometry.projector(backend), sinogram, geometry, geometry.volume_shape, geometry.voxel_spacing,
                   grid_origin(geometry.volume_shape, geometry.voxel_spacing), "full")


def central_index(geometry: ScanGeometry) -> int:
    """Index of the central plane along z (the upper of the two middle planes for even D)."""
    return geometry.volume_shape[0] // 2


def _row_heights(geometry: ScanGeometry) -> torch.Tensor | None:
    """z of every detector row per view, (n_views, V), if every ray is horizontal; else None."""
    t = geometry.trajectory
    if t.beam != "parallel":
        return None
    d = t.source.detach().to(torch.float64)
    u, v = t.detector_u.detach().to(torch.float64), t.detector_v.detach().to(torch.float64)
    tiny = 1e-9
    if (d[:, 2].abs() > tiny * d.norm(dim=1)).any() or (u[:, 2].abs() > tiny * u.norm(dim=1)).any():
        return None
    V = geometry.detector_shape[1]
    dv = geometry.detector_spacing[1]
    j = torch.arange(V, dtype=torch.float64) - (V - 1) / 2
    return t.detector_center.detach().to(torch.float64)[:, 2:3] + j[None, :] * dv * v[:, 2:3]


def separable_rows(geometry: ScanGeometry, index: int) -> tuple[int, int] | None:
    """Detector rows ``[j0, j1)`` that see plane ``index`` and no other, if the scan is slab-separable there."""
    if geometry.is_2d:
        return (0, 1)
    z = _row_heights(geometry)
    if z is None:
        return None
    D = geometry.volume_shape[0]
    dz = geometry.voxel_spacing[0]
    zk = (index - (D - 1) / 2) * dz
    dist = (z - zk).abs()
    tol = 1e-5 * dz
    touching = (dist < dz - tol).any(dim=0)          # Joseph's z-interpolation weight is > 0
    aligned = (dist <= tol).all(dim=0)
    rows = touching.nonzero()[:, 0]
    if rows.numel() == 0 or not aligned[rows].all():
        return None
    j0, j1 = int(rows.min()), int(rows.max()) + 1
    if rows.numel() != j1 - j0:
        return None
    return j0, j1


def rows_sampled(geometry: ScanGeometry, index: int, margin: int = 1) -> tuple[int, int]:
    """Detector rows ``[j0, j1)`` that a voxel-driven backprojection of plane ``index`` reads.

    Every voxel centre of the plane is projected in every view; bilinear
    sampling reads the two rows around it, and ``margin`` more on each side.
    """
    from .completeness import projection_matrices, voxel_centres

    D, H, W = geometry.volume_shape
    dz = geometry.voxel_spacing[0]
    pts = voxel_centres((H, W), geometry.voxel_spacing[1:])
    pts[:, 2] = (index - (D - 1) / 2) * dz
    hom = torch.cat([pts, torch.ones(pts.shape[0], 1, dtype=pts.dtype)], dim=1).T
    m = projection_matrices(geometry.trajectory) @ hom                # (views, 3, N)
    w = m[:, 2]
    ok = w > 0
    if not ok.any():
        return 0, geometry.detector_shape[1]
    V = geometry.detector_shape[1]
    j = (m[:, 1] / torch.where(ok, w, torch.ones_like(w)))[ok] / geometry.detector_spacing[1] + (V - 1) / 2
    j0 = max(0, int(torch.floor(j.min())) - margin)
    j1 = min(V, int(torch.floor(j.max())) + 2 + margin)
    if j1 <= j0:   # the plane projects off the detector: keep one row so shapes stay valid
        j0, j1 = (0, 1) if j.max() < 0 else (V - 1, V)
    return j0, j1


def _shift_detector(geometry: ScanGeometry, j0: int, j1: int) -> ScanGeometry:
    """The same rays as rows ``[j0, j1)`` of the detector, as a detector of ``j1 - j0`` rows."""
    t = geometry.trajectory
    V = geometry.detector_shape[1]
    dv = geometry.detector_spacing[1]
    shift = ((j0 + j1 - 1) / 2 - (V - 1) / 2) * dv
    ctr = t.detector_center + shift * t.detector_v
    return ScanGeometry(t.replace(detector_center=ctr), (geometry.detector_shape[0], j1 - j0),
                        geometry.detector_spacing, geometry.volume_shape, geometry.voxel_spacing)


def _slab(projector, index: int):
    # A projector whose volume is the slab [index, index+1) of the global grid:
    # the same window the distributed 'space' partition uses, so rays keep
    # their global coordinates and the slab's contribution is exact.
    projector.volume_slice = slice(index, index + 1)
    return projector


def slice_problem(geometry: ScanGeometry, sinogram: torch.Tensor, algorithm: str, *, index: int | None = None,
                  backend: str = "auto") -> Problem:
    """The reconstruction of one z plane (default: the central one); see the module notes.

    Raises :class:`PreviewError` for an iterative ``algorithm`` on a scan
    that is not slab-separable at that plane (the slice alone cannot
    explain rays that also cross other planes).
    """
    if geometry.is_2d:
        p = full_problem(geometry, sinogram, backend)
        p.mode, p.note = "slice", "2D scan: the whole image"
        return p
    D = geometry.volume_shape[0]
    k = central_index(geometry) if index is None else int(index)
    if not 0 <= k < D:
        raise PreviewError(f"slice index must be in [0, {D}), got {index}")
    origin = list(grid_origin(geometry.volume_shape, geometry.voxel_spacing))
    origin[0] += k * geometry.voxel_spacing[0]
    one = (1, *geometry.volume_shape[1:])
    if algorithm in DIRECT:
        # Rows are filtered one by one and sampled only where the plane's voxels
        # project: the other rows cannot change this plane, so they are dropped.
        j0, j1 = rows_sampled(geometry, k)
        g = _shift_detector(geometry, j0, j1)
        return Problem(_slab(g.projector(backend), k), sinogram[:, :, j0:j1].contiguous(), g, one,
                       geometry.voxel_spacing, tuple(origin), "slice",
                       f"central slice z index {k}, rows {j0}..{j1 - 1}")
    rows = separable_rows(geometry, k)
    if rows is None:
        raise PreviewError("a central-slice preview of an iterative method is exact only for slab-separable "
                           "scans (2D scans, parallel beams with rows at voxel-plane heights); "
                           "use the 2x-binned preview for this scan")
    j0, j1 = rows
    g = _shift_detector(geometry, j0, j1)
    return Problem(_slab(g.projector(backend), k), sinogram[:, :, j0:j1].contiguous(), g, one,
                   geometry.voxel_spacing, tuple(origin), "slice", f"central slice z index {k}, rows {j0}..{j1 - 1}")


def bin_sinogram(sinogram: torch.Tensor, factor: int = 2, view_step: int = 2) -> torch.Tensor:
    """Mean over ``factor`` x ``factor`` detector pixels (``factor`` in 2D), every ``view_step``-th view.

    Trailing pixels that do not fill a bin are dropped.
    """
    s = sinogram[::view_step]
    if s.ndim == 2:
        U = s.shape[1] // factor * factor
        return s[:, :U].reshape(s.shape[0], -1, factor).mean(-1)
    U = s.shape[1] // factor * factor
    V = s.shape[2] // factor * factor
    s = s[:, :U, :V].reshape(s.shape[0], U // factor, factor, V // factor, factor)
    return s.mean(dim=(2, 4))


def binned_geometry(geometry: ScanGeometry, factor: int = 2, view_step: int = 2) -> ScanGeometry:
    """The scan with ``factor``-times larger pixels and voxels and every ``view_step``-th view."""
    t = geometry.trajectory[::view_step]
    ctr = t.detector_center
    new_det, new_dsp = [], []
    axes = (t.detector_u, t.detector_v)
    for a, (n, d) in enumerate(zip(geometry.detector_shape, geometry.detector_spacing)):
        m = max(n // factor, 1)
        # A binned pixel's centre is the mean of its pixels' centres; an odd
        # count drops the last pixel, which moves the centre by half a pixel.
        shift = ((factor * m - 1) / 2 - (n - 1) / 2) * d
        if shift:
            ctr = ctr + shift * axes[a]
        new_det.append(m)
        new_dsp.append(d * factor)
    shape = tuple(max(n // factor, 1) for n in geometry.volume_shape)
    spacing = tuple(d * n / m for n, d, m in zip(geometry.volume_shape, geometry.voxel_spacing, shape))
    return ScanGeometry(t.replace(detector_center=ctr), tuple(new_det), tuple(new_dsp), shape, spacing)


def binned_problem(geometry: ScanGeometry, sinogram: torch.Tensor, *, factor: int = 2, view_step: int = 2,
                   backend: str = "auto") -> Problem:
    """The whole problem at ``factor``-times coarser detector and grid, every ``view_step``-th view."""
    if factor < 1 or view_step < 1:
        raise PreviewError(f"factor and view_step must be positive integers, got {factor}, {view_step}")
    g = binned_geometry(geometry, factor, view_step)
    s = bin_sinogram(sinogram, factor, view_step)
    return Problem(g.projector(backend), s.contiguous(), g, g.volume_shape, g.voxel_spacing,
                   grid_origin(g.volume_shape, g.voxel_spacing), "binned",
                   f"{factor}x binned, 1 view in {view_step}" if view_step > 1 else f"{factor}x binned")


# Above this many (slice voxels x views) an iterative slice preview is no longer quick:
# a large 2D scan (HTC2022: 512^2 x 721) is previewed binned instead.
SLICE_BUDGET = 8_000_000


def choose_mode(geometry: ScanGeometry, algorithm: str) -> str:
    """'slice' where the central slice is exact and quick (direct methods; small separable scans), else 'binned'."""
    if algorithm in DIRECT:
        return "slice"
    H, W = geometry.volume_shape[-2:]
    if H * W * geometry.n_views > SLICE_BUDGET:
        return "binned"
    if geometry.is_2d:
        return "slice"
    return "slice" if separable_rows(geometry, central_index(geometry)) is not None else "binned"


def preview_problem(geometry: ScanGeometry, sinogram: torch.Tensor, algorithm: str, mode: str = "auto", *,
                    backend: str = "auto") -> Problem:
    """The reduced problem of a quick preview; ``mode`` is one of :data:`MODES`."""
    if mode not in MODES:
        raise PreviewError(f"preview mode must be one of {MODES}, got {mode!r}")
    if mode == "auto":
        mode = choose_mode(geometry, algorithm)
    if mode == "slice":
        return slice_problem(geometry, sinogram, algorithm, backend=backend)
    return binned_problem(geometry, sinogram, backend=backend)
