"""The correction keys of the recon config: each one does in ``prepare`` what its function does alone, the report
counts what was touched, bad keys name their field, and ``run_recon`` runs with all of them."""

import numpy as np
import pytest

from ctbench.pipeline import PreprocessConfig, parse_config, prepare, run_recon, load_config
from ctbench.io.sample_scan import LabScanSpec, write_lab_scan
from ctbench.io.scan import RawScan
from ctbench.preprocessing import (fit_linearisation, linearise, minus_log, paganin, remove_outliers,
                                   remove_stripes_sorting, remove_stripes_wavelet)

RNG = np.random.default_rng(5)


def _counts_scan(hits=None):
    n, rows, cols = 16, 12, 40
    r, c = np.mgrid[0:rows, 0:cols]
    t = np.stack([np.exp(-0.8 * np.exp(-((c - 20 - 6 * np.cos(k / 3)) ** 2 + (r - 6) ** 2) / 120.0)) for k in range(n)])
    flat = np.full((rows, cols), 5000.0)
    dark = np.full((rows, cols), 100.0)
    counts = t * (flat - dark) + dark
    if hits is not None:
        counts[hits] += 3000.0
    return RawScan(counts, flat[None], dark[None], pixel_size=(0.5, 0.5), values="counts",
                   scanner={"source_object_distance_mm": 100.0, "source_detector_distance_mm": 200.0}), t


def test_zinger_key_removes_planted_hits_and_reports_them():
    idx = RNG.choice(16 * 12 * 40, 25, replace=False)
    hits = np.unravel_index(idx, (16, 12, 40))
    dirty, t = _counts_scan(hits)
    clean, _ = _counts_scan()
    pre = PreprocessConfig(zingers={"threshold": 0.1})
    got = prepare(dirty, pre)
    assert got.correction["zingers"]["n_replaced"] == 25 and got.correction["zingers"]["n_values"] == t.size
    base = prepare(clean, PreprocessConfig()).images
    planted = np.zeros(t.shape, bool)
    planted[hits] = True
    np.testing.assert_array_equal(got.images[~planted], base[~planted])          # nothing else touched
    assert np.abs(got.images[planted] - base[planted]).max() < 0.03                  # the 3x3 median at the blob
    # chunked in the pipeline (32 views), whole here: the same answer
    t_dirty = (np.asarray(dirty.projections) - 100.0) / 4900.0
    np.testing.assert_allclose(got.images, minus_log(remove_outliers(t_dirty, 0.1, sign="bright")), atol=1e-5)


@pytest.mark.parametrize("key, expect", [
    ({"rings": {"method": "sorting", "size": 5}}, lambda p, t: remove_stripes_sorting(p, 5)),
    ({"rings": {"method": "wavelet", "level": 2, "sigma": 1.5}}, lambda p, t: remove_stripes_wavelet(p, 2, 1.5)),
    ({"phase": {"delta_beta": 200, "energy_kev": 20, "distance_mm": 50}},
     lambda p, t: paganin(t, (0.5, 0.5), delta_beta=200, energy_kev=20, distance_mm=50)),
    ({"beam_hardening": {"coefficients": [1.0, 0.3, -0.01]}}, lambda p, t: linearise(p, [1.0, 0.3, -0.01])),
    ({"beam_hardening": {"wedge_thickness_mm": [0, 1, 2, 4, 8], "wedge_line_integrals": [0, 0.3, 0.55, 0.95, 1.6],
                         "degree": 2}},
     lambda p, t: linearise(p, fit_linearisation([0, 1, 2, 4, 8], [0, 0.3, 0.55, 0.95, 1.6], 2))),
])
def test_each_key_does_what_its_function_does(key, expect):
    scan, t = _counts_scan()
    got = prepare(scan, PreprocessConfig(**key))
    t32 = ((np.asarray(scan.projections) - 100.0) / 4900.0).astype(np.float32)
    np.testing.assert_allclose(got.images, expect(minus_log(t32), t32), atol=2e-5)
    assert set(key) <= set(got.correction) or "phase" in got.correction


def test_phase_key_on_line_integral_and_transmission_scans():
    _, t = _counts_scan()
    ph = {"delta_beta": 200, "energy_kev": 20, "distance_mm": 50, "pixel_size_mm": [0.25, 0.5]}
    want = paganin(t, (0.25, 0.5), delta_beta=200, energy_kev=20, distance_mm=50)
    for values, data in (("transmission", t), ("line_integrals", -np.log(t))):
        scan = RawScan(data.astype(np.float32), pixel_size=(0.5, 0.5), values=values)
        got = prepare(scan, PreprocessConfig(phase=ph))
        np.testing.assert_allclose(got.images, want, atol=2e-5)


@pytest.mark.parametrize("pre, words", [
    ({"zingers": {"threshold": 0}}, "preprocess.zingers.threshold"),
    ({"zingers": {"size": 3}}, "preprocess.zingers.threshold: Field required"),
    ({"rings": {"method": "fourier"}}, "preprocess.rings"),
    ({"rings": {"method": "wavelet", "wavelet": "sym8"}}, "wavelet must be 'db1' .. 'db12'"),
    ({"rings": {"method": "sorting", "sigma": 2}}, "preprocess.rings.sorting.sigma: Extra inputs"),
    ({"phase": {"delta_beta": 100, "energy_kev": -5, "distance_mm": 10}}, "preprocess.phase.energy_kev"),
    ({"phase": {"delta_beta": 100, "energy_kev": 5}}, "preprocess.phase.distance_mm: Field required"),
    ({"beam_hardening": {}}, "give either coefficients or wedge_thickness_mm"),
    ({"beam_hardening": {"coefficients": [1], "wedge_thickness_mm": [1]}}, "give either coefficients"),
    ({"beam_hardening": {"wedge_thickness_mm": [1, 2]}}, "needs both"),
    ({"beam_hardening": {"coefficients": []}}, "1 to 8 finite numbers"),
    ({"beam_hardening": {"coefficients": [0, 0]}}, "all coefficients are zero"),
    ({"beam_hardening": {"wedge_thickness_mm": [0, 1, 2, 3], "wedge_line_integrals": [0, 1, 1, 1], "degree": 2}},
     "the wedge is not monotone"),
    ({"zingers": {"threshold": 0.1, "size": 100000}}, "preprocess.zingers.size: Input should be less than or equal "
                                                      "to 31"),
    ({"rings": {"method": "sorting", "size": 10 ** 9}}, "preprocess.rings.sorting.size"),
    ({"phase": {"delta_beta": 1e300, "energy_kev": 20, "distance_mm": 10}}, "preprocess.phase.delta_beta"),
    ({"phase": {"delta_beta": 100, "energy_kev": 20, "distance_mm": 10, "pad": 10 ** 6}}, "preprocess.phase.pad"),
])
def test_bad_correction_keys_name_the_field(pre, words):
    with pytest.raises(ValueError) as e:
        parse_config({"input": {"path": "x"}, "preprocess": pre})
    assert words in str(e.value), str(e.value)


def test_a_wedge_that_cannot_be_fitted_is_a_clear_error_when_the_config_is_read():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not monotone"):          # before any scan is read
        PreprocessConfig(beam_hardening={"wedge_thickness_mm": [1, 2, 3, 4, 5],
                                         "wedge_line_integrals": [0.1, 0.2, 0.3, 0.2, 0.1], "degree": 4})
    # a monotone wedge that degree 1 cannot follow (a strongly hardened curve) is refused with the reason too
    with pytest.raises(ValidationError, match="misses the wedge's steps"):
        PreprocessConfig(beam_hardening={"wedge_thickness_mm": [1, 2, 4, 8, 16],
                                         "wedge_line_integrals": [0.5, 0.6, 0.7, 0.8, 0.9], "degree": 1})


@pytest.mark.slow
def test_recon_runs_with_every_correction_and_gives_a_finite_volume(tmp_path):
    spec = LabScanSpec()
    path = write_lab_scan(tmp_path / "lab", spec)
    doc = {"input": {"path": str(path)},
           "preprocess": {"bin": 2, "zingers": {"threshold": 0.2}, "rings": {"method": "sorting", "size": 9},
                          "phase": {"delta_beta": 50, "energy_kev": 60, "distance_mm": 20},
                          "beam_hardening": {"coefficients": [1.0, 0.05]}},
           "geometry": {"detector_offset_u_mm": spec.offset_px * spec.pitch}}
    (tmp_path / "recon.json").write_text(__import__("json").dumps(doc))
    report = run_recon(load_config(tmp_path / "recon.json"))
    vol = report["volume"].numpy()
    assert np.isfinite(vol).all() and vol.max() > 0.01
    assert {"zingers", "rings", "phase", "beam_hardening"} <= set(report["correction"])


def test_preview_shows_what_prepare_does_to_that_view_and_row():
    from ctbench.pipeline.corrections_preview import correction_preview

    idx = RNG.choice(16 * 12 * 40, 25, replace=False)
    scan, _ = _counts_scan(np.unravel_index(idx, (16, 12, 40)))
    pre = PreprocessConfig(zingers={"threshold": 0.1}, rings={"method": "sorting", "size": 5},
                           beam_hardening={"coefficients": [1.0, 0.2]})
    pv = correction_preview(scan, pre, view=7)
    full = prepare(scan, pre.model_copy(update={"rings": None}))
    plain = prepare(scan, PreprocessConfig())
    np.testing.assert_allclose(pv.view_after, full.images[7], atol=1e-6)
    np.testing.assert_allclose(pv.view_before, plain.images[7], atol=1e-6)
    np.testing.assert_allclose(pv.sinogram_after, prepare(scan, pre).images[:, 6, :], atol=1e-6)
    np.testing.assert_allclose(pv.sinogram_before, plain.images[:, 6, :], atol=1e-6)
    assert pv.row == 6 and pv.side_by_side("view").shape == (12, 82) and pv.side_by_side("sinogram").shape == (16, 82)
    with pytest.raises(ValueError, match="view must be an index in 0..15"):
        correction_preview(scan, pre, view=16)


def test_non_finite_data_is_refused_by_the_correction_steps_not_spread():
    """The steps ``prepare`` calls refuse NaN with its count (whatever rule the flat/dark step applies before)."""
    from ctbench.pipeline.corrections import clean_outliers, correct_line_integrals, to_line_integrals

    _, t = _counts_scan()
    t = t.astype(np.float32)
    t[3, 4, 5] = np.nan
    for key, step in (({"zingers": {"threshold": 0.1}}, lambda pre: clean_outliers(t, pre, {})),
                      ({"phase": {"delta_beta": 10, "energy_kev": 20, "distance_mm": 5}},
                       lambda pre: to_line_integrals(t, pre, (0.5, 0.5), {})),
                      ({"rings": {"method": "sorting"}}, lambda pre: correct_line_integrals(-np.log(t), pre, {})),
                      ({"rings": {"method": "wavelet", "level": 2}},
                       lambda pre: correct_line_integrals(-np.log(t), pre, {})),
                      ({"beam_hardening": {"coefficients": [1.0, 0.1]}},
                       lambda pre: correct_line_integrals(-np.log(t), pre, {}))):
        with pytest.raises(ValueError, match="1 non-finite values"):
            step(PreprocessConfig(**key))
