"""Halo exchange of neighbouring z faces for regularizers on space-partitioned volumes.

Under ``partition="space"`` or ``"hybrid"`` a rank owns the planes
``projector.volume_slice`` of the volume.  A regularizer that couples
neighbouring planes (total variation) needs the plane just below and just
above the slab, which live on other ranks (or nowhere, at the ends of the
volume; empty slabs are skipped).  :func:`neighbour_planes` fetches them with
a differentiable all-gather over the rank's space group: the gradient that a
rank computes for a borrowed plane flows back to the plane's owner.
:func:`total_variation_distributed` uses it so that the value and the
gradient of :func:`ctbench.solvers.total_variation` equal the single-process
ones.
"""

from __future__ import annotations

import torch

from ..engine.finite_differences import divergence, gradient
from .collectives import all_gather, global_sum
from .partition import balanced_split


def neighbour_planes(volume: torch.Tensor, projector) -> tuple[torch.Tensor, torch.Tensor]:
    """The global planes just below and just above this rank's slab.

    ``volume`` is the local slab ``(*batch, nz, H, W)``.  Returns
    ``(below, above)``, each ``(*batch, k, H, W)`` with ``k`` 1 when the
    plane exists and 0 at the bottom/top of the global volume.  Every rank of
    the space group must call it (ranks with an empty slab too).
    """
    lay = getattr(getattr(projector, "_strategy", None), "layout", None)
    if lay is None:
        raise ValueError("neighbour_planes needs a Projector built with distributed=True")
    if volume.ndim < 3 or tuple(volume.shape[-3:]) != tuple(projector.volume_shape):
        raise ValueError(f"volume must be this rank's slab (*batch, {', '.join(map(str, projector.volume_shape))}), "
                         f"got {tuple(volume.shape)}")
    S, s = lay.space_world_size, lay.space_rank
    D = projector.global_volume_shape[0]
    nz = volume.shape[-3]
    if nz > 0:
        faces = torch.stack([volume[..., 0, :, :], volume[..., -1, :, :]])
    else:  # zeros that stay in the graph (sum over the empty axis), like the other ranks' faces
        empty_sum = volume.sum(dim=-3)
        faces = torch.stack([empty_sum, empty_sum])
    gathered = all_gather(faces, lay.space_group)  # (S, 2, *batch, H, W)
    sizes = [balanced_split(D, S, i) for i in range(S)]
    below_rank = next((i for i in range(s - 1, -1, -1) if sizes[i].stop > sizes[i].start), None)
    above_rank = next((i for i in range(s + 1, S) if sizes[i].stop > sizes[i].start), None)
    # Missing planes are empty slices of the gathered faces, so that every
    # rank's result stays in the graph and joins the backward all-reduce.
    below = gathered[s if below_rank is None else below_rank, 1].unsqueeze(-3)
    above = gathered[s if above_rank is None else above_rank, 0].unsqueeze(-3)
    return (below[..., :0, :, :] if below_rank is None else below,
            above[..., :0, :, :] if above_rank is None else above)


def _split_spatially(projector) -> bool:
    return getattr(projector, "partition", None) in ("space", "hybrid") and projector.space_world_size > 1


def gradient_distributed(x: torch.Tensor, projector, ndim: int = 3) -> torch.Tensor:
    """:func:`ctbench.solvers.gradient` of the global volume, for this rank's slab.

    Forward differences along (z, y, x), zero on each axis's last global
    plane; the z difference of the slab's top plane uses the plane above
    (halo).  Returns ``(3, *x.shape)``.
    """
    if not _split_spatially(projector):
        return gradient(x, ndim)
    if ndim != 3:
        raise ValueError(f"a space-partitioned volume has 3 spatial axes, got ndim={ndim}")
    _, above = neighbour_planes(x, projector)
    nz = x.shape[-3]
    ext = torch.cat([x, above], dim=-3)
    dz = ext[..., 1:, :, :] - ext[..., :-1, :, :]
    if above.shape[-3] == 0 and nz > 0:  # the global top plane: zero difference
        dz = torch.cat([dz, torch.zeros_like(x[..., :1, :, :])], dim=-3)
    return torch.cat([dz.unsqueeze(0), gradient(x, 2)])


def divergence_distributed(q: torch.Tensor, projector) -> torch.Tensor:
    """:func:`ctbench.solvers.divergence` of a field from :func:`gradient_distributed`.

    Minus the adjoint of the distributed gradient: the z part of each slab's
    bottom plane uses ``q_z`` of the plane below (halo); ``q_z`` of the
    global top plane never contributes.
    """
    if not _split_spatially(projector):
        return divergence(q)
    if q.shape[0] != 3:
        raise ValueError(f"q must hold 3 components (z, y, x), got {q.shape[0]}")
    qz = q[0]
    nz = qz.shape[-3]
    below, above = neighbour_planes(qz, projector)
    if above.shape[-3] == 0 and nz > 0:  # the global top plane has no difference
        qz = torch.cat([qz[..., :-1, :, :], torch.zeros_like(qz[..., -1:, :, :])], dim=-3)
    prev = torch.cat([below, qz], dim=-3)
    if below.shape[-3] == 0:  # the global bottom plane: nothing below
        prev = torch.cat([torch.zeros_like(qz[..., :1, :, :]), qz], dim=-3) if nz else prev
    div_z = qz - prev[..., :nz, :, :]  # q_z[k] - q_z[k-1], as in the single-process divergence
    return div_z + divergence(q[1:])


def total_variation_distributed(volume: torch.Tensor, projector, *, eps: float) -> torch.Tensor:
    """:func:`ctbench.solvers.total_variation` of the global volume from this rank's slab.

    ``TV_eps(x) = sum_v sqrt(|D x|^2[v] + eps)`` with the forward differences
    of :func:`gradient_distributed`.  Every rank of the space group must call
    it.  The value is the global one on every rank; the gradient of each slab
    is exact (the rank's own share), so add it to a loss undivided.
    """
    if not _split_spatially(projector):
        ndim = len(projector.volume_shape)
        return torch.sqrt(gradient(volume, ndim).square().sum(0) + eps).sum()
    g = gradient_distributed(volume, projector)
    share = torch.sqrt(g.square().sum(0) + eps).sum()
    return global_sum(share, projector._strategy.layout.space_group)


