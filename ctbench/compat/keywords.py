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

    @property
    def backend(self) -> str:
        """The backend that runs: for ``backend="auto"`` ctbench's engine's choice ("cpu", or "cuda" for CUDA
        tensors: :attr:`engine_backend`), not the label diffct would show; otherwise the name asked for."""
        label = self.__dict__.get("_backend_label")
        if getattr(self, "backend_name", None) == "auto" and not getattr(self, "_cell_model", False):
            return self.engine_backend
        return label

    @backend.setter
    def backend(self, label: str) -> None:
        self.__dict__["_backend_label"] = label

    # ctbench code passes the per-call trajectory positionally: project(x, trajectory)
    def project(self, volume, trajectory=None):
        return super().project(volume, trajectory=trajectory)

    def backproject(self, sinogram, trajectory=None):
        return super().backproject(sinogram, trajectory=trajectory)

    def __call__(self, volume, trajectory=None):
        return super().project(volume, trajectory=trajectory)
