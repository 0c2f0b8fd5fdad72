"""Exact line integrals of a Gaussian blob along the rays of detector pixels (the independent truth
of the diffct compatibility tests)."""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def pixel_rays(traj, U: int, V: int, du: float = 1.0):
    """(origins, directions) of the rays through every pixel centre, (n, U, V, 3) in float64
    (directions not normalised; a parallel beam's rays start at the pixels)."""
    src, ctr, u, v = (t.detach().to(F64) for t in traj.tensors())
    iu = (torch.arange(U, dtype=F64) - (U - 1) / 2) * du
    iv = (torch.arange(V, dtype=F64) - (V - 1) / 2) * du
    pix = ctr[:, None, None] + iu[None, :, None, None] * u[:, None, None] + iv[None, None, :, None] * v[:, None, None]
    if traj.beam == "cone":
        return src[:, None, None].expand_as(pix), pix - src[:, None, None]
    return pix, src[:, None, None].expand_as(pix)


def gauss_line_integrals(origins, directions, centre, sigma, planar=False):
    """Integrals of exp(-|x - c|^2 / 2 sigma^2) along whole lines: sqrt(2 pi) sigma exp(-d^2 / 2 sigma^2),
    d the line's distance from c (``planar``: a 2D image, i.e. a cylinder along z)."""
    d = directions / directions.norm(dim=-1, keepdim=True)
    w = torch.tensor([*centre, 0.0][:3], dtype=F64) - origins
    if planar:
        w[..., 2] = 0.0
    perp = w - (w * d).sum(-1, keepdim=True) * d
    return math.sqrt(2 * math.pi) * sigma * torch.exp(-(perp ** 2).sum(-1) / (2 * sigma ** 2))
