"""ctbench's top-level :class:`Projector` (``ctbench.Projector``): ctbench's Joseph engine with
diffct's keywords.

It is the diffct-face :class:`ctbench.compat.operators.Projector` (all of diffct's keywords and
their checks) except for one meaning: ``backend="auto"`` (the default) is ctbench's choice, its
compiled kernels for the data's device, where the diffct face's ``"auto"`` is diffct's, its cell
model off NVIDIA CUDA (docs/FROM_DIFFCT.md, "Projection model").  ``backend="torch"`` asks for
diffct's model here too."""

from __future__ import annotations

from .operators import Projector as _DiffctProjector

__all__ = ["Projector"]


class Projector(_DiffctProjector):
    __doc__ = _DiffctProjector.__doc__
    _AUTO_IS_DIFFCT = False

    # ctbench code passes the per-call trajectory positionally: project(x, trajectory)
    def project(self, volume, trajectory=None):
        return super().project(volume, trajectory=trajectory)

    def backproject(self, sinogram, trajectory=None):
        return super().backproject(sinogram, trajectory=trajectory)

    def __call__(self, volume, trajectory=None):
        return super().project(volume, trajectory=trajectory)
