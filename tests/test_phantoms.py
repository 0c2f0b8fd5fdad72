"""Tests of ctbench.phantoms: exact chords, Shepp-Logan tables, voxelisation and detector conventions.

The references here are computed independently of the module: closed-form
sphere chords, a plain numpy indicator of the ellipsoids (from their public
fields) and dense midpoint quadrature along lines.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ctbench.geometry import (
    Trajectory,
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
)
from ctbench.phantoms import (
    Ellipsoid,
    default_scale,
    ellipsoid_line_integrals,
    ellipsoid_phantom,
    ellipsoid_projections,
    ellipsoid_values,
    shepp_logan_3d,
    shepp_logan_ellipsoids,
    shepp_logan_line_integrals,
)

F64 = torch.float64


# ------------------------------------------------------------ independent references
def indicator_sum(ellipsoids, pts: np.ndarray, scale: float) -> np.ndarray:
    """Sum of intensities of the (closed) ellipsoids containing each point of ``pts`` (N, 3)."""
    out = np.zeros(pts.shape[0])
    for e in ellipsoids:
        R = np.array(e.rotation)
        loc = (pts - np.array(e.center) * scale) @ R          # row-wise R^T (p - c)
        rho = ((loc / (np.array(e.semi_axes) * scale)) ** 2).sum(1)
        out += e.intensity * (rho <= 1.0)
    return out


def quad_line(ellipsoids, origin, direction, scale, half_length, n=200_000) -> float:
    """Midpoint-rule integral of the indicator phantom along the whole line (it is zero beyond half_length)."""
    d = np.asarray(direction, float) / np.linalg.norm(direction)
    o = np.asarray(origin, float)
    p0 = o - (o @ d) * d                                       # closest point to the world origin
    h = 2 * half_length / n
    t = -half_length + (np.arange(n) + 0.5) * h
    return float(indicator_sum(ellipsoids, p0 + t[:, None] * d, scale).sum() * h)


def pixel_positions(traj: Trajectory, U, V, du, dv) -> np.ndarray:
    """Pixel centres (n, U, V, 3) written out from the documented convention."""
    c, u, v = (t.detach().numpy().astype(float) for t in (traj.detector_center, traj.detector_u, traj.detector_v))
    out = np.empty((traj.n_views, U, V, 3))
    for i in range(U):
        for j in range(V):
            out[:, i, j] = c + (i - (U - 1) / 2) * du * u + (j - (V - 1) / 2) * dv * v
    return out


def sphere_chord(centre, r, origin, direction) -> np.ndarray:
    """2 sqrt(r^2 - p^2) with p the distance from the sphere centre to each line."""
    d = direction / np.linalg.norm(direction, axis=-1, keepdims=True)
    p2 = (np.cross(np.asarray(centre) - origin, d) ** 2).sum(-1)
    return 2 * np.sqrt(np.clip(r * r - p2, 0, None))


def random_unit(rng, n):
    x = rng.normal(size=(n, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# ------------------------------------------------------------------ chords
def test_sphere_chord_through_centre_is_diameter():
    rng = np.random.default_rng(0)
    r, c = 7.5, np.array([3.0, -2.0, 5.0])
    dirs = random_unit(rng, 50) * rng.uniform(0.1, 10.0, size=(50, 1))   # any length
    origins = c + rng.uniform(-100, 100, size=(50, 1)) * dirs
    got = ellipsoid_line_integrals([Ellipsoid.sphere(r, c)], torch.tensor(origins), torch.tensor(dirs))
    assert got.dtype == F64 and got.shape == (50,)
    torch.testing.assert_close(got, torch.full((50,), 2 * r, dtype=F64), rtol=0, atol=1e-12)


def test_sphere_off_centre_chord():
    rng = np.random.default_rng(1)
    r, c = 7.5, np.array([-1.0, 4.0, 2.0])
    ps = np.array([0.0, 1.0, 5.0, 7.4, 7.5, 9.0, 30.0])
    d = random_unit(rng, len(ps))
    n = np.cross(d, random_unit(rng, len(ps)))
    n /= np.linalg.norm(n, axis=1, keepdims=True)            # unit normal to each direction
    origins = c + ps[:, None] * n + rng.uniform(-50, 50, size=(len(ps), 1)) * d
    got = ellipsoid_line_integrals([Ellipsoid.sphere(r, c)], torch.tensor(origins), torch.tensor(d)).numpy()
    want = 2 * np.sqrt(np.clip(r * r - ps * ps, 0, None))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert got[-1] == 0.0 and got[-2] == 0.0                 # tangent and missing lines


def test_scale_and_intensity():
    e = Ellipsoid.sphere(0.5, (0.1, 0.0, 0.0), intensity=3.0)
    o = torch.tensor([[2.0, -100.0, 0.0]], dtype=F64)        # normalised centre 0.1 -> 2 mm at scale 20
    d = torch.tensor([[0.0, 1.0, 0.0]], dtype=F64)
    assert ellipsoid_line_integrals([e], o, d, scale=20.0).item() == pytest.approx(3.0 * 2 * 10.0, abs=1e-12)
    # Intensities add up; a zero-length direction is a non-ray and integrates to 0.
    got = ellipsoid_line_integrals([e, e], torch.cat([o, o]), torch.cat([d, 0 * d]), scale=20.0)
    assert got.tolist() == pytest.approx([120.0, 0.0], abs=1e-12)


def test_rotated_ellipsoid_against_quadrature():
    rng = np.random.default_rng(2)
    e = Ellipsoid.from_euler(1.7, (30.0, 12.0, 7.0), (4.0, -3.0, 2.0), phi=33.0, theta=50.0, psi=-20.0)
    R = np.array(e.rotation)
    # Along the local x axis through the centre the chord is the full axis.
    got = ellipsoid_line_integrals([e], torch.tensor([e.center]), torch.tensor(R[:, :1].T))
    assert got.item() == pytest.approx(1.7 * 2 * 30.0, abs=1e-10)
    origins = np.array(e.center) + rng.uniform(-5, 5, size=(6, 3))
    dirs = random_unit(rng, 6)
    got = ellipsoid_line_integrals([e], torch.tensor(origins), torch.tensor(dirs)).numpy()
    want = [quad_line([e], o, d, 1.0, 45.0) for o, d in zip(origins, dirs)]
    assert min(want) > 1.0
    np.testing.assert_allclose(got, want, rtol=1e-3)


@pytest.mark.parametrize("modified", [True, False])
@pytest.mark.slow
def test_shepp_logan_line_integrals_against_quadrature(modified):
    rng = np.random.default_rng(3 + modified)
    ells = shepp_logan_ellipsoids(modified)
    scale = 100.0
    origins = random_unit(rng, 6) * rng.uniform(0, 0.6, size=(6, 1)) * scale
    dirs = random_unit(rng, 6)
    got = ellipsoid_line_integrals(ells, torch.tensor(origins), torch.tensor(dirs), scale).numpy()
    want = np.array([quad_line(ells, o, d, scale, 1.6 * scale) for o, d in zip(origins, dirs)])
    assert np.all(np.abs(want) > 10.0)
    np.testing.assert_allclose(got, want, rtol=1e-3)


@pytest.mark.slow
def test_point_values_match_independent_indicator():
    rng = np.random.default_rng(5)
    pts = rng.uniform(-1, 1, size=(20000, 3)) * 50.0
    for modified in (True, False):
        ells = shepp_logan_ellipsoids(modified)
        got = ellipsoid_values(ells, torch.tensor(pts), scale=50.0).numpy()
        np.testing.assert_allclose(got, indicator_sum(ells, pts, 50.0), atol=1e-12)


# ------------------------------------------------------------ tables
def test_tables():
    mod, ks = shepp_logan_ellipsoids(True), shepp_logan_ellipsoids(False)
    assert len(mod) == len(ks) == 10
    assert [e.intensity for e in mod] == [1.0, -0.8, -0.2, -0.2] + [0.1] * 6
    assert [e.intensity for e in ks] == [2.0, -0.98, -0.02, -0.02, 0.02, 0.02, 0.01, 0.01, 0.02, -0.02]
    assert ks[0].semi_axes == (0.69, 0.92, 0.9) and mod[0].semi_axes == (0.69, 0.92, 0.81)
    # Kak & Slaney's ellipsoid c: local x axis at 108 degrees from +x.
    R = np.array(ks[2].rotation)
    np.testing.assert_allclose(R[:, 0], [math.cos(math.radians(108)), math.sin(math.radians(108)), 0], atol=1e-15)
    for e in mod + ks:                                         # every ellipsoid inside the unit cube
        assert all(abs(c) + h <= 1.0 for c, h in zip(e.center, e.half_extent()))


@pytest.mark.slow
def test_modified_table_follows_phantom3d_rule():
    # phantom3d (Schabel) puts p in ellipsoid k when alpha_k @ p - c0_k lies in the axis-aligned
    # ellipsoid, with alpha the z-x-z Euler matrix: the tabulated centre is in the rotated frame.
    #        A     a       b       c      x0     y0       z0   phi theta psi
    raw = [(1.0, 0.69, 0.92, 0.81, 0, 0, 0, 0, 0, 0), (-0.8, 0.6624, 0.874, 0.78, 0, -0.0184, 0, 0, 0, 0),
           (-0.2, 0.11, 0.31, 0.22, 0.22, 0, 0, -18, 0, 10), (-0.2, 0.16, 0.41, 0.28, -0.22, 0, 0, 18, 0, 10),
           (0.1, 0.21, 0.25, 0.41, 0, 0.35, -0.15, 0, 0, 0), (0.1, 0.046, 0.046, 0.05, 0, 0.1, 0.25, 0, 0, 0),
           (0.1, 0.046, 0.046, 0.05, 0, -0.1, 0.25, 0, 0, 0), (0.1, 0.046, 0.023, 0.05, -0.08, -0.605, 0, 0, 0, 0),
           (0.1, 0.023, 0.023, 0.02, 0, -0.606, 0, 0, 0, 0), (0.1, 0.023, 0.046, 0.02, 0.06, -0.605, 0, 0, 0, 0)]
    rng = np.random.default_rng(11)
    pts = rng.uniform(-1, 1, size=(40000, 3)) * np.array([0.5, 0.5, 0.3])   # where ellipsoids 3, 4 are
    want = np.zeros(len(pts))
    for A, a, b, c, x0, y0, z0, phi, theta, psi in raw:
        f, t, s = np.radians([phi, theta, psi])
        alpha = np.array([
            [np.cos(s) * np.cos(f) - np.cos(t) * np.sin(f) * np.sin(s),
             np.cos(s) * np.sin(f) + np.cos(t) * np.cos(f) * np.sin(s), np.sin(s) * np.sin(t)],
            [-np.sin(s) * np.cos(f) - np.cos(t) * np.sin(f) * np.cos(s),
             -np.sin(s) * np.sin(f) + np.cos(t) * np.cos(f) * np.cos(s), np.cos(s) * np.sin(t)],
            [np.sin(t) * np.sin(f), -np.sin(t) * np.cos(f), np.cos(t)]])
        q = pts @ alpha.T - np.array([x0, y0, z0])
        want += A * (((q / np.array([a, b, c])) ** 2).sum(1) <= 1)
    got = ellipsoid_values(shepp_logan_ellipsoids(True), torch.tensor(pts)).numpy()
    assert np.mean(np.abs(got - want) > 1e-9) < 1e-3          # only boundary round-off may differ
    assert np.any(np.isclose(want, 0.0) & (np.abs(pts[:, 0]) < 0.3))   # ellipsoids 3/4 are sampled


def test_ellipsoid_validation():
    with pytest.raises(ValueError, match="semi_axes"):
        Ellipsoid(1.0, (1.0, 0.0, 1.0))
    with pytest.raises(ValueError, match="orthonormal"):
        Ellipsoid(1.0, (1.0, 1.0, 1.0), rotation=((1, 0, 0), (0, 2, 0), (0, 0, 1)))
    with pytest.raises(ValueError, match="reflection"):
        Ellipsoid(1.0, (1.0, 1.0, 1.0), rotation=((1, 0, 0), (0, 1, 0), (0, 0, -1)))


# ----------------------------------------------------------- voxel phantom
def test_modified_phantom_known_points():
    # z from -0.3 to 0.3, y from -1 to 1 in steps of 0.01 (scale 100 mm, 1 mm voxels), x = 0 in the middle.
    vol = shepp_logan_3d((61, 201, 3), 1.0, scale=100.0, dtype=F64)

    def at(x, y, z):
        assert x == 0
        return vol[round(z * 100) + 30, round(y * 100) + 100, 1].item()

    assert at(0, 0, 0) == pytest.approx(1 - 0.8)              # brain
    assert at(0, 0.35, -0.15) == pytest.approx(0.3)           # centre of ellipsoid 5
    assert at(0, 0.1, 0.25) == pytest.approx(0.3)             # centre of ellipsoid 6
    assert at(0, -0.61, 0) == pytest.approx(0.3)              # inside ellipsoid 9
    assert at(0, 0.89, 0) == pytest.approx(1.0)               # skull, above the brain
    assert at(0, -0.9, 0) == pytest.approx(1.0)               # skull, below the brain
    assert at(0, 0.95, 0) == 0.0 and at(0, -0.95, 0) == 0.0   # outside


def test_kak_slaney_phantom_known_points():
    vol = shepp_logan_3d((131, 81, 3), 1.0, modified=False, scale=100.0, dtype=F64)

    def at(y, z):
        return vol[round(z * 100) + 65, round(y * 100) + 40, 1].item()

    assert at(0, 0) == pytest.approx(2.0 - 0.98)
    assert at(0.35, -0.25) == pytest.approx(2.0 - 0.98 + 0.02)     # centre of ellipsoid e
    assert at(0.1, 0.625) == pytest.approx(2.0 - 0.98 - 0.02)      # centre of ellipsoid j


def test_shape_dtype_device():
    v = shepp_logan_3d((4, 5, 6), dtype=F64, device="cpu")
    assert v.shape == (4, 5, 6) and v.dtype == F64 and v.device.type == "cpu"
    w = shepp_logan_3d([5, 6], 2.0, supersample=2)
    assert w.shape == (5, 6) and w.dtype == torch.float32
    assert shepp_logan_3d((3, 3, 3), device=torch.device("cpu"))[1, 1, 1].item() == pytest.approx(0.2)


@pytest.mark.parametrize("modified", [True, False])
def test_2d_slice_is_z0_plane_of_3d(modified):
    spacing = (1.5, 1.0, 1.25)
    vol = shepp_logan_3d((33, 40, 36), spacing, modified=modified, scale=20.0)
    sl = shepp_logan_3d((40, 36), spacing[1:], modified=modified, scale=20.0)
    assert torch.equal(vol[16], sl)
    assert torch.equal(sl, shepp_logan_3d((40, 36), spacing, modified=modified, scale=20.0))
    assert sl.abs().sum() > 0


def test_default_scale_rule():
    assert default_scale((8, 10, 12), (2.0, 1.0, 0.5)) == 3.0      # extents 16, 10, 6 mm
    assert default_scale((10, 12), (1.0, 0.5)) == 3.0
    assert default_scale((7, 9, 11)) == 3.5
    shape, spacing = (8, 10, 12), (2.0, 1.0, 0.5)
    assert torch.equal(shepp_logan_3d(shape, spacing), shepp_logan_3d(shape, spacing, scale=3.0))
    # A unit ball at the default scale is the ball of radius min-extent/2 = 4.5 mm.
    ball = ellipsoid_phantom([Ellipsoid.sphere(1.0)], (9, 9, 9), 1.0, dtype=F64)
    g = np.arange(9) - 4.0
    r2 = g[:, None, None] ** 2 + g[None, :, None] ** 2 + g[None, None, :] ** 2
    np.testing.assert_array_equal(ball.numpy(), (r2 <= 4.5 ** 2).astype(float))


def test_supersample_matches_brute_force():
    e = Ellipsoid.from_euler(2.0, (4.0, 2.5, 1.5), (0.7, -0.4, 0.3), phi=25.0, theta=40.0, psi=10.0)
    shape, (dz, dy, dx), s = (9, 11, 13), (1.0, 0.8, 1.2), 3
    got = ellipsoid_phantom([e], shape, (dz, dy, dx), scale=1.0, supersample=s, dtype=F64).numpy()
    off = ((np.arange(s) + 0.5) / s - 0.5)
    zs, ys, xs = [(np.arange(n) - (n - 1) / 2)[:, None] * d + off[None, :] * d
                  for n, d in zip(shape, (dz, dy, dx))]
    # Every sub-sample of every voxel, evaluated with the independent indicator.
    Z, Y, X = np.meshgrid(zs.ravel(), ys.ravel(), xs.ravel(), indexing="ij")
    vals = indicator_sum([e], np.stack([X.ravel(), Y.ravel(), Z.ravel()], 1), 1.0).reshape(
        shape[0], s, shape[1], s, shape[2], s)
    want = vals.mean(axis=(1, 3, 5))
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert np.any((got > 0) & (got < 2.0))                    # partial voxels exist


def test_supersample_2d_matches_brute_force():
    ells = shepp_logan_ellipsoids(True)
    s, (H, W), (dy, dx), scale = 4, (21, 17), (1.0, 1.25), 10.0
    got = shepp_logan_3d((H, W), (dy, dx), scale=scale, supersample=s, dtype=F64).numpy()
    off = ((np.arange(s) + 0.5) / s - 0.5)
    ys = ((np.arange(H) - (H - 1) / 2)[:, None] * dy + off * dy).ravel()
    xs = ((np.arange(W) - (W - 1) / 2)[:, None] * dx + off * dx).ravel()
    Y, X = np.meshgrid(ys, xs, indexing="ij")
    vals = indicator_sum(ells, np.stack([X.ravel(), Y.ravel(), 0 * X.ravel()], 1), scale)
    want = vals.reshape(H, s, W, s).mean(axis=(1, 3))
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_supersampled_ball_volume():
    r = 6.0
    ball = ellipsoid_phantom([Ellipsoid.sphere(r)], (17, 17, 17), 1.0, scale=1.0, supersample=4, dtype=F64)
    assert ball.min() >= 0 and ball.max() <= 1
    assert ((ball > 0) & (ball < 1)).any()
    assert ball.sum().item() == pytest.approx(4 / 3 * math.pi * r ** 3, rel=5e-3)


# ------------------------------------------------------------- trajectories
@pytest.mark.slow
def test_circular_convention_central_pixel():
    tr = circular_trajectory_3d(n_views=4, sid=600.0, sdd=1200.0, dtype=F64)
    scale = 100.0
    sino = shepp_logan_line_integrals(tr, (5, 3), 2.0, scale=scale)
    assert sino.shape == (4, 5, 3) and sino.dtype == F64
    ells = shepp_logan_ellipsoids(True)
    zero = torch.zeros(1, 3, dtype=F64)
    along_y = ellipsoid_line_integrals(ells, zero, torch.tensor([[0.0, 1.0, 0.0]], dtype=F64), scale).item()
    along_x = ellipsoid_line_integrals(ells, zero, torch.tensor([[1.0, 0.0, 0.0]], dtype=F64), scale).item()
    # Angle 0: source at (0, sid, 0), the central ray is the y axis; angle pi/2: the x axis.
    assert sino[0, 2, 1].item() == pytest.approx(along_y, abs=1e-9)
    assert sino[2, 2, 1].item() == pytest.approx(along_y, abs=1e-9)
    assert sino[1, 2, 1].item() == pytest.approx(along_x, abs=1e-9)
    assert along_y == pytest.approx(quad_line(ells, [0, 0, 0], [0, 1, 0], scale, 150.0), rel=1e-3)
    assert abs(along_x - along_y) > 1.0                       # the two axes really differ
    # Off-centre pixel (i=3, j=2) at angle 0 (u = +x, v = +z): the line from (0,600,0) through (2, -600, 2).
    src = torch.tensor([[0.0, 600.0, 0.0]], dtype=F64)
    ray = ellipsoid_line_integrals(ells, src, torch.tensor([[2.0, -1200.0, 2.0]], dtype=F64), scale).item()
    assert sino[0, 3, 2].item() == pytest.approx(ray, abs=1e-9)


def test_cone_pixels_against_sphere_chords():
    tr = circular_trajectory_3d(n_views=6, sid=500.0, sdd=900.0, dtype=F64)
    U, V, du, dv = 9, 7, 12.0, 9.0
    c, r = np.array([25.0, -10.0, 15.0]), 40.0
    got = ellipsoid_projections([Ellipsoid.sphere(r, c)], tr, (U, V), (du, dv)).numpy()
    pix = pixel_positions(tr, U, V, du, dv)
    src = tr.source.numpy()[:, None, None, :]
    want = sphere_chord(c, r, src, pix - src)
    assert want.max() > 40 and want.min() == 0.0              # some pixels hit, some miss
    np.testing.assert_allclose(got, want, atol=1e-9)


def test_parallel_2d_exact_and_int_detector_shape():
    tr = circular_trajectory_2d_parallel(8, dtype=F64)
    U, du, r, c = 33, 1.5, 10.0, np.array([5.0, 3.0, 0.0])
    got = ellipsoid_projections([Ellipsoid.sphere(r, c)], tr, U, du)
    assert got.shape == (8, U)
    s = (np.arange(U) - (U - 1) / 2) * du
    cu = tr.detector_u.numpy() @ c                             # centre's offset along u per view
    want = 2 * np.sqrt(np.clip(r * r - (s[None, :] - cu[:, None]) ** 2, 0, None))
    np.testing.assert_allclose(got.numpy(), want, atol=1e-9)
    # (U, 1) gives the same numbers with the V axis kept.
    kept = ellipsoid_projections([Ellipsoid.sphere(r, c)], tr, (U, 1), du)
    assert kept.shape == (8, U, 1) and torch.equal(kept[..., 0], got)


def test_fan_2d_is_central_row_of_3d_cone():
    fan = circular_trajectory_2d_fan(7, sid=400.0, sdd=800.0, dtype=F64)
    cone = circular_trajectory_3d(7, sid=400.0, sdd=800.0, dtype=F64)
    a = shepp_logan_line_integrals(fan, 41, 3.0, scale=80.0, dtype=torch.float32)
    b = shepp_logan_line_integrals(cone, (41, 1), 3.0, scale=80.0)
    assert a.shape == (7, 41) and a.dtype == torch.float32
    torch.testing.assert_close(a, b[..., 0].float())
    assert a.max() > 10


@pytest.mark.parametrize("beam", ["cone", "parallel"])
@pytest.mark.slow
def test_projections_match_generic_rays_for_awkward_geometry(beam):
    # Sources inside the head, oblique (non-orthogonal) detector axes, tiny and huge detectors:
    # the per-view fast path and its shadow windows must agree with the plain per-ray formula.
    rng = np.random.default_rng(7)
    n, U, V, du, dv, scale = 5, 11, 6, 7.0, 5.0, 60.0
    src = rng.normal(size=(n, 3)) * (15.0 if beam == "cone" else 1.0)
    ctr = rng.normal(size=(n, 3)) * 40.0
    u = random_unit(rng, n)
    v = u * 0.3 + random_unit(rng, n)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    tr = Trajectory(*(torch.tensor(x) for x in (src, ctr, u, v)), beam=beam)
    ells = shepp_logan_ellipsoids(False)
    got = ellipsoid_projections(ells, tr, (U, V), (du, dv), scale=scale).numpy()
    pix = pixel_positions(tr, U, V, du, dv)
    s = np.broadcast_to(src[:, None, None, :], pix.shape)
    o, d = (s, pix - s) if beam == "cone" else (pix, s)
    want = ellipsoid_line_integrals(ells, torch.tensor(o.reshape(-1, 3)), torch.tensor(d.reshape(-1, 3)),
                                    scale).numpy().reshape(n, U, V)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-9)
    # A far-away orbit with magnification: windows cut the small ellipsoids but not their values.
    tr = circular_trajectory_3d(12, sid=700.0, sdd=1100.0, dtype=F64) if beam == "cone" else \
        circular_trajectory_3d_parallel(12, dtype=F64)
    got = ellipsoid_projections(ells, tr, (64, 48), 3.0, scale=scale).numpy()
    pix = pixel_positions(tr, 64, 48, 3.0, 3.0)
    s = np.broadcast_to(tr.source.numpy()[:, None, None, :], pix.shape)
    o, d = (s, pix - s) if beam == "cone" else (pix, s)
    want = ellipsoid_line_integrals(ells, torch.tensor(o.reshape(-1, 3)), torch.tensor(d.reshape(-1, 3)),
                                    scale).numpy().reshape(got.shape)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-9)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("shape", [(0, 4, 4), (4, -1), (4, 4, 4, 4), (4,), (4.0, 4, 4), "abc", (True, 3)])
def test_bad_shape(shape):
    with pytest.raises(ValueError, match="shape"):
        shepp_logan_3d(shape)


@pytest.mark.parametrize("kwargs, name", [
    ({"voxel_spacing": -1.0}, "voxel_spacing"),
    ({"voxel_spacing": (1.0, 1.0)}, "voxel_spacing"),
    ({"supersample": 0}, "supersample"),
    ({"scale": 0.0}, "scale"),
    ({"scale": float("nan")}, "scale"),
])
def test_bad_volume_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        shepp_logan_3d((4, 4, 4), **kwargs)


def test_bad_detector_arguments():
    tr3 = circular_trajectory_3d(2, sid=500.0, sdd=1000.0, dtype=F64)
    tr2 = circular_trajectory_2d_fan(2, sid=500.0, sdd=1000.0, dtype=F64)
    for bad in [(4,), (4, 4, 4), (0, 4), (4, -2), 5, (4.0, 4)]:
        with pytest.raises(ValueError, match="detector_shape"):
            shepp_logan_line_integrals(tr3, bad, scale=10.0)
    for bad in [(4, 2), 0]:
        with pytest.raises(ValueError, match="detector_shape"):
            shepp_logan_line_integrals(tr2, bad, scale=10.0)
    with pytest.raises(ValueError, match="detector_spacing"):
        shepp_logan_line_integrals(tr3, (4, 4), (1.0, -1.0), scale=10.0)
    with pytest.raises(ValueError, match="scale"):
        shepp_logan_line_integrals(tr3, (4, 4), scale=-1.0)
    with pytest.raises(ValueError, match="origins and directions"):
        ellipsoid_line_integrals(shepp_logan_ellipsoids(), torch.zeros(4, 3), torch.zeros(4, 2))


# ------------------------------------------------------------------ the chiral phantom
def test_chiral_phantom_has_no_mirror_symmetry_in_any_slice():
    from ctbench.phantoms import chiral_phantom

    vol = chiral_phantom((48, 64, 64), 1.0, scale=30.0).numpy()
    body = [k for k in range(vol.shape[0]) if vol[k].any()]
    assert len(body) > 30
    for k in body:
        s = vol[k]
        # Mirror lines along x, y and both diagonals (the F has none; neither has any slice of the volume).
        for m in (s[:, ::-1], s[::-1, :], s.T, s[::-1, ::-1].T):
            assert np.abs(s - m).sum() > 0.1 * np.abs(s).sum(), f"slice {k} is mirror symmetric"
    # Nor is the volume its own mirror: in x and y by the F, in z by the helix and the tilted ellipsoid
    # (small, so the difference is ~5 % of the volume's sum, measured 0.049).
    for axis, least in ((0, 0.03), (1, 0.1), (2, 0.1)):
        assert np.abs(vol - np.flip(vol, axis)).sum() > least * np.abs(vol).sum()


@pytest.mark.slow
def test_chiral_line_integrals_against_quadrature():
    from ctbench.phantoms import chiral_ellipsoids, chiral_line_integrals

    rng = np.random.default_rng(7)
    ells, scale = chiral_ellipsoids(), 30.0
    traj = circular_trajectory_3d(sid=120.0, sdd=200.0, angles=torch.tensor([0.3, 2.1], dtype=F64), dtype=F64)
    U, V, du = 12, 10, 5.0
    got = chiral_line_integrals(traj, (U, V), du, scale=scale).numpy()
    px = pixel_positions(traj, U, V, du, du)
    src = traj.source.numpy()
    for _ in range(8):
        k, i, j = rng.integers(2), rng.integers(U), rng.integers(V)
        want = quad_line(ells, src[k], px[k, i, j] - src[k], scale, 1.6 * scale)
        assert got[k, i, j] == pytest.approx(want, rel=1e-3, abs=1e-3)
    assert got.max() > 10.0
