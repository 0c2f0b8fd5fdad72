"""FDK/FBP one z-slab at a time from the detector rows that slab needs: the streamed analytic reconstruction.

A circular scan's voxels in planes ``[z0, z1)`` project onto a band of
detector rows (for a cone beam the band widens with the magnification; for a
parallel beam it is the slab's own height).  The band is the projection of
the slab's bounding box (the voxel centres at its eight corners) in every
view, widened by one row on each side because the backprojector's bilinear
sample reads the row beyond each projected point, and clipped to the
detector.  Reading only those rows, pre-weighting and ramp-filtering them
(each row is filtered on its own, so a band filters to exactly the rows of
the whole detector) and backprojecting with the same weights as
:func:`ctbench.solvers.fdk` gives that slab of the whole reconstruction: the
same numbers up to float32 round-off of the band's shifted detector centre
and of the order in which view batches are summed.

:class:`SlabFDK` holds what every slab shares (orbit, weights, rays); the
caller reads the band blocks (from a zarr work store, a file, memory) and
decides which slabs to run where (``ctbench recon``'s streamed pipeline,
torchrun ranks).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..engine.base import Rays
from ..engine.fdk_kernels import weighted_backproject
from . import analytic
from .filtering import check_filter, check_oversample, check_padding
from .weights import F64, orbit_of, redundancy_weights

FILTER_VIEWS = 16     # views pre-weighted and filtered at a time (bounds the float64 pre-weights)


class SlabFDK:
    """The shared state of a slab-by-slab FDK (cone) or FBP (parallel 3D) of one projector's scan."""

    def __init__(self, projector, *, filter: str = "ram-lak", cutoff: float = 1.0, padding: float = 2.0,
                 oversample: int = 1, short_scan="auto", backend: str = "auto", dtype: torch.dtype = torch.float32):
        if projector.is_2d:
            raise ValueError("slab-by-slab FDK reconstructs 3D scans; a 2D scan is one slab: use fdk or fbp")
        self.who = "fdk" if projector.beam == "cone" else "fbp"
        self.projector = projector
        self.filter = check_filter(filter)
        self.cutoff = float(cutoff)
        self.padding = check_padding(padding)
        self.oversample = check_oversample(oversample)
        self.backend = backend
        self.dtype = dtype
        self.orbit = orbit_of(projector, require="circular", who=self.who)
        arc, self.parker = redundancy_weights(self.orbit, short_scan, who=self.who)
        self.weights = (arc * analytic.view_scale(self.orbit)).to(dtype)
        self.grid = projector.grid
        self.n_views = projector.n_views
        self.U, self.V = projector.detector_shape
        self._rays64 = projector._rays(None, F64, torch.device("cpu")).detach()
        self._rows_cache: dict[tuple[int, int], tuple[int, int]] = {}

    # ------------------------------------------------------------ bands
    def rows(self, z0: int, z1: int) -> tuple[int, int]:
        """The detector rows ``[lo, hi)`` (V index) the rays through planes ``[z0, z1)`` cross; lo == hi: none."""
        key = (int(z0), int(z1))
        if key not in self._rows_cache:
            self._rows_cache[key] = self._rows(*key)
        return self._rows_cache[key]

    def band_height(self, z0: int, z1: int) -> int:
        lo, hi = self.rows(z0, z1)
        return hi - lo

    def _rows(self, z0: int, z1: int) -> tuple[int, int]:
        D, H, W = self.grid.shape
        dz, dy, dx = self.grid.spacing
        zs = [(z - (D - 1) / 2) * dz for z in (z0, z1 - 1)]
        ys = [(j - (H - 1) / 2) * dy for j in (0, H - 1)]
        xs = [(i - (W - 1) / 2) * dx for i in (0, W - 1)]
        pts = torch.tensor([[x, y, z] for z in zs for y in ys for x in xs], dtype=F64)      # (8, 3)
        s, c, u, v = self._rays64.tensors()                                                 # (n, 3) each
        n = torch.linalg.cross(u, v, dim=1)
        if self._rays64.cone:
            d = pts[None] - s[:, None]                                                      # (n, 8, 3)
            t = ((c - s) * n).sum(1)[:, None] / (d * n[:, None]).sum(2)
            hit = s[:, None] + t[..., None] * d
        else:
            t = ((c[:, None] - pts[None]) * n[:, None]).sum(2) / (s * n).sum(1)[:, None]
            hit = pts[None] + t[..., None] * s[:, None]
        r = hit - c[:, None]
        uu, uv, vv = (u * u).sum(1)[:, None], (u * v).sum(1)[:, None], (v * v).sum(1)[:, None]
        ru, rv = (r * u[:, None]).sum(2), (r * v[:, None]).sum(2)
        fj = (uu * rv - uv * ru) / (uu * vv - uv * uv) + (self.V - 1) / 2
        lo = max(0, math.floor(float(fj.min())) - 1)
        hi = min(self.V, math.ceil(float(fj.max())) + 2)
        return (lo, hi) if hi > lo else (0, 0)

    # ------------------------------------------------------------ filtering and backprojection
    def filter_band(self, block: torch.Tensor, a: int, b: int, lo: int, hi: int) -> torch.Tensor:
        """Pre-weighted, ramp-filtered views ``[a, b)`` of detector rows ``[lo, hi)``: ``block`` is
        ``(b-a, U, hi-lo)``; returns ``(b-a, (U-1)*oversample+1, hi-lo)`` in :attr:`dtype`."""
        if tuple(block.shape) != (b - a, self.U, hi - lo):
            raise ValueError(f"band block of views [{a}, {b}) and rows [{lo}, {hi}) must be "
                             f"{(b - a, self.U, hi - lo)}, got {tuple(block.shape)}")
        um = (self.U - 1) * self.oversample + 1
        out = torch.empty((b - a, um, hi - lo), dtype=self.dtype)
        block = block.to(self.dtype)
        for s0 in range(a, b, FILTER_VIEWS):
            s1 = min(b, s0 + FILTER_VIEWS)
            part = dataclasses.replace(self.orbit, sdd=self.orbit.sdd[s0:s1], pixel_u=self.orbit.pixel_u[s0:s1],
                                       pixel_v=self.orbit.pixel_v[s0:s1, lo:hi])
            parker = None if self.parker is None else self.parker[s0:s1]
            out[s0 - a:s1 - a] = analytic.filtered_views(
                self.projector, part, block[None, s0 - a:s1 - a], 0, s1 - s0, self.filter, self.cutoff,
                self.padding, parker, self.oversample)[0]
        return out

    def band_rays(self, a: int, b: int, lo: int, hi: int) -> Rays:
        """The rays of views ``[a, b)`` on the sub-detector of rows ``[lo, hi)`` (its centre moved to theirs)."""
        r = analytic.fdk_rays(self.projector, self.dtype, torch.device("cpu"), a, b, self.oversample)
        shift = lo + (hi - lo - 1) / 2 - (self.V - 1) / 2
        return Rays(r.source, r.center + shift * r.vstep, r.ustep, r.vstep, r.cone, (r.detector_shape[0], hi - lo))

    def backproject(self, filtered: torch.Tensor, a: int, b: int, lo: int, hi: int, z0: int, z1: int,
                    out: torch.Tensor) -> torch.Tensor:
        """Add the backprojection of filtered views ``[a, b)`` (rows ``[lo, hi)``) into the slab ``out``."""
        if hi <= lo or b <= a:
            return out
        return weighted_backproject(filtered, self.band_rays(a, b, lo, hi), self.grid, self.weights[a:b],
                                    z0=z0, z1=z1, out=out, backend=self.backend)

    def slab(self, z0: int, z1: int, blocks) -> torch.Tensor:
        """Planes ``[z0, z1)`` of the reconstruction from ``blocks``: an iterable of ``((a, b), block)`` with
        ``block`` the raw line integrals ``(b-a, U, hi-lo)`` of the rows :meth:`rows` gives, covering every view
        once."""
        lo, hi = self.rows(z0, z1)
        out = torch.zeros((z1 - z0, self.grid.H, self.grid.W), dtype=self.dtype)
        with torch.no_grad():
            for (a, b), block in blocks:
                if hi > lo:
                    self.backproject(self.filter_band(block, a, b, lo, hi), a, b, lo, hi, z0, z1, out)
        return out


__all__ = ["SlabFDK"]
