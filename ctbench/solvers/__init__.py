"""Reconstruction solvers: analytic (FDK, FBP, helical FDK) and iterative (SIRT, CGLS, TV, OS-SIRT, OS-TV,
and the catalogue: FISTA on composable functionals, FISTA-TV, LSQR, LSMR, transmission MLEM/OS-EM, SART/OS-SART, PWLS, TGV),
and the projector of cylindrical detectors they reconstruct (:class:`CylindricalProjector`).

Analytic solvers return a volume.  Iterative solvers come in two forms: a
generator (``sirt_iterations``, ``cgls_iterations``, ``tv_iterations``,
``os_sirt_iterations``, ``os_tv_iterations``)
that yields an :class:`IterationState` after every iteration (for progress,
live previews and cancellation; ``disk_cgls_iterations`` keeps its vectors in
zarr stores and writes rank-local checkpoints), and a function (``sirt``, ``cgls``,
``tv_reconstruction``) that runs it to the end and returns a
:class:`ReconResult`.  See docs/RECONSTRUCTION.md.
"""

from .analytic import fbp, fdk, fdk_weighting, field_of_view, helical_fdk
from .cgls import cgls, cgls_iterations
from .cylindrical import CylindricalProjector
from .checkpoint import CheckpointError
from .disk_cgls import disk_cgls, disk_cgls_iterations, plan_disk_cgls
from .fista import fista, fista_iterations, fista_tv, fista_tv_iterations
from .em import mlem, mlem_iterations, osem, osem_iterations
from .lsmr import lsmr, lsmr_iterations
from .lsqr import lsqr, lsqr_iterations
from .pwls import pwls, pwls_iterations
from .sart import os_sart, os_sart_iterations, sart, sart_iterations
from .filtering import FILTERS, ramp_filter
from .ordered_subsets import os_sirt, os_sirt_iterations, os_tv_iterations, os_tv_reconstruction
from .sirt import sirt, sirt_iterations
from .state import IterationState, ReconResult
from .tgv import tgv, tgv_iterations
from .streamed import fdk_into
from .tv import divergence, gradient, total_variation, tv_iterations, tv_reconstruction

__all__ = [
    "fdk", "fbp", "helical_fdk", "field_of_view", "fdk_weighting", "ramp_filter", "FILTERS", "CylindricalProjector",
    "sirt", "sirt_iterations", "cgls", "cgls_iterations", "disk_cgls", "disk_cgls_iterations", "plan_disk_cgls",
    "CheckpointError", "fdk_into", "tv_reconstruction", "tv_iterations",
    "total_variation", "gradient", "divergence", "IterationState", "ReconResult",
    "os_sirt", "os_sirt_iterations", "os_tv_reconstruction", "os_tv_iterations",
    "fista", "fista_iterations", "fista_tv", "fista_tv_iterations", "lsqr", "lsqr_iterations", "lsmr",
    "lsmr_iterations",
    "mlem", "mlem_iterations", "osem", "osem_iterations", "sart", "sart_iterations", "os_sart",
    "os_sart_iterations", "pwls", "pwls_iterations", "tgv", "tgv_iterations",
]
