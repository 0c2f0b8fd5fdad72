"""The calibration's uncertainties are honest (issue 26): over several simulated scans the true error of every
estimated parameter is within 3 reported standard deviations, and the figure is not uselessly large.

Each scan: an object the calibration does not know (random ellipsoid clusters, and the chiral phantom), exact
line integrals through the true geometry, Poisson noise (2x10^4 photons); 48^3 voxels, 48^2 detector, 60 views.

Rule (also in docs/CALIBRATION.md): over all (scan, estimated parameter) pairs, at most one in eight may have
|error| > 3 sd; none may exceed 5 sd; at least two thirds of the freed parameters must come back estimated
(not "not identifiable"); and not every |error| / sd may be below 0.05 (an sd that large says nothing).
Before the robust covariance the white-noise figure put axis tilt, pitch and sdd 2-4 sd from the truth.
With axis tilt free, the chiral phantom's tilt came back 0.21 +/- 0.21 deg for 1.0 (3.7 sd) while the geometry step
held the volume; with the variable-projection step (ctbench/calibration/varpro.py) it is 1.064 +/- 0.33 deg (0.2 sd),
and the two random objects' 1.078 and 1.414 deg (sd 0.62, 0.74: held as not determined).
"""

from __future__ import annotations

import pytest

from ctbench.calibration import calibrate
from ctbench.calibration.simulate import object_volume, random_object
from ctbench.phantoms import chiral_ellipsoids
from selfcal_scans import cone_scan, estimate_of, misaligned

OPTS = dict(levels=(2, 1), n_outer=(6, 3))
UNKNOWN = ({"offset_u": 1.3, "roll": 0.5}, ("offset_u", "roll"))
TILT = ({"offset_u": 1.3, "roll": 0.5, "axis_tilt": 1.0}, ("offset_u", "roll", "axis_tilt"))
OBJECTS = [("ellipsoids seed 3", random_object(0.4 * 256, seed=3), 4),
           ("ellipsoids seed 7", random_object(0.4 * 256, seed=7), 8),
           ("chiral phantom", [e.scaled(0.4 * 256) for e in chiral_ellipsoids()], 5)]
KNOWN = ({"offset_u": 1.3, "pitch": 2.0, "yaw": -1.5, "sdd": 15.0}, ("offset_u", "offset_v", "pitch", "yaw", "sdd"))


def _ratios(objects, truth, free, known, tilts=None):
    """|error| / sd of every estimated parameter, and how many were freed; ``tilts`` collects the axis tilts."""
    out, n_free = [], 0
    for label, ells, seed in objects:
        P, _ = cone_scan(size=48, views=60, det=48, seed=1)
        y, _ = misaligned(P, ells, truth, seed=seed)
        res = calibrate(P, y, free, known_object=object_volume(ells, P).float() if known else None, **OPTS)
        print(label, "\n" + res.table())
        if tilts is not None:
            tilts.append((label, estimate_of(res, "axis_tilt")))
        for p in res.parameters:
            n_free += 1
            if p.value is not None:
                err = p.value - truth.get(p.name, 0.0)
                assert p.uncertainty > 0, p.name
                out.append((label, p.name, abs(err) / p.uncertainty))
    return out, n_free


def _check_rule(ratios, n_free):
    print([(a, b, round(z, 2)) for a, b, z in ratios])
    z = [r[2] for r in ratios]
    assert len(z) >= 2 * n_free / 3, f"only {len(z)} of {n_free} freed parameters estimated"
    assert sum(v > 3 for v in z) <= len(z) / 8, ratios
    assert max(z) <= 5, ratios
    assert max(z) >= 0.05, ratios


@pytest.mark.slow
def test_uncertainty_covers_the_error_of_an_unknown_object():
    _check_rule(*_ratios(OBJECTS, *UNKNOWN, known=False))


@pytest.mark.slow
def test_uncertainty_covers_the_error_of_an_unknown_object_with_axis_tilt():
    tilts = []
    _check_rule(*_ratios(OBJECTS, *TILT, known=False, tilts=tilts))
    # every object's tilt (kept or held as not determined) within 2 of its sd, and kept where its sd is useful
    print(tilts)
    for label, (value, sd) in tilts:
        assert abs(value - TILT[0]["axis_tilt"]) < 2 * sd, label
    assert any(sd < 0.5 for _, (_, sd) in tilts)


@pytest.mark.slow
def test_uncertainty_covers_the_error_with_a_known_object():
    objects = [("ellipsoids seed 3", random_object(0.4 * 256, seed=3), 4),
               ("ellipsoids seed 5", random_object(0.4 * 256, seed=5), 6)]
    _check_rule(*_ratios(objects, *KNOWN, known=True))
