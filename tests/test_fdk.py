"""Analytic reconstruction: the weighted backprojection kernel, the ramp filter, FDK/FBP/helical FDK.

References are independent of the code under test: the pure-torch oracle of
the kernel (rays intersected with the detector plane), a direct spatial
convolution with Kak & Slaney's ramp kernel, analytic phantoms (exact line
integrals) and their voxel-centre values, and 2D Parker redundancy checked
on conjugate rays found geometrically.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ctbench import (
    Projector,
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    spiral_trajectory_3d,
)
from ctbench.engine.fdk_kernels import weighted_backproject
from ctbench.phantoms import Ellipsoid, ellipsoid_phantom, ellipsoid_projections, shepp_logan_3d, \
    shepp_logan_line_integrals
from ctbench.solvers import fbp, fdk, field_of_view, helical_fdk, ramp_filter
from ctbench.solvers import weights as W
from ctbench.solvers.filtering import window
from sample_geometries import sample_geometries as _geometries

F64 = torch.float64


def _setup(index, dtype=F64, seed=0):
    name, traj, vs, ds, kw = _geometries(dtype)[index]
    p = Projector(traj, vs, ds, **kw)
    rays = p._rays(None, dtype, torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((traj.n_views, *p.detector_shape), generator=g, dtype=dtype)
    w = torch.rand(traj.n_views, generator=g, dtype=dtype) + 0.5
    return name, p, rays, q, w


# ------------------------------------------------------------------ the kernel
@pytest.mark.parametrize("index", range(5), ids=lambda i: _geometries(F64)[i][0])
def test_cpu_kernel_matches_reference(index):
    name, p, rays, q, w = _setup(index)
    cpu = weighted_backproject(q, rays, p.grid, w, backend="cpu")
    ref = weighted_backproject(q, rays, p.grid, w, backend="reference")
    assert ref.abs().max() > 0.1, "the test geometry must put data into the volume"
    torch.testing.assert_close(cpu, ref, rtol=1e-10, atol=1e-10 * float(ref.abs().max()))


@pytest.mark.parametrize("index", range(5), ids=lambda i: _geometries(F64)[i][0])
def test_cpu_kernel_float32_close_to_float64(index):
    name, p, rays, q, w = _setup(index)
    ref = weighted_backproject(q, rays, p.grid, w, backend="cpu")
    r32 = p._rays(None, torch.float32, torch.device("cpu"))
    f32 = weighted_backproject(q.float(), r32, p.grid, w.float(), backend="cpu")
    assert float((f32.double() - ref).abs().max()) < 1e-4 * float(ref.abs().max())


@pytest.mark.parametrize("index", [0, 1, 2])
def test_slab_windows_and_view_ranges_add_up(index):
    name, p, rays, q, w = _setup(index)
    full = weighted_backproject(q, rays, p.grid, w)
    D, n = p.grid.D, rays.n_views
    # slabs: each slab equals that slab of the whole, with global coordinates preserved
    cuts = [0, 3, 4, D]
    parts = [weighted_backproject(q, rays, p.grid, w, z0=a, z1=b) for a, b in zip(cuts, cuts[1:])]
    torch.testing.assert_close(torch.cat(parts), full, rtol=0, atol=1e-12)
    # view ranges accumulate into `out`
    out = torch.zeros_like(full)
    for a, b in [(0, 2), (2, 2), (2, n - 1), (n - 1, n)]:
        weighted_backproject(q, rays, p.grid, w, views=(a, b), out=out)
    torch.testing.assert_close(out, full, rtol=0, atol=1e-12)
    # a slab and a view range together, against the oracle
    sub = weighted_backproject(q, rays, p.grid, w, z0=2, z1=5, views=(1, n - 2))
    ref = weighted_backproject(q, rays, p.grid, w, z0=2, z1=5, views=(1, n - 2), backend="reference")
    torch.testing.assert_close(sub, ref, rtol=1e-10, atol=1e-10)


def test_kernel_reads_strided_projections():
    name, p, rays, q, w = _setup(0)
    transposed = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, u contiguous
    torch.testing.assert_close(weighted_backproject(transposed, rays, p.grid, w),
                               weighted_backproject(q, rays, p.grid, w), rtol=0, atol=0)


def test_kernel_window_errors():
    name, p, rays, q, w = _setup(0)
    with pytest.raises(ValueError, match="slab"):
        weighted_backproject(q, rays, p.grid, w, z0=3, z1=2)
    with pytest.raises(ValueError, match="views"):
        weighted_backproject(q, rays, p.grid, w, views=(0, rays.n_views + 1))
    with pytest.raises(ValueError, match="view_weight"):
        weighted_backproject(q, rays, p.grid, w[:-1])
    with pytest.raises(ValueError, match="do not match"):
        weighted_backproject(q[:, :-1], rays, p.grid, w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("index", range(5), ids=lambda i: _geometries(F64)[i][0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_kernel_matches_cpu(index, dtype):
    name, p, rays, q, w = _setup(index, dtype)
    cpu = weighted_backproject(q, rays, p.grid, w, z0=1, z1=p.grid.D, views=(1, rays.n_views), backend="cpu")
    dev = torch.device("cuda")
    gpu = weighted_backproject(q.to(dev), rays.to(device=dev), p.grid, w.to(dev), z0=1, z1=p.grid.D,
                               views=(1, rays.n_views), backend="cuda")
    tol = 1e-10 if dtype == F64 else 2e-4
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=tol, atol=tol * float(cpu.abs().max()))


# ------------------------------------------------------------------ the ramp filter
def _ks_kernel(n_half: int, tau: float) -> np.ndarray:
    k = np.arange(-n_half, n_half + 1)
    h = np.zeros(k.shape)
    h[k == 0] = 1 / (4 * tau ** 2)
    odd = k % 2 == 1
    h[odd] = -1 / (np.pi * k[odd] * tau) ** 2
    return h


def test_ram_lak_is_the_spatial_convolution():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 37, generator=g, dtype=F64)
    tau = 0.7
    out = ramp_filter(x, tau, filter="ram-lak")
    h = _ks_kernel(36, tau)
    for r in range(3):
        ref = tau * np.convolve(x[r].numpy(), h)[36:36 + 37]
        np.testing.assert_allclose(out[r].numpy(), ref, rtol=1e-10, atol=1e-12)


def test_windows_at_dc_and_nyquist():
    f = torch.tensor([0.0, 0.5], dtype=F64)
    assert window("ram-lak", f).tolist() == [1.0, 1.0]
    np.testing.assert_allclose(window("shepp-logan", f).numpy(), [1.0, 2 / math.pi])
    np.testing.assert_allclose(window("cosine", f).numpy(), [1.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(window("hamming", f).numpy(), [1.0, 0.08])
    np.testing.assert_allclose(window("hann", f).numpy(), [1.0, 0.0], atol=1e-15)
    # a cut-off at half Nyquist zeroes the upper half of the band
    assert float(window("hann", torch.tensor([0.3], dtype=F64), cutoff=0.5)) == 0.0


def test_oversampled_filter_keeps_the_original_samples():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 25, 3, generator=g, dtype=F64)
    base = ramp_filter(x, 1.3, dim=1, filter="shepp-logan")
    over = ramp_filter(x, 1.3, dim=1, filter="shepp-logan", oversample=3)
    assert over.shape == (4, 73, 3)
    torch.testing.assert_close(over[:, ::3], base, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------ amplitudes (units)
def _ball(radius, intensity=1.0, centre=(0.0, 0.0, 0.0)):
    return [Ellipsoid.sphere(radius, centre, intensity)]


def test_fdk_unit_ball_reconstructs_to_one():
    traj = circular_trajectory_3d(120, 200.0, 400.0, dtype=F64)
    p = Projector(traj, (32, 40, 40), (64, 48), voxel_spacing=1.5, detector_spacing=2.0)
    sino = ellipsoid_projections(_ball(20.0), traj, (64, 48), 2.0)
    rec = fdk(p, sino)
    centre = rec[12:20, 16:24, 16:24]
    assert abs(float(centre.mean()) - 1.0) < 0.01
    assert float(rec[8:24, 20, 3].abs().max()) < 0.05  # outside the ball, inside the field of view


@pytest.mark.parametrize("kind", ["fan2d", "parallel2d", "parallel3d"])
def test_fbp_unit_disc_reconstructs_to_one(kind):
    if kind == "fan2d":
        traj = circular_trajectory_2d_fan(180, 150.0, 300.0, dtype=F64)
        p = Projector(traj, (64, 64), 96, voxel_spacing=1.0, detector_spacing=1.5)
        sino = ellipsoid_projections(_ball(20.0), traj, 96, 1.5)
    elif kind == "parallel2d":
        traj = circular_trajectory_2d_parallel(90, dtype=F64)
        p = Projector(traj, (64, 64), 96, voxel_spacing=1.0, detector_spacing=1.0)
        sino = ellipsoid_projections(_ball(20.0), traj, 96, 1.0)
    else:
        traj = circular_trajectory_3d_parallel(90, dtype=F64)
        p = Projector(traj, (8, 48, 48), (64, 8), voxel_spacing=1.0, detector_spacing=1.0)
        sino = ellipsoid_projections(_ball(20.0), traj, (64, 8), 1.0)
    rec = fbp(p, sino)
    centre = rec[..., 24:40, 24:40] if kind != "parallel3d" else rec[:, 18:30, 18:30]
    assert abs(float(centre.mean()) - 1.0) < 0.01


def test_parallel_full_turn_equals_half_turn():
    """Views beyond 180 degrees are averaged with their opposites: same amplitude."""
    half = circular_trajectory_2d_parallel(60, dtype=F64)
    full = circular_trajectory_2d_parallel(120, angle_range=2 * math.pi, dtype=F64)
    out = []
    for t in (half, full):
        p = Projector(t, (48, 48), 64, voxel_spacing=1.0, detector_spacing=1.0)
        out.append(fbp(p, ellipsoid_projections(_ball(15.0, centre=(3.0, -2.0, 0.0)), t, 64, 1.0)))
    assert float((out[0] - out[1]).abs().mean()) < 0.01


# ------------------------------------------------------------------ Shepp-Logan, short scan, helical
def _sl_case(angle_range=2 * math.pi, n_views=90, direction=1):
    n, vox, det, pix, sid, sdd = 48, 5.0, 48, 10.0, 600.0, 1200.0
    start = 0.0 if direction > 0 else 1.0
    traj = circular_trajectory_3d(n_views, sid, sdd, angle_range=direction * angle_range, start_angle=start,
                                  dtype=F64)
    p = Projector(traj, (n, n, n), (det, det), voxel_spacing=vox, detector_spacing=pix)
    sino = shepp_logan_line_integrals(traj, (det, det), pix, modified=False, scale=104.0)
    truth = shepp_logan_3d((n, n, n), vox, modified=False, scale=104.0, dtype=F64)
    return p, sino, truth


def _psnr(rec, truth, mask):
    d = torch.where(mask, rec, torch.zeros_like(rec)) - truth
    return 20 * math.log10(2.0) - 10 * math.log10(float((d * d).mean()))


@pytest.mark.slow
def test_fdk_shepp_logan_against_voxel_centres():
    p, sino, truth = _sl_case()
    rec = fdk(p, sino)
    mask = field_of_view(p)
    d = torch.where(mask, rec, torch.zeros_like(rec)) - truth
    assert float(d.abs().mean()) < 0.05
    assert _psnr(rec, truth, mask) > 22.0
    # the brain (1.02) at the centre, within 2%
    assert abs(float(rec[22:26, 20:28, 20:28].median()) - 1.02) < 0.02


@pytest.mark.parametrize("direction", [1, -1])
@pytest.mark.slow
def test_short_scan_parker_close_to_full_scan(direction):
    fan = 2 * math.atan(24 * 10.0 / 1200.0)
    step = 2 * math.pi / 90
    n_short = int(math.ceil((math.pi + fan) / step))
    p_full, sino_full, truth = _sl_case()
    p_short, sino_short, _ = _sl_case(n_short * step, n_short, direction)
    mask = field_of_view(p_full)
    full, short = fdk(p_full, sino_full), fdk(p_short, sino_short)
    # the central slab (small cone angle): within 1 dB; the whole volume: within 3 dB
    mid = slice(20, 28)
    assert _psnr(full[mid], truth[mid], mask[mid]) - _psnr(short[mid], truth[mid], mask[mid]) < 1.0
    assert _psnr(full, truth, mask) - _psnr(short, truth, mask) < 3.0
    # without Parker weights the short scan is clearly worse
    plain = fdk(p_short, sino_short, short_scan=False)
    assert _psnr(plain, truth, mask) < _psnr(short, truth, mask) - 1.5


@pytest.mark.parametrize("direction", [1, -1])
def test_parker_weights_complement_on_conjugate_rays(direction):
    """In a fan (2D) short scan, a ray and its conjugate (found geometrically) weigh 1 together."""
    fan = 2 * math.atan(30 * 2.0 / 300.0)
    n = 80
    traj = circular_trajectory_2d_fan(n, 150.0, 300.0, angle_range=direction * (math.pi + fan + 0.2), dtype=F64)
    p = Projector(traj, (32, 32), 60, voxel_spacing=1.0, detector_spacing=2.0)
    orbit = W.orbit_of(p, who="test")
    w = W.parker_weights(orbit)
    src = traj.source[:, :2]
    sid, sdd = 150.0, 300.0
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        k, i = int(rng.integers(0, n)), int(rng.integers(0, 60))
        pix = traj.detector_center[k, :2] + (i - 29.5) * 2.0 * traj.detector_u[k, :2]
        d = pix - src[k]
        # the line meets the source circle again at the conjugate source position
        t = -2 * float(src[k] @ d) / float(d @ d)
        other = src[k] + t * d
        t2 = math.atan2(float(-other[0]), float(other[1]))
        # unwrap next to the orbit's angles
        t2 = float(orbit.angles[0]) + ((t2 - float(orbit.angles[0])) * direction % (2 * math.pi)) * direction
        # where that line hits the detector of a view at t2 (same convention as the generators)
        u2 = torch.tensor([math.cos(t2), math.sin(t2)], dtype=F64)
        radial = torch.tensor([-math.sin(t2), math.cos(t2)], dtype=F64)  # isocentre -> source
        c2 = -(sdd - sid) * radial
        dirn = -d
        nrm = radial
        s_ = float((c2 - other) @ nrm) / float(dirn @ nrm)
        p2 = float((other + s_ * dirn - c2) @ u2)
        beta2 = (t2 - float(orbit.angles[0])) * direction + 0.5 * orbit.step
        if beta2 > orbit.coverage:  # the same source position one turn earlier
            beta2 -= 2 * math.pi
            t2 -= 2 * math.pi * direction
        if not 0 <= beta2 <= orbit.coverage:
            assert float(w[k, i]) == 1.0  # no conjugate measured: this ray carries the full weight
            continue
        probe = W.Orbit(torch.tensor([float(orbit.angles[0]), t2], dtype=F64), orbit.direction, orbit.step,
                        orbit.coverage, orbit.radius[:2], orbit.sdd[:2], orbit.source_z[:2],
                        torch.tensor([[0.0], [p2]], dtype=F64), orbit.pixel_v[:2], True, orbit.handedness)
        w2 = float(W.parker_weights(probe)[1, 0])
        assert abs(float(w[k, i]) + w2 - 1.0) < 1e-9, (k, i, float(w[k, i]), w2)
        checked += 1
    assert checked > 50


def test_fan_short_scan_matches_full_scan_in_2d():
    """In 2D, Parker weighting is exact: a short scan reconstructs like a full turn."""
    ells = [Ellipsoid(1.0, (30.0, 22.0, 30.0), (3.0, -4.0, 0.0)), Ellipsoid(0.5, (8.0, 5.0, 8.0), (-6.0, 8.0, 0.0))]
    fan = 2 * math.atan(60 * 1.5 / 400.0)
    out = []
    for rng_, n in ((2 * math.pi, 360), (math.pi + fan + math.radians(10), 220)):
        traj = circular_trajectory_2d_fan(n, 200.0, 400.0, angle_range=rng_, dtype=F64)
        p = Projector(traj, (80, 80), 120, voxel_spacing=1.0, detector_spacing=1.5)
        out.append(fbp(p, ellipsoid_projections(ells, traj, 120, 1.5)))
    truth = ellipsoid_phantom(ells, (80, 80), 1.0, scale=1.0, dtype=F64)
    err_full = float((out[0] - truth).abs().mean())
    err_short = float((out[1] - truth).abs().mean())
    assert err_short < 1.3 * err_full + 1e-3
    assert float((out[0] - out[1]).abs().mean()) < 0.01


def test_helical_fdk_reconstructs_a_ball():
    traj = spiral_trajectory_3d(360, sid=200.0, sdd=400.0, z_range=40.0, n_turns=3.0, dtype=F64)
    p = Projector(traj, (24, 40, 40), (64, 24), voxel_spacing=1.5, detector_spacing=2.0)
    ball = [Ellipsoid(1.0, (20.0, 20.0, 14.0))]
    sino = ellipsoid_projections(ball, traj, (64, 24), 2.0)
    rec = helical_fdk(p, sino)
    truth = ellipsoid_phantom(ball, (24, 40, 40), 1.5, scale=1.0, dtype=F64)
    assert abs(float(rec[10:14, 16:24, 16:24].mean()) - 1.0) < 0.03
    assert float((rec - truth)[4:20].abs().mean()) < 0.08
    # plain circular FDK refuses this orbit
    with pytest.raises(ValueError, match="helical_fdk"):
        fdk(p, sino)


def test_field_of_view_mask():
    traj = circular_trajectory_3d(36, 100.0, 200.0, dtype=F64)
    p = Projector(traj, (20, 40, 40), (40, 20), voxel_spacing=2.0, detector_spacing=2.0)
    m = field_of_view(p)
    assert m.shape == (20, 40, 40) and m.dtype == torch.bool
    # in the midplane the field of view is the disc the fan covers in every view:
    # radius sid * sin(atan(half detector span / sdd)), the span running between pixel centres
    r_fov = 100.0 * math.sin(math.atan(19.5 * 2.0 / 200.0))
    c = (torch.arange(40, dtype=F64) - 19.5) * 2.0
    r = torch.sqrt(c[None, :] ** 2 + c[:, None] ** 2)
    mid = m[9]  # z = -1 mm: the cone barely matters
    assert bool(mid[r < r_fov - 1.0].all()) and not bool(mid[r > r_fov + 1.0].any())
    # the cone narrows the field of view away from the midplane
    assert int(m[0].sum()) < int(m[9].sum())


def test_batched_sinograms():
    traj = circular_trajectory_2d_fan(60, 150.0, 300.0, dtype=F64)
    p = Projector(traj, (32, 32), 48, voxel_spacing=1.0, detector_spacing=1.5)
    s = ellipsoid_projections(_ball(10.0), traj, 48, 1.5)
    both = fbp(p, torch.stack([s, 2 * s]))
    assert both.shape == (2, 32, 32)
    torch.testing.assert_close(both[1], 2 * both[0])
    torch.testing.assert_close(both[0], fbp(p, s))


def test_short_scan_of_a_mirrored_detector_frame():
    """Parker weights follow the detector's handedness, read from the vectors: a fan short scan whose
    u axis is reversed (diffct's custom paths, ASTRA-frame data) with its rows reversed is the same
    measurement and reconstructs the same image."""
    ells = [Ellipsoid(1.0, (20.0, 14.0, 30.0), (4.0, -3.0, 0.0))]
    fan = 2 * math.atan(32 * 1.0 / 300.0)
    traj = circular_trajectory_2d_fan(72, 150.0, 300.0, angle_range=math.pi + fan + 0.3, dtype=F64)
    mirrored = traj.replace(detector_u=-traj.detector_u)
    p = Projector(traj, (48, 48), 64, voxel_spacing=1.0, detector_spacing=1.0)
    pm = Projector(mirrored, (48, 48), 64, voxel_spacing=1.0, detector_spacing=1.0)
    assert W.orbit_of(p).handedness == 1 and W.orbit_of(pm).handedness == -1
    sino = ellipsoid_projections(ells, traj, (64, 1), 1.0)[..., 0]
    torch.testing.assert_close(ellipsoid_projections(ells, mirrored, (64, 1), 1.0)[..., 0], sino.flip(-1))
    a, b = fbp(p, sino), fbp(pm, sino.flip(-1))
    torch.testing.assert_close(b, a, rtol=0, atol=1e-9 * float(a.abs().max()))
    # the weights really matter here: ignoring them leaves a visibly different image
    assert float((fbp(p, sino, short_scan=False) - a).abs().max()) > 0.05
