"""SART and OS-SART: the ordered-subset SIRT update with one view (SART) or a few views per subset.

:func:`ctbench.solvers.os_sirt` already *is* OS-SART (Censor & Elfving's
block-iterative SART): each subset update is

    x <- clip(x + relax * C_s A_s^T R_s (b_s - A_s x)),   R_s = 1/(A_s 1),  C_s = 1/(A_s^T 1),

so :func:`os_sart` is that function under its other name, and :func:`sart`
is the case of one view per subset (Andersen & Kak 1984).  One iteration is
one sweep over all views (about one projection and one backprojection of all
views, plus one call overhead per view).  With consistent data and
``relax`` in (0, 2) SART converges to a weighted least-squares solution; with
noisy data it cycles, so a few sweeps (often one or two) and ``relax`` below
1 give the best images.
"""

from __future__ import annotations

import torch

from ._checks import check_projector
from .ordered_subsets import os_sirt, os_sirt_iterations
from .state import ReconResult

__all__ = ["sart", "sart_iterations", "os_sart", "os_sart_iterations"]

os_sart = os_sirt
os_sart_iterations = os_sirt_iterations


def sart_iterations(projector, sinogram: torch.Tensor, n_iter: int = 5, *, relax: float = 1.0, x0=None,
                    bounds=None, tol=None, callback=None, cancel=None, on_subset=None):
    """Generator of SART sweeps (one view per update); yields an :class:`IterationState` after each sweep.

    Arguments and ``extra`` as :func:`ctbench.solvers.os_sirt_iterations` with ``n_subsets = n_views``.
    """
    check_projector(projector)
    return os_sirt_iterations(projector, sinogram, n_iter, n_subsets=projector.n_views, relax=relax, x0=x0,
                              bounds=bounds, tol=tol, callback=callback, cancel=cancel, on_subset=on_subset)


def sart(projector, sinogram: torch.Tensor, n_iter: int = 5, *, relax: float = 1.0, x0=None, bounds=None,
         tol=None, callback=None, cancel=None) -> ReconResult:
    """Run SART for up to ``n_iter`` sweeps; see :func:`sart_iterations`."""
    check_projector(projector)
    return os_sirt(projector, sinogram, n_iter, n_subsets=projector.n_views, relax=relax, x0=x0, bounds=bounds,
                   tol=tol, callback=callback, cancel=cancel)
