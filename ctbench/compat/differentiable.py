"""diffct's older home of the autograd function classes (``diffct.differentiable``); they live in
:mod:`ctbench.compat.projectors`."""

from .projectors import (  # noqa: F401
    ConeBackprojectorFunction,
    ConeProjectorFunction,
    FanBackprojectorFunction,
    FanProjectorFunction,
    ParallelBackprojectorFunction,
    ParallelProjectorFunction,
)

__all__ = ["ParallelProjectorFunction", "ParallelBackprojectorFunction", "FanProjectorFunction",
           "FanBackprojectorFunction", "ConeProjectorFunction", "ConeBackprojectorFunction"]
