"""Issue 20 findings 8, 9, 11: a stated non-finite policy in preprocessing, a centre finder that refuses
degenerate input and reports a confidence, and size-like arguments that cannot allocate without bound."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ctbench.geometry import circular_trajectory_2d_fan
from ctbench.phantoms import shepp_logan_line_integrals
from ctbench.preprocessing import (CorrectionReport, average_frames, find_centre, flat_dark_correct, minus_log,
                                   remove_stripes)


ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))


def _memory_limit() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))


def _counts(n=4, rows=6, cols=8, seed=0):
    rng = np.random.default_rng(seed)
    flat = rng.uniform(900, 1100, (rows, cols))
    dark = rng.uniform(5, 15, (rows, cols))
    t = rng.uniform(0.2, 0.9, (n, rows, cols))
    return (dark + t * (flat - dark)).astype(np.float32), flat, dark


# ------------------------------------------------------------------ finding 8: NaN in, NaN out silently
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_count_is_replaced_by_its_neighbours_median_and_counted(bad):
    p, flat, dark = _counts()
    p[1, 3, 4] = bad
    rep = CorrectionReport()
    t = flat_dark_correct(p, flat, dark, report=rep)
    assert np.isfinite(t).all() and np.isfinite(minus_log(t)).all()
    assert rep.n_nonfinite_counts == 1 and rep.n_nonfinite_unfilled == 0 and "non-finite" in rep.text()
    # Independent truth: the median of the 8 neighbours' counts, corrected like any count.
    nb = [p[1, 3 + dr, 4 + dc] for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)]
    expect = (np.median(nb) - dark[3, 4]) / (flat[3, 4] - dark[3, 4])
    assert t[1, 3, 4] == pytest.approx(expect, rel=1e-5)
    clean = flat_dark_correct(np.where(np.isfinite(p), p, 0), flat, dark)
    mask = np.ones(t.shape, bool)
    mask[1, 3, 4] = False
    np.testing.assert_array_equal(t[mask], clean[mask])      # nothing else moved


def test_without_flats_one_nan_does_not_make_everything_nan():
    p, _, _ = _counts()
    ref = flat_dark_correct(p)
    p[0, 0, 0] = np.nan
    rep = CorrectionReport()
    t = flat_dark_correct(p, report=rep)
    assert np.isfinite(t).all() and rep.n_nonfinite_counts == 1
    mask = np.ones(t.shape, bool)
    mask[0, 0, 0] = False
    np.testing.assert_allclose(t[mask], ref[mask], rtol=1e-6)   # same flat: the brightest finite count


def test_non_finite_flat_and_dark_values_are_left_out_or_make_dead_pixels():
    p, flat, dark = _counts()
    flats = np.stack([flat, flat * 1.02, flat * 0.98]).astype(np.float32)
    flats[1, 2, 2] = np.nan                                   # one frame: the other two are averaged
    flats[:, 4, 5] = np.inf                                   # every frame: no flat for this pixel -> dead
    darks = np.stack([dark, dark]).astype(np.float32)
    darks[0, 1, 1] = -np.inf
    rep = CorrectionReport()
    f = average_frames(flats, "flats", report=rep)
    d = average_frames(darks, "darks", report=rep)
    assert f[2, 2] == pytest.approx((flat[2, 2] + flat[2, 2] * 0.98) / 2, rel=1e-6)
    assert d[1, 1] == pytest.approx(dark[1, 1], rel=1e-6)
    assert np.isnan(f[4, 5])
    t = flat_dark_correct(p, f, d, report=rep)
    assert np.isfinite(t).all()
    assert rep.n_nonfinite_flat_values == 1 + 3 and rep.n_nonfinite_dark_values == 1
    assert rep.n_nonfinite_field_pixels == 1 and rep.n_dead_pixels == 1
    assert (t[:, 4, 5] == 1e-4).all()                          # a dead pixel: clipped and counted
    assert rep.to_dict()["nonfinite_rule"].startswith("non-finite counts")


def test_a_view_of_nothing_but_nan_is_clipped_and_counted_not_nan():
    p, flat, dark = _counts()
    p[2] = np.nan
    rep = CorrectionReport()
    t = flat_dark_correct(p, flat, dark, report=rep)
    assert np.isfinite(t).all()
    assert rep.n_nonfinite_counts == p[2].size and rep.n_nonfinite_unfilled == p[2].size
    assert (t[2] == 1e-4).all() and rep.n_clipped >= p[2].size


def test_minus_log_refuses_non_finite_transmission():
    with pytest.raises(ValueError, match="NaN or infinite"):
        minus_log(np.array([0.5, np.nan], np.float32))


def test_the_ring_filter_does_not_spread_a_nan():
    rng = np.random.default_rng(1)
    img = rng.uniform(0, 1, (20, 5, 16)).astype(np.float32)
    ref = remove_stripes(img, 5)
    bad = img.copy()
    bad[7, 2, 9] = np.nan
    out = remove_stripes(bad, 5)
    assert np.isnan(out[7, 2, 9]) and np.isfinite(np.delete(out.reshape(-1), 7 * 80 + 2 * 16 + 9)).all()
    # Elsewhere the filter is what it was, up to the one replaced value's effect on the column's median.
    diff = np.abs(out - ref)
    diff[7, 2, 9] = 0
    assert diff.max() < 0.2 and np.median(diff) < 1e-6


def test_recon_prepare_reports_the_non_finite_values(tmp_path):
    from ctbench.pipeline import PreprocessConfig, prepare
    from ctbench.io.scan import RawScan

    p, flat, dark = _counts(n=3)
    p[0, 2, 2] = np.nan
    scan = RawScan(p, flat[None].astype(np.float32), dark[None].astype(np.float32), pixel_size=(1.0, 1.0))
    prep = prepare(scan, PreprocessConfig())
    assert np.isfinite(prep.images).all()
    assert prep.correction["n_nonfinite_counts"] == 1 and "nonfinite_rule" in prep.correction
    li = RawScan(np.where(np.isfinite(p), p / 1000, np.inf).astype(np.float32), values="line_integrals",
                 pixel_size=(1.0, 1.0))
    prep = prepare(li, PreprocessConfig())
    assert np.isfinite(prep.images).all() and prep.correction["n_nonfinite_counts"] == 1


# ------------------------------------------------------------------ finding 9: centres without a centre
def _fan_sino(offset_px, n=120, U=96, du=1.0, sid=150.0, sdd=300.0):
    ang = torch.linspace(0, 2 * math.pi, n + 1, dtype=torch.float64)[:-1]
    traj = circular_trajectory_2d_fan(angles=ang, sid=sid, sdd=sdd, detector_offset=offset_px * du,
                                      dtype=torch.float64)
    return shepp_logan_line_integrals(traj, U, du, scale=30.0).numpy(), ang.numpy()


@pytest.fixture(scope="module")
def fan():
    return _fan_sino(2.3)


@pytest.mark.parametrize("make, match", [
    (lambda s, a: (np.zeros_like(s), a), "constant"),
    (lambda s, a: (np.full_like(s, 3.0), a), "constant"),
    (lambda s, a: (s[:1], a[:1]), "several angles"),
    (lambda s, a: (s, np.where(np.arange(a.size) == 3, np.nan, a)), "angles must be finite"),
    (lambda s, a: (np.full_like(s, np.nan), a), "no finite value"),
])
def test_find_centre_refuses_input_without_a_centre(fan, make, match):
    s, a = make(*fan)
    with pytest.raises(ValueError, match=match):
        find_centre(s, a, 1.0, sid=150.0, sdd=300.0, cross_check=False)


def test_nan_angles_are_refused_for_parallel_beams_too(fan):
    s, a = fan
    with pytest.raises(ValueError, match="angles must be finite"):
        find_centre(s, np.where(np.arange(a.size) == 3, np.nan, a), 1.0, cross_check=False)


def test_find_centre_refuses_an_infinite_pitch_and_huge_search_ranges(fan):
    s, a = fan
    with pytest.raises(ValueError, match="pitch must be a positive finite length"):
        find_centre(s, a, math.inf, sid=150.0, sdd=300.0, cross_check=False)
    with pytest.raises(ValueError, match="search_px must be"):
        find_centre(s, a, 1.0, sid=150.0, sdd=300.0, search_px=(np.nan, 3), cross_check=False)


@pytest.mark.slow
def test_every_answer_has_a_confidence_high_for_data_low_for_noise(fan):
    s, a = fan
    res = find_centre(s, a, 1.0, sid=150.0, sdd=300.0, cross_check=False)
    assert res.offset_px == pytest.approx(2.3, abs=0.1)
    assert res.confidence > 0.9 and not res.low_confidence and res.split_px < 0.2
    assert res.to_dict()["confidence"] == res.confidence and "confidence" in res.text()
    noise = np.random.default_rng(0).random(s.shape)
    res = find_centre(noise, a, 1.0, sid=150.0, sdd=300.0, cross_check=False)
    assert res.confidence < 0.5 and res.low_confidence and "LOW" in res.text()


@pytest.mark.slow
def test_one_nan_pixel_does_not_move_the_centre(fan):
    s, a = fan
    ref = find_centre(s, a, 1.0, sid=150.0, sdd=300.0, cross_check=False)
    bad = s.copy()
    bad[30, 40] = np.nan
    res = find_centre(bad, a, 1.0, sid=150.0, sdd=300.0, cross_check=False)
    assert res.n_nonfinite == 1
    assert abs(res.offset_px - ref.offset_px) < 0.05


# ------------------------------------------------------------------ finding 11: sizes that would allocate
@pytest.mark.parametrize("size, match", [(2.5, "integer >= 3"), (True, "integer >= 3"), (np.nan, "integer >= 3"),
                                         (17, "at most the detector width")])
def test_the_ring_filter_size_is_bounded(size, match):
    with pytest.raises(ValueError, match=match):
        remove_stripes(np.zeros((3, 4, 16), np.float32), size)


@pytest.mark.slow
def test_sizes_that_would_allocate_gigabytes_are_refused():
    """Run apart with 2 GiB of data memory: a regression (the 7.45 GiB median filter, the 14.9 GiB centre
    search of issue 20) fails with a MemoryError instead of exhausting the machine."""
    code = """
import numpy as np
from ctbench.preprocessing import find_centre, remove_stripes
for call in (lambda: remove_stripes(np.zeros((3, 4, 16), np.float32), 1e9),
             lambda: remove_stripes(np.zeros((3, 4, 16), np.float32), 10 ** 9),
             lambda: find_centre(np.random.default_rng(0).random((8, 16)), np.linspace(0, 6, 8), 1.0,
                                 search_px=(-1e9, 1e9), cross_check=False)):
    try:
        call()
        print("ACCEPTED")
    except ValueError as e:
        print("REFUSED", e)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=300, preexec_fn=_memory_limit)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("REFUSED") == 3, r.stdout
    assert r.stdout.count("at most the detector width") == 2 and "search_px must lie within +-16 px" in r.stdout
