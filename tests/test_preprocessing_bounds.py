"""Every correction parameter bounded where it enters, and no correction returns NaN (issue 47).

Before issue 47: ``remove_outliers(size=10**5)`` asked for a 9.3 GiB mask, ``remove_stripes_sorting(size=10**9)``
for 7.5 GiB, ``paganin(pad=10**6)`` for 29 TiB; ``remove_stripes_wavelet(sigma=1e-200)`` returned all NaN and
``sigma=1e300`` raised OverflowError; Paganin with 1e300 parameters returned all NaN; beam-hardening
coefficients that decrease (45% of the values negative) or are all zero, and wedges that are no wedge, were
accepted; ``find_centre`` on a sinogram that is 92% NaN answered -2.00 px.  The allocation cases run in a
child process under a 2 GiB address-space limit, so the old code fails them with MemoryError instead of
taking the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ctbench.preprocessing import (find_centre, fit_linearisation, linearise, paganin, remove_outliers,
                                   remove_stripes, remove_stripes_sorting, remove_stripes_wavelet)

ROOT = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(4)
IMAGES = (RNG.random((16, 8, 32)) + 1).astype(np.float32)


def test_sizes_and_pads_are_bounded_before_anything_is_allocated():
    code = """
        import numpy as np
        from ctbench.preprocessing import paganin, remove_outliers, remove_stripes_sorting, remove_stripes
        img = np.random.default_rng(0).random((4, 8, 32)).astype(np.float32) + 0.5
        cases = [(lambda: remove_outliers(img, 0.1, 10 ** 5), "size must be at most 31"),
                 (lambda: remove_stripes_sorting(img, 10 ** 9), "size must be at most 32"),
                 (lambda: paganin(img, 0.01, delta_beta=1, energy_kev=20, distance_mm=100, pad=10 ** 6),
                  "pad must be at most 32"),
                 (lambda: remove_stripes(img, 10 ** 30), "at most the detector width")]
        for call, words in cases:
            try:
                call()
            except ValueError as e:
                assert words in str(e), str(e)
            else:
                raise AssertionError(f"accepted: {words}")
        print("BOUNDED", len(cases))
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env=env, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)))
    assert p.returncode == 0 and "BOUNDED 4" in p.stdout, p.stderr[-3000:]


@pytest.mark.parametrize("call, words", [
    (lambda: remove_outliers(IMAGES, 0.1, float("inf")), "size must be an integer"),
    (lambda: remove_outliers(IMAGES, 0.1, 10 ** 400), "size must be at most 31"),
    (lambda: remove_stripes_wavelet(IMAGES, 10 ** 9, 1.0), "level must be at most 30"),
    (lambda: remove_stripes_wavelet(IMAGES, 2, float("nan")), "sigma must be a finite number"),
    (lambda: paganin(IMAGES / 3, 0.01, delta_beta=1, energy_kev=20, distance_mm=100, pad=-1), "pad must be"),
])
def test_bad_numbers_are_named_errors_not_overflow_or_type_errors(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_wavelet_sigma_at_either_extreme_gives_the_filters_limit_not_nan():
    tiny = remove_stripes_wavelet(IMAGES, 2, 1e-200)          # the notch at view frequency 0 only
    assert np.isfinite(tiny).all()
    np.testing.assert_allclose(tiny, remove_stripes_wavelet(IMAGES, 2, 1e-6), rtol=0, atol=1e-6)
    huge = remove_stripes_wavelet(IMAGES, 2, 1e300)            # every vertical detail damped
    assert np.isfinite(huge).all()
    np.testing.assert_allclose(huge, remove_stripes_wavelet(IMAGES, 2, 1e200), rtol=0, atol=1e-6)
    # a stripe (a column offset in every view) is what the tiny notch removes: it is the k = 0 part
    striped = IMAGES.copy()
    striped[:, :, 10] += 0.5
    assert np.abs(remove_stripes_wavelet(striped, 2, 1e-200) - tiny).max() < 0.2    # of the 0.5 added


@pytest.mark.parametrize("kw", [dict(delta_beta=1e300, distance_mm=1e300, energy_kev=20.0),
                                dict(delta_beta=1e300, distance_mm=100.0, energy_kev=1e-300)])
def test_paganin_parameters_that_overflow_its_filter_are_refused_not_returned_as_nan(kw):
    with pytest.raises(ValueError, match="the Paganin filter overflows"):
        paganin(IMAGES / 3, 0.01, **kw)
    with pytest.raises(ValueError, match="pixel_size_mm=1e-300"):
        paganin(IMAGES / 3, 1e-300, delta_beta=1.0, energy_kev=20.0, distance_mm=100.0)
    assert np.isfinite(paganin(IMAGES / 3, 0.01, delta_beta=100.0, energy_kev=20.0, distance_mm=100.0)).all()


def test_beam_hardening_coefficients_must_give_an_increasing_map():
    p = np.linspace(0, 2, 50, dtype=np.float32)
    with pytest.raises(ValueError, match="slope is <= 0 from p = 1"):
        linearise(p, [1.0, -0.5])                               # decreasing beyond p = 1: 45% of a 0..2 range
    with pytest.raises(ValueError, match="all coefficients are zero"):
        linearise(p, [0.0, 0.0])
    with pytest.raises(ValueError, match=r"c1 \(the slope at zero thickness\) must be > 0"):
        linearise(p, [-1.0])
    np.testing.assert_allclose(linearise(p, [1.0, 0.1]), p + 0.1 * p ** 2, rtol=1e-6)   # a good one still works


@pytest.mark.parametrize("t, p, degree, words", [
    ([0, 1, 2, 3], [0, 1, 1, 1], 2, "not monotone: the 2 mm step attenuates no more than the 1 mm step"),
    ([1, 1, 1], [1, 2, 3], 1, "lists the step 1 mm twice"),
    ([1, 2, 4, 8, 16], [0.5, 0.6, 0.7, 0.8, 0.9], 1, "misses the wedge's steps"),
    ([1, 2, 3], [0.1, 0.2, 0.3], 20, "degree must be at most 8"),
])
def test_a_degenerate_wedge_fit_is_refused_with_the_reason(t, p, degree, words):
    with pytest.raises(ValueError, match=words):
        fit_linearisation(t, p, degree)


def test_find_centre_refuses_a_sinogram_made_mostly_of_nan():
    a = np.linspace(0, 2 * np.pi, 32, endpoint=False)
    s = np.full((32, 4, 12), np.nan)
    s[:, :, 0] = RNG.random((32, 4))                           # one finite column: the rest would be invented
    with pytest.raises(ValueError, match=r"are NaN or infinite, more than the 10%"):
        find_centre(s, a, 0.1)
    s = RNG.random((32, 4, 40))
    s[3, :, :30] = np.nan                                       # one view three quarters gone
    with pytest.raises(ValueError, match="view 3 of the mid-plane sinogram has 30 of its 40 values"):
        find_centre(s, a, 0.1, cross_check=False)
