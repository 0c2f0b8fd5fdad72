"""Self-calibration: bad input gets a clear error, unidentifiable parameters are reported, not guessed,
and the geometry model matches independent constructions (issue 26)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d, circular_trajectory_3d_parallel
from ctbench.calibration import calibrate, calibrate_iterations
from ctbench.calibration.model import GeometryModel
from ctbench.phantoms import Ellipsoid, ellipsoid_projections
from selfcal_scans import cone_scan, misaligned


@pytest.fixture(scope="module")
def small():
    P, ells = cone_scan(size=32, views=24, det=32, seed=5)
    y, _ = misaligned(P, ells, {"offset_u": 1.5}, seed=6)
    return P, y


def test_too_few_views_for_per_view_shifts():
    P, ells = cone_scan(size=16, views=8, det=16)
    y, _ = misaligned(P, ells, {})
    with pytest.raises(ValueError, match=r"'shift_u' needs at least 12 views.*has 8"):
        calibrate(P, y, ("offset_u", "shift"))


def test_scan_without_structure(small):
    P, y = small
    with pytest.raises(ValueError, match="no structure"):
        calibrate(P, torch.full_like(y, 0.7), ("offset_u",))
    with pytest.raises(ValueError, match="no structure"):
        calibrate(P, torch.zeros_like(y), ("offset_u",))


def test_bounds_that_exclude_the_start(small):
    P, y = small
    with pytest.raises(ValueError, match=r"bounds\['roll'\].*exclude the nominal start"):
        calibrate(P, y, ("roll",), bounds={"roll": (0.5, 2.0)})
    with pytest.raises(ValueError, match=r"start\['roll'\] = 3.0 lies outside its bounds"):
        calibrate(P, y, ("roll",), bounds={"roll": (0.5, 2.0)}, start={"roll": 3.0})
    with pytest.raises(ValueError, match=r"bounds\['roll'\] must be finite with low < high"):
        calibrate(P, y, ("roll",), bounds={"roll": (1.0, -1.0)})


def test_unknown_and_meaningless_parameters(small):
    P, y = small
    with pytest.raises(ValueError, match="unknown parameter 'centre'"):
        calibrate(P, y, ("centre",))
    with pytest.raises(ValueError, match="at least one parameter"):
        calibrate(P, y, ())
    traj = circular_trajectory_3d_parallel(24)
    Q = Projector(traj, (16, 16, 16), (16, 16), backend="cpu")
    with pytest.raises(ValueError, match="'sdd' has no meaning for a parallel beam"):
        calibrate(Q, torch.rand(Q.projection_shape), ("sdd",))
    with pytest.raises(ValueError, match=r"sinogram has shape"):
        calibrate(P, y[:-1], ("offset_u",))
    with pytest.raises(ValueError, match="levels"):
        calibrate(P, y, ("offset_u",), levels=(0,))


@pytest.mark.slow
def test_unidentifiable_parameter_is_reported_not_guessed():
    """In a parallel beam a detector shift along v is a shift of the object along the axis: the object
    explains it completely, so it must come back as 'not identifiable' with no value (a full turn, so that
    the u offset is well determined)."""
    traj = circular_trajectory_3d_parallel(30, angle_range=2 * math.pi)
    P = Projector(traj, (24, 24, 24), (32, 32), voxel_spacing=1.0, detector_spacing=1.0, backend="cpu")
    ells = [Ellipsoid(0.05, (7.0, 5.0, 6.0), (1.0, 0.5, -1.0)), Ellipsoid(0.04, (2.0, 3.0, 2.5), (-3.0, 2.0, 3.0))]
    model = GeometryModel(traj, P.detector_spacing)
    true = model.apply({"offset_u": torch.tensor(1.2, dtype=torch.float64),
                        "offset_v": torch.tensor(0.8, dtype=torch.float64)})
    y = ellipsoid_projections(ells, true, P.detector_shape, 1.0).float()
    res = calibrate(P, y, ("offset_u", "offset_v"), levels=(1,), n_outer=(4,), volume_factor=1)
    rows = {p.name: p for p in res.parameters}
    assert rows["offset_v"].status == "not identifiable" and rows["offset_v"].value is None
    assert rows["offset_v"].identifiability < 0.03
    assert rows["offset_u"].status == "estimated" and abs(rows["offset_u"].value - 1.2) < 0.1
    assert any("offset_v: not identifiable" in n for n in res.notes)
    assert "not identifiable" in res.table()


@pytest.mark.slow
def test_generator_yields_progress_and_cancels(small):
    P, y = small
    stop = threading.Event()
    gen = calibrate_iterations(P, y, ("offset_u",), levels=(2, 1), n_outer=(5, 5), cancel=stop)
    first = next(gen)
    assert first.iteration == 1 and first.binning == 2 and math.isfinite(first.loss)
    assert set(first.parameters) == {"offset_u"}
    stop.set()
    with pytest.raises(StopIteration) as done:
        next(gen)
    res = done.value.value
    assert res.stopped == "cancelled" and len(res.loss_history) == 1
    assert res.trajectory.n_views == P.n_views


def test_per_view_shift_is_an_object_translation():
    """Parallel beam: shifting the object by T in the world gives the data of the per-view shifts
    (T . u_i, T . v_i) / pixel (exact line integrals, no projector involved)."""
    traj = circular_trajectory_3d_parallel(12, dtype=torch.float64)
    ell = [Ellipsoid(1.0, (5.0, 3.0, 4.0), (1.0, -2.0, 0.5))]
    T = torch.tensor([1.3, -0.7, 0.9], dtype=torch.float64)
    moved = [Ellipsoid(1.0, (5.0, 3.0, 4.0), tuple(float(c) for c in torch.tensor([1.0, -2.0, 0.5]) + T))]
    pitch = (0.8, 0.6)
    model = GeometryModel(traj, pitch)
    a = (model.uh @ T) / pitch[0]
    b = (model.vh @ T) / pitch[1]
    shifted = model.apply({}, a, b)
    want = ellipsoid_projections(moved, traj, (24, 20), pitch)
    got = ellipsoid_projections(ell, shifted, (24, 20), pitch)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
    # and that direction is in the gauge the calibration removes
    N = model.gauge_vectors(("shift_u", "shift_v"), ())
    coef = torch.linalg.lstsq(N, torch.cat([a, b])[:, None]).solution
    torch.testing.assert_close(N @ coef, torch.cat([a, b])[:, None], rtol=0, atol=1e-9)


def test_roll_and_offset_match_an_explicit_detector():
    traj = circular_trajectory_3d(6, 300.0, 600.0, dtype=torch.float64)
    model = GeometryModel(traj, (1.5, 2.0))
    phi = math.radians(0.7)
    t = model.apply({"roll": torch.tensor(0.7, dtype=torch.float64),
                     "offset_u": torch.tensor(2.5, dtype=torch.float64)})
    u0, v0 = traj.detector_u, traj.detector_v
    torch.testing.assert_close(t.detector_u, math.cos(phi) * u0 + math.sin(phi) * v0)
    torch.testing.assert_close(t.detector_v, -math.sin(phi) * u0 + math.cos(phi) * v0)
    torch.testing.assert_close(t.detector_center, traj.detector_center + 2.5 * 1.5 * u0)
    torch.testing.assert_close(t.source, traj.source)
    zero = model.apply({k: torch.tensor(0.0, dtype=torch.float64) for k in
                        ("offset_u", "offset_v", "roll", "pitch", "yaw", "axis_tilt", "sdd")})
    for p, q in zip(zero.tensors(), traj.tensors()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_nothing_identifiable_leaves_the_geometry_nominal():
    traj = circular_trajectory_3d_parallel(30, angle_range=2 * math.pi)
    P = Projector(traj, (24, 24, 24), (32, 32), backend="cpu")
    ells = [Ellipsoid(0.05, (7.0, 5.0, 6.0), (1.0, 0.5, -1.0)), Ellipsoid(0.04, (2.0, 3.0, 2.5), (-3.0, 2.0, 3.0))]
    y = ellipsoid_projections(ells, traj, P.detector_shape, 1.0).float()
    res = calibrate(P, y, ("offset_v",), levels=(1,), n_outer=(3,), volume_factor=1)
    assert [p.status for p in res.parameters] == ["not identifiable"]
    assert any("geometry is left nominal" in n for n in res.notes)
    for a, b in zip(res.trajectory.tensors(), traj.tensors()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["offset_u", "offset_v", "roll", "pitch", "yaw", "axis_tilt", "sdd"])
@pytest.mark.slow
def test_loss_gradient_through_the_projector_matches_finite_differences(name):
    """Every global parameter reaches the projector's geometry gradients; d(loss)/d(p) by autograd agrees
    with a central difference of the loss (float64, reference backend)."""
    traj = circular_trajectory_3d(8, 60.0, 120.0, dtype=torch.float64)
    P = Projector(traj, (10, 12, 12), (16, 14), voxel_spacing=1.0, detector_spacing=1.6, backend="reference")
    model = GeometryModel(traj, P.detector_spacing)
    g = torch.Generator().manual_seed(0)
    # a smooth volume: Joseph's interpolation is piecewise linear, so a rough one puts kinks everywhere
    zz, yy, xx = torch.meshgrid(*(torch.arange(n, dtype=torch.float64) - (n - 1) / 2 for n in P.volume_shape),
                                indexing="ij")
    x = torch.exp(-((xx - 1.0) ** 2 / 8 + (yy + 0.5) ** 2 / 12 + (zz - 0.5) ** 2 / 6))
    y = torch.rand(P.projection_shape, generator=g, dtype=torch.float64)
    p0 = {"offset_u": 0.3, "offset_v": -0.2, "roll": 0.4, "pitch": 1.0, "yaw": -1.0, "axis_tilt": 0.5, "sdd": 2.0}

    def loss(value, requires_grad=False):
        t = torch.tensor(value, dtype=torch.float64, requires_grad=requires_grad)
        vals = {k: (t if k == name else torch.tensor(v, dtype=torch.float64)) for k, v in p0.items()}
        return t, 0.5 * (P.project(x, trajectory=model.apply(vals)) - y).square().sum()

    t, l0 = loss(p0[name], True)
    (grad,) = torch.autograd.grad(l0, t)
    h = 1e-4
    fd = (loss(p0[name] + h)[1] - loss(p0[name] - h)[1]) / (2 * h)
    assert abs(float(grad)) > 0
    assert float(grad) == pytest.approx(float(fd), rel=2e-3, abs=1e-6)
