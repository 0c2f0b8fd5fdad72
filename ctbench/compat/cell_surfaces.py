"""Curved detectors on diffct's cell model: the diffct face's ``Projector(..., detector_surface=)``
with ``backend="torch"`` (or diffct's ``"auto"`` off NVIDIA CUDA).

:class:`~ctbench.compat.surfaces.SurfaceProjector` turns every surface pixel into a one-pixel view
of an inner flat projector; here that inner projector is the cell model (compat/cells.py), so a
curved scan agrees with diffct's portable backend as a flat one does."""

from __future__ import annotations

import torch

from .cells import check_cell_geometry
from .operators import Projector
from .surfaces import SurfaceProjector

__all__ = ["CellSurfaceProjector"]


class _PixelProjector(Projector):
    """The cell model over one-pixel views: their frames are built from the surface, not given by
    the user, so only the model's own needs are checked (finite, non-zero axes)."""

    def _check_trajectory(self, trajectory):
        check_cell_geometry(trajectory, self.beam)
        return trajectory


class CellSurfaceProjector(SurfaceProjector):
    def _inner(self, trajectory, dtype, device):
        from .surfaces import pixel_trajectory, sample_offsets

        flat = self.flat
        tr = flat.trajectory if trajectory is None else flat._check_override(trajectory)
        off = sample_offsets(self.detector_surface, flat.detector_shape, flat.detector_spacing, flat.is_2d,
                             tr.n_views)
        pix = pixel_trajectory(tr, off, dtype, device)
        return _PixelProjector(pix, flat.volume_shape, 1 if flat.is_2d else (1, 1), beam=flat.beam,
                               voxel_spacing=self._voxel_spacing_arg, backend="torch",
                               precision=self.__dict__.get("precision") or
                               ("float64" if dtype == torch.float64 else "float32"))
