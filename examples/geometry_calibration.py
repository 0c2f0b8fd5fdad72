"""Geometry calibration by gradient descent on the projection loss.

A circular cone-beam scan of a known calibration phantom (a few Gaussian
blobs) is simulated with four hidden errors in the scan geometry:

- a detector shift along u and along v (in pixels),
- an in-plane rotation of the detector about its normal (degrees),
- an error of the source-to-isocentre distance (mm; the detector stays put).

Starting from the nominal geometry, the four parameters are recovered by
minimising ``|| A(g(p)) x - y ||^2`` with L-BFGS: the gradient with respect to
``p`` flows from the projector's geometry-gradient kernel through ordinary
torch autograd of :func:`scan_geometry`.  The data are noiseless and the
model is exact, so the minimum sits at the true values.

Run:  python examples/geometry_calibration.py [--size 40] [--views 24]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch

from ctbench import Projector, circular_trajectory_3d, custom_trajectory_3d

PARAMETERS = ("shift_u_px", "shift_v_px", "rotation_deg", "source_distance_error_mm")
# Optimisation units: one unit of each moves detector features by roughly a
# pixel, which keeps the problem well scaled for L-BFGS.
_UNITS = torch.tensor([1.0, 1.0, 1.0, 10.0], dtype=torch.float64)


@dataclass
class Scan:
    """Nominal scan: circular orbit and detector."""

    n_views: int = 24
    sid: float = 250.0
    sdd: float = 500.0
    volume_shape: tuple[int, int, int] = (40, 40, 40)
    voxel_spacing: float = 1.0
    detector_shape: tuple[int, int] = (48, 48)
    detector_spacing: float = 2.0
    dtype: torch.dtype = torch.float64


def scan_geometry(scan: Scan, params: torch.Tensor):
    """The trajectory for parameters ``(shift_u_px, shift_v_px, rotation_deg, source_distance_error_mm)``.

    Differentiable in ``params``.  Shifts move the detector centre along the
    nominal u and v axes; the rotation turns u and v about the detector normal.
    """
    nominal = circular_trajectory_3d(scan.n_views, scan.sid, scan.sdd, dtype=scan.dtype)
    p = params.to(scan.dtype)
    u0, v0 = nominal.detector_u, nominal.detector_v
    radial = nominal.source / scan.sid  # isocentre -> source, unit length
    source = (scan.sid + p[3]) * radial
    center = nominal.detector_center + scan.detector_spacing * (p[0] * u0 + p[1] * v0)
    phi = p[2] * (math.pi / 180.0)
    u = torch.cos(phi) * u0 + torch.sin(phi) * v0
    v = -torch.sin(phi) * u0 + torch.cos(phi) * v0
    return custom_trajectory_3d(source, center, u, v)


def calibration_phantom(scan: Scan) -> torch.Tensor:
    """Smooth, asymmetric Gaussian blobs (known to the calibration)."""
    D, H, W = scan.volume_shape
    s = scan.voxel_spacing
    z = (torch.arange(D, dtype=scan.dtype) - (D - 1) / 2) * s
    y = (torch.arange(H, dtype=scan.dtype) - (H - 1) / 2) * s
    x = (torch.arange(W, dtype=scan.dtype) - (W - 1) / 2) * s
    zz, yy, xx = torch.meshgrid(z, y, x, indexing="ij")
    r = min(D, H, W) * s / 2
    blobs = [  # centre (x, y, z) as a fraction of the half-size, width (fraction), amplitude
        ((0.45, 0.10, 0.40), 0.12, 1.0), ((-0.40, 0.35, -0.30), 0.15, 0.8), ((0.05, -0.50, 0.05), 0.10, 1.2),
        ((-0.20, -0.15, 0.55), 0.09, 0.9), ((0.30, 0.45, -0.50), 0.11, 0.7), ((0.0, 0.0, 0.0), 0.30, 0.3),
    ]
    vol = torch.zeros(scan.volume_shape, dtype=scan.dtype)
    for (cx, cy, cz), width, amp in blobs:
        d2 = (xx - cx * r) ** 2 + (yy - cy * r) ** 2 + (zz - cz * r) ** 2
        vol += amp * torch.exp(-d2 / (2 * (width * r) ** 2))
    return vol


def make_projector(scan: Scan, backend: str = "cpu") -> Projector:
    nominal = circular_trajectory_3d(scan.n_views, scan.sid, scan.sdd, dtype=scan.dtype)
    return Projector(nominal, scan.volume_shape, scan.detector_shape, voxel_spacing=scan.voxel_spacing,
                     detector_spacing=scan.detector_spacing, backend=backend)


def calibrate(projector: Projector, scan: Scan, phantom: torch.Tensor, measured: torch.Tensor,
              n_iter: int = 60, tol: float = 1e-12) -> tuple[torch.Tensor, list[float]]:
    """Recover the four parameters from ``measured`` by L-BFGS on the squared projection error.

    Returns the parameters (in the units of PARAMETERS) and the loss history.
    """
    z = torch.zeros(4, dtype=torch.float64, requires_grad=True)  # start at the nominal geometry
    scale = measured.square().sum().item()
    opt = torch.optim.LBFGS([z], lr=1.0, max_iter=20, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-14, tolerance_change=1e-16)
    history: list[float] = []

    def closure():
        opt.zero_grad()
        traj = scan_geometry(scan, z * _UNITS)
        loss = (projector.project(phantom, trajectory=traj) - measured).square().sum() / scale
        loss.backward()
        return loss

    for _ in range(max(1, n_iter // 20)):
        loss = opt.step(closure)
        history.append(float(loss.detach()))
        if history[-1] < tol:
            break
    return (z.detach() * _UNITS), history


def run(size: int = 40, views: int = 24, truth=(1.7, -0.9, 0.8, 8.0), backend: str = "cpu",
        dtype: torch.dtype = torch.float64, n_iter: int = 60):
    """Simulate, calibrate and return ``(true, recovered, loss history)`` as dicts/lists."""
    scan = Scan(n_views=views, volume_shape=(size, size, size), detector_shape=(int(1.2 * size),) * 2,
                dtype=dtype)
    projector = make_projector(scan, backend)
    phantom = calibration_phantom(scan)
    true = torch.tensor(truth, dtype=torch.float64)
    with torch.no_grad():
        measured = projector.project(phantom, trajectory=scan_geometry(scan, true))
    recovered, history = calibrate(projector, scan, phantom, measured, n_iter=n_iter)
    as_dict = lambda t: {name: float(v) for name, v in zip(PARAMETERS, t)}
    return as_dict(true), as_dict(recovered), history


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=40, help="volume edge in voxels (detector is 1.2x)")
    ap.add_argument("--views", type=int, default=24)
    ap.add_argument("--iters", type=int, default=60, help="L-BFGS iterations")
    ap.add_argument("--float32", action="store_true", help="compute in float32 instead of float64")
    ap.add_argument("--truth", type=float, nargs=4, default=(1.7, -0.9, 0.8, 8.0), metavar="P",
                    help="hidden shift_u_px shift_v_px rotation_deg source_distance_error_mm")
    args = ap.parse_args(argv)
    dtype = torch.float32 if args.float32 else torch.float64
    true, rec, history = run(args.size, args.views, tuple(args.truth), dtype=dtype, n_iter=args.iters)
    print(f"loss: {history[0]:.3e} -> {history[-1]:.3e} in {len(history)} L-BFGS rounds")
    print(f"{'parameter':<28}{'true':>12}{'recovered':>14}{'error':>12}")
    for name in PARAMETERS:
        print(f"{name:<28}{true[name]:>12.4f}{rec[name]:>14.4f}{rec[name] - true[name]:>12.2e}")


if __name__ == "__main__":
    main()
