"""Preprocessing of measured scans against independent truth: known transmissions, exact line integrals."""

import math

import numpy as np
import pytest
import torch

from ctbench.geometry import circular_trajectory_2d_fan, circular_trajectory_2d_parallel, circular_trajectory_3d
from ctbench.io.scan import sinogram_to_images
from ctbench.phantoms import shepp_logan_line_integrals
from ctbench.preprocessing import (CorrectionReport, DetectorChange, average_frames, bin_pixels, crop,
                                   find_centre, flat_dark_correct, minus_log, offset_by_conjugate_rays,
                                   offset_by_sharpness, remove_stripes, view_subset)

RNG = np.random.default_rng(1)


def test_flat_dark_correction_recovers_the_transmission_and_counts_what_it_clips():
    t_true = RNG.uniform(0.05, 1.0, (6, 8, 10))
    gain = RNG.uniform(800, 1200, (8, 10))
    dark = RNG.uniform(50, 150, (8, 10))
    counts = t_true * gain + dark
    counts[0, 0, :3] = dark[0, :3] - 5            # below the dark level: 3 values
    counts[1, 2, 4] = dark[2, 4]                  # exactly the dark level: 1 value
    flats = np.stack([gain + dark] * 3) + RNG.normal(0, 1e-9, (3, 8, 10))
    darks = np.stack([dark] * 2)
    rep = CorrectionReport()
    t = flat_dark_correct(counts, average_frames(flats), average_frames(darks), min_transmission=1e-3, report=rep)
    ok = np.ones(t.shape, bool)
    ok[0, 0, :3] = ok[1, 2, 4] = False
    np.testing.assert_allclose(t[ok], t_true[ok], rtol=1e-5)
    assert rep.n_clipped == 4 and rep.n_values == t.size and (t[~ok] == 1e-3).all()
    np.testing.assert_allclose(minus_log(t)[ok], -np.log(t_true[ok]), rtol=1e-4, atol=1e-6)


def test_dead_pixels_are_clipped_and_counted():
    flat = np.full((4, 4), 1000.0)
    flat[1, 1] = 100.0                             # flat == dark: a dead pixel
    rep = CorrectionReport()
    t = flat_dark_correct(np.full((3, 4, 4), 600.0), flat, np.full((4, 4), 100.0), report=rep)
    assert rep.n_dead_pixels == 1 and rep.n_clipped == 3 and (t[:, 1, 1] == 1e-4).all()
    with pytest.raises(ValueError, match="non-positive"):
        minus_log(np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="flat field is"):
        flat_dark_correct(np.ones((1, 4, 4)), np.ones((3, 3)))


def _exact_images(U, V, du, offset_u=0.0, offset_v=0.0, n=8):
    traj = circular_trajectory_3d(n, 200.0, 400.0, detector_offset=(offset_u, offset_v), dtype=torch.float64)
    return sinogram_to_images(shepp_logan_line_integrals(traj, (U, V), du, scale=30.0).numpy())


def test_crop_shift_puts_the_cropped_detector_where_its_pixels_are():
    du = 1.5
    full = _exact_images(40, 30, du)
    change = DetectorChange()
    part = crop(full, rows=(3, 20), cols=(5, 31), pitch=(du, du), change=change)
    # The cropped pixels are exactly the pixels of a smaller detector whose centre moved by the shift.
    expect = _exact_images(26, 17, du, change.shift_u, change.shift_v)
    np.testing.assert_allclose(part, expect, atol=1e-9)
    assert change.shift_u == pytest.approx(((5 + 30) / 2 - 19.5) * du)
    with pytest.raises(ValueError, match="cols must satisfy"):
        crop(full, cols=(10, 50))


def test_binning_averages_pixels_and_keeps_them_in_place():
    rows, cols, du, dv = 9, 11, 0.5, 0.25
    r, c = np.mgrid[:rows, :cols]
    u = (c - (cols - 1) / 2) * du                  # a linear field: a bin's mean is its value at the bin centre
    v = -(r - (rows - 1) / 2) * dv
    img = np.stack([3 * u + 2 * v + 1] * 2)
    change = DetectorChange()
    out = bin_pixels(img, 2, pitch=(du, dv), change=change)
    assert out.shape == (2, 4, 5) and change.pitch_factor == (2, 2)
    r2, c2 = np.mgrid[:4, :5]
    u2 = (c2 - 2) * 2 * du + change.shift_u
    v2 = -(r2 - 1.5) * 2 * dv + change.shift_v
    np.testing.assert_allclose(out[0], 3 * u2 + 2 * v2 + 1, atol=1e-5)
    with pytest.raises(ValueError, match="bin factor must be a positive integer"):
        bin_pixels(img, 0)


def test_view_subset_every_kth_and_angular_range():
    angles = np.radians(np.arange(0, 360, 10.0))
    np.testing.assert_array_equal(view_subset(36, angles, every=3), np.arange(0, 36, 3))
    np.testing.assert_array_equal(view_subset(36, angles, every=2, angle_range_deg=(90, 180)), [9, 11, 13, 15, 17])
    with pytest.raises(ValueError, match="keeps no view"):
        view_subset(36, angles, angle_range_deg=(361, 400))
    with pytest.raises(ValueError, match="needs the rotation angles"):
        view_subset(36, None, angle_range_deg=(0, 90))


def test_ring_filter_removes_column_offsets_and_keeps_the_object():
    clean = _exact_images(64, 6, 1.0, n=90)          # line integrals up to ~15
    cols = [10, 25, 26, 40]
    stripes = np.zeros(64)
    stripes[cols] = [0.3, -0.2, 0.25, 0.4]
    fixed = remove_stripes(clean + stripes[None, None, :], size=9)
    err = np.abs(fixed - clean)
    others = np.ones(64, bool)
    others[cols] = False
    residual = err[:, :, cols].mean(axis=(0, 1))
    assert (residual < np.abs(stripes[cols]) / 3).all(), residual      # every stripe at least 3x weaker
    assert err[:, :, others].mean() < 2e-3 * clean.max()               # the object is left alone
    with pytest.raises(ValueError, match="ring filter size"):
        remove_stripes(clean, size=1)


def _fan_sino(offset_px, n=180, U=128, du=1.0, sid=150.0, sdd=300.0):
    ang = torch.linspace(0, 2 * math.pi, n + 1, dtype=torch.float64)[:-1]
    traj = circular_trajectory_2d_fan(angles=ang, sid=sid, sdd=sdd, detector_offset=offset_px * du,
                                      dtype=torch.float64)
    return shepp_logan_line_integrals(traj, U, du, scale=30.0).numpy(), ang.numpy()


@pytest.mark.parametrize("offset", [-4.6, 2.3])
@pytest.mark.slow
def test_conjugate_rays_find_a_fan_beam_offset(offset):
    sino, ang = _fan_sino(offset)
    found, xs, cs = offset_by_conjugate_rays(sino, ang, 1.0, 150.0, 300.0)
    assert found == pytest.approx(offset, abs=0.1)
    assert cs[np.argmin(np.abs(xs - offset))] < 0.05 * np.nanmax(cs[np.isfinite(cs)])


@pytest.mark.slow
def test_sharpness_sweep_finds_a_fan_beam_offset():
    sino, ang = _fan_sino(-4.6, n=120, U=96)
    found, _, _ = offset_by_sharpness(sino, ang, 1.0, 150.0, 300.0, search_px=(-8, 4))
    assert found == pytest.approx(-4.6, abs=0.3)


@pytest.mark.slow
def test_parallel_beam_offset_by_mirrored_opposite_views():
    ang = torch.linspace(0, 2 * math.pi, 121, dtype=torch.float64)[:-1]
    traj = circular_trajectory_2d_parallel(angles=ang, detector_offset=2.7 * 0.5, dtype=torch.float64)
    sino = shepp_logan_line_integrals(traj, 128, 0.5, scale=25.0).numpy()
    res = find_centre(sino, ang.numpy(), 0.5, cross_check=True, search_px=(-8, 8))
    assert res.offset_px == pytest.approx(2.7, abs=0.1) and res.offset_mm == pytest.approx(1.35, abs=0.05)
    assert res.agreement_px < 0.5


def test_centre_finder_refuses_a_short_fan_scan():
    sino, ang = _fan_sino(1.0, n=60)
    with pytest.raises(ValueError, match="does not cover enough angles"):
        offset_by_conjugate_rays(sino[:20], ang[:20], 1.0, 150.0, 300.0)
