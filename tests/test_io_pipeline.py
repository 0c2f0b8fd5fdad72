"""Measured-scan round trip: raw counts on disk -> correction -> centre -> geometry -> FDK, and ``ctbench recon``."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ctbench.io import read_scan, read_volume
from ctbench.pipeline import (GeometryConfig, PreprocessConfig, build_geometry, find_offset, parse_config,
                              prepare)
from ctbench.io.sample_scan import LabScanSpec, simulate_counts, write_lab_scan
from ctbench.io.scan import images_to_sinogram
from ctbench.solvers import fdk

from io_helpers import write_nxtomo

SPEC = LabScanSpec()          # 120 views, 96 x 72 pixels of 1.5 mm, SID 200, SDD 400, offset 3.3 px
GRID = {"volume_shape": [64, 64, 64], "voxel_size_mm": 1.0}


@pytest.fixture(scope="module")
def lab_scan(tmp_path_factory):
    return write_lab_scan(tmp_path_factory.mktemp("scan") / "lab_scan", SPEC)


@pytest.fixture(scope="module")
def prepared(lab_scan):
    scan = read_scan(lab_scan)
    return scan, prepare(scan, PreprocessConfig())


def test_bundled_sample_is_what_the_generator_writes(lab_scan):
    import tifffile

    from ctbench.io.sample_scan import sample_scan_path

    shipped = sample_scan_path()
    for rel in ("projections/proj_0000.tif", "projections/proj_0077.tif", "flats/flat_03.tif", "darks/dark_05.tif"):
        np.testing.assert_array_equal(tifffile.imread(shipped / rel), tifffile.imread(lab_scan / rel))
    assert json.loads((shipped / "scan.json").read_text()) == json.loads((lab_scan / "scan.json").read_text())


def _fdk_error(prep, offset_mm, truth):
    geo = build_geometry(prep, GeometryConfig(**GRID), SPEC.sid, SPEC.sdd, SPEC.angles, offset_mm)
    sino = torch.from_numpy(np.ascontiguousarray(images_to_sinogram(prep.images)))
    vol = fdk(geo.projector(), sino).numpy()
    return float(np.sqrt(np.mean((vol - truth) ** 2)))


@pytest.mark.slow
def test_round_trip_finds_the_offset_and_reconstructs_as_well_as_the_exact_geometry(prepared):
    scan, prep = prepared
    assert scan.values == "counts" and prep.images.shape == (SPEC.n_views, SPEC.detector_v, SPEC.detector_u)
    centre = find_offset(prep, scan.angles, SPEC.sid, SPEC.sdd)
    assert abs(centre.offset_px - SPEC.offset_px) <= 0.25, centre.text()
    assert abs(centre.cross_check_px - SPEC.offset_px) <= 0.5, centre.text()
    assert centre.offset_mm == pytest.approx(centre.offset_px * SPEC.pitch)
    truth = SPEC.phantom()
    exact = _fdk_error(prep, SPEC.offset_px * SPEC.pitch, truth)
    found = _fdk_error(prep, centre.offset_mm, truth)
    ignored = _fdk_error(prep, 0.0, truth)
    print(f"RMSE vs phantom: exact geometry {exact:.3e}, found offset {found:.3e}, offset ignored {ignored:.3e}")
    assert found <= 1.10 * exact
    assert ignored > 1.3 * exact           # the offset matters: the test would notice a wrong one


@pytest.mark.slow
def test_crop_bookkeeping_moves_the_offset_with_the_detector_centre(prepared, lab_scan):
    scan, _ = prepared
    prep = prepare(scan, PreprocessConfig(cols=(6, 96)))
    assert prep.shift_u == pytest.approx(3 * SPEC.pitch)
    centre = find_offset(prep, scan.angles, SPEC.sid, SPEC.sdd)
    expect = SPEC.offset_px * SPEC.pitch + prep.shift_u
    assert abs(centre.offset_mm - expect) <= 0.25 * SPEC.pitch, centre.text()


@pytest.mark.slow
def test_nexus_file_gives_the_same_data_geometry_and_centre_as_the_tiff_folder(prepared, tmp_path):
    from ctbench.pipeline import distances
    scan_t, prep_t = prepared
    proj, flats, darks, _ = simulate_counts(SPEC)      # the same counts (same seed) as the TIFF files
    write_nxtomo(tmp_path / "scan.nxs", proj, flats, darks, np.degrees(SPEC.angles), SPEC.pitch * 1e-3,
                 sample_detector_m=(SPEC.sdd - SPEC.sid) * 1e-3)
    scan_n = read_scan(tmp_path / "scan.nxs")
    assert scan_n.format == "nexus" and scan_n.pixel_size == pytest.approx(scan_t.pixel_size)
    np.testing.assert_allclose(scan_n.angles, scan_t.angles, atol=1e-12)
    # SID from the user, SDD = SID + the file's sample-detector distance
    assert distances(scan_n, GeometryConfig(sid_mm=SPEC.sid)) == pytest.approx((SPEC.sid, SPEC.sdd))
    prep_n = prepare(scan_n, PreprocessConfig())
    np.testing.assert_array_equal(prep_n.images, prep_t.images)
    c_n = find_offset(prep_n, scan_n.angles, SPEC.sid, SPEC.sdd, cross_check=False)
    c_t = find_offset(prep_t, scan_t.angles, SPEC.sid, SPEC.sdd, cross_check=False)
    assert c_n.offset_px == pytest.approx(c_t.offset_px, abs=1e-6) and abs(c_n.offset_px - SPEC.offset_px) <= 0.25


@pytest.mark.slow
def test_ctbench_recon_command_writes_the_volume_with_its_voxel_size(lab_scan, tmp_path):
    cfg = {"input": {"path": str(lab_scan)},
           "preprocess": {"bin": 2, "ring_filter": 5},
           "geometry": {"detector_offset_u_mm": SPEC.offset_px * SPEC.pitch},
           "algorithm": {"name": "sirt", "params": {"n_iter": 3}},
           "output": {"path": "recon.h5"}}
    (tmp_path / "recon.json").write_text(json.dumps(cfg))
    out = subprocess.run([sys.executable, "-m", "ctbench.cli", "recon", str(tmp_path / "recon.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    vol, spacing = read_volume(tmp_path / "recon.h5")      # relative output path: next to the config
    # 2x binning: 48 x 36 pixels of 3 mm; the default grid covers the detector at the isocentre (1.5 mm voxels)
    assert vol.shape == (36, 48, 48) and spacing == pytest.approx((1.5, 1.5, 1.5))
    assert report["detector_offset_mm"][0] == pytest.approx(SPEC.offset_px * SPEC.pitch)
    assert report["algorithm"]["n_iter"] == 3 and vol.max() > 0.01
    # the same command again refuses to overwrite
    again = subprocess.run([sys.executable, "-m", "ctbench.cli", "recon", str(tmp_path / "recon.json")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "exists" in again.stderr


@pytest.mark.parametrize("doc, words", [
    ({"input": {"path": "x"}, "preprocess": {"binning": 2}}, "preprocess.binning: Extra inputs are not permitted"),
    ({"input": {"path": "x"}, "preprocess": {"bin": 0}}, "preprocess.bin"),
    ({"input": {"path": "x"}, "geometry": {"detector_offset_u_mm": "left"}}, "geometry.detector_offset_u_mm"),
    ({"input": {"path": "x"}, "preprocess": {"ring_filter": 2}}, "ring_filter must be 0 (off) or a width"),
    ({"preprocess": {}}, "input: Field required"),
])
def test_bad_configs_name_the_field(doc, words):
    with pytest.raises(ValueError) as e:
        parse_config(doc)
    assert words in str(e.value), str(e.value)
