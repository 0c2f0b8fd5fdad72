"""Orientation as data: the four combinations of rotation direction and image view through ``ctbench recon``.

Each scan is simulated in raw counts (flats, darks, Poisson noise, a
non-integer detector offset that the file does not state) from the chiral
phantom's exact line integrals.  The reference is ctbench's FDK with the
exact geometry on the same counts; "not mirrored" means the volume
correlates better with the phantom than with its mirror images.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from ctbench.cli import main
from ctbench.io import read_scan
from ctbench.io.orientation import CTBENCH, Orientation, reverse_rotation, to_ctbench_images
from ctbench.pipeline import GeometryConfig, PreprocessConfig, build_geometry, prepare
from ctbench.io.sample_scan import LabScanSpec, write_lab_scan
from ctbench.io.scan import images_to_sinogram
from ctbench.solvers import fdk

OFFSET_PX = 2.37          # not in scan.json


def spec_for(rotation, seen_from) -> LabScanSpec:
    return LabScanSpec(n_views=96, detector_u=80, detector_v=56, offset_px=OFFSET_PX, phantom_name="chiral",
                       rotation=rotation, seen_from=seen_from, seed=5)


def _recon_cli(folder, tmp_path, capsys, geometry=None):
    cfg = {"input": {"path": str(folder)}, "output": {"path": str(tmp_path / "recon.h5")}}
    if geometry:
        cfg["geometry"] = geometry
    (tmp_path / "recon.json").write_text(json.dumps(cfg))
    assert main(["recon", str(tmp_path / "recon.json")]) == 0
    cap = capsys.readouterr()
    from ctbench.io.export import read_volume
    vol, spacing = read_volume(tmp_path / "recon.h5")
    return np.asarray(vol), json.loads(cap.out), cap.err


def _exact_fdk(folder, spec, shape):
    """ctbench's FDK with the true orientation, offset and angles, on the same counts."""
    scan = read_scan(folder)
    prep = prepare(scan, PreprocessConfig())
    images = to_ctbench_images(prep.images, spec.orientation)
    prep.images = images
    geo = build_geometry(prep, GeometryConfig(volume_shape=shape), spec.sid, spec.sdd, spec.angles,
                         spec.offset_px * spec.pitch)
    sino = torch.from_numpy(np.ascontiguousarray(images_to_sinogram(images)))
    return fdk(geo.projector(), sino).numpy(), geo


def _rmse(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)))


def _corr(a, b):
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


COMBOS = [("ccw", "detector"), ("ccw", "source"), ("cw", "detector"), ("cw", "source")]


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    out = {}
    for rot, seen in COMBOS:
        spec = spec_for(rot, seen)
        base = tmp_path_factory.mktemp(f"{rot}_{seen}")
        stated = write_lab_scan(base / "stated", spec)
        unstated = shutil.copytree(stated, base / "unstated")
        doc = json.loads((stated / "scan.json").read_text())
        for key in Orientation().to_dict():
            del doc["geometry"][key]
        (unstated / "scan.json").write_text(json.dumps(doc))
        out[rot, seen] = (spec, stated, unstated)
    return out


def _not_mirrored(vol, truth, margin=0.5):
    """The part of the volume that changes under each mirror correlates with the phantom's, with the right sign."""
    for axis in (0, 1, 2):
        mv, mt = np.flip(vol, axis), np.flip(truth, axis)
        assert _corr(vol, truth) > _corr(vol, mt)
        assert _corr(vol - mv, truth - mt) > margin, f"mirrored along axis {axis}"


@pytest.mark.parametrize("rot,seen", COMBOS)
@pytest.mark.slow
def test_stated_orientation_reconstructs_like_the_exact_geometry_and_not_mirrored(scans, rot, seen, tmp_path,
                                                                                   capsys):
    spec, stated, _ = scans[rot, seen]
    vol, report, err = _recon_cli(stated, tmp_path, capsys)
    ref, geo = _exact_fdk(stated, spec, vol.shape)
    truth = spec.truth(vol.shape, geo.voxel_spacing[0])
    assert report["orientation"]["image_seen_from"] == seen and report["orientation"]["rotation_direction"] == rot
    assert report["orientation"]["detected_from_data"] is False
    assert report["centre"]["offset_px"] == pytest.approx(OFFSET_PX, abs=0.25)
    assert _rmse(vol, truth) <= 1.10 * _rmse(ref, truth)
    assert _corr(vol, truth) > 0.8
    _not_mirrored(vol, truth)
    assert report["warnings"] == [] and "warning" not in err


@pytest.mark.parametrize("rot,seen", COMBOS)
@pytest.mark.slow
def test_unstated_orientation_is_detected_sharp_and_reported(scans, rot, seen, tmp_path, capsys):
    spec, _, unstated = scans[rot, seen]
    vol, report, err = _recon_cli(unstated, tmp_path, capsys)
    ref, geo = _exact_fdk(unstated, spec, vol.shape)
    truth = spec.truth(vol.shape, geo.voxel_spacing[0])
    o = report["orientation"]
    assert o["detected_from_data"] is True
    chosen = Orientation(o["image_seen_from"], o["image_columns"], o["image_rows"], o["rotation_direction"])
    # Both auto: the camera convention is assumed and the rotation read from the data, so the choice is
    # the truth or its mirror reading; the mirror reading reconstructs the x-mirrored object.
    assert chosen.seen_from == "source"
    assert chosen in (spec.orientation, spec.orientation.mirror())
    target = truth if chosen == spec.orientation else truth[:, :, ::-1]
    assert _rmse(vol, target) <= 1.10 * _rmse(ref, truth)
    assert "cannot be known from the data alone" in err and "cannot be known" in " ".join(o["notes"])
    assert len(o["readings"]) == 2
    assert report["warnings"] == []


@pytest.mark.slow
def test_one_stated_field_detects_the_other_without_mirror(scans, tmp_path, capsys):
    """The file says the rotation only (a camera image): the image view is detected, and it is the true one."""
    spec, _, unstated = scans["cw", "source"]
    vol, report, err = _recon_cli(unstated, tmp_path, capsys, {"rotation_direction": "cw"})
    truth = spec.truth(vol.shape, report["geometry"]["voxel_spacing"][0])
    assert report["orientation"]["image_seen_from"] == "source"
    _not_mirrored(vol, truth)


@pytest.mark.slow
def test_a_false_rotation_sense_in_the_file_is_overruled_by_the_data(scans, tmp_path, capsys):
    """scan.json says "cw" for a scan that turned "ccw": the data win (the image view kept, the rotation reversed),
    the volume is the true one, not mirrored, and the warning gives the evidence."""
    spec, stated, _ = scans["ccw", "source"]
    wrong = shutil.copytree(stated, tmp_path / "wrong")
    doc = json.loads((wrong / "scan.json").read_text())
    doc["geometry"]["rotation_direction"] = "cw"
    (wrong / "scan.json").write_text(json.dumps(doc))
    vol, report, err = _recon_cli(wrong, tmp_path, capsys)
    o = report["orientation"]
    assert (o["image_seen_from"], o["rotation_direction"], o["decided_by"]) == ("source", "ccw", "data")
    assert o["evidence"]["ratio"] > 3 and o["evidence"]["stated"]["orientation"]["rotation_direction"] == "cw"
    ref, geo = _exact_fdk(stated, spec, vol.shape)
    truth = spec.truth(vol.shape, geo.voxel_spacing[0])
    assert _rmse(vol, truth) <= 1.10 * _rmse(ref, truth)
    _not_mirrored(vol, truth)
    assert report["centre"]["offset_px"] == pytest.approx(OFFSET_PX, abs=0.25)
    assert any("the data contradict the orientation the file states" in w and "conjugate-ray mismatch" in w
               for w in report["warnings"])
    assert "ctbench recon: warning: the data contradict" in err


@pytest.mark.slow
def test_a_convention_fixed_in_the_config_against_the_data_is_an_error(scans, tmp_path, capsys):
    """The user states ctbench's image view for a camera-convention scan: ctbench stops, naming the evidence and
    the setting to change, instead of reconstructing a blurred volume."""
    spec, stated, _ = scans["ccw", "source"]
    cfg = {"input": {"path": str(stated)}, "geometry": {"image_seen_from": "detector"},
           "output": {"path": str(tmp_path / "recon.h5")}}
    (tmp_path / "recon.json").write_text(json.dumps(cfg))
    assert main(["recon", str(tmp_path / "recon.json")]) == 2
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("ctbench recon: the data contradict")]
    assert len(line) == 1 and "Traceback" not in err
    assert "geometry.image_seen_from='detector'" in line[0] and "Change geometry.image_seen_from to 'source'" in line[0]
    assert "conjugate-ray mismatch" in line[0] and "centre by conjugate rays" in line[0]
    assert not (tmp_path / "recon.h5").exists()


@pytest.mark.slow
def test_centre_methods_that_disagree_give_a_warning():
    """The Shepp-Logan head wider than the field of view (64 px detector): the truncated slices fool the
    sharpness sweep while the conjugate rays still find the offset; the report must say the methods part."""
    from ctbench.io.handedness import resolve_orientation

    def images_of(spec):
        return np.ascontiguousarray(spec.line_integrals().transpose(0, 2, 1)[:, ::-1, :])

    spec = LabScanSpec(n_views=96, detector_u=64, detector_v=16, offset_px=2.37, seed=2)
    res = resolve_orientation(images_of(spec), spec.angles, CTBENCH, "ccw", pitch=spec.pitch, pitch_v=spec.pitch,
                              sid=spec.sid, sdd=spec.sdd)
    assert res.centre.offset_px == pytest.approx(2.37, abs=0.2)
    assert res.centre.agreement_px > 0.5
    assert any("centre methods disagree" in w for w in res.warnings)
    # The chiral phantom inside the field of view: the methods agree and nothing is said.
    spec = LabScanSpec(n_views=96, detector_u=80, detector_v=16, offset_px=2.37, phantom_name="chiral", seed=2)
    ok = resolve_orientation(images_of(spec), spec.angles, CTBENCH, "ccw", pitch=spec.pitch, pitch_v=spec.pitch,
                             sid=spec.sid, sdd=spec.sdd)
    assert ok.centre.agreement_px < 0.5 and ok.warnings == []


def test_orientation_fields_are_checked_and_round_trip():
    o = Orientation("source", "right", "up", "cw")
    assert Orientation.from_dict(o.to_dict()) == o
    assert o.flip_columns and o.flip_rows and not CTBENCH.flip_columns
    assert o.mirror() == Orientation("detector", "right", "up", "ccw")
    with pytest.raises(ValueError, match="rotation_direction must be one of"):
        Orientation.from_dict({"rotation_direction": "clockwise"}, "geometry")
    with pytest.raises(ValueError, match="seen_from"):
        Orientation(seen_from="behind")
    with pytest.raises(ValueError, match="not known"):
        Orientation().flip_columns
    np.testing.assert_allclose(reverse_rotation(np.radians([10.0, 13.0, 16.0])), np.radians([10.0, 7.0, 4.0]))


def test_the_centre_disagreement_tolerance_follows_the_sharpness_sweeps_voxel():
    """The sharpness sweep images the detector in SHARPNESS_PIXELS voxels: on a 1024-column detector it lands
    within a few pixels of the conjugate rays (1.7 px in benchmarks/bench_centre.py), which is no sign of a
    wrong orientation; up to 96 columns the tolerance stays DISAGREEMENT_PX."""
    from ctbench.io.handedness import DISAGREEMENT_PX, disagreement_tolerance_px
    from ctbench.preprocessing.centre import SHARPNESS_PIXELS

    assert disagreement_tolerance_px(64) == disagreement_tolerance_px(SHARPNESS_PIXELS) == DISAGREEMENT_PX
    assert disagreement_tolerance_px(1024) == pytest.approx(0.5 * 1024 / SHARPNESS_PIXELS)
    assert disagreement_tolerance_px(1024) > 1.7 > disagreement_tolerance_px(256) * 0.5
