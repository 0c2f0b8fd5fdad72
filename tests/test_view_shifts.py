"""Per-view shifts the scanners record (Bruker SkyScan's TS list, Zeiss Xradia's Alignment/X-, Y-Shifts) are
read and applied with the right sign: a scan whose views moved by known amounts, written the way the vendor
writes it with the shifts that align it, reconstructs as well as the same scan without movement (RMSE against
the phantom within 10%), and ignoring the shifts (``preprocess.view_shifts: false``) makes it clearly worse."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ctbench.io import ScanFileError, read_scan
from ctbench.pipeline import load_config, run_recon
from ctbench.io.sample_scan import LabScanSpec, simulate_counts
from ctbench.io.view_shifts import read_skyscan_shift_list, shift_images

from vendor_files import write_bruker, write_txrm, zeiss_angles_deg, zeiss_images


def moved_trajectory(spec: LabScanSpec, ex, ey):
    """The spec's orbit with each detector moved so that view ``k`` of the *file* shows the object ``ex[k]``
    columns to the right and ``ey[k]`` rows lower (its image convention applied), exactly."""
    traj = spec.trajectory()
    # Moving the detector by +c along u moves the image by -c along u; seen from the source, +u is to the left
    # of the image (columns reversed), so the file's content moves by +c; rows run along -v.
    sign = 1.0 if spec.seen_from == "source" else -1.0
    cu = torch.from_numpy(sign * np.asarray(ex) * spec.pitch)[:, None]
    cv = torch.from_numpy(np.asarray(ey) * spec.pitch)[:, None]
    return traj.replace(detector_center=traj.detector_center + cu * traj.detector_u + cv * traj.detector_v)


def _rmse(report, spec):
    vol = report["volume"].numpy()
    truth = spec.truth(vol.shape, report["geometry"]["voxel_spacing"][0])
    return float(np.sqrt(np.mean((vol - truth) ** 2)))


def _run(tmp_path, name, path, **pre):
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps({"input": {"path": str(path)}, "preprocess": pre}))
    return run_recon(load_config(cfg))


def _movement(n, seed, amp_x=2.0, amp_y=1.5):
    rng = np.random.default_rng(seed)
    return rng.uniform(-amp_x, amp_x, n), rng.uniform(-amp_y, amp_y, n)


# ------------------------------------------------------------------ the shift itself
def test_shift_images_moves_content_by_plus_x_columns_and_plus_y_rows():
    img = np.zeros((1, 9, 11), np.float32)
    img[0, 4, 5] = 1.0
    out = shift_images(img, [2.0], [-1.0])
    assert np.unravel_index(np.argmax(out[0]), out[0].shape) == (3, 7)
    half = shift_images(img, [0.5], [0.0])[0]
    assert half[4, 5] == pytest.approx(0.5) and half[4, 6] == pytest.approx(0.5)


def test_skyscan_shift_list_is_read_as_the_scanner_writes_it(tmp_path):
    x, y = np.linspace(-2, 1, 12), np.linspace(7, 4, 12)      # within a 16 x 16 detector: a shift that moves a view off it is refused
    write_bruker(tmp_path, "s_", np.ones((12, 16, 16), np.uint16), sid=50, sdd=200, pitch=0.01, step_deg=15,
                 shifts=(x, y), short_list=True, postalignment=2.5, random_movement="ON (3)")
    rx, ry = read_skyscan_shift_list(tmp_path / "s__TS.csv", 12)
    np.testing.assert_allclose(rx[:11], x[:11], atol=1e-6)
    np.testing.assert_allclose(ry[:11], y[:11], atol=1e-6)
    assert rx[11] == rx[10] and ry[11] == ry[10]          # one view short, as SkyScan lists them: the last kept
    scan = read_scan(tmp_path)
    assert scan.scanner["view_shifts_px"]["source"] == "s__TS.csv"
    assert scan.scanner["postalignment_px"] == 2.5
    assert scan.scanner["random_movement"] == {"on": True, "max_px": 3.0}
    assert "warnings" not in scan.scanner
    with pytest.raises(ScanFileError, match="lists shifts for 11 views; the scan has 14"):
        read_skyscan_shift_list(tmp_path / "s__TS.csv", 14)
    (tmp_path / "s__TS.csv").write_text("Format,  CSV\nCURVE, Y1, Y2\n0, 1.0, x\n")
    with pytest.raises(ScanFileError, match="not 'index, Y1, Y2'"):
        read_scan(tmp_path)


def test_skyscan_random_movement_without_its_list_is_a_warning(tmp_path):
    write_bruker(tmp_path, "r_", np.ones((4, 4, 6), np.uint16), sid=50, sdd=200, pitch=0.01, step_deg=90,
                 random_movement="ON (10)")
    scan = read_scan(tmp_path)
    assert "view_shifts_px" not in scan.scanner
    assert any("Random Movement is ON" in w and "r__TS.csv" in w for w in scan.scanner["warnings"])


# ------------------------------------------------------------------ Bruker SkyScan, end to end
SKY = LabScanSpec(n_views=96, detector_u=80, detector_v=40, offset_px=-1.63, phantom_name="chiral",
                  rotation="ccw", seen_from="source", seed=31)     # a camera image, "CC" (TIGRE's reading)


def _skyscan_counts(spec, trajectory=None):
    proj, flats, darks, _ = simulate_counts(spec, trajectory)
    d, f = darks.mean(0), flats.mean(0)
    return np.clip(np.rint((proj - d) / (f - d) * 65535), 1, 65535).astype(np.uint16)


@pytest.mark.slow
def test_bruker_per_view_shifts_are_applied_with_the_right_sign(tmp_path):
    ex, ey = _movement(SKY.n_views, 7)
    common = dict(sid=SKY.sid, sdd=SKY.sdd, pitch=SKY.pitch, step_deg=360.0 / SKY.n_views, direction="CC")
    still = write_bruker(tmp_path / "still", "c_", _skyscan_counts(SKY), **common)
    moved = write_bruker(tmp_path / "moved", "c_", _skyscan_counts(SKY, moved_trajectory(SKY, ex, ey)),
                         shifts=(-ex, -ey), random_movement="ON (2)", **common)
    r0 = _run(tmp_path, "still", still)
    r1 = _run(tmp_path, "moved", moved)
    r2 = _run(tmp_path, "ignored", moved, view_shifts=False)
    e0, e1, e2 = _rmse(r0, SKY), _rmse(r1, SKY), _rmse(r2, SKY)
    assert r1["correction"]["view_shifts"]["source"] == "c__TS.csv"
    assert r1["centre"]["offset_px"] == pytest.approx(SKY.offset_px, abs=0.3)
    assert e1 <= 1.10 * e0, (e0, e1)
    assert e2 > 1.3 * e0, (e0, e2)
    # the opposite sign (shifts read as the movement instead of its correction) is as bad as ignoring them
    flipped = write_bruker(tmp_path / "flipped", "c_", _skyscan_counts(SKY, moved_trajectory(SKY, ex, ey)),
                           shifts=(ex, ey), **common)
    assert _rmse(_run(tmp_path, "flipped", flipped), SKY) > 1.3 * e0


# ------------------------------------------------------------------ Zeiss Xradia, end to end
ZS = LabScanSpec(n_views=96, detector_u=80, detector_v=40, offset_px=3.1, phantom_name="chiral", seed=41)


def _zeiss(path, spec, trajectory=None, **shifts):
    proj, flats, darks, _ = simulate_counts(spec, trajectory)
    counts = np.clip(proj.astype(np.float64) - darks.mean(0), 1, 65535).astype(np.uint16)
    ref = (flats.mean(0) - darks.mean(0)).astype(np.float32)
    return write_txrm(path, zeiss_images(counts), zeiss_images(ref[None])[0], angles_deg=zeiss_angles_deg(spec.angles),
                      sid=spec.sid, sdd=spec.sdd,
                      pixel_um=spec.pitch * 1e3 * spec.sid / spec.sdd, **shifts)


@pytest.mark.slow
def test_zeiss_alignment_shifts_are_applied_with_the_right_sign(tmp_path):
    ex, ey = _movement(ZS.n_views, 8)
    still = _zeiss(tmp_path / "still.txrm", ZS)
    # the content moved by (ex, ey) in ctbench's image moves by (-ex, -ey) in the stored one (both axes reversed)
    moved = _zeiss(tmp_path / "moved.txrm", ZS, moved_trajectory(ZS, ex, ey), x_shifts=ex, y_shifts=ey)
    scan = read_scan(moved)
    np.testing.assert_allclose(scan.scanner["view_shifts_px"]["x"], ex, atol=1e-5)
    np.testing.assert_allclose(scan.scanner["view_shifts_px"]["y"], ey, atol=1e-5)
    r0, r1 = _run(tmp_path, "still", still), _run(tmp_path, "moved", moved)
    r2 = _run(tmp_path, "ignored", moved, view_shifts=False)
    e0, e1, e2 = _rmse(r0, ZS), _rmse(r1, ZS), _rmse(r2, ZS)
    assert r1["orientation"]["image_seen_from"] == "source" and r1["orientation"]["image_rows"] == "up"  # CIL's
    assert r1["centre"]["offset_px"] == pytest.approx(ZS.offset_px, abs=0.3)
    assert e1 <= 1.10 * e0, (e0, e1)
    assert e2 > 1.3 * e0, (e0, e2)
    # binned by 2: the shifts (in the file's unbinned pixels) are halved with the pixels
    b0, b1 = _run(tmp_path, "still2", still, bin=2), _run(tmp_path, "moved2", moved, bin=2)
    assert _rmse(b1, ZS) <= 1.10 * _rmse(b0, ZS)
