"""The calibrated geometry as a differentiable function of the calibration parameters.

Every view keeps its nominal frame (unit detector axes ``u``, ``v``, normal
``n = u x v``, beam direction ``w`` from source to detector).  In the order applied:

1. per-view object translation ``t_i = (shift_u_i u + shift_v_i v) * du / M_i``
   (pixels at the detector, ``M_i`` the view's magnification): the source and
   the detector move by ``-t_i`` (moving the object is moving the scanner the other way);
2. ``axis_tilt``: source and detector turn about the view's lateral axis ``u``
   through the isocentre (the rotation axis leans towards the beam);
3. ``offset_u``, ``offset_v``: the detector centre moves along ``u`` and ``v``;
4. ``roll`` (about ``n``), ``pitch`` (about ``u``), ``yaw`` (about ``v``):
   the detector turns about its centre;
5. ``sdd``: the detector centre moves along ``w``.

All tensors stay differentiable in the parameters (the projector's geometry
gradients flow through ordinary autograd).
"""

from __future__ import annotations

import math

import torch

from ..geometry import Trajectory

__all__ = ["GeometryModel", "complement_basis"]

F64 = torch.float64


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t / t.norm(dim=-1, keepdim=True)


def _skew(w: torch.Tensor) -> torch.Tensor:
    z = torch.zeros_like(w[..., 0])
    return torch.stack([torch.stack([z, -w[..., 2], w[..., 1]], -1),
                        torch.stack([w[..., 2], z, -w[..., 0]], -1),
                        torch.stack([-w[..., 1], w[..., 0], z], -1)], -2)


def _rotate(R: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (R @ x.unsqueeze(-1)).squeeze(-1)


class GeometryModel:
    """Maps parameter values to a :class:`~ctbench.geometry.Trajectory` around a nominal one.

    ``pitch`` is the full-resolution detector pitch ``(du, dv)`` in mm: pixel
    parameters are converted with it whatever the binning of the level that uses them.
    """

    def __init__(self, nominal: Trajectory, pitch: tuple[float, float]):
        self.nominal = nominal.detach()
        self.beam = nominal.beam
        self.du, self.dv = float(pitch[0]), float(pitch[1])
        src, ctr, u, v = (t.to(F64).cpu() for t in self.nominal.tensors())
        self.src, self.ctr, self.u, self.v = src, ctr, u, v
        self.uh, self.vh = _unit(u), _unit(v)
        self.nh = _unit(torch.linalg.cross(self.uh, self.vh, dim=1))
        if self.beam == "cone":
            sign = torch.sign(((ctr - src) * self.nh).sum(1, keepdim=True))
            self.w = self.nh * torch.where(sign == 0, torch.ones_like(sign), sign)
            sid = -(src * self.w).sum(1)
            sdd = ((ctr - src) * self.w).sum(1)
            self.magnification = torch.where(sid > 0, sdd / sid.clamp_min(1e-12), torch.ones_like(sid))
        else:
            self.w = _unit(src)
            self.magnification = torch.ones(src.shape[0], dtype=F64)

    @property
    def n_views(self) -> int:
        return self.src.shape[0]

    def apply(self, g: dict, shift_u: torch.Tensor | None = None, shift_v: torch.Tensor | None = None,
              *, dtype=None) -> Trajectory:
        """The trajectory for global values ``g`` ({name: scalar tensor or float}) and per-view shifts (px)."""
        n = self.n_views
        zero = torch.zeros((), dtype=F64)

        def val(name):
            x = g.get(name, zero)
            return torch.as_tensor(x, dtype=F64)

        src, ctr, u, v = self.src, self.ctr, self.u, self.v
        uh, vh = self.uh, self.vh
        cone = self.beam == "cone"
        # 1. per-view object translation (the scanner moves the other way)
        if shift_u is not None or shift_v is not None:
            su = torch.zeros(n, dtype=F64) if shift_u is None else shift_u.to(F64)
            sv = torch.zeros(n, dtype=F64) if shift_v is None else shift_v.to(F64)
            t = (su * self.du / self.magnification)[:, None] * uh + (sv * self.dv / self.magnification)[:, None] * vh
            ctr = ctr - t
            if cone:
                src = src - t
        # 2. rotation-axis tilt towards the beam: turn the scanner about each view's lateral axis
        tilt = val("axis_tilt") * (math.pi / 180)
        if "axis_tilt" in g:
            R = torch.linalg.matrix_exp(_skew(tilt * uh))
            # the source (or a parallel beam's ray direction) turns with the detector
            src, ctr, u, v = _rotate(R, src), _rotate(R, ctr), _rotate(R, u), _rotate(R, v)
        # 3. detector offsets along its (nominal) axes
        ctr = ctr + (val("offset_u") * self.du) * uh + (val("offset_v") * self.dv) * vh
        # 4. detector rotation about its centre
        if any(k in g for k in ("roll", "pitch", "yaw")):
            deg = math.pi / 180
            omega = (val("roll") * deg) * self.nh + (val("pitch") * deg) * uh + (val("yaw") * deg) * vh
            R = torch.linalg.matrix_exp(_skew(omega))
            u, v = _rotate(R, u), _rotate(R, v)
        # 5. source-detector distance
        if cone and "sdd" in g:
            ctr = ctr + val("sdd") * self.w
        dtype = dtype or self.nominal.dtype
        meta = dict(self.nominal.meta)
        meta["calibrated"] = True
        return Trajectory(src.to(dtype), ctr.to(dtype), u.to(dtype), v.to(dtype), beam=self.beam,
                          ndim=self.nominal.ndim, meta=meta)

    def gauge_vectors(self, free_shifts: tuple[str, ...], free_global: tuple[str, ...]) -> torch.Tensor:
        """Directions of the per-view shifts ``[shift_u; shift_v]`` the data cannot see, as columns.

        A fixed translation of the object (x, y, z) only moves the reconstruction;
        a constant shift along u (v) is the detector offset when that one is free.
        """
        n = self.n_views
        parts = {"shift_u": (self.uh, self.du), "shift_v": (self.vh, self.dv)}
        cols = []
        for e in torch.eye(3, dtype=F64):
            col = [((axis @ e) * self.magnification / pitch) for name, (axis, pitch) in parts.items()
                   if name in free_shifts]
            cols.append(torch.cat(col))
        for name, off in (("shift_u", "offset_u"), ("shift_v", "offset_v")):
            if name in free_shifts and off in free_global:
                col = [torch.ones(n, dtype=F64) if k == name else torch.zeros(n, dtype=F64)
                       for k in parts if k in free_shifts]
                cols.append(torch.cat(col))
        return torch.stack(cols, 1)


def complement_basis(N: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis (columns) of the complement of span(N) (columns of N, rank-revealed)."""
    m = N.shape[0]
    Uq, s, _ = torch.linalg.svd(N, full_matrices=True)
    rank = int((s > 1e-9 * s.max()).sum()) if s.numel() else 0
    return Uq[:, rank:m]

