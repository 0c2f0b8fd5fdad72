"""The offsets a vendor's file states are applied in ctbench's frame (``detector_offset_u_mm: "file"``, the centre
finder off): a chiral-phantom scan written the way the vendor writes it, with a known offset stated in the file,
reconstructs as well as the equivalent TIFF scan with the exact geometry, and ignoring the field makes it worse.

The offsets are stated the way the vendor (as CIL's NikonDataReader reads it) places them: Nikon's
DetectorOffsetX moves the panel along its columns (the object images ``DetectorOffsetX / pitch`` columns towards
column 0), ObjectOffsetX moves the rotation axis at the object the other way (magnified by SDD / SID), the
CentreOfRotation values are that axis offset at the detector; SkyScan's Postalignment is where the axis images
in the stored columns, ``(cols - 1) / 2 + Postalignment``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ctbench.io import read_scan
from ctbench.io.orientation import CTBENCH
from ctbench.pipeline import load_config, run_recon
from ctbench.io.sample_scan import LabScanSpec, simulate_counts
from ctbench.io.scanner import scanner_json

from vendor_files import write_bruker, write_nikon

O_U, O_V = 3.0, 1.5          # px: the offsets the scans are simulated with (ctbench's detector offsets)
ROLL = 6.0                   # deg: ctbench's detector roll (u towards v, seen from behind the detector)


def _recon(tmp_path, name, path, geometry):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps({"input": {"path": str(path)}, "geometry": geometry}))
    return run_recon(load_config(p))


def _rmse(r, spec):
    v = r["volume"].numpy()
    truth = spec.truth(v.shape, r["geometry"]["voxel_spacing"][0])
    return float(np.sqrt(np.mean((v - truth) ** 2)))


def _tiff_scan(folder, imgs, full, spec, orientation):
    import tifffile

    (folder / "projections").mkdir(parents=True)
    for i, img in enumerate(imgs):
        tifffile.imwrite(folder / "projections" / f"p_{i:04d}.tif", img)
    (folder / "flats").mkdir()
    tifffile.imwrite(folder / "flats" / "f_0000.tif", np.full(imgs.shape[1:], full, np.float32))
    doc = scanner_json(sid=spec.sid, sdd=spec.sdd, pixel_size=(spec.pitch, spec.pitch), n_projections=spec.n_views,
                       orientation=orientation)
    doc["files"].pop("darks")
    doc["files"]["flats"] = "flats/*.tif"
    (folder / "scan.json").write_text(json.dumps(doc))
    return folder


def _corrected(spec, full):
    proj, flats, darks, _ = simulate_counts(spec)
    d, f = darks.mean(0), flats.mean(0)
    return np.clip(np.rint((proj - d) / (f - d) * full), 1, 65535).astype(np.uint16)


# ------------------------------------------------------------------ Nikon XT H
NK = LabScanSpec(n_views=48, detector_u=48, detector_v=16, offset_px=O_U, offset_v_px=O_V, phantom_name="chiral",
                 seed=41)
WHITE = 60000.0


@pytest.fixture(scope="module")
def nikon_case(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nk")
    imgs = _corrected(NK, WHITE)
    exact = {"detector_offset_u_mm": O_U * NK.pitch, "detector_offset_v_mm": O_V * NK.pitch}
    tif = _recon(tmp, "tif", _tiff_scan(tmp / "tif", imgs, WHITE, NK, CTBENCH), exact)
    return tmp, imgs, _rmse(tif, NK)


M = NK.sdd / NK.sid
NIKON_STATED = {   # three ways a .xtekct states the same offset (u = DetectorOffsetX - axis offset at the detector)
    "detector": {"DetectorOffsetX": O_U * NK.pitch, "DetectorOffsetY": O_V * NK.pitch},
    "object": {"ObjectOffsetX": -O_U * NK.pitch / M, "DetectorOffsetY": O_V * NK.pitch},
    "centre_of_rotation": {"ObjectOffsetX": None, "CentreOfRotationTop": -O_U * NK.pitch,
                           "CentreOfRotationBottom": -O_U * NK.pitch, "DetectorOffsetY": O_V * NK.pitch},
}


@pytest.mark.parametrize("how", sorted(NIKON_STATED))
def test_nikon_stated_offsets_reconstruct_like_the_exact_geometry(nikon_case, how):
    tmp, imgs, rmse_tif = nikon_case
    xt = write_nikon(tmp / how, "chiral", imgs, pitch=NK.pitch, sid=NK.sid, sdd=NK.sdd,
                     angles_deg=np.degrees(NK.angles), white_level=WHITE, extra=NIKON_STATED[how])
    scan = read_scan(xt)
    assert scan.scanner["detector_offset_u_mm"] == pytest.approx(O_U * NK.pitch)
    assert scan.scanner["detector_offset_v_mm"] == pytest.approx(O_V * NK.pitch)
    r = _recon(tmp, f"{how}_file", xt, {"detector_offset_u_mm": "file"})
    assert r["centre"] is None and r["detector_offset_mm"] == pytest.approx([O_U * NK.pitch, O_V * NK.pitch])
    rmse = _rmse(r, NK)
    assert rmse <= 1.1 * rmse_tif, (rmse, rmse_tif)
    ignored = _rmse(_recon(tmp, f"{how}_ignored", xt, {"detector_offset_u_mm": 0.0}), NK)
    assert ignored > 1.2 * rmse, (ignored, rmse)


def test_nikon_axis_tilt_from_the_centre_of_rotation_is_the_detector_roll(tmp_path):
    """CentreOfRotation values at the panel's top and bottom (an axis leaning across the panel) without ObjectRoll:
    the top's axis image lies (Top - Bottom) further along +u, a clockwise turn of the axis (u right, v up): the
    panel rolled anticlockwise by atan2(Top - Bottom, height)."""
    imgs = np.full((3, 4, 6), 1000, np.uint16)
    xt = write_nikon(tmp_path, "t", imgs, pitch=0.1, sid=50.0, sdd=200.0, angles_deg=[0.0, 120.0, 240.0],
                     white_level=2000.0, extra={"ObjectOffsetX": None, "ObjectRoll": None,
                                                "CentreOfRotationTop": 0.3, "CentreOfRotationBottom": 0.1})
    scan = read_scan(xt)
    assert scan.scanner["detector_offset_u_mm"] == pytest.approx(-0.2)     # the mean of Top and Bottom
    assert scan.scanner["detector_roll_deg"] == pytest.approx(np.degrees(np.arctan2(0.2, 0.4)))
    assert "warnings" not in scan.scanner


@pytest.mark.slow
def test_nikon_object_roll_is_the_detector_roll(tmp_path):
    """ObjectRoll (CIL: the axis tilted towards its +x, ctbench's -u): a ctbench detector roll of ROLL is an
    ObjectRoll of -ROLL; the default (geometry.detector_roll_deg null) applies it."""
    from ctbench.io.orientation import roll_detector

    spec = LabScanSpec(n_views=48, detector_u=48, detector_v=40, offset_px=O_U, phantom_name="chiral", seed=49)
    proj, flats, darks, _ = simulate_counts(spec, trajectory=roll_detector(spec.trajectory(), ROLL))
    d, f = darks.mean(0), flats.mean(0)
    imgs = np.clip(np.rint((proj - d) / (f - d) * WHITE), 1, 65535).astype(np.uint16)
    xt = write_nikon(tmp_path / "nk", "r", imgs, pitch=spec.pitch, sid=spec.sid, sdd=spec.sdd,
                     angles_deg=np.degrees(spec.angles), white_level=WHITE,
                     extra={"DetectorOffsetX": O_U * spec.pitch, "ObjectRoll": -ROLL})
    tif = _recon(tmp_path, "tif", _tiff_scan(tmp_path / "tif", imgs, WHITE, spec, CTBENCH),
                 {"detector_offset_u_mm": O_U * spec.pitch, "detector_roll_deg": ROLL})
    r = _recon(tmp_path, "file", xt, {"detector_offset_u_mm": "file"})
    assert r["warnings"] == [] and f"{ROLL}" in r["detector_roll"]
    rmse, rmse_tif = _rmse(r, spec), _rmse(tif, spec)
    assert rmse <= 1.1 * rmse_tif, (rmse, rmse_tif)
    ignored = _rmse(_recon(tmp_path, "ignored", xt, {"detector_offset_u_mm": "file", "detector_roll_deg": 0.0}), spec)
    opposite = _rmse(_recon(tmp_path, "opp", xt, {"detector_offset_u_mm": "file", "detector_roll_deg": -ROLL}), spec)
    assert ignored > 1.1 * rmse and opposite > ignored, (ignored, opposite, rmse)


def test_file_offset_without_one_in_the_file_is_a_clear_error(tmp_path):
    imgs = np.full((3, 4, 6), 1000, np.uint16)
    folder = _tiff_scan(tmp_path / "tif", imgs, 2000.0, LabScanSpec(n_views=3, detector_u=6, detector_v=4),
                        CTBENCH)
    with pytest.raises(ValueError, match="detector_offset_u_mm is 'file'"):
        _recon(tmp_path, "x", folder, {"detector_offset_u_mm": "file"})


# ------------------------------------------------------------------ Bruker SkyScan
SK = LabScanSpec(n_views=48, detector_u=48, detector_v=16, offset_px=O_U, phantom_name="chiral", rotation="ccw",
                 seen_from="source", seed=43)


@pytest.mark.slow
def test_skyscan_postalignment_reconstructs_like_the_exact_geometry(tmp_path):
    imgs = _corrected(SK, 65535.0)
    # the writer's reading of Postalignment: the axis images at stored column (cols - 1) / 2 + P
    log = write_bruker(tmp_path / "sky", "c_", imgs, sid=SK.sid, sdd=SK.sdd, pitch=SK.pitch,
                       step_deg=360.0 / SK.n_views, direction="CC", postalignment=O_U)
    assert read_scan(log).scanner["detector_offset_u_mm"] == pytest.approx(O_U * SK.pitch)
    tif = _recon(tmp_path, "tif", _tiff_scan(tmp_path / "tif", imgs, 65535.0, SK, SK.orientation),
                 {"detector_offset_u_mm": O_U * SK.pitch})
    r = _recon(tmp_path, "file", log, {"detector_offset_u_mm": "file"})
    assert r["centre"] is None
    rmse, rmse_tif = _rmse(r, SK), _rmse(tif, SK)
    assert rmse <= 1.1 * rmse_tif, (rmse, rmse_tif)
    ignored = _rmse(_recon(tmp_path, "ignored", log, {"detector_offset_u_mm": 0.0}), SK)
    assert ignored > 1.2 * rmse, (ignored, rmse)


SKR = LabScanSpec(n_views=48, detector_u=48, detector_v=40, offset_px=O_U, phantom_name="chiral", rotation="ccw",
                  seen_from="source", seed=47)       # rows enough for the roll to show


@pytest.mark.slow
def test_skyscan_image_rotation_is_the_detector_roll(tmp_path):
    """The stored images are seen from the source (columns mirrored), so a ctbench roll of ROLL is a turn of -ROLL
    in them: the writer states Image Rotation = -ROLL (Bruker does not document the sign; this is ctbench's
    reading, docs/SCANS.md), and the default (geometry.detector_roll_deg null) applies it."""
    from ctbench.io.orientation import roll_detector

    proj, flats, darks, _ = simulate_counts(SKR, trajectory=roll_detector(SKR.trajectory(), ROLL))
    d, f = darks.mean(0), flats.mean(0)
    imgs = np.clip(np.rint((proj - d) / (f - d) * 65535), 1, 65535).astype(np.uint16)
    log = write_bruker(tmp_path / "sky", "r_", imgs, sid=SKR.sid, sdd=SKR.sdd, pitch=SKR.pitch,
                       step_deg=360.0 / SKR.n_views, direction="CC", postalignment=O_U, image_rotation=-ROLL)
    scan = read_scan(log)
    assert scan.scanner["detector_roll_deg"] == pytest.approx(ROLL)
    tif = _recon(tmp_path, "tif", _tiff_scan(tmp_path / "tif", imgs, 65535.0, SKR, SKR.orientation),
                 {"detector_offset_u_mm": O_U * SKR.pitch, "detector_roll_deg": ROLL})
    r = _recon(tmp_path, "file", log, {"detector_offset_u_mm": "file"})
    assert r["detector_roll"] is not None and f"{ROLL}" in r["detector_roll"]
    rmse, rmse_tif = _rmse(r, SKR), _rmse(tif, SKR)
    assert rmse <= 1.1 * rmse_tif, (rmse, rmse_tif)
    ignored = _rmse(_recon(tmp_path, "ignored", log, {"detector_offset_u_mm": "file", "detector_roll_deg": 0.0}), SKR)
    opposite = _rmse(_recon(tmp_path, "opp", log, {"detector_offset_u_mm": "file", "detector_roll_deg": -ROLL}), SKR)
    assert ignored > 1.1 * rmse and opposite > ignored, (ignored, opposite, rmse)
