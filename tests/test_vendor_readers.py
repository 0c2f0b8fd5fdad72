"""The vendors' formats: a file written the way the vendor writes it reconstructs to the same volume as the
equivalent TIFF scan, with its distances, pitch, angles and orientation, not mirrored (chiral phantom)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ctbench.io import ScanFileError, read_scan
from ctbench.io.orientation import CTBENCH, Orientation
from ctbench.pipeline import load_config, run_recon
from ctbench.io.sample_scan import LabScanSpec, simulate_counts

from vendor_files import (skyscan_optical_axis, write_bruker, write_dxchange, write_nikon, write_txrm,
                          zeiss_angles_deg, zeiss_images)


def _corr(a, b):
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def _not_mirrored(vol, truth, margin=0.5):
    for axis in (0, 1, 2):
        mv, mt = np.flip(vol, axis), np.flip(truth, axis)
        assert _corr(vol - mv, truth - mt) > margin, f"mirrored along axis {axis}"


def _write_tiffs(folder, proj, flats, darks):
    import tifffile

    for sub, stack in (("projections", proj), ("flats", flats), ("darks", darks)):
        (folder / sub).mkdir(parents=True)
        for i, img in enumerate(stack):
            tifffile.imwrite(folder / sub / f"{sub}_{i:04d}.tif", img)
    return folder


def _recon(tmp_path, name, inp: dict, geometry: dict):
    cfg = {"input": inp, "geometry": geometry}
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(cfg))
    return run_recon(load_config(p))


# ------------------------------------------------------------------ DXchange
PAR = LabScanSpec(n_views=96, detector_u=64, detector_v=20, pitch=1.0, offset_px=1.7, phantom_name="chiral",
                  beam="parallel", seed=11)


@pytest.fixture(scope="module")
def par_counts():
    return simulate_counts(PAR)[:3]


def test_dxchange_reads_counts_angles_pitch_and_binning(par_counts, tmp_path):
    proj, flats, darks = par_counts
    path = write_dxchange(tmp_path / "scan.h5", proj, flats, darks, np.degrees(PAR.angles), pixel_size_um=250.0,
                          magnification=0.5, binning=1)
    scan = read_scan(path)
    assert scan.format == "dxchange" and scan.scanner["beam"] == "parallel"
    assert scan.pixel_size == pytest.approx((0.5, 0.5))            # 250 um sensor pixel / 0.5 magnification
    np.testing.assert_allclose(scan.angles, PAR.angles, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(scan.projections[5]), proj[5])
    np.testing.assert_array_equal(np.asarray(scan.flats), flats)
    assert scan.orientation.seen_from == "auto" and scan.orientation.rotation == "auto"
    path2 = write_dxchange(tmp_path / "binned.h5", proj, flats, darks, np.degrees(PAR.angles), pixel_size_um=500.0,
                           binning=2)
    assert read_scan(path2).pixel_size == pytest.approx((1.0, 1.0))


@pytest.mark.slow
def test_dxchange_reconstructs_like_the_tiff_scan_and_not_mirrored(par_counts, tmp_path):
    proj, flats, darks = par_counts
    dx = write_dxchange(tmp_path / "scan.h5", proj, flats, darks, np.degrees(PAR.angles), resolution_um=1000.0)
    tif = _write_tiffs(tmp_path / "tiffs", proj, flats, darks)
    stated = {"image_seen_from": "detector", "rotation_direction": "ccw"}
    r_dx = _recon(tmp_path, "dx", {"path": str(dx)}, stated)
    r_tif = _recon(tmp_path, "tif", {"path": str(tif / "projections"), "flats": str(tif / "flats"),
                                     "darks": str(tif / "darks")},
                   {**stated, "beam": "parallel", "pixel_size_mm": [1.0, 1.0], "angle_range_deg": 360})
    v_dx, v_tif = r_dx["volume"].numpy(), r_tif["volume"].numpy()
    assert r_dx["centre"]["offset_px"] == pytest.approx(PAR.offset_px, abs=0.2)
    np.testing.assert_allclose(v_dx, v_tif, rtol=0, atol=1e-4 * float(np.abs(v_tif).max()))
    truth = PAR.truth(v_dx.shape, r_dx["geometry"]["voxel_spacing"][0])
    assert _corr(v_dx, truth) > 0.8
    _not_mirrored(v_dx, truth)
    # The orientation as ctbench's attributes on /exchange: no config needed, the same volume.
    dx2 = write_dxchange(tmp_path / "stated.h5", proj, flats, darks, np.degrees(PAR.angles), resolution_um=1000.0,
                         orientation=CTBENCH)
    r2 = _recon(tmp_path, "dx2", {"path": str(dx2)}, {})
    np.testing.assert_allclose(r2["volume"].numpy(), v_dx, atol=1e-6 * float(np.abs(v_dx).max()))


def test_dxchange_bad_files_are_named(tmp_path):
    import h5py

    p = tmp_path / "empty.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("exchange/theta", data=np.zeros(3))
    with pytest.raises(ScanFileError, match="exchange/data"):
        read_scan(p, format="dxchange")
    q = tmp_path / "grad.h5"
    with h5py.File(q, "w") as f:
        f.create_dataset("exchange/data", data=np.ones((3, 4, 5), np.uint16))
        f.create_dataset("exchange/theta", data=np.zeros(3)).attrs["units"] = "grad"
    with pytest.raises(ScanFileError, match="theta has units 'grad'"):
        read_scan(q)


# ------------------------------------------------------------------ Nikon XT H
CONE = LabScanSpec(n_views=96, detector_u=80, detector_v=40, offset_px=2.37, phantom_name="chiral", seed=21)
WHITE = 60000.0


@pytest.fixture(scope="module")
def shading_corrected():
    """Counts as Nikon stores them: flat/dark corrected by the scanner, open beam at WhiteLevel (uint16)."""
    proj, flats, darks, _ = simulate_counts(CONE)
    d, f = darks.mean(0), flats.mean(0)
    t = (proj - d) / (f - d)
    return np.clip(np.rint(t * WHITE), 1, 65535).astype(np.uint16)


@pytest.mark.slow
def test_nikon_reads_distances_pitch_angles_and_binning(shading_corrected, tmp_path):
    deg = np.degrees(CONE.angles)
    measured = deg + np.random.default_rng(1).normal(0, 0.01, deg.size)
    xt = write_nikon(tmp_path / "nikon", "chiral", shading_corrected, pitch=CONE.pitch, sid=CONE.sid, sdd=CONE.sdd,
                     angles_deg=deg, white_level=WHITE, ctdata_deg=measured)
    scan = read_scan(xt.parent)                                   # the folder is enough
    assert scan.format == "nikon" and read_scan(xt).format == "nikon"
    assert scan.pixel_size == (CONE.pitch, CONE.pitch)
    assert scan.scanner["source_object_distance_mm"] == CONE.sid
    assert scan.scanner["source_detector_distance_mm"] == CONE.sdd
    np.testing.assert_allclose(np.degrees(scan.angles), measured, atol=1e-6)    # _ctdata.txt wins
    np.testing.assert_array_equal(np.asarray(scan.projections[3]), shading_corrected[3])
    assert float(np.asarray(scan.flats).mean()) == WHITE
    (tmp_path / "nikon" / "_ctdata.txt").unlink()
    np.testing.assert_allclose(np.degrees(read_scan(xt).angles), deg, atol=1e-9)   # InitialAngle + AngularStep
    xb = write_nikon(tmp_path / "binned", "b", shading_corrected[:4], pitch=CONE.pitch, sid=CONE.sid, sdd=CONE.sdd,
                     angles_deg=deg[:4], white_level=WHITE, binning=2)
    assert read_scan(xb).pixel_size == pytest.approx((CONE.pitch, CONE.pitch))


@pytest.mark.slow
def test_nikon_reconstructs_like_the_tiff_scan_and_not_mirrored(shading_corrected, tmp_path):
    from ctbench.io.nikon import NIKON_ORIENTATION
    from ctbench.io.scanner import scanner_json

    # ctbench's images are Nikon's (columns to the left seen from the source = to the right seen from behind).
    assert not (NIKON_ORIENTATION.flip_columns or NIKON_ORIENTATION.flip_rows)
    xt = write_nikon(tmp_path / "nikon", "chiral", shading_corrected, pitch=CONE.pitch, sid=CONE.sid, sdd=CONE.sdd,
                     angles_deg=np.degrees(CONE.angles), white_level=WHITE, ctdata_deg=np.degrees(CONE.angles))
    tif = _write_tiffs(tmp_path / "tiffs", shading_corrected, np.full((1, *shading_corrected.shape[1:]), WHITE,
                                                                       np.float32), np.zeros((0, 1, 1)))
    doc = scanner_json(sid=CONE.sid, sdd=CONE.sdd, pixel_size=(CONE.pitch, CONE.pitch), n_projections=CONE.n_views,
                       orientation=CTBENCH)
    doc["files"].pop("darks")
    doc["files"]["flats"] = "flats/*.tif"
    (tif / "scan.json").write_text(json.dumps(doc))
    r_nk = _recon(tmp_path, "nk", {"path": str(xt)}, {})
    r_tif = _recon(tmp_path, "tif", {"path": str(tif)}, {})
    assert r_nk["orientation"]["detected_from_data"] is False and r_nk["warnings"] == []
    assert r_nk["centre"]["offset_px"] == pytest.approx(CONE.offset_px, abs=0.25)
    v_nk, v_tif = r_nk["volume"].numpy(), r_tif["volume"].numpy()
    np.testing.assert_allclose(v_nk, v_tif, rtol=0, atol=1e-4 * float(np.abs(v_tif).max()))
    truth = CONE.truth(v_nk.shape, r_nk["geometry"]["voxel_spacing"][0])
    assert _corr(v_nk, truth) > 0.8
    _not_mirrored(v_nk, truth)


def test_nikon_bad_files_are_named(tmp_path):
    bad = tmp_path / "x.xtekct"
    bad.write_text("[Other]\nName=x\n")
    with pytest.raises(ScanFileError, match="no \\[XTekCT\\] section"):
        read_scan(bad)
    bad.write_text("[XTekCT]\nName=x\nProjections=3\nDetectorPixelsX=4\nDetectorPixelsY=4\nDetectorPixelSizeX=1\n"
                   "DetectorPixelSizeY=1\nSrcToObject=200\nSrcToDetector=100\n")
    with pytest.raises(ScanFileError, match="SrcToDetector"):
        read_scan(bad)



def test_a_folder_with_two_nikon_files_names_both_instead_of_reading_a_tiff_stack(tmp_path):
    """Which scan to read cannot be guessed: the error names both files and says to give one (it fell back to a
    TIFF stack once and said "no pixel size")."""
    proj = np.full((3, 4, 4), 30000, np.uint16)
    for name in ("a", "b"):
        write_nikon(tmp_path, name, proj, pitch=0.2, sid=200, sdd=400, angles_deg=[0, 120, 240], white_level=60000)
    with pytest.raises(ScanFileError, match=r"holds 2 \.xtekct files \(a\.xtekct, b\.xtekct\)"):
        read_scan(tmp_path)
    assert read_scan(tmp_path / "a.xtekct").projections.shape[0] == 3

# ------------------------------------------------------------------ Bruker SkyScan
SKY = LabScanSpec(n_views=96, detector_u=80, detector_v=40, offset_px=-1.63, offset_v_px=1.5, phantom_name="chiral",
                  rotation="ccw", seen_from="source", seed=31)   # "CC": TIGRE's angles step x i, a camera image


@pytest.fixture(scope="module")
def skyscan_counts():
    proj, flats, darks, _ = simulate_counts(SKY)
    d, f = darks.mean(0), flats.mean(0)
    return np.clip(np.rint((proj - d) / (f - d) * 65535), 1, 65535).astype(np.uint16)


@pytest.mark.slow
def test_bruker_reads_distances_pitch_angles_direction_and_optical_axis(skyscan_counts, tmp_path):
    axis = skyscan_optical_axis(SKY.detector_v, SKY.offset_v_px)
    log = write_bruker(tmp_path / "sky", "chiral_", skyscan_counts, sid=SKY.sid, sdd=SKY.sdd, pitch=SKY.pitch,
                       step_deg=360.0 / SKY.n_views, direction="CC", optical_axis=axis, binning=2)
    scan = read_scan(log.parent)
    assert scan.format == "bruker"
    assert scan.pixel_size == pytest.approx((SKY.pitch, SKY.pitch), rel=1e-6)
    assert scan.scanner["source_object_distance_mm"] == SKY.sid
    assert scan.scanner["detector_offset_v_mm"] == pytest.approx(SKY.offset_v_px * SKY.pitch)
    assert scan.orientation.rotation == "ccw" and scan.orientation.seen_from == "source"
    np.testing.assert_allclose(np.degrees(scan.angles), 3.75 * np.arange(SKY.n_views))    # TIGRE's step x i
    np.testing.assert_array_equal(np.asarray(scan.projections[7]), skyscan_counts[7])


@pytest.mark.slow
def test_bruker_reconstructs_like_the_tiff_scan_and_not_mirrored(skyscan_counts, tmp_path):
    from ctbench.io.scanner import scanner_json

    axis = skyscan_optical_axis(SKY.detector_v, SKY.offset_v_px)
    log = write_bruker(tmp_path / "sky", "chiral_", skyscan_counts, sid=SKY.sid, sdd=SKY.sdd, pitch=SKY.pitch,
                       step_deg=360.0 / SKY.n_views, direction="CC", optical_axis=axis)
    tif = _write_tiffs(tmp_path / "tiffs", skyscan_counts,
                       np.full((1, *skyscan_counts.shape[1:]), 65535.0, np.float32), np.zeros((0, 1, 1)))
    doc = scanner_json(sid=SKY.sid, sdd=SKY.sdd, pixel_size=(SKY.pitch, SKY.pitch), n_projections=SKY.n_views,
                       orientation=SKY.orientation)
    doc["files"].pop("darks")
    (tif / "scan.json").write_text(json.dumps(doc))
    r_sky = _recon(tmp_path, "sky", {"path": str(log)}, {})
    r_tif = _recon(tmp_path, "tif", {"path": str(tif)}, {"detector_offset_v_mm": SKY.offset_v_px * SKY.pitch})
    assert r_sky["detector_offset_mm"][1] == pytest.approx(SKY.offset_v_px * SKY.pitch)
    assert r_sky["orientation"]["rotation_direction"] == "ccw" and r_sky["warnings"] == []
    assert r_sky["centre"]["offset_px"] == pytest.approx(SKY.offset_px, abs=0.25)
    v_sky, v_tif = r_sky["volume"].numpy(), r_tif["volume"].numpy()
    np.testing.assert_allclose(v_sky, v_tif, rtol=0, atol=1e-4 * float(np.abs(v_tif).max()))
    truth = SKY.truth(v_sky.shape, r_sky["geometry"]["voxel_spacing"][0])
    assert _corr(v_sky, truth) > 0.8
    _not_mirrored(v_sky, truth)


def test_bruker_bad_files_are_named(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("[Acquisition]\nFilename Prefix=x_\nNumber of Files= 3\nNumber of Rows= 4\nNumber of Columns= 4\n"
                   "Object to Source (mm)=100\nCamera to Source (mm)=200\nImage Pixel Size (um)=10\n"
                   "Rotation Step (deg)=1\n")
    with pytest.raises(ScanFileError, match="announces 3 files"):
        read_scan(log)


# ------------------------------------------------------------------ Zeiss Xradia
ZS = LabScanSpec(n_views=96, detector_u=80, detector_v=40, offset_px=3.1, phantom_name="chiral", seed=41)


@pytest.fixture(scope="module")
def zeiss_counts():
    proj, flats, darks, _ = simulate_counts(ZS)
    # Xradia stores dark-subtracted counts and the reference (open beam) as float32.
    return (np.clip(proj.astype(np.float64) - darks.mean(0), 1, 65535).astype(np.uint16),
            (flats.mean(0) - darks.mean(0)).astype(np.float32))


def test_zeiss_reads_distances_pitch_angles_reference_and_shifts(zeiss_counts, tmp_path):
    proj, ref = zeiss_counts
    shifts = np.linspace(-0.5, 0.5, ZS.n_views)
    stored, stored_ref = zeiss_images(proj), zeiss_images(ref[None])[0]       # CIL's bottom-left origin
    path = write_txrm(tmp_path / "scan.txrm", stored, stored_ref, angles_deg=zeiss_angles_deg(ZS.angles), sid=ZS.sid,
                      sdd=ZS.sdd, pixel_um=ZS.pitch * 1e3 * ZS.sid / ZS.sdd, x_shifts=shifts)
    scan = read_scan(path)
    assert scan.format == "zeiss"
    assert scan.scanner["source_object_distance_mm"] == pytest.approx(ZS.sid)
    assert scan.scanner["source_detector_distance_mm"] == pytest.approx(ZS.sdd)
    assert scan.pixel_size == pytest.approx((ZS.pitch, ZS.pitch), rel=1e-6)
    np.testing.assert_allclose(scan.angles, ZS.angles, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(scan.projections[50]), stored[50])     # as stored: the file's frame
    np.testing.assert_array_equal(np.asarray(scan.flats)[0], stored_ref)
    np.testing.assert_allclose(scan.scanner["view_shifts_px"]["x"], shifts, atol=1e-6)   # applied by the pipeline
    assert scan.scanner["view_shifts_px"]["y"] == [0.0] * ZS.n_views
    assert scan.orientation == Orientation("source", "right", "up", "ccw")


@pytest.mark.slow
def test_zeiss_reconstructs_like_the_tiff_scan_and_not_mirrored(zeiss_counts, tmp_path):
    from ctbench.io.scanner import scanner_json

    proj, ref = zeiss_counts
    path = write_txrm(tmp_path / "scan.txrm", zeiss_images(proj), zeiss_images(ref[None])[0],
                      angles_deg=zeiss_angles_deg(ZS.angles), sid=ZS.sid, sdd=ZS.sdd,
                      pixel_um=ZS.pitch * 1e3 * ZS.sid / ZS.sdd)
    tif = _write_tiffs(tmp_path / "tiffs", proj, ref[None], np.zeros((0, 1, 1)))
    doc = scanner_json(sid=ZS.sid, sdd=ZS.sdd, pixel_size=(ZS.pitch, ZS.pitch), n_projections=ZS.n_views,
                       orientation=CTBENCH)
    doc["files"].pop("darks")
    (tif / "scan.json").write_text(json.dumps(doc))
    r_zs = _recon(tmp_path, "zs", {"path": str(path)}, {})
    r_tif = _recon(tmp_path, "tif", {"path": str(tif)}, {})
    # CIL's reading, stated by the reader and confirmed by the data (no warning).
    assert r_zs["orientation"]["detected_from_data"] is False and r_zs["warnings"] == []
    assert r_zs["orientation"]["image_seen_from"] == "source" and r_zs["orientation"]["image_rows"] == "up"
    assert r_zs["centre"]["offset_px"] == pytest.approx(ZS.offset_px, abs=0.25)
    v_zs, v_tif = r_zs["volume"].numpy(), r_tif["volume"].numpy()
    np.testing.assert_allclose(v_zs, v_tif, rtol=0, atol=1e-4 * float(np.abs(v_tif).max()))
    truth = ZS.truth(v_zs.shape, r_zs["geometry"]["voxel_spacing"][0])
    assert _corr(v_zs, truth) > 0.8
    _not_mirrored(v_zs, truth)


def test_zeiss_bad_files_are_named(tmp_path):
    p = tmp_path / "x.txrm"
    p.write_bytes(b"not an OLE file at all" * 40)
    with pytest.raises(ScanFileError, match="not an OLE2 compound file"):
        read_scan(p)


# ------------------------------------------------------------------ mappings checked against the open readers
def test_bruker_row_pitch_follows_the_camera_xy_ratio(tmp_path):
    """TIGRE's BrukerDataLoader: dv = du x CameraXYRatio (docs/SCANS.md, the mapping table)."""
    log = write_bruker(tmp_path, "x_", np.ones((3, 4, 6), np.uint16), sid=50.0, sdd=200.0, pitch=0.02,
                       step_deg=120.0, xy_ratio=0.9927, optical_axis=2.5)
    scan = read_scan(log)
    assert scan.pixel_size == pytest.approx((0.02, 0.02 * 0.9927), rel=1e-5)
    assert scan.scanner["detector_offset_v_mm"] == pytest.approx((2.5 - 2.0) * 0.02 * 0.9927, rel=1e-5)


def test_zeiss_parallel_beam_and_volume_files(tmp_path):
    """CIL's ZEISSDataReader: ImageInfo/XrayGeometry 1 is a cone beam, otherwise parallel (the pixel size is then
    the detector pitch); ImageInfo/AcquisitionMode other than 0 is a reconstructed volume."""
    proj = np.full((4, 6, 8), 1000, np.uint16)
    ref = np.full((6, 8), 2000.0, np.float32)
    kw = dict(angles_deg=[0, 45, 90, 135], sid=100.0, sdd=300.0, pixel_um=2.0)
    par = read_scan(write_txrm(tmp_path / "par.txrm", proj, ref, xray_geometry=2, **kw))
    assert par.scanner["beam"] == "parallel" and "source_object_distance_mm" not in par.scanner
    assert par.pixel_size == pytest.approx((0.002, 0.002))
    cone = read_scan(write_txrm(tmp_path / "cone.txrm", proj, ref, **kw))
    assert "beam" not in cone.scanner and cone.pixel_size == pytest.approx((0.006, 0.006))
    with pytest.raises(ScanFileError, match="reconstructed volume"):
        read_scan(write_txrm(tmp_path / "vol.txrm", proj, ref, acquisition_mode=1, **kw))


def test_stated_tilts_that_are_not_applied_are_warnings(tmp_path):
    """A Nikon ObjectRoll/ObjectTilt (CIL turns its axis by them) and a SkyScan Image Rotation are not applied by
    ctbench's circular orbit: the scan says so instead of reconstructing silently with a tilted axis."""
    imgs = np.full((3, 4, 6), 1000, np.uint16)
    xt = write_nikon(tmp_path / "nk", "t", imgs, pitch=0.1, sid=50.0, sdd=200.0, angles_deg=[0.0, 120.0, 240.0],
                     white_level=2000.0, extra={"ObjectTilt": 0.5, "ObjectRoll": 0.25})
    assert any("ObjectTilt=0.5 deg is not applied" in w for w in read_scan(xt).scanner["warnings"])
    assert read_scan(xt).scanner["detector_roll_deg"] == -0.25       # a roll is applied (test_vendor_offsets.py)
    assert "warnings" not in read_scan(write_nikon(tmp_path / "ok", "t", imgs, pitch=0.1, sid=50.0, sdd=200.0,
                                                   angles_deg=[0.0, 120.0, 240.0], white_level=2000.0)).scanner
    log = write_bruker(tmp_path / "sky", "r_", imgs, sid=50.0, sdd=200.0, pitch=0.02, step_deg=120.0,
                       image_rotation=0.23)
    scan = read_scan(log)
    assert scan.scanner["image_rotation_deg"] == pytest.approx(0.23)
    assert any("Image Rotation=0.23 deg is applied" in w for w in scan.scanner["warnings"])   # sign undocumented
