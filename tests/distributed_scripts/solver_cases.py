"""Solver runs shared by the torchrun ranks and the single-process oracle.

Each rank passes its part of the global data (``sinogram[view_slice]``) and
of the global starting volume (``x0[volume_slice]``); the iterates it gets
back are its part of the global iterates.
"""

from __future__ import annotations

import torch

from cases import global_inputs
from ctbench.solvers import cgls, fdk, sirt, total_variation, tv_reconstruction


def run_solver_case(op, case: dict) -> dict:
    gi = global_inputs(case)
    vs, ws = op.volume_slice, op.view_slice
    n_iter = case.get("n_iter", 5)
    b = gi["m"][ws].clone()
    x0 = (0.1 * gi["x"])[vs].clone()
    out = {"volume_slice": (vs.start, vs.stop), "view_slice": (ws.start, ws.stop)}

    # Every rank records the volume after each iteration through the callback.
    def recorder(name):
        seen = out[f"{name}_iterates"] = []

        def callback(state):
            seen.append(state.volume.detach().clone())
            return False
        return callback

    r = cgls(op, b, n_iter, x0=x0, callback=recorder("cgls"))
    out["cgls_residuals"] = torch.tensor(r.residuals, dtype=torch.float64)
    r = sirt(op, b, n_iter, bounds=(0.0, None), callback=recorder("sirt"))
    out["sirt_residuals"] = torch.tensor(r.residuals, dtype=torch.float64)
    r = tv_reconstruction(op, b, n_iter, lam=0.05, callback=recorder("tv"))
    out["tv_residuals"] = torch.tensor(r.residuals, dtype=torch.float64)
    out["tv_objective"] = torch.tensor([h["objective"] for h in r.history], dtype=torch.float64)

    # Analytic: FDK of the rank's views into the rank's slab.
    out["fdk"] = fdk(op, b)

    # The regularizer itself: global value on every rank, exact gradient per slab.
    x = gi["x"][vs].clone().requires_grad_(True)
    tv = total_variation(x, projector=op, eps=1e-3)
    tv.backward()
    out["tv_value"] = tv.detach()
    out["tv_grad"] = x.grad
    for k in ("cgls", "sirt", "tv"):
        out[f"{k}_iterates"] = torch.stack(out[f"{k}_iterates"])
    return out
