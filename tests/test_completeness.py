"""Data-completeness maps: views per voxel against independent geometry and the projector."""

import math

import numpy as np
import pytest
import torch

from ctbench import circular_trajectory_3d, circular_trajectory_3d_parallel, saddle_trajectory_3d
from ctbench.workbench.completeness import (coarse_grid, completeness_map, projection_matrices, summarize, views_seeing,
                                  voxel_centres)
from ctbench.workbench.design import ScanGeometry, TrajectoryDesign


def test_parallel_beam_counts_match_the_analytic_rule():
    # Parallel beam about z: a point (x, y, z) lands on the detector of the view
    # at angle t when |-x sin t + y cos t| <= U du / 2 and |z| <= V dv / 2 (u = (-sin t, cos t, 0)).
    n = 37
    traj = circular_trajectory_3d_parallel(n, angle_range=math.pi, dtype=torch.float64)
    U, V, du, dv = 11, 5, 1.3, 1.1
    geo = ScanGeometry(traj, (U, V), (du, dv), (9, 13, 13), (1.0, 1.0, 1.0))
    counts = completeness_map(geo).numpy()
    pts = voxel_centres(geo.volume_shape, geo.voxel_spacing).numpy()
    t = np.arange(n) * math.pi / n
    a = -pts[:, 0:1] * np.sin(t)[None] + pts[:, 1:2] * np.cos(t)[None]
    seen = (np.abs(a) <= U * du / 2) & (np.abs(pts[:, 2:3]) <= V * dv / 2)
    np.testing.assert_array_equal(counts.reshape(-1), seen.sum(1))
    assert counts.min() == 0 and counts.max() == n   # the rule is not trivially all or nothing here


def _brute_force_seen(traj, p, U, V, du, dv):
    """Solve s + t (p - s) = c + a u + b v for (t, a, b) per view with a dense 3x3 solve."""
    src, ctr, u, v = (x.double().numpy() for x in traj.tensors())
    count = 0
    for i in range(traj.n_views):
        A = np.stack([p - src[i], -u[i], -v[i]], axis=1)
        t, a, b = np.linalg.solve(A, ctr[i] - src[i])
        count += int(t > 0 and abs(a) <= U * du / 2 and abs(b) <= V * dv / 2)
    return count


def test_cone_beam_counts_match_a_brute_force_ray_solve():
    traj = saddle_trajectory_3d(23, 120.0, 260.0, 25.0, dtype=torch.float64)
    U, V, du, dv = 40, 12, 1.7, 1.9
    gen = torch.Generator().manual_seed(3)
    pts = (torch.rand(200, 3, generator=gen, dtype=torch.float64) - 0.5) * torch.tensor([90.0, 90.0, 60.0],
                                                                                         dtype=torch.float64)
    got = views_seeing(traj, pts, (U, V), (du, dv)).numpy()
    want = [_brute_force_seen(traj, p, U, V, du, dv) for p in pts.numpy()]
    np.testing.assert_array_equal(got, want)
    assert 0 < got.mean() < traj.n_views


def test_projection_matrices_put_points_on_the_right_pixel():
    traj = circular_trajectory_3d(8, 100.0, 180.0, dtype=torch.float64)
    M = projection_matrices(traj)
    src, ctr, u, v = (x.double() for x in traj.tensors())
    # A point on the ray through detector position (a, b) projects back to (a, b).
    a, b = 7.5, -3.25
    target = ctr + a * u + b * v
    p = src + 0.4 * (target - src)
    m = torch.einsum("nij,nj->ni", M, torch.cat([p, torch.ones(8, 1, dtype=torch.float64)], 1))
    torch.testing.assert_close(m[:, 0] / m[:, 2], torch.full((8,), a, dtype=torch.float64))
    torch.testing.assert_close(m[:, 1] / m[:, 2], torch.full((8,), b, dtype=torch.float64))
    assert (m[:, 2] > 0).all()


def test_narrow_detector_leaves_outer_voxels_incomplete_and_wide_detector_sees_all():
    base = TrajectoryDesign(kind="circular", n_views=60, sid=200.0, sdd=400.0, volume_d=16, volume_h=32,
                            volume_w=32, voxel_size=2.0, detector_v=64, pixel_v=2.0)
    narrow = base.replace(detector_u=20, pixel_u=2.0).build()   # 40 mm at the detector: ~20 mm field at the axis
    wide = base.replace(detector_u=160, pixel_u=2.0).build()
    c_narrow = completeness_map(narrow)
    c_wide = completeness_map(wide)
    pts = voxel_centres(narrow.volume_shape, narrow.voxel_spacing)
    r = pts[:, :2].norm(dim=1).reshape(narrow.volume_shape)
    # Inside the field of view every view sees the voxel; well outside, some views miss it.
    assert (c_narrow[r < 8.0] == 60).all()
    assert (c_narrow[r > 15.0] < 60).all()
    assert summarize(c_narrow, 60).full < 0.5
    assert (c_wide == 60).all()
    assert summarize(c_wide, 60).full == 1.0


def test_unreached_voxels_have_zero_views():
    # Four detector rows cannot cover a tall volume: voxels far above the
    # orbit plane near the axis are never hit by any ray.
    g = TrajectoryDesign(kind="circular", n_views=36, detector_u=96, detector_v=4, volume_d=40, volume_h=16,
                         volume_w=16).build()
    counts = completeness_map(g)
    assert (counts[0] == 0).all() and (counts[-1] == 0).all()
    assert (counts[20, 6:10, 6:10] == 36).all()
    assert summarize(counts, 36).unreached > 0.3


def test_completeness_agrees_with_the_support_of_a_backprojection():
    # Backprojecting ones with the Joseph projector reaches the voxels the
    # counts say are seen; voxels whose whole neighbourhood is unseen get nothing.
    g = TrajectoryDesign(kind="circular", n_views=24, sid=150.0, sdd=300.0, detector_u=24, detector_v=8,
                         pixel_u=2.0, pixel_v=2.0, volume_d=16, volume_h=24, volume_w=24, voxel_size=2.0).build()
    counts = completeness_map(g)
    bp = g.projector("cpu").backproject(torch.ones(g.sinogram_shape))
    assert (bp[counts == g.n_views] > 0).all()
    unseen = (counts == 0).float()[None, None]
    isolated = -torch.nn.functional.max_pool3d(-unseen, 3, stride=1, padding=1)[0, 0] > 0.5  # unseen with all neighbours
    assert isolated.any()
    assert (bp[isolated] == 0).all()


def test_coarse_grid_covers_the_same_box():
    shape, spacing = coarse_grid((100, 64, 7), (0.5, 1.0, 2.0), max_size=40)
    assert shape == (40, 40, 7)
    np.testing.assert_allclose(np.multiply(shape, spacing), [50.0, 64.0, 14.0])
    with pytest.raises(ValueError, match="max_size"):
        coarse_grid((8, 8, 8), (1, 1, 1), 0)


def test_2d_scans_give_a_2d_map():
    g = TrajectoryDesign(kind="fan", n_views=30, detector_u=40, volume_h=32, volume_w=32).build()
    counts = completeness_map(g)
    assert counts.shape == (32, 32)
    assert counts.max() == 30
    with pytest.raises(ValueError, match="must match"):
        completeness_map(g, (4, 4, 4), (1.0, 1.0, 1.0))
