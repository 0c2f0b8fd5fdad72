"""Self-calibration of the weak global parameters (issue 26): axis tilt, detector yaw and pitch, the
source-detector distance, and what the calibration says when a scan cannot determine one.

Simulated raw scans as in test_selfcal_recovery: a random ellipsoid object the calibration does not know,
exact line integrals through the true geometry, Poisson noise (2x10^4 photons).  The scan is W1-shaped
and scaled down (48^3 voxels, 48^2 detector, 60 views, SID 600 mm, SDD 1200 mm, 12 degree half cone).
"""

from __future__ import annotations

import pytest
import torch

from ctbench.calibration import SPECS, calibrate
from ctbench.calibration.simulate import object_volume
from selfcal_scans import cone_scan, estimate_of, misaligned

OPTS = dict(levels=(2, 1), n_outer=(6, 3))


@pytest.fixture(scope="module")
def scan():
    return cone_scan(size=48, views=60, det=48, seed=3)


def _run(scan, truth, free, known=False):
    P, ells = scan
    y, _ = misaligned(P, ells, truth, seed=4)
    res = calibrate(P, y, free, known_object=object_volume(ells, P).float() if known else None, **OPTS)
    print(res.table())
    print("\n".join(res.notes))
    return {p.name: p for p in res.parameters}, res


@pytest.mark.slow
def test_axis_tilt_recovered_from_an_unknown_object(scan):
    """offset_v, which an unknown object imitates and which traded with the tilt (0.795 deg and offset_v 0.47 px
    for truth 1.0 deg and 0 px before), is held and reported not identifiable; the tilt then comes back within
    0.25 deg and within 3 of its honest standard deviations (measured 1.099 +/- 0.599 deg with the variable-projection
    step; 0.9105 +/- 0.585 deg with the volume held in the geometry step).  That sd exceeds the
    tilt's 0.5 deg resolution and the estimate is within 2 sd of the start, so the tilt is held and reported
    "not determined by this scan" with the estimate in the note (either outcome is accepted; a confident value
    outside 3 sd is not)."""
    rows, res = _run(scan, {"offset_u": 1.3, "axis_tilt": 1.0}, ("offset_u", "offset_v", "axis_tilt"))
    tilt = rows["axis_tilt"]
    found = estimate_of(res, "axis_tilt")      # a held tilt's estimate comes from its "not determined" note
    assert found is not None
    value, sd = found
    if tilt.status == "estimated":
        assert sd < SPECS["axis_tilt"].resolution or abs(value) >= 2 * sd
    else:
        assert tilt.status == "not identifiable" and tilt.value is None
        assert sd > SPECS["axis_tilt"].resolution and abs(value) < 2 * sd
    assert abs(value - 1.0) < min(0.25, 3 * sd)
    assert tilt.identifiability > 0.5
    assert abs(rows["offset_u"].value - 1.3) < 0.1
    assert rows["offset_v"].status == "not identifiable" and rows["offset_v"].value is None
    assert any(n.startswith("offset_v: not identifiable from an unknown object") for n in res.notes)


@pytest.mark.slow
def test_pitch_yaw_and_sdd_recovered_with_a_known_object(scan):
    """A known object fixes the absolute scale: a detector pitch and a source-detector distance error, which an
    unknown object would mimic (a flared, a larger object), are then recovered, with the yaw and the offsets."""
    truth = {"offset_u": 1.3, "pitch": 2.0, "yaw": -1.5, "sdd": 15.0}
    rows, res = _run(scan, truth, ("offset_u", "offset_v", "pitch", "yaw", "sdd"), known=True)
    tol = {"offset_u": 0.05, "offset_v": 0.05, "pitch": 0.4, "yaw": 0.2, "sdd": 1.0}
    for k, t in tol.items():
        assert rows[k].status == "estimated", k
        assert abs(rows[k].value - truth.get(k, 0.0)) < t, k
        assert 0 < rows[k].uncertainty < SPECS[k].resolution
    assert not any("absolute scale" in n or "not identifiable" in n for n in res.notes)
    assert abs(res.correlations["offset_v/pitch"]) > 0.8      # a pitch's mean v shift trades with offset_v
    assert any("offset_v and pitch are strongly correlated" in n for n in res.notes) == \
        (abs(res.correlations["offset_v/pitch"]) > 0.9)


@pytest.mark.slow
def test_sdd_of_an_unknown_object_is_not_a_confident_wrong_value(scan):
    """With the object unknown a changed source-detector distance is mostly a changed magnification: the
    calibration must say it cannot tell (an earlier version returned -36 mm off with a 0.85 mm uncertainty),
    leave the distance nominal and still find the offset."""
    rows, res = _run(scan, {"offset_u": 1.3, "sdd": 20.0}, ("offset_u", "sdd"))
    sdd = rows["sdd"]
    assert sdd.status == "not identifiable" and sdd.value is None and sdd.uncertainty is None
    assert any(n.startswith("sdd: not identifiable") and "magnification" in n and "known_object" in n
               for n in res.notes)
    assert any("absolute scale" in n for n in res.notes)
    nominal = scan[0].trajectory
    beam = torch.nn.functional.normalize(nominal.detector_center - nominal.source, dim=1)
    # the distance along the nominal beam (the offset moves the detector sideways)
    sdd_of = lambda t: ((t.detector_center - t.source) * beam).sum(1)    # noqa: E731
    torch.testing.assert_close(sdd_of(res.trajectory), sdd_of(nominal), rtol=0, atol=1e-3)
    assert abs(rows["offset_u"].value - 1.3) < 0.1


def test_pitch_of_an_unknown_object_is_reported_not_identifiable(scan):
    rows, res = _run(scan, {"offset_u": 1.3, "pitch": 2.0}, ("offset_u", "pitch"))
    pitch = rows["pitch"]
    assert pitch.status == "not identifiable" and pitch.value is None
    assert any(n.startswith("pitch: not identifiable") and "flares" in n for n in res.notes)
    assert abs(rows["offset_u"].value - 1.3) < 0.1


def test_known_object_is_checked(scan):
    P, ells = scan
    y, _ = misaligned(P, ells, {}, seed=4)
    with pytest.raises(ValueError, match=r"known_object has shape \(4, 4, 4\)"):
        calibrate(P, y, ("offset_u",), known_object=torch.zeros(4, 4, 4))
    with pytest.raises(ValueError, match="known_object has non-finite values"):
        calibrate(P, y, ("offset_u",), known_object=torch.full(P.volume_shape, float("nan")))
    with pytest.raises(ValueError, match="known_object is empty"):
        calibrate(P, y, ("offset_u",), known_object=torch.zeros(P.volume_shape))
    with pytest.raises(TypeError, match="known_object must be a volume tensor"):
        calibrate(P, y, ("offset_u",), known_object=object())


@pytest.mark.slow
def test_yaw_of_an_unknown_object_is_partly_recovered_on_a_wide_cone():
    """A detector yaw is only partly identifiable from an unknown object (about half its signature is a radial
    bulge of the object): on a wide cone (SID 300, SDD 600, 23 degree half cone) a 3 degree yaw comes back with
    its sign, about 20% short (measured 2.34 +/- 0.15 deg with the white-noise figure, which understated the model
    error; 2.381 +/- 0.57 deg with the robust uncertainty and offset_v held).
    The tolerance is that bias, not the noise: 0.8 deg."""
    from ctbench import Projector, circular_trajectory_3d
    from ctbench.calibration.simulate import random_object

    P = Projector(circular_trajectory_3d(60, 300.0, 600.0), (48, 48, 48), (48, 48), voxel_spacing=256.0 / 48,
                  detector_spacing=512.0 / 48, backend="cpu")
    rows, res = _run((P, random_object(0.4 * 256, seed=3)), {"offset_u": 1.3, "yaw": 3.0},
                     ("offset_u", "offset_v", "yaw"))
    yaw = rows["yaw"]
    assert yaw.status == "estimated" and 0.3 < yaw.identifiability < 0.7
    assert abs(yaw.value - 3.0) < 0.8
    # the robust uncertainty (measured 2.381 +/- 0.57 deg) covers the bias; it exceeds the 0.5 deg resolution, but
    # the estimate is more than 2 sd from the start, so it is kept
    assert 0 < yaw.uncertainty and abs(yaw.value - 3.0) < 3 * yaw.uncertainty and abs(yaw.value) >= 2 * yaw.uncertainty
    assert abs(rows["offset_u"].value - 1.3) < 0.1
