"""diffct's ``diffct.backends`` public names: :class:`ReferenceProjector` and the backend names.

diffct's reference projector is its portable torch implementation of an operator; ctbench's
oracle is its pure-torch ``"reference"`` backend, an independent implementation of the same
Joseph model.  ``ReferenceProjector(owner)`` runs ``owner``'s geometry on it."""

from __future__ import annotations

from ..projector import Projector as _CoreProjector
from .operators import BACKEND_ALIASES

__all__ = ["ReferenceProjector", "BACKEND_ALIASES"]


class ReferenceProjector:
    """``owner``'s operator (a ctbench or diffct-face Projector) on ctbench's reference backend:
    ``project``, ``backproject`` and ``__call__``, differentiable."""

    def __init__(self, owner, *, validate=True, synchronize=True):
        if not isinstance(owner, _CoreProjector):
            raise TypeError(f"owner must be a ctbench Projector, got {type(owner).__name__}")
        self.owner = owner
        is_2d = owner.is_2d
        self._op = _CoreProjector(owner.trajectory, owner.volume_shape if is_2d else owner.global_volume_shape,
                                  owner.detector_shape[0] if is_2d else owner.detector_shape,
                                  beam=owner.beam, detector_spacing=owner.detector_spacing,
                                  voxel_spacing=owner.voxel_spacing, backend="reference")

    def project(self, volume, trajectory=None):
        return self._op.project(volume, trajectory)

    def backproject(self, sinogram, trajectory=None):
        return self._op.backproject(sinogram, trajectory)

    __call__ = project
