"""ctbench's diffct-compatible face (docs/FROM_DIFFCT.md): diffct 2.5's public names and module
layout over ctbench's engine, so that a diffct script runs with ``diffct`` replaced by
``ctbench`` (top level) or ``ctbench.compat`` (modules).

=========================  ==============================================================
diffct module              ctbench.compat module
=========================  ==============================================================
``diffct``                 ``ctbench.compat`` (and the top level ``ctbench``)
``diffct.operators``       :mod:`.operators`: :class:`Projector` with diffct's keywords
``diffct.projectors``      :mod:`.projectors`: the six autograd function classes
``diffct.differentiable``  :mod:`.differentiable`: the same classes (diffct's older home)
``diffct.reconstruction``  :mod:`.reconstruction`: functional ``fdk``/``fbp``/``helical_fdk``, ``*_into``
``diffct.analytical``      :mod:`.analytical`: weights, ``ramp_filter_1d``, weighted backprojections
``diffct.solvers``         :mod:`.solvers`: ``cgls``, ``sirt``, ``tv_reconstruction``, ``cgls_into``
``diffct.storage``         :mod:`.storage`: ``TensorStore``, ``NpyStore``
``diffct.surfaces``        :mod:`.surfaces`: ``ParameterizedSurface`` and the curved-detector projector
``diffct.geometry``        :mod:`.geometry`: the trajectory generators
``diffct.utils``           :mod:`.utils`: ``TorchCUDABridge``
``diffct.backends``        :mod:`.backends`: ``ReferenceProjector``
=========================  ==============================================================

The package sits beside the napari plugin, above everything else in ctbench: it imports from
any layer below and nothing below imports it (the import-linter contracts in pyproject.toml).
"""

from .analytical import (
    angular_integration_weights,
    cone_cosine_weights,
    cone_weighted_backproject,
    detector_coordinates_1d,
    fan_cosine_weights,
    fan_weighted_backproject,
    parallel_weighted_backproject,
    parker_weights,
    ramp_filter_1d,
)
from .geometry import (
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    custom_trajectory_2d_fan,
    custom_trajectory_2d_parallel,
    custom_trajectory_3d,
    random_trajectory_3d,
    saddle_trajectory_3d,
    sinusoidal_trajectory_2d_fan,
    sinusoidal_trajectory_2d_parallel,
    sinusoidal_trajectory_3d,
    spiral_trajectory_3d,
    transform_trajectory,
)
from .operators import Projector
from .projectors import (
    ConeBackprojectorFunction,
    ConeProjectorFunction,
    FanBackprojectorFunction,
    FanProjectorFunction,
    ParallelBackprojectorFunction,
    ParallelProjectorFunction,
)
from .reconstruction import fbp, fbp_into, fdk, fdk_into, helical_fdk, helical_view_weights, helical_weighted_backproject
from .solvers import SolverResult, cgls, cgls_into, sirt, total_variation, tv_reconstruction
from .storage import NpyStore, TensorStore
from .surfaces import ParameterizedSurface

# diffct 2.5's __all__, in its order
__all__ = [
    "Projector", "TensorStore", "NpyStore", "ParameterizedSurface", "fbp", "fdk", "fbp_into", "fdk_into",
    "SolverResult", "cgls", "sirt", "tv_reconstruction", "cgls_into", "total_variation", "helical_fdk",
    "helical_view_weights", "helical_weighted_backproject", "ParallelProjectorFunction",
    "ParallelBackprojectorFunction", "FanProjectorFunction", "FanBackprojectorFunction", "ConeProjectorFunction",
    "ConeBackprojectorFunction", "transform_trajectory", "circular_trajectory_3d_parallel", "circular_trajectory_3d",
    "random_trajectory_3d", "spiral_trajectory_3d", "sinusoidal_trajectory_3d", "saddle_trajectory_3d",
    "custom_trajectory_3d", "circular_trajectory_2d_fan", "sinusoidal_trajectory_2d_fan", "custom_trajectory_2d_fan",
    "circular_trajectory_2d_parallel", "sinusoidal_trajectory_2d_parallel", "custom_trajectory_2d_parallel",
    "detector_coordinates_1d", "angular_integration_weights", "fan_cosine_weights", "cone_cosine_weights",
    "parker_weights", "ramp_filter_1d", "parallel_weighted_backproject", "fan_weighted_backproject",
    "cone_weighted_backproject",
]
