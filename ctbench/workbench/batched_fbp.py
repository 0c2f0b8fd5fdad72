"""FBP/FDK one batch of views at a time, so a GUI can show real progress (views done / all views).

The filtered backprojection is a sum over views: each batch is pre-weighted,
ramp-filtered and backprojected into the same volume with the solvers' own
public pieces (``orbit_of``, ``redundancy_weights``, ``filtered_views``,
``fdk_rays``, ``weighted_backproject``), so the result equals
:func:`ctbench.solvers.fdk` / :func:`~ctbench.solvers.fbp` (same weights,
same kernel; only the summation is split).  Helical scans and distributed
projectors are not split (:func:`splittable` says so).
"""

from __future__ import annotations

import torch


def splittable(projector, kind: str) -> bool:
    """Whether the view-batched path applies: circular orbits / parallel rotations on one process."""
    if kind == "spiral" and projector.beam == "cone" and not projector.is_2d:
        return False
    n = projector.projection_shape[0]
    views = getattr(projector, "view_slice", slice(0, n))
    return getattr(projector, "view_group", None) is None and (views.start, views.stop) == (0, n)


def filtered_backprojection_in_batches(projector, sinogram: torch.Tensor, *, filter: str = "ram-lak",
                                       batch: int = 16, backend: str = "auto"):
    """Generator: yields ``(views done, n_views)`` after each batch and returns the volume
    ``projector.volume_shape`` (FDK for cone/fan beams, FBP for parallel beams, Parker weights for short scans)."""
    from ..engine.fdk_kernels import weighted_backproject
    from ..solvers import analytic
    from ..solvers.filtering import check_filter
    from ..solvers.weights import orbit_of, redundancy_weights

    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive number of views, got {batch!r}")
    filter = check_filter(filter)
    who = "fdk" if projector.beam == "cone" else "fbp"
    orbit = orbit_of(projector, require="circular", who=who)
    arc, parker = redundancy_weights(orbit, "auto", who=who)
    weights = arc * analytic.view_scale(orbit)
    n = projector.projection_shape[0]
    if tuple(sinogram.shape) != tuple(projector.projection_shape):
        raise ValueError(f"sinogram has shape {tuple(sinogram.shape)} but the scan expects "
                         f"{tuple(projector.projection_shape)}")
    sino4 = sinogram.reshape(1, *projector.projection_shape)
    if projector.is_2d:
        sino4 = sino4.unsqueeze(-1)
    sl = getattr(projector, "volume_slice", slice(0, projector.global_volume_shape[0]))
    grid = projector.grid
    out = torch.zeros((sl.stop - sl.start, grid.H, grid.W), dtype=sinogram.dtype, device=sinogram.device)
    with torch.no_grad():
        for a in range(0, n, batch):
            b = min(a + batch, n)
            # filtered_views takes the full-scan pre-weights and picks views [a, b) itself.
            filt = analytic.filtered_views(projector, orbit, sino4[:, a:b], a, b, filter, 1.0, 2.0, parker, 1)
            rays = analytic.fdk_rays(projector, filt.dtype, filt.device, a, b, 1)
            w = weights[a:b].to(device=filt.device, dtype=filt.dtype)
            weighted_backproject(filt[0], rays, grid, w, z0=sl.start, z1=sl.stop, out=out, backend=backend)
            yield b, n
    return out.reshape(projector.volume_shape)
