"""Geometry-gradient benchmark (issue 5): cost of the geometry VJP against a forward projection.

Workload W1 (benchmarks/workloads.py): circular cone beam, 128^3 volume of 2 mm
voxels, 180 views, 128x128 detector of 4 mm pixels, float32.  Measured on the
same projector, best of ``--repeat`` after a warm-up call (which also compiles
the kernels if the cache is cold):

- ``forward``: the executor's projection of the volume (one window);
- ``geometry_vjp``: the executor's geometry VJP, d<A(g) x, y>/d(source, centre,
  u, v) for a dense cotangent y (every ray contributes);
- ``ratio``: geometry_vjp / forward (target <= 2);
- ``autograd_forward`` and ``autograd_geometry_backward``: the same through the
  public API (``Projector.project(x, trajectory=...)`` then ``backward()`` of
  ``<A(g) x, y>`` with learnable trajectory tensors; the volume needs no grad),
  and their ratio.

The CPU is often shared with other work: the timed runs of the operations
being compared are interleaved, best-of-N is reported, and the header line
records the load average at the start.

Output: JSON lines on stdout, appended to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Emitter, interleaved  # noqa: E402
from workloads import W1, w1_projector  # noqa: E402

from ctbench import custom_trajectory_3d  # noqa: E402

BENCH = "geometry_grad"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_geometry_grad.jsonl"
TARGET_RATIO = 2.0


def _best_interleaved(fns, repeat: int, sync) -> tuple[list[float], list[float]]:
    """Best-of-``repeat`` wall and process-CPU times of each function, interleaved call by call after a
    warm-up (harness.interleaved; CPU time is less sensitive to competing processes than wall time)."""
    stats, _ = interleaved(dict(enumerate(fns)), repeat, sync=sync)
    return [stats[i]["seconds"] for i in range(len(fns))], [stats[i]["cpu_min_s"] for i in range(len(fns))]


def _phantom(n: int, dtype, device) -> torch.Tensor:
    """A few Gaussian blobs: smooth and non-zero wherever rays pass."""
    ax = torch.linspace(-1, 1, n, dtype=torch.float64)
    zz, yy, xx = torch.meshgrid(ax, ax, ax, indexing="ij")
    vol = torch.zeros((n, n, n), dtype=torch.float64)
    for (cx, cy, cz), s in (((0.3, 0.1, -0.2), 0.25), ((-0.4, -0.3, 0.3), 0.2), ((0.0, 0.4, 0.1), 0.3)):
        vol += torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2 + (zz - cz) ** 2) / (2 * s * s))
    return vol.to(dtype=dtype, device=device)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="geometry-gradient vs forward projection timing on W1")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines are appended here")
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repeat", type=int, default=3, help="best of this many timed runs")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink W1 (volume and detector) for quick runs")
    args = ap.parse_args(argv)

    device = torch.device("cuda" if args.backend == "cuda" else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    P = w1_projector(args.backend, scale=args.scale)
    dtype = W1["dtype"]
    emit = Emitter(args.out, run_id, bench=BENCH)
    emit(kind="header", machine=platform.machine(), processor=platform.processor(),
         cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(), torch=torch.__version__,
         loadavg=list(os.getloadavg()) if hasattr(os, "getloadavg") else None, backend=args.backend,
         device=str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu",
         workload="W1", scale=args.scale, volume_shape=list(P.volume_shape),
         detector_shape=list(P.detector_shape), n_views=P.n_views, dtype=str(dtype), repeat=args.repeat)

    vol = _phantom(P.volume_shape[0], dtype, device)
    ex = P._executor(device)
    rays = P._rays(None, dtype, device)
    vol4 = vol[None]
    sino = ex.project(vol4, 0, rays)
    cot = torch.randn_like(sino)  # dense cotangent: every ray contributes

    (t_fwd, t_vjp), (c_fwd, c_vjp) = _best_interleaved([lambda: ex.project(vol4, 0, rays),
                                                        lambda: ex.geometry_vjp(vol4, 0, cot, rays)],
                                                       args.repeat, sync)
    rays_total = P.n_views * P.detector_shape[0] * P.detector_shape[1]
    emit(op="forward", seconds=t_fwd, cpu_seconds=c_fwd, rays_per_s=rays_total / t_fwd)
    emit(op="geometry_vjp", seconds=t_vjp, cpu_seconds=c_vjp, rays_per_s=rays_total / t_vjp)
    emit(ratio="geometry_vjp/forward", value=t_vjp / t_fwd, cpu_time_value=c_vjp / c_fwd,
         target=TARGET_RATIO, meets_target=t_vjp / t_fwd <= TARGET_RATIO)

    # End to end through the public API and autograd.
    leaves = [t.detach().to(device).clone().requires_grad_(True) for t in P.trajectory.tensors()]
    w = cot[0]

    def api_forward():
        with torch.no_grad():
            return P.project(vol, trajectory=custom_trajectory_3d(*leaves))

    def api_backward():
        traj = custom_trajectory_3d(*leaves)
        loss = (P.project(vol, trajectory=traj) * w).sum()
        torch.autograd.grad(loss, leaves)

    (t_api_fwd, t_api_fb), (c_api_fwd, c_api_fb) = _best_interleaved([api_forward, api_backward], args.repeat,
                                                                      sync)
    t_api_bwd = max(t_api_fb - t_api_fwd, 0.0)
    c_api_bwd = max(c_api_fb - c_api_fwd, 0.0)
    emit(op="autograd_forward", seconds=t_api_fwd, cpu_seconds=c_api_fwd)
    emit(op="autograd_forward_and_geometry_backward", seconds=t_api_fb, cpu_seconds=c_api_fb)
    emit(ratio="autograd_geometry_backward/autograd_forward", value=t_api_bwd / t_api_fwd,
         cpu_time_value=c_api_bwd / c_api_fwd, target=TARGET_RATIO, meets_target=t_api_bwd / t_api_fwd <= TARGET_RATIO,
         note="backward time = (forward+backward) - forward, each best of N")


if __name__ == "__main__":
    main()
