"""Curved detectors on diffct's cell model: the diffct face's ``Projector(..., detector_surface=)``
with ``backend="torch"`` (or diffct's ``"auto"`` off NVIDIA CUDA).

:class:`~ctbench.compat.surfaces.SurfaceProjector` turns every surface pixel into a one-pixel view
of an inner flat projector; here that inner projector is the cell model (compat/cells.py), so a
curved scan agrees with diffct's portable backend as a flat one does."""

from __future__ import annotations

import torch

from ..projector import Projector as _CoreProjector
from .cells import CellStrategy, check_cell_geometry
from .surfaces import SurfaceProjector, pixel_trajectory, sample_offsets

__all__ = ["CellSurfaceProjector"]

_DTYPES = {"fast": torch.float32, "float32": torch.float32, "float64": torch.float64}


class _PixelProjector(_CoreProjector):
    """The cell model over one-pixel views: their frames are built from the surface, not given by
    the user, so only the model's own needs are checked (finite, non-zero axes)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._strategy = CellStrategy(self)

    def _check_trajectory(self, trajectory):
        check_cell_geometry(trajectory, self.beam)
        return trajectory


class CellSurfaceProjector(SurfaceProjector):
    """:class:`SurfaceProjector` on the cell model, with the diffct face's ``precision``."""

    def _cast(self, x):
        dtype = _DTYPES.get(self.__dict__.get("precision"))
        return x.to(dtype) if dtype is not None and isinstance(x, torch.Tensor) and x.is_floating_point() else x

    def project(self, volume, trajectory=None):
        return super().project(self._cast(volume), trajectory)

    def backproject(self, sinogram, trajectory=None):
        return super().backproject(self._cast(sinogram), trajectory)

    __call__ = project

    def _inner(self, trajectory, dtype, device):
        flat = self.flat
        tr = flat.trajectory if trajectory is None else flat._check_override(trajectory)
        off = sample_offsets(self.detector_surface, flat.detector_shape, flat.detector_spacing, flat.is_2d,
                             tr.n_views)
        pix = pixel_trajectory(tr, off, dtype, device)
        return _PixelProjector(pix, flat.volume_shape, 1 if flat.is_2d else (1, 1), beam=flat.beam,
                               voxel_spacing=self._voxel_spacing_arg, backend="reference")
