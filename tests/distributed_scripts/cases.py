"""Problems and loss recipes shared by the torchrun rank scripts and the single-process oracle.

``run_projector_case(op, case)`` runs the same computation on a distributed
Projector (inside a torchrun rank) and on an ordinary one (in the pytest
process).  Every input is built from the *global* problem and sliced with the
operator's ``volume_slice`` / ``view_slice``; every loss follows the scaling
rules of docs/DISTRIBUTED.md, which reduce to factor 1 in one process.
Results are returned as plain tensors keyed by name, together with the
slices that say which global part they are.
"""

from __future__ import annotations

import torch

from ctbench import Projector, circular_trajectory_3d, spiral_trajectory_3d
from ctbench.distributed import scale_grad


def make_trajectory(case: dict):
    dtype = getattr(torch, case.get("dtype", "float32"))
    n = case["n_views"]
    if case.get("orbit", "circular") == "spiral":
        tr = spiral_trajectory_3d(n, sid=40.0, sdd=80.0, z_range=6.0, n_turns=1.0, dtype=dtype)
    else:
        tr = circular_trajectory_3d(n, 40.0, 80.0, detector_offset=(0.7, -0.4), dtype=dtype)
    return tr


def make_projector(case: dict, *, trajectory=None, **options) -> Projector:
    tr = make_trajectory(case) if trajectory is None else trajectory
    return Projector(tr, tuple(case["volume_shape"]), tuple(case["detector_shape"]),
                     voxel_spacing=case.get("voxel_spacing", (1.1, 0.9, 1.0)), detector_spacing=(1.5, 1.3),
                     **options)


def global_inputs(case: dict):
    """Deterministic global volume, measurements, sinogram and weights."""
    dtype = getattr(torch, case.get("dtype", "float32"))
    g = torch.Generator().manual_seed(int(case.get("seed", 0)))
    D, H, W = case["volume_shape"]
    U, V = case["detector_shape"]
    n = case["n_views"]
    r = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    return {"x": r(D, H, W), "m": r(n, U, V), "y": r(n, U, V), "w": r(D, H, W) - 0.5}


def scales(op) -> dict:
    """Loss divisors of docs/DISTRIBUTED.md (all 1 in one process)."""
    part = getattr(op, "partition", None)
    if part is None:
        return {"projection": 1, "backprojection": 1}
    return {"projection": op.space_world_size, "backprojection": op.view_world_size}


def run_projector_case(op: Projector, case: dict) -> dict:
    """Forward, adjoint, gradients of three losses and inner products; local parts only."""
    gi = global_inputs(case)
    vs, ws = op.volume_slice, op.view_slice
    sc = scales(op)
    out = {"volume_slice": (vs.start, vs.stop), "view_slice": (ws.start, ws.stop)}
    tr0 = op.trajectory

    def leaf_trajectory():
        return tr0.replace(**{f: t.detach().clone().requires_grad_(True)
                              for f, t in zip(("source", "detector_center", "detector_u", "detector_v"),
                                              tr0.tensors())})

    def geometry_grads(tr):
        return torch.stack([t.grad if t.grad is not None else torch.zeros_like(t) for t in tr.tensors()])

    x_local = gi["x"][vs].clone()
    m_local = gi["m"][ws].clone()
    y_local = gi["y"][ws].clone()
    w_local = gi["w"][vs].clone()

    with torch.no_grad():
        out["project"] = op.project(x_local)
        out["backproject"] = op.backproject(y_local)
        out["batched_project"] = op.project(torch.stack([x_local, 2 * x_local]))

    # (1) Projection data term 0.5 |A x - m|^2 over all rays plus an L2
    # regularizer on the volume (undivided: its gradient is never reduced).
    tr = leaf_trajectory()
    x = x_local.clone().requires_grad_(True)
    data = 0.5 * (op.project(x, tr) - m_local).square().sum() / sc["projection"]
    reg = 0.3 * x.square().sum()
    (data + reg).backward()
    # Logging: the regularizer of a slab replicated over view ranks counts once.
    out["loss1"] = data.detach() + reg.detach() / sc["backprojection"]
    out["grad1_volume"] = x.grad
    out["grad1_geometry"] = geometry_grads(tr)

    # (2) Loss on the backprojection of fixed data: <w, A^T y>.
    tr = leaf_trajectory()
    y = y_local.clone().requires_grad_(True)
    loss = (op.backproject(y, tr) * w_local).sum() / sc["backprojection"]
    loss.backward()
    out["loss2"] = loss.detach()
    out["grad2_geometry"] = geometry_grads(tr)
    out["grad2_sinogram"] = y.grad

    # (3) Normal-equation loss 0.5 |A^T (A x - m)|^2: both rules in one graph.
    tr = leaf_trajectory()
    x = x_local.clone().requires_grad_(True)
    loss = 0.5 * op.backproject(op.project(x, tr) - m_local, tr).square().sum() / sc["backprojection"]
    loss.backward()
    out["loss3"] = loss.detach()
    out["grad3_volume"] = x.grad
    out["grad3_geometry"] = geometry_grads(tr)

    # (4) Unrolled step x1 = x - t A^T(Ax - m) with an undivided loss on x1.
    tr = leaf_trajectory()
    x = x_local.clone().requires_grad_(True)
    b = op.backproject(op.project(x, tr) - m_local, tr)
    x1 = x - 0.01 * scale_grad(b, 1 / sc["backprojection"])
    loss = 0.5 * x1.square().sum()
    loss.backward()
    out["loss4"] = loss.detach() / sc["backprojection"]
    out["grad4_volume"] = x.grad
    out["grad4_geometry"] = geometry_grads(tr)

    with torch.no_grad():
        out["inner_volume"] = op.inner_volume(x_local, w_local)
        p = op.project(x_local)
        out["inner_projection"] = op.inner_projection(p, p)
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
