"""Run by tests in a subprocess (python tests/prebuilt_probe.py OUT.pt): every CPU kernel family on a
small cone-beam scan, in float32 and float64, with whichever kernel build this environment loads.

Writes the outputs (torch.save) and what was loaded (``cpu_library.loaded_libraries()``), plus whether a
C++ compiler was found, so a test can compare two environments' builds bit for bit.
"""

from __future__ import annotations

import sys

import torch


def run() -> dict:
    from ctbench import Projector, circular_trajectory_3d, custom_trajectory_3d
    from ctbench.engine.cpu import library as cpu_library
    from ctbench.solvers import fdk

    try:
        compiler = cpu_library.find_compiler()
    except RuntimeError:
        compiler = None
    g = torch.Generator().manual_seed(21)
    out = {}
    for dtype in (torch.float32, torch.float64):
        tag = str(dtype).split(".")[-1]
        tr = circular_trajectory_3d(12, 60.0, 120.0, dtype=dtype)
        op = Projector(tr, (10, 12, 14), (16, 12), voxel_spacing=1.0, detector_spacing=1.6, backend="cpu")
        vol = torch.rand(op.volume_shape, generator=g, dtype=torch.float64).to(dtype)
        sino = torch.rand(op.projection_shape, generator=g, dtype=torch.float64).to(dtype)
        out[f"forward_{tag}"] = op.project(vol)
        out[f"backward_{tag}"] = op.backproject(sino)
        out[f"fdk_{tag}"] = fdk(op, out[f"forward_{tag}"], backend="cpu")
        # geometry VJP kernel (joseph_grad family)
        leaves = [t.detach().clone().requires_grad_(True)
                  for t in (tr.source, tr.detector_center, tr.detector_u, tr.detector_v)]
        loss = (op.project(vol, trajectory=custom_trajectory_3d(*leaves, beam=tr.beam, ndim=tr.ndim)) * sino).sum()
        for name, grad in zip(("source", "center", "u", "v"), torch.autograd.grad(loss, leaves)):
            out[f"grad_{name}_{tag}"] = grad
    return {"outputs": out, "loaded": cpu_library.loaded_libraries(), "compiler": compiler}


if __name__ == "__main__":
    torch.save(run(), sys.argv[1])
