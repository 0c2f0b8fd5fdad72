"""Trajectory generators, rigid transforms, JSON round trip and view slicing."""

import json
import math

import pytest
import torch

from ctbench import (
    Trajectory,
    circular_trajectory_2d_fan,
    circular_trajectory_2d_parallel,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    custom_trajectory_3d,
    load_trajectory,
    saddle_trajectory_3d,
    sinusoidal_trajectory_3d,
    spiral_trajectory_3d,
    transform_trajectory,
)

ALL = [
    lambda dt: circular_trajectory_3d(12, 500.0, 900.0, dtype=dt),
    lambda dt: spiral_trajectory_3d(20, sid=80.0, sdd=128.0, z_range=8.0, n_turns=2.0, dtype=dt),
    lambda dt: saddle_trajectory_3d(16, 300.0, 600.0, z_amplitude=20.0, dtype=dt),
    lambda dt: sinusoidal_trajectory_3d(16, 300.0, 600.0, amplitude=15.0, frequency=3.0, dtype=dt),
    lambda dt: circular_trajectory_3d_parallel(10, dtype=dt),
    lambda dt: circular_trajectory_2d_fan(10, 400.0, 550.0, dtype=dt),
    lambda dt: circular_trajectory_2d_parallel(10, dtype=dt),
]


@pytest.mark.parametrize("make", ALL)
def test_orthonormal_detector_frames_facing_the_source(make):
    tr = make(torch.float64)
    u, v = tr.detector_u, tr.detector_v
    torch.testing.assert_close(u.norm(dim=1), torch.ones(tr.n_views, dtype=torch.float64))
    torch.testing.assert_close(v.norm(dim=1), torch.ones(tr.n_views, dtype=torch.float64))
    torch.testing.assert_close((u * v).sum(1), torch.zeros(tr.n_views, dtype=torch.float64))
    ray = tr.detector_center - tr.source if tr.beam == "cone" else tr.source
    # the central ray is perpendicular to the detector plane
    torch.testing.assert_close((ray * u).sum(1), torch.zeros(tr.n_views, dtype=torch.float64), atol=1e-9, rtol=0)
    # right-handed detector frame: u x v points along the rays, source -> detector (docs/GEOMETRY.md)
    assert ((torch.linalg.cross(u, v, dim=1) * ray).sum(1) > 0).all()


def test_circular_convention_and_distances():
    # docs/GEOMETRY.md (diffct 2.5's frame): source at sid (-sin t, cos t, 0), u = (cos t, sin t, 0)
    tr = circular_trajectory_3d(4, 600.0, 1200.0, dtype=torch.float64)
    torch.testing.assert_close(tr.source[0], torch.tensor([0.0, 600.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(tr.detector_center[0], torch.tensor([0.0, -600.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(tr.detector_u[0], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(tr.detector_v[0], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close((tr.detector_center - tr.source).norm(dim=1), torch.full((4,), 1200.0, dtype=torch.float64))
    # quarter turn (anticlockwise seen from +z): source at (-sid, 0, 0), u = +y
    torch.testing.assert_close(tr.source[1], torch.tensor([-600.0, 0.0, 0.0], dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(tr.detector_u[1], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64), atol=1e-12, rtol=0)
    # parallel: ray (cos t, sin t, 0), u = (-sin t, cos t, 0)
    par = circular_trajectory_3d_parallel(2, dtype=torch.float64)
    torch.testing.assert_close(par.source[1], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(par.detector_u[1], torch.tensor([-1.0, 0.0, 0.0], dtype=torch.float64),
                               atol=1e-12, rtol=0)


def test_end_angle_and_angle_range():
    a = circular_trajectory_3d(8, 100.0, 200.0, start_angle=0.5, end_angle=2.5, dtype=torch.float64)
    b = circular_trajectory_3d(8, 100.0, 200.0, start_angle=0.5, angle_range=2.0, dtype=torch.float64)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors()))
    torch.testing.assert_close(torch.tensor(a.meta["angles"], dtype=torch.float64),
                               0.5 + 0.25 * torch.arange(8, dtype=torch.float64))
    # diffct: without end_angle a circular orbit ends at 2 pi, whatever the start
    c = circular_trajectory_3d(4, 100.0, 200.0, start_angle=1.0)
    assert c.meta["angles"][1] == pytest.approx(1.0 + (2 * math.pi - 1.0) / 4)
    with pytest.raises(ValueError, match="end_angle.*angle_range"):
        circular_trajectory_3d(4, 100.0, 200.0, end_angle=1.0, angle_range=1.0)


def test_trajectories_unpack_like_diffct_tuples():
    src, det, u, v = circular_trajectory_3d(5, 100.0, 200.0)
    assert src.shape == (5, 3) and v.shape == (5, 3)
    ray, origin, u2 = circular_trajectory_2d_parallel(6, 2.0)
    assert ray.shape == origin.shape == u2.shape == (6, 2)
    torch.testing.assert_close(origin, 2.0 * u2)
    back = Trajectory.from_diffct((ray, origin, u2), beam="parallel")
    assert back.beam == "parallel" and back.ndim == 2 and back.diffct_beam == "parallel"
    assert torch.equal(back.source[:, :2], ray) and torch.equal(back.detector_v[:, 2], torch.ones(6))
    with pytest.raises(ValueError, match="beam='fan' or beam='parallel'"):
        Trajectory.from_diffct((ray, origin, u2))
    with pytest.raises(ValueError, match=r"shape \(6, 3\)"):
        Trajectory.from_diffct((ray, origin, torch.zeros(6, 3)), beam="fan")


def test_spiral_rises_through_z_range():
    tr = spiral_trajectory_3d(31, sid=80.0, sdd=128.0, z_range=8.0, n_turns=1.0, dtype=torch.float64)
    z = tr.source[:, 2]
    assert z[0].item() == pytest.approx(-4.0) and z[-1].item() == pytest.approx(4.0)
    assert (z.diff() > 0).all()
    torch.testing.assert_close(tr.detector_center[:, 2], z)


def test_short_scan_and_learnable_angles():
    angles = torch.linspace(0, math.pi, 8, dtype=torch.float64, requires_grad=True)
    tr = circular_trajectory_3d(sid=100.0, sdd=200.0, angles=angles)
    assert tr.requires_grad and tr.n_views == 8
    tr.source[:, 0].sum().backward()
    torch.testing.assert_close(angles.grad, -100.0 * torch.cos(angles.detach()))


def test_json_round_trip_is_exact(tmp_path):
    for make in ALL:
        for dt in (torch.float32, torch.float64):
            tr = make(dt)
            path = tmp_path / "t.json"
            tr.save(path)
            back = load_trajectory(path)
            assert back.dtype == dt and back.beam == tr.beam and back.ndim == tr.ndim
            for a, b in zip(tr.tensors(), back.tensors()):
                assert torch.equal(a, b)
            assert back.meta["kind"] == tr.meta["kind"]


def test_malformed_json_is_refused(tmp_path):
    with pytest.raises(ValueError, match="malformed"):
        Trajectory.from_json("{not json")
    with pytest.raises(ValueError, match="not a ctbench trajectory"):
        Trajectory.from_json(json.dumps({"format": "other"}))
    d = circular_trajectory_3d(3, 10.0, 20.0).to_dict()
    del d["detector_u"]
    with pytest.raises(ValueError, match="detector_u"):
        Trajectory.from_dict(d)


def test_slicing_by_views():
    tr = circular_trajectory_3d(10, 100.0, 200.0)
    part = tr[2:5]
    assert part.n_views == 3 and torch.equal(part.source, tr.source[2:5])
    assert len(part.meta["angles"]) == 3
    assert tr[torch.tensor([0, 9])].n_views == 2
    assert tr[3].n_views == 1


def test_rigid_transform_is_differentiable_and_rigid():
    tr = circular_trajectory_3d(6, 100.0, 200.0, dtype=torch.float64)
    rot = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64, requires_grad=True)
    shift = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    moved = transform_trajectory(tr, rot, shift)
    # distances and detector frames are preserved
    torch.testing.assert_close((moved.detector_center - moved.source).norm(dim=1),
                               (tr.detector_center - tr.source).norm(dim=1))
    torch.testing.assert_close((moved.detector_u * moved.detector_v).sum(1), torch.zeros(6, dtype=torch.float64),
                               atol=1e-12, rtol=0)
    moved.source.sum().backward()
    assert torch.isfinite(rot.grad).all() and rot.grad.abs().sum() > 0
    torch.testing.assert_close(shift.grad, torch.full((3,), 6.0, dtype=torch.float64))
    # parallel beams: directions rotate but do not translate
    par = circular_trajectory_3d_parallel(3, dtype=torch.float64)
    moved = transform_trajectory(par, translation=[5.0, 0.0, 0.0])
    assert torch.equal(moved.source, par.source)


def test_trajectory_validation():
    with pytest.raises(ValueError, match=r"shape \(n_views, 3\)"):
        custom_trajectory_3d(torch.zeros(3, 2), torch.zeros(3, 3), torch.zeros(3, 3), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="4 views but source has 3"):
        custom_trajectory_3d(torch.zeros(3, 3), torch.zeros(4, 3), torch.zeros(3, 3), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="sdd"):
        circular_trajectory_3d(10, 500.0, 400.0)
    with pytest.raises(ValueError, match="n_views"):
        circular_trajectory_3d(0, 500.0, 1000.0)
    with pytest.raises(ValueError, match="beam"):
        custom_trajectory_3d(torch.zeros(3, 3), torch.zeros(3, 3), torch.zeros(3, 3), torch.zeros(3, 3), beam="fan")


def test_the_package_exports_every_generator_lazily():
    """ctbench's top level loads on first use; its __all__ lists every generator of ctbench.geometry."""
    import ctbench
    import ctbench.geometry

    assert set(ctbench.geometry.GENERATORS) <= set(ctbench.__all__)
    for name in ctbench.__all__:
        assert getattr(ctbench, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ctbench.nope
