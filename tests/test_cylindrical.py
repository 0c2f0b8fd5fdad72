"""Cylindrical (curved) detectors: the fast projector against the per-pixel surface projector (the oracle),
its adjoint and gradients, the weighted backprojection's cylinder mode on every backend against the reference,
and FDK on a cylinder against exact line integrals of ellipsoids."""

from __future__ import annotations

import math
import os

import pytest
import torch

from ctbench.compat.surfaces import SurfaceProjector
from ctbench.engine.base import Rays, VolumeGrid
from ctbench.engine.fdk_kernels import CYLINDER, weighted_backproject
from ctbench.geometry import circular_trajectory_2d_fan, circular_trajectory_3d
from ctbench.phantoms import Ellipsoid, ellipsoid_line_integrals, ellipsoid_phantom, shepp_logan_ellipsoids
from ctbench.solvers import CylindricalProjector, cgls, fbp, fdk, fdk_weighting, field_of_view
from ctbench.solvers.cylindrical import cylinder_pixels
from ctbench.workbench.design import ScanGeometry, TrajectoryDesign

F64 = torch.float64


def _surface(R):
    """The same cylinder as a diffct detector_surface (local offsets t, w, h), for the per-pixel oracle."""
    return lambda u, v: torch.stack([R * torch.sin(u / R), v, R * (torch.cos(u / R) - 1)], -1)


def _cylinder_sinogram(ells, traj, det, pitch, radius=None):
    """Exact line integrals from the source to every cylinder pixel (positions written independently here: with a
    fixed radius R the arc about the axis through c - R n; source-centred, the circle about the source's vertical
    through the centre c, starting at c)."""
    U, V = det
    du, dv = pitch
    src, ctr, u, v = (t.double() for t in traj.tensors())
    out = torch.empty((traj.n_views, U, V), dtype=F64)
    for k in range(traj.n_views):
        s, c, vk = src[k], ctr[k], v[k] / v[k].norm()
        if radius is None:
            axis_point = s + ((c - s) @ vk) * vk
            R = float((c - axis_point).norm())
            n = (c - axis_point) / R
            t = torch.linalg.cross(vk, n)
            t = t if float(t @ u[k]) > 0 else -t
        else:
            n = torch.linalg.cross(u[k], v[k])
            n = n / n.norm()
            n = n if float((c - s) @ n) > 0 else -n
            R, t = float(radius), u[k] / u[k].norm()
            axis_point = c - R * n
        a = (torch.arange(U, dtype=F64) - (U - 1) / 2) * du / R
        h = (torch.arange(V, dtype=F64) - (V - 1) / 2) * dv
        pos = axis_point[None, None, :] + R * (torch.sin(a)[:, None, None] * t + torch.cos(a)[:, None, None] * n) \
            + h[None, :, None] * vk
        d = pos - src[k]
        d = d / d.norm(dim=-1, keepdim=True)
        out[k] = ellipsoid_line_integrals(ells, src[k].expand(U * V, 3), d.reshape(-1, 3)).reshape(U, V)
    return out


@pytest.mark.parametrize("radius", [None, 300.0])
def test_projector_equals_the_per_pixel_oracle(radius):
    traj = circular_trajectory_3d(10, 60.0, 110.0, detector_offset=(0.7, 1.3), dtype=F64)
    kw = dict(detector_spacing=(2.0, 1.5), voxel_spacing=(1.1, 0.9, 1.0), backend="cpu")
    fast = CylindricalProjector(traj, (10, 12, 11), (15, 9), radius=radius, **kw)
    # the oracle's surface is a cylinder of one radius bent about the frame's own u: source-centred, only a
    # centred detector is that (the offset detector's cylinder passes through its shifted centre)
    if radius is None:
        traj = circular_trajectory_3d(10, 60.0, 110.0, detector_offset=(0.0, 1.3), dtype=F64)
        fast = CylindricalProjector(traj, (10, 12, 11), (15, 9), **kw)
    R = 110.0 if radius is None else radius
    oracle = SurfaceProjector(traj, (10, 12, 11), (15, 9), detector_surface=_surface(R), **kw)
    x = torch.rand(10, 12, 11, dtype=F64, generator=torch.Generator().manual_seed(0))
    y = fast.project(x)
    torch.testing.assert_close(y, oracle.project(x), rtol=1e-12, atol=1e-12)
    q = torch.rand(y.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(fast.backproject(q), oracle.backproject(q), rtol=1e-12, atol=1e-12)
    # the pixels themselves: the module's formula and the independent one of _cylinder_sinogram
    ells = [Ellipsoid(1.0, (8.0, 6.0, 7.0), (1.0, -2.0, 0.5))]
    exact = _cylinder_sinogram(ells, traj, (15, 9), (2.0, 1.5), radius)
    pix = cylinder_pixels(traj, (15, 9), (2.0, 1.5), radius)
    src = traj.source[:, None, None, :].expand_as(pix)
    d = pix - src
    mine = ellipsoid_line_integrals(ells, src.reshape(-1, 3), (d / d.norm(dim=-1, keepdim=True)).reshape(-1, 3))
    torch.testing.assert_close(mine.reshape(exact.shape), exact, rtol=1e-10, atol=1e-10)


def test_adjoint_and_gradients():
    traj = circular_trajectory_3d(6, 40.0, 80.0, dtype=F64)
    P = CylindricalProjector(traj, (5, 6, 6), (8, 5), detector_spacing=1.7, voxel_spacing=1.2, backend="cpu")
    g = torch.Generator().manual_seed(2)
    x, y = torch.rand(5, 6, 6, dtype=F64, generator=g), torch.rand(6, 8, 5, dtype=F64, generator=g)
    lhs, rhs = float((P.project(x) * y).sum()), float((x * P.backproject(y)).sum())
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)
    xs = x.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: P.project(t), (xs,), eps=1e-6, atol=1e-8)
    assert torch.autograd.gradcheck(lambda t: P.backproject(t), (y.clone().requires_grad_(True),), eps=1e-6, atol=1e-8)
    # the trajectory's tensors: the geometry gradient flows through the column views (at a shift where no
    # sample sits on a voxel plane: Joseph's interpolation has kinks there)
    at = torch.tensor([0.013, -0.021, 0.037], dtype=F64)
    shift = at.clone().requires_grad_(True)

    def by_shift(s):
        moved = traj.replace(source=traj.source + s, detector_center=traj.detector_center + s)
        return P.project(x, trajectory=moved).sum()

    (grad,) = torch.autograd.grad(by_shift(shift), shift)
    h = 1e-4
    fd = torch.stack([(by_shift(at + h * e) - by_shift(at - h * e)) / (2 * h) for e in torch.eye(3, dtype=F64)])
    torch.testing.assert_close(grad, fd.detach(), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_cylinder_mode_of_the_weighted_backprojection(dtype):
    """The kernels' cylinder mode (every cpu path, and the CUDA entry file run on the host) against the
    reference backend's independent ray-cylinder formulas."""
    traj = circular_trajectory_3d(7, 60.0, 110.0, detector_offset=(0.0, 1.3), dtype=dtype)
    rays = Rays(traj.source, traj.detector_center, traj.detector_u * 1.7, traj.detector_v * 1.3, CYLINDER, (15, 13))
    grid = VolumeGrid((11, 12, 10), (1.1, 0.9, 1.3))
    g = torch.Generator().manual_seed(0)
    q = torch.randn((7, 15, 13), generator=g, dtype=F64).to(dtype)
    w = (torch.rand(7, generator=g, dtype=F64) + 0.5).to(dtype)
    ref = weighted_backproject(q, rays, grid, w, backend="reference")
    tol = 1e-12 if dtype == F64 else 3e-6
    scale = float(ref.abs().max())
    old = os.environ.get("CTBENCH_CPU_PATH")
    try:
        for path in ("rows", "columns-scalar", "columns"):
            os.environ["CTBENCH_CPU_PATH"] = f"fdk={path}"
            got = weighted_backproject(q, rays, grid, w, backend="cpu")
            assert float((got - ref).abs().max()) <= tol * scale, path
    finally:
        if old is None:
            os.environ.pop("CTBENCH_CPU_PATH", None)
        else:
            os.environ["CTBENCH_CPU_PATH"] = old
    emu = weighted_backproject(q, rays, grid, w, backend="cuda-emulated")
    assert float((emu - ref).abs().max()) <= tol * scale


def test_fdk_of_a_unit_ball_on_a_cylinder():
    traj = circular_trajectory_3d(120, 200.0, 400.0, dtype=F64)
    P = CylindricalProjector(traj, (32, 40, 40), (64, 48), detector_spacing=2.0, voxel_spacing=1.5)
    sino = _cylinder_sinogram([Ellipsoid.sphere(20.0, (0.0, 0.0, 0.0), 1.0)], traj, (64, 48), (2.0, 2.0))
    rec = fdk(P, sino)
    assert abs(float(rec[12:20, 16:24, 16:24].mean()) - 1.0) < 0.01
    assert float(rec[8:24, 20, 3].abs().max()) < 0.05
    assert fdk_weighting(P)["detector"] == "cylinder"


@pytest.mark.slow
def test_fdk_on_a_cylinder_matches_a_flat_detector_of_the_same_sampling():
    """Shepp-Logan on a source-centred cylinder and on a flat detector with the same central pitch: the same
    accuracy (the cylinder's equiangular ramp, cosine weights and (R/rho)^2 weights are FDK's own)."""
    ells = shepp_logan_ellipsoids(modified=False)
    traj = circular_trajectory_3d(90, 600.0, 1200.0, dtype=F64)
    shape, det, pix, vox = (48, 48, 48), (56, 48), 10.0, 5.0
    truth = ellipsoid_phantom(ells, shape, vox, scale=104.0, dtype=F64)
    cyl = CylindricalProjector(traj, shape, det, detector_spacing=pix, voxel_spacing=vox)
    flat = cyl.flat
    scaled = [e.scaled(104.0) for e in ells]
    r_cyl = fdk(cyl, _cylinder_sinogram(scaled, traj, det, (pix, pix)))
    from ctbench.phantoms import ellipsoid_projections
    r_flat = fdk(flat, ellipsoid_projections(ells, traj, det, pix, scale=104.0))
    mask = field_of_view(flat) & field_of_view(cyl)
    e_cyl = float(((r_cyl - truth)[mask] ** 2).mean().sqrt())
    e_flat = float(((r_flat - truth)[mask] ** 2).mean().sqrt())
    assert e_cyl <= 1.05 * e_flat, (e_cyl, e_flat)


def test_equiangular_fan_beam_short_scan_and_half_fan():
    """2D fan beam on an arc (equiangular rays): FBP of a full turn, a Parker short scan and a displaced detector
    reconstruct the same disc."""
    ells = [Ellipsoid(1.0, (30.0, 22.0, 30.0), (3.0, -4.0, 0.0)), Ellipsoid(0.5, (8.0, 5.0, 8.0), (-6.0, 8.0, 0.0))]
    truth = ellipsoid_phantom(ells, (64, 64), 1.0, scale=1.0, dtype=F64)
    fan = 2 * math.atan(60 * 1.5 / 400.0)
    cases = {"full": (circular_trajectory_2d_fan(360, 200.0, 400.0, dtype=F64), 120),
             "short": (circular_trajectory_2d_fan(220, 200.0, 400.0, angle_range=math.pi + fan + math.radians(10),
                                                  dtype=F64), 120),
             "half": (circular_trajectory_2d_fan(360, 200.0, 400.0, dtype=F64, detector_offset=0.4 * 66 * 1.5), 66)}
    errs = {}
    for name, (traj, U) in cases.items():
        P = CylindricalProjector(traj, (64, 64), U, detector_spacing=1.5, voxel_spacing=1.0)
        # the fan's sinogram on the arc: the flat (one-row) detector's frames, pixels on the circle
        sino = _cylinder_sinogram(ells, traj, (U, 1), (1.5, 1.0))[..., 0]
        errs[name] = float((fbp(P, sino) - truth).abs().mean())
        expect = {"full": "full", "short": "parker", "half": "displaced"}[name]
        assert fdk_weighting(P)["kind"] == expect
    assert errs["short"] < 1.3 * errs["full"] + 1e-3
    assert errs["half"] < 1.3 * errs["full"] + 1e-3


def test_refusals_and_the_designer():
    traj = circular_trajectory_3d(12, 60.0, 110.0, dtype=F64)
    P = CylindricalProjector(traj, (6, 8, 8), (10, 6), radius=200.0, detector_spacing=2.0)
    assert not P.centred_on_source
    with pytest.raises(ValueError, match="centred on the source"):
        fdk(P, torch.zeros(12, 10, 6, dtype=F64))
    cgls(P, P.project(torch.ones(6, 8, 8, dtype=F64)), 2)  # iterative solvers take any cylinder
    with pytest.raises(ValueError, match="radius"):
        CylindricalProjector(traj, (6, 8, 8), (10, 6), radius=-1.0)
    with pytest.raises(TypeError, match="does not take"):
        CylindricalProjector(traj, (6, 8, 8), (10, 6), distributed=True)
    g = TrajectoryDesign(kind="cylindrical", n_views=24, detector_u=24, detector_v=12, volume_d=8, volume_h=16,
                         volume_w=16).build(F64)
    assert g.detector_kind == "cylinder" and isinstance(g.projector(), CylindricalProjector)
    again = ScanGeometry.from_dict(g.to_dict())
    assert again.detector_kind == "cylinder"
    assert "detector_kind" not in TrajectoryDesign(kind="circular").build().to_dict()  # flat: as before
