"""ctbench: a CT reconstruction workbench.

The engine API follows the ctbench specification: :class:`Projector`,
trajectory generators such as :func:`spiral_trajectory_3d` (diffct 2.5's
frame and signatures, docs/GEOMETRY.md), and the reconstruction solvers in
:mod:`ctbench.solvers`.  The names diffct 2.5 exports at top level exist
here too (the :mod:`ctbench.compat` package, with diffct's module layout;
docs/FROM_DIFFCT.md), so a diffct script runs with its import changed.
"""

from .openmp_env import shorten_idle_spin as _shorten_idle_spin

_shorten_idle_spin()  # before anything loads torch and its libgomp (ctbench/openmp_env.py)

# Names load on first use (PEP 562), so that ``import ctbench.io`` (file readers, no torch) does not pay
# for torch and the engine; ``from ctbench import Projector`` and ``ctbench.Projector`` work as usual.
_LAZY = {
    "NpyStore": "compat",
    "SolverResult": "compat",
    "TensorStore": "compat",
    "angular_integration_weights": "compat",
    "cgls": "compat",
    "cgls_into": "compat",
    "cone_cosine_weights": "compat",
    "detector_coordinates_1d": "compat",
    "fan_cosine_weights": "compat",
    "fbp": "compat",
    "fbp_into": "compat",
    "fdk": "compat",
    "fdk_into": "compat",
    "helical_fdk": "compat",
    "parker_weights": "compat",
    "ramp_filter_1d": "compat",
    "sirt": "compat",
    "total_variation": "compat",
    "tv_reconstruction": "compat",
    "ConeBackprojectorFunction": "compat",
    "ConeProjectorFunction": "compat",
    "FanBackprojectorFunction": "compat",
    "FanProjectorFunction": "compat",
    "ParallelBackprojectorFunction": "compat",
    "ParallelProjectorFunction": "compat",
    "cone_weighted_backproject": "compat",
    "fan_weighted_backproject": "compat",
    "helical_view_weights": "compat",
    "helical_weighted_backproject": "compat",
    "parallel_weighted_backproject": "compat",
    "ParameterizedSurface": "compat",
    "GENERATORS": "geometry",
    "Trajectory": "geometry",
    "circular_trajectory_2d_fan": "geometry",
    "circular_trajectory_2d_parallel": "geometry",
    "circular_trajectory_3d": "geometry",
    "circular_trajectory_3d_parallel": "geometry",
    "custom_trajectory_2d_fan": "geometry",
    "custom_trajectory_2d_parallel": "geometry",
    "custom_trajectory_3d": "geometry",
    "load_trajectory": "geometry",
    "random_trajectory_3d": "geometry",
    "saddle_trajectory_3d": "geometry",
    "save_trajectory": "geometry",
    "sinusoidal_trajectory_2d_fan": "geometry",
    "sinusoidal_trajectory_2d_parallel": "geometry",
    "sinusoidal_trajectory_3d": "geometry",
    "spiral_trajectory_3d": "geometry",
    "transform_trajectory": "geometry",
    "Projector": "compat.keywords",  # the core Projector plus diffct's keywords, ctbench's "auto" (ctbench.compat.keywords)
}

__version__ = "0.1.0"

# ctbench.geometry.GENERATORS, spelled out so that __all__ needs no import
_GENERATOR_NAMES = ("circular_trajectory_3d", "spiral_trajectory_3d", "saddle_trajectory_3d", "sinusoidal_trajectory_3d", "random_trajectory_3d", "custom_trajectory_3d", "circular_trajectory_3d_parallel", "circular_trajectory_2d_fan", "sinusoidal_trajectory_2d_fan", "custom_trajectory_2d_fan", "circular_trajectory_2d_parallel", "sinusoidal_trajectory_2d_parallel", "custom_trajectory_2d_parallel")


_SUBPACKAGES = ("geometry", "engine", "distributed", "storage", "solvers", "workbench", "io", "preprocessing",
                "jobs", "phantoms", "datasets", "compat", "projector")


def __getattr__(name: str):
    from importlib import import_module

    if name in _SUBPACKAGES:  # ``import ctbench; ctbench.solvers.cgls`` keeps working
        return import_module(f"{__name__}.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ctbench' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Projector", "Trajectory", "load_trajectory", "save_trajectory", *_GENERATOR_NAMES, "transform_trajectory",
    "SolverResult", "cgls", "cgls_into", "sirt", "tv_reconstruction", "total_variation",
    "fdk", "fbp", "helical_fdk", "fdk_into", "fbp_into", "TensorStore", "NpyStore",
    "detector_coordinates_1d", "angular_integration_weights", "fan_cosine_weights", "cone_cosine_weights",
    "parker_weights", "ramp_filter_1d",
    "ParallelProjectorFunction", "ParallelBackprojectorFunction", "FanProjectorFunction", "FanBackprojectorFunction",
    "ConeProjectorFunction", "ConeBackprojectorFunction", "parallel_weighted_backproject", "fan_weighted_backproject",
    "cone_weighted_backproject", "helical_view_weights", "helical_weighted_backproject", "ParameterizedSurface",
]
