"""FDK on every geometry a real scan has: calibrated per-view geometry (roll, drift, tilts, per-view distances),
displaced (half-fan) detectors, non-circular planar orbits, and what FDK still refuses.

Truths are independent of the code under test: exact line integrals of ellipsoids (``ctbench.phantoms``) and
their voxel values, an FDK written here from the textbook formulas (numpy-free torch, its own geometry, its own
filter by direct convolution and its own interpolation), conjugate rays found geometrically, and the weighted
backprojection's pure-torch reference backend.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ctbench import Projector, circular_trajectory_2d_fan, circular_trajectory_3d
from ctbench.calibration.model import GeometryModel
from ctbench.calibration.simulate import gauge_free_walk, true_trajectory
from ctbench.geometry import (circular_trajectory_2d_parallel, circular_trajectory_3d_parallel, half_fan_offset,
                              half_fan_trajectory_3d, saddle_trajectory_3d, sinusoidal_trajectory_2d_fan,
                              spiral_trajectory_3d)
from ctbench.io.orientation import roll_detector
from ctbench.phantoms import Ellipsoid, ellipsoid_phantom, ellipsoid_projections, shepp_logan_ellipsoids
from ctbench.solvers import fbp, fdk, fdk_into, fdk_weighting, field_of_view
from ctbench.solvers import weights as W
from ctbench.storage import ZarrStore

F64 = torch.float64


def _rmse(a, b, mask=None):
    d = (a.double() - b.double())
    if mask is not None:
        d = d[mask]
    return math.sqrt(float((d * d).mean()))


# ------------------------------------------------------------------ an independent FDK
def textbook_fdk(sino: torch.Tensor, angles, sid: float, sdd: float, du: float, dv: float, shape, voxel: float,
                 offset_u: float = 0.0) -> torch.Tensor:
    """Feldkamp, Davis & Kress (1984) for a circular orbit, written from the formulas: source at
    sid (-sin b, cos b, 0), flat detector at sdd opposite, u = (cos b, sin b, 0), v = z; cosine weights,
    Kak & Slaney's ramp by direct convolution, voxel-driven backprojection with sid sdd / U^2 and
    bilinear interpolation (zero off the detector).  float64."""
    n, U, V = sino.shape
    us = (torch.arange(U, dtype=F64) - (U - 1) / 2) * du + offset_u
    vs = (torch.arange(V, dtype=F64) - (V - 1) / 2) * dv
    cosw = sdd / torch.sqrt(sdd ** 2 + us[:, None] ** 2 + vs[None, :] ** 2)
    lag = torch.arange(-(U - 1), U)
    h = torch.zeros(2 * U - 1, dtype=F64)
    h[lag == 0] = 1 / (4 * du * du)
    odd = lag % 2 != 0
    h[odd] = -1 / (math.pi * lag[odd].double() * du) ** 2
    p = sino.double() * cosw
    # q[k, i, j] = du sum_l h[i - l] p[k, l, j]
    idx = torch.arange(U)[:, None] - torch.arange(U)[None, :] + (U - 1)
    q = du * torch.einsum("il,klj->kij", h[idx], p)
    D, H, Wd = shape
    z = (torch.arange(D, dtype=F64) - (D - 1) / 2) * voxel
    y = (torch.arange(H, dtype=F64) - (H - 1) / 2) * voxel
    x = (torch.arange(Wd, dtype=F64) - (Wd - 1) / 2) * voxel
    Z, Y, X = torch.meshgrid(z, y, x, indexing="ij")
    out = torch.zeros(shape, dtype=F64)
    angles = torch.as_tensor(angles, dtype=F64)
    dbeta = 2 * math.pi / n
    for k in range(n):
        b = float(angles[k])
        t = X * math.cos(b) + Y * math.sin(b)         # along u
        s = -X * math.sin(b) + Y * math.cos(b)        # towards the source
        depth = sid - s
        uu = t * sdd / depth
        vv = Z * sdd / depth
        fi = (uu - offset_u) / du + (U - 1) / 2
        fj = vv / dv + (V - 1) / 2
        i0, j0 = fi.floor().long(), fj.floor().long()
        ti, tj = fi - i0, fj - j0
        val = torch.zeros_like(fi)
        for di, wi in ((0, 1 - ti), (1, ti)):
            for dj, wj in ((0, 1 - tj), (1, tj)):
                ii, jj = i0 + di, j0 + dj
                ok = (ii >= 0) & (ii < U) & (jj >= 0) & (jj < V)
                val += torch.where(ok, wi * wj * q[k][ii.clamp(0, U - 1), jj.clamp(0, V - 1)], torch.zeros_like(fi))
        out += 0.5 * dbeta * sid * sdd / depth ** 2 * val
    return out


# ------------------------------------------------------------------ calibrated scans
N, DET, VOX, PIX, SID, SDD, VIEWS, SCALE = 48, 48, 5.0, 10.0, 600.0, 1200.0, 90, 104.0


def _case():
    traj = circular_trajectory_3d(VIEWS, SID, SDD, dtype=F64)
    ells = shepp_logan_ellipsoids(modified=False)
    truth = ellipsoid_phantom(ells, (N, N, N), VOX, scale=SCALE, dtype=F64)
    return traj, ells, truth


def _scan(traj, ells):
    p = Projector(traj, (N, N, N), (DET, DET), voxel_spacing=VOX, detector_spacing=PIX)
    return p, ellipsoid_projections(ells, traj, (DET, DET), PIX, scale=SCALE)


def _misaligned(traj, values, walk):
    model = GeometryModel(traj, (PIX, PIX))
    shifts = gauge_free_walk(model, walk, seed=4) if walk else None
    return true_trajectory(traj, (PIX, PIX), values, shifts)


@pytest.fixture(scope="module")
def exact():
    traj, ells, truth = _case()
    p, sino = _scan(traj, ells)
    mask = field_of_view(p)
    return dict(traj=traj, ells=ells, truth=truth, mask=mask, rec=fdk(p, sino), sino=sino)


def test_exact_geometry_agrees_with_an_independent_fdk(exact):
    indep = textbook_fdk(exact["sino"], exact["traj"].meta["angles"], SID, SDD, PIX, PIX, (N, N, N), VOX)
    mask, truth = exact["mask"], exact["truth"]
    ours, theirs = _rmse(exact["rec"], truth, mask), _rmse(indep, truth, mask)
    assert abs(ours - theirs) <= 0.02 * theirs, (ours, theirs)
    # the two reconstructions themselves: the same method, so far closer to each other than to the phantom
    assert _rmse(exact["rec"], indep, mask) < 0.05 * theirs


@pytest.mark.slow
@pytest.mark.parametrize("name,values,walk", [
    ("roll", {"roll": 0.6}, 0.0),
    ("drift", {}, 1.5),
    ("roll and drift", {"roll": 0.6, "offset_u": 1.4}, 1.5),
    ("roll 5 degrees", {"roll": 5.0}, 0.0),
    ("pitch, yaw and axis tilt", {"pitch": 1.0, "yaw": 1.0, "axis_tilt": 1.0}, 0.0),
])
def test_fdk_on_a_calibrated_trajectory_is_as_good_as_on_the_exact_geometry(exact, name, values, walk):
    """The scan measured through the misaligned geometry, reconstructed by FDK with that geometry as it is
    (no resampling): RMSE within 5% of the exact geometry's."""
    tt = _misaligned(exact["traj"], values, walk)
    p, sino = _scan(tt, exact["ells"])
    rec = fdk(p, sino)
    base = _rmse(exact["rec"], exact["truth"], exact["mask"])
    got = _rmse(rec, exact["truth"], exact["mask"])
    assert got <= 1.05 * base, (name, got, base)
    if walk:
        # the geometry was used, not ignored: the drifting scan reconstructed on the nominal circle is far worse
        # (a roll of a few tenths of a degree, ignored, costs this small scan less than the discretisation)
        p_nominal = Projector(exact["traj"], (N, N, N), (DET, DET), voxel_spacing=VOX, detector_spacing=PIX)
        assert _rmse(fdk(p_nominal, sino), exact["truth"], exact["mask"]) > 1.4 * got, name


def test_orbit_reads_each_views_geometry():
    traj = circular_trajectory_3d(36, 300.0, 600.0, dtype=F64)
    model = GeometryModel(traj, (2.0, 2.0))
    walk = gauge_free_walk(model, 2.0, seed=1)
    tt = true_trajectory(traj, (2.0, 2.0), {"roll": 1.5, "sdd": 12.0}, walk)
    p = Projector(tt, (16, 24, 24), (40, 32), voxel_spacing=2.0, detector_spacing=2.0)
    orbit = W.orbit_of(p, who="test")
    assert torch.allclose(orbit.roll.abs(), torch.full((36,), math.radians(1.5), dtype=F64), atol=1e-9)
    # per-view distances: the source moved with the object's shifts, the detector 12 mm further
    src, ctr = tt.source.double(), tt.detector_center.double()
    torch.testing.assert_close(orbit.radius, src[:, :2].norm(dim=1))
    n = torch.linalg.cross(tt.detector_u, tt.detector_v).double()
    torch.testing.assert_close(orbit.sdd, ((ctr - src) * n).sum(1).abs())
    assert float(orbit.sdd.mean()) == pytest.approx(612.0, abs=0.01)
    assert float(orbit.source_z.max() - orbit.source_z.min()) > 0.5  # vertical drift, accepted


def test_fdk_refuses_only_what_it_cannot_represent():
    fine = circular_trajectory_3d(24, 60.0, 120.0, dtype=F64)
    zero = torch.zeros(24, 14, 8, dtype=F64)
    kw = dict(voxel_spacing=1.0, detector_spacing=1.6)
    with pytest.raises(ValueError, match="rolls it by up to 30 degrees.*unroll_images.*iterative"):
        fdk(Projector(roll_detector(fine, 30.0), (6, 10, 10), (14, 8), **kw), zero)
    fdk(Projector(roll_detector(fine, 9.0), (6, 10, 10), (14, 8), **kw), zero)  # a roll FDK takes
    saddle = saddle_trajectory_3d(24, sid=60.0, sdd=120.0, z_amplitude=5.0, radial_amplitude=0.0, dtype=F64)
    with pytest.raises(ValueError, match="source z varies.*iterative solver"):
        fdk(Projector(saddle, (6, 10, 10), (14, 8), **kw), zero)
    helix = spiral_trajectory_3d(24, sid=60.0, sdd=120.0, z_range=10.0, dtype=F64)
    with pytest.raises(ValueError, match="helical_fdk"):
        fdk(Projector(helix, (6, 10, 10), (14, 8), **kw), zero)
    # a detector facing along the axis
    up = fine.replace(detector_v=torch.linalg.cross(fine.detector_u, torch.tensor([0.0, 0.0, 1.0], dtype=F64)
                                                    .expand(24, 3), dim=1))
    with pytest.raises(ValueError, match="faces along the rotation"):
        W.orbit_of(Projector(up.replace(detector_center=up.detector_center + torch.tensor([0, 0, -60.0], dtype=F64),
                                        source=up.source + torch.tensor([0, 0, 60.0], dtype=F64)),
                             (6, 10, 10), (14, 8), **kw))


def test_non_circular_planar_orbit_in_2d():
    """A fan-beam orbit whose source distance swings by 20 % three times a turn (sinusoidal, diffct's): the cosine
    weights take the Jacobian |1 - (R'/R) tan gamma| of the non-circular orbit (an odd frequency: conjugate rays
    do not cancel its error), and the image is as good as the circular orbit's."""
    ells = [Ellipsoid(1.0, (30.0, 22.0, 30.0), (3.0, -4.0, 0.0)), Ellipsoid(0.5, (8.0, 5.0, 8.0), (-6.0, 8.0, 0.0))]
    truth = ellipsoid_phantom(ells, (80, 80), 1.0, scale=1.0, dtype=F64)
    out = {}
    for name, traj in (("circle", circular_trajectory_2d_fan(360, 250.0, 450.0, dtype=F64)),
                       ("swing", sinusoidal_trajectory_2d_fan(360, 250.0, 450.0, amplitude=50.0, frequency=3.0,
                                                              dtype=F64))):
        p = Projector(traj, (80, 80), 160, voxel_spacing=1.0, detector_spacing=1.5)
        out[name] = fbp(p, ellipsoid_projections(ells, traj, 160, 1.5))
    box = (slice(30, 50), slice(28, 48))
    assert float(out["swing"][box].mean()) == pytest.approx(float(truth[box].mean()), rel=0.02)
    assert _rmse(out["swing"], truth) < 1.02 * _rmse(out["circle"], truth)


# ------------------------------------------------------------------ displaced (half-fan) detectors
def _conjugate_pixel(traj, k, i, sid, sdd, du, U):
    """The 2D fan's conjugate of ray (view k, column i), found geometrically: (angle of the other source, the
    other view's u coordinate of the same line)."""
    src = traj.source[k, :2].double()
    pix = traj.detector_center[k, :2].double() + (i - (U - 1) / 2) * du * traj.detector_u[k, :2].double()
    d = pix - src
    t = -2 * float(src @ d) / float(d @ d)
    other = src + t * d
    b2 = math.atan2(float(-other[0]), float(other[1]))
    u2 = torch.tensor([math.cos(b2), math.sin(b2)], dtype=F64)
    radial = torch.tensor([-math.sin(b2), math.cos(b2)], dtype=F64)
    c2 = -(sdd - sid) * radial
    s_ = float((c2 - other) @ radial) / float(-d @ radial)
    return b2, float((other - s_ * d - c2) @ u2)


def test_wang_weights_complement_on_conjugate_rays():
    """Over a full turn with the detector displaced by 40 % of its width, a ray and its conjugate (found
    geometrically, with the displacement's offset) weigh 1 together; rays whose conjugate misses the detector
    weigh 1; the weights are smooth (no step larger than the overlap's sampling gives)."""
    U, du, sid, sdd = 80, 2.0, 150.0, 300.0
    offset = half_fan_offset(U * du, 0.1 * U * du)
    assert offset == pytest.approx(0.4 * U * du)
    traj = circular_trajectory_2d_fan(120, sid, sdd, detector_offset=offset, dtype=F64)
    p = Projector(traj, (32, 32), U, voxel_spacing=1.0, detector_spacing=du)
    orbit = W.orbit_of(p, who="test")
    wt = W.weighting_of(orbit)
    assert wt.kind == "displaced"
    w = wt.per_column
    rng = np.random.default_rng(1)
    checked = alone = 0
    for _ in range(300):
        k, i = int(rng.integers(0, 120)), int(rng.integers(0, U))
        b2, u2 = _conjugate_pixel(traj, k, i, sid, sdd, du, U)
        i2 = (u2 - offset) / du + (U - 1) / 2          # the conjugate's column (fractional)
        if not 0 <= i2 <= U - 1:
            assert float(w[k, i]) == 1.0
            alone += 1
            continue
        # the conjugate's weight, interpolated between its columns (any view: the weights depend on the column)
        j = min(int(i2), U - 2)
        w2 = float(w[0, j]) * (j + 1 - i2) + float(w[0, j + 1]) * (i2 - j)
        assert abs(float(w[k, i]) + w2 - 1.0) < 2e-3, (k, i, float(w[k, i]), w2)
        checked += 1
    assert checked > 40 and alone > 40
    assert float((w[0, 1:] - w[0, :-1]).abs().max()) < 0.15


def test_displaced_short_scan_weights_sum_to_one_over_each_line():
    U, du, sid, sdd = 60, 2.0, 150.0, 300.0
    offset = half_fan_offset(U * du, 0.3 * U * du)
    fan = 2 * math.atan((U * du / 2 + offset) / sdd)
    traj = circular_trajectory_2d_fan(100, sid, sdd, angle_range=math.pi + fan + 0.2, detector_offset=offset,
                                      dtype=F64)
    p = Projector(traj, (32, 32), U, voxel_spacing=1.0, detector_spacing=du)
    orbit = W.orbit_of(p, who="test")
    with pytest.warns(RuntimeWarning, match="displaced detector"):
        wt = W.weighting_of(orbit)
    assert wt.kind == "displaced+parker"
    w, ang = wt.per_column, orbit.angles
    rng = np.random.default_rng(2)
    checked = 0
    for _ in range(300):
        k, i = int(rng.integers(0, 100)), int(rng.integers(0, U))
        b2, u2 = _conjugate_pixel(traj, k, i, sid, sdd, du, U)
        b2 = float(ang[0]) + (b2 - float(ang[0])) % (2 * math.pi)
        i2 = (u2 - offset) / du + (U - 1) / 2
        k2 = (b2 - float(ang[0])) / orbit.step
        if not (0 <= i2 <= U - 1 and 0 <= k2 <= 99):
            continue  # measured once (or at the arc's ends): no pair to check
        # the conjugate's weight from the weights' own formula at that view angle and column
        probe = W.Orbit(torch.tensor([float(ang[0]), b2], dtype=F64), orbit.direction, orbit.step, orbit.coverage,
                        orbit.radius[:2], orbit.sdd[:2], orbit.source_z[:2], orbit.pixel_u[[0, 0]], orbit.pixel_v[:2],
                        True, orbit.handedness)
        full = W.displaced_short_scan_weights(probe)[1]
        j = min(int(i2), U - 2)
        w2 = float(full[j]) * (j + 1 - i2) + float(full[j + 1]) * (i2 - j)
        if 0.02 < float(w[k, i]) < 0.98:
            assert abs(float(w[k, i]) + w2 - 1.0) < 0.03, (k, i, float(w[k, i]), w2)
            checked += 1
    assert checked > 20


def _half_fan_case(kind: str):
    """(projector, sinogram) of an off-centre phantom: a half-fan scan (detector offset 40 % of its width) or the
    centred scan whose detector covers the same field of view."""
    U, du, V, dv, sid, sdd = 40, 4.0, 24, 4.0, 300.0, 600.0
    ells = [Ellipsoid(1.0, (50.0, 40.0, 20.0), (8.0, -5.0, 0.0), ((0.8, -0.6, 0.0), (0.6, 0.8, 0.0), (0, 0, 1.0))),
            Ellipsoid(0.5, (12.0, 9.0, 12.0), (-20.0, 22.0, 3.0)), Ellipsoid(-0.3, (7.0, 7.0, 7.0), (30.0, 5.0, -4.0))]
    if kind == "half-fan":
        traj = half_fan_trajectory_3d(180, sid, sdd, U * du, 0.1 * U * du, dtype=F64)
        det = (U, V)
    else:
        traj = circular_trajectory_3d(180, sid, sdd, dtype=F64)
        det = (int(round(1.8 * U)), V)
    p = Projector(traj, (16, 48, 48), det, voxel_spacing=2.5, detector_spacing=(du, dv))
    return p, ellipsoid_projections(ells, traj, det, (du, dv)), ellipsoid_phantom(ells, (16, 48, 48), 2.5,
                                                                                   scale=1.0, dtype=F64)


def test_half_fan_scan_reconstructs_like_a_centred_scan():
    p_half, s_half, truth = _half_fan_case("half-fan")
    p_full, s_full, _ = _half_fan_case("centred")
    info = fdk_weighting(p_half)
    assert info["kind"] == "displaced" and info["detector_asymmetry"] == pytest.approx(0.8, abs=0.02)
    assert fdk_weighting(p_full)["kind"] == "full"
    half, full = fdk(p_half, s_half), fdk(p_full, s_full)
    mask = field_of_view(p_full)
    e_half, e_full = _rmse(half, truth, mask), _rmse(full, truth, mask)
    assert e_half <= 1.10 * e_full, (e_half, e_full)
    # without Wang's weights the truncated half-fan scan is far worse
    plain = fdk(p_half, s_half, displaced=False)
    assert _rmse(plain, truth, mask) > 3 * e_half


def test_half_fan_field_of_view():
    """The midplane field of view of a half-fan scan is the disc of radius sid sin(gamma_max) (the fan's far
    edge), about twice the centred detector's."""
    p_half, _, _ = _half_fan_case("half-fan")
    m = field_of_view(p_half)
    U, du, sid, sdd = 40, 4.0, 300.0, 600.0
    reach = (U - 1) / 2 * du + half_fan_offset(U * du, 0.1 * U * du)
    r_fov = sid * math.sin(math.atan(reach / sdd))
    c = (torch.arange(48, dtype=F64) - 23.5) * 2.5
    r = torch.sqrt(c[None, :] ** 2 + c[:, None] ** 2)
    mid = m[8]
    assert bool(mid[r < r_fov - 3.0].all()) and not bool(mid[r > r_fov + 3.0].any())
    inner = field_of_view(p_half, displaced=False)[8]   # the band both sides see: the old, smaller disc
    assert int(inner.sum()) < 0.4 * int(mid.sum())


def test_parallel_half_acquisition():
    """A parallel scan over 360 degrees with the detector displaced (synchrotron half acquisition): Wang's weights
    of the lateral offset; the same image as a centred detector twice as wide."""
    ells = [Ellipsoid(1.0, (25.0, 18.0, 30.0), (4.0, -3.0, 0.0)), Ellipsoid(0.5, (6.0, 5.0, 8.0), (-12.0, 14.0, 0.0))]
    truth = ellipsoid_phantom(ells, (64, 64), 1.0, scale=1.0, dtype=F64)
    half = circular_trajectory_2d_parallel(240, detector_offset=half_fan_offset(48.0, 4.0), angle_range=2 * math.pi,
                                           dtype=F64)
    full = circular_trajectory_2d_parallel(120, dtype=F64)
    ph, pf = Projector(half, (64, 64), 48, voxel_spacing=1.0), Projector(full, (64, 64), 88, voxel_spacing=1.0)
    assert fdk_weighting(ph)["kind"] == "displaced"
    rh = fbp(ph, ellipsoid_projections(ells, half, 48, 1.0))
    rf = fbp(pf, ellipsoid_projections(ells, full, 88, 1.0))
    disc = (torch.arange(64, dtype=F64) - 31.5)
    inside = (disc[None, :] ** 2 + disc[:, None] ** 2) < 40.0 ** 2
    assert _rmse(rh, truth, inside) <= 1.10 * _rmse(rf, truth, inside)


def test_streamed_and_batched_fdk_take_the_new_geometries(tmp_path):
    """fdk_into (slab by slab, view batches) and the workbench's batched FBP give fdk's result on a rolled,
    drifting half-fan scan."""
    from ctbench.workbench.batched_fbp import filtered_backprojection_in_batches

    traj = half_fan_trajectory_3d(40, 200.0, 400.0, 24 * 3.0, 6.0)
    model = GeometryModel(traj, (3.0, 3.0))
    tt = true_trajectory(traj, (3.0, 3.0), {"roll": 1.0}, gauge_free_walk(model, 1.0, seed=2)).to(dtype=torch.float32)
    p = Projector(tt, (12, 20, 20), (24, 16), voxel_spacing=3.0, detector_spacing=3.0)
    sino = ellipsoid_projections([Ellipsoid(1.0, (20.0, 16.0, 10.0), (5.0, -3.0, 0.0))], tt, (24, 16), 3.0).float()
    ref = fdk(p, sino)
    src = ZarrStore.create(str(tmp_path / "s.zarr"), tuple(sino.shape), torch.float32)
    src.write(None, sino)
    out = ZarrStore.create(str(tmp_path / "v.zarr"), (12, 20, 20), torch.float32)
    fdk_into(p, src, out)
    torch.testing.assert_close(out.read(), ref, rtol=1e-5, atol=1e-5)
    gen = filtered_backprojection_in_batches(p, sino, batch=7)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            vol = stop.value
            break
    torch.testing.assert_close(vol, ref, rtol=1e-5, atol=1e-5)


def test_weighting_report():
    kw = dict(voxel_spacing=2.0, detector_spacing=2.0)
    full = fdk_weighting(Projector(circular_trajectory_3d(30, 100.0, 200.0), (4, 8, 8), (16, 8), **kw))
    assert full["kind"] == "full" and full["coverage_deg"] == pytest.approx(360.0)
    short = fdk_weighting(Projector(circular_trajectory_3d(30, 100.0, 200.0, angle_range=math.radians(220)),
                                    (4, 8, 8), (16, 8), **kw))
    assert short["kind"] == "parker" and "Parker" in short["description"]
    tiny = fdk_weighting(Projector(circular_trajectory_3d(30, 100.0, 200.0, angle_range=math.radians(90)),
                                   (4, 8, 8), (16, 8), **kw))
    assert tiny["warnings"] and "180 + fan angle" in tiny["warnings"][0]
    par = fdk_weighting(Projector(circular_trajectory_3d_parallel(30), (4, 8, 8), (16, 8), **kw))
    assert par["kind"] == "parallel"
    with pytest.raises(ValueError, match="must be 'auto', True or False"):
        fdk_weighting(Projector(circular_trajectory_3d(30, 100.0, 200.0), (4, 8, 8), (16, 8), **kw), displaced="yes")


@pytest.mark.parametrize("kind", ["calibrated-half-fan", "cylinder"])
def test_slab_fdk_takes_the_new_geometries(kind):
    """The streamed pipeline's SlabFDK (row bands, views in batches, slab by slab) gives fdk's result on a rolled,
    drifting half-fan scan (per-view distances, padding of the short side); a cylindrical detector is refused
    (its kernel mode measures rows from the source's height, so row bands do not apply) and goes to fdk."""
    from ctbench.solvers.cylindrical import CylindricalProjector
    from ctbench.solvers.slab_fdk import SlabFDK

    ell = [Ellipsoid(1.0, (20.0, 16.0, 10.0), (5.0, -3.0, 0.0))]
    if kind == "cylinder":
        traj = circular_trajectory_3d(40, 200.0, 400.0)
        p = CylindricalProjector(traj, (12, 20, 20), (24, 16), voxel_spacing=3.0, detector_spacing=3.0)
        with pytest.raises(ValueError, match="flat detectors"):   # routed to the in-memory FDK
            SlabFDK(p)
        return
    else:
        traj = half_fan_trajectory_3d(40, 200.0, 400.0, 24 * 3.0, 6.0)
        model = GeometryModel(traj, (3.0, 3.0))
        traj = true_trajectory(traj, (3.0, 3.0), {"roll": 1.0}, gauge_free_walk(model, 1.0, seed=2)).to(dtype=torch.float32)
        p = Projector(traj, (12, 20, 20), (24, 16), voxel_spacing=3.0, detector_spacing=3.0)
        sino = ellipsoid_projections(ell, traj, (24, 16), 3.0).float()
        assert sum(W.detector_padding(W.orbit_of(p))) > 0
    ref = fdk(p, sino)
    s = SlabFDK(p)
    out = torch.empty_like(ref)
    for z0 in range(0, 12, 5):
        z1 = min(12, z0 + 5)
        lo, hi = s.rows(z0, z1)
        blocks = [((a, a + 9), sino[a:a + 9, :, lo:hi]) for a in range(0, 36, 9)] + [((36, 40), sino[36:, :, lo:hi])]
        out[z0:z1] = s.slab(z0, z1, blocks)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
