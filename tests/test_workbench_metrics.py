"""ctbench.workbench.metrics against independent formulas and scikit-image."""

import numpy as np
import pytest

from ctbench.workbench import metrics

skm = pytest.importorskip("skimage.metrics")


def _pair(shape=(12, 20, 24), seed=0):
    rng = np.random.default_rng(seed)
    ref = np.zeros(shape)
    ref[..., 4:-4, 5:-5] = 1.0
    ref[..., 8:12, 9:14] = 0.4
    img = ref + 0.05 * rng.standard_normal(shape)
    return img, ref


def test_rmse_and_psnr_match_the_textbook_formulas_and_skimage():
    img, ref = _pair()
    e = np.sqrt(((img - ref) ** 2).mean())
    assert metrics.rmse(img, ref) == pytest.approx(e, rel=1e-12)
    assert metrics.psnr(img, ref) == pytest.approx(20 * np.log10(1.0 / e), rel=1e-12)
    assert metrics.psnr(img, ref) == pytest.approx(skm.peak_signal_noise_ratio(ref, img, data_range=1.0), rel=1e-9)
    assert metrics.psnr(ref, ref) == float("inf")


@pytest.mark.parametrize("shape", [(40, 36), (12, 20, 24)])
def test_ssim_matches_skimage(shape):
    img, ref = _pair(shape)
    want = skm.structural_similarity(img, ref, data_range=1.0, win_size=7)
    assert metrics.ssim(img, ref, peak=1.0) == pytest.approx(want, rel=1e-9)
    assert metrics.ssim(ref, ref) == pytest.approx(1.0)


def test_masked_metrics_use_only_the_masked_voxels():
    img, ref = _pair()
    mask = np.zeros(ref.shape, bool)
    mask[:, 6:14, 7:17] = True
    d = (img - ref)[mask]
    assert metrics.rmse(img, ref, mask) == pytest.approx(np.sqrt((d * d).mean()), rel=1e-12)
    # An error outside the mask changes nothing inside it.
    worse = img.copy()
    worse[~mask] += 5.0
    m1, m2 = metrics.compare(img, ref, mask), metrics.compare(worse, ref, mask)
    assert m1.rmse == m2.rmse and m1.psnr == m2.psnr and m1.n_voxels == int(mask.sum())
    _, full = skm.structural_similarity(img, ref, data_range=float(ref[mask].max() - ref[mask].min()),
                                           win_size=7, full=True)
    inner = np.zeros_like(mask)
    inner[3:-3, 3:-3, 3:-3] = True
    assert m1.ssim == pytest.approx(full[mask & inner].mean(), rel=1e-9)


def test_bad_inputs_are_explained():
    img, ref = _pair()
    with pytest.raises(ValueError, match="same grid"):
        metrics.rmse(img[:-1], ref)
    with pytest.raises(ValueError, match="mask selects no voxel"):
        metrics.rmse(img, ref, np.zeros(ref.shape, bool))
    with pytest.raises(ValueError, match="reference is constant"):
        metrics.psnr(img, np.zeros_like(ref))


def test_profile_histogram_window_and_masks():
    img = np.arange(50, dtype=float).reshape(5, 10)           # value = 10 row + col
    dist, vals = metrics.line_profile(img, (2, 0), (2, 9))
    np.testing.assert_allclose(vals, 20 + dist)
    dist, vals = metrics.line_profile(img, (0, 0), (4, 0), n=9)
    np.testing.assert_allclose(vals, 10 * dist)
    counts, edges = metrics.histogram(img, bins=5)
    assert counts.tolist() == [10] * 5 and edges[0] == 0 and edges[-1] == 49
    data = np.zeros(10000)
    data[:3] = 1e6                                              # hot pixels
    data[3:] = np.linspace(0, 1, 9997)
    lo, hi = metrics.percentile_window(data)
    assert 0 <= lo < 0.01 and 0.99 < hi < 1.0
    cyl = metrics.cylinder_mask((3, 9, 9))
    assert cyl[1, 4, 4] and not cyl[1, 0, 0] and cyl.shape == (3, 9, 9) and cyl[0].sum() == cyl[2].sum()
