"""Detector roll on a tiny scan (issue 26): 48x40 detector, 60 views, the object 36 mm tall.  A reconstruction
volume shorter than the object (12 slices of 1 mm) cannot explain the rows that see the rest of it; that model
error pulled the roll to the wrong sign (-0.075 deg for truth 0.5).  The calibration must then say the scan
cannot determine the roll, not return a confident wrong value; with a volume that holds the object it finds it."""

from __future__ import annotations

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.calibration import calibrate
from ctbench.io.selfcal_sample import SelfCalSpec, _scan

SPEC = SelfCalSpec(n_views=60, detector_u=48, detector_v=40, offset_u_px=1.3, roll_deg=0.5, drift_rms_px=0.0,
                   seed=7)


@pytest.fixture(scope="module")
def sinogram():
    line, truth, _ = _scan(SPEC)                     # exact line integrals through the true geometry
    g = torch.Generator().manual_seed(1)
    counts = torch.poisson(SPEC.i0 * torch.exp(-torch.from_numpy(line)), generator=g).clamp_min(1)
    return -torch.log(counts / SPEC.i0).float()


def _calibrate(y, height):
    P = Projector(circular_trajectory_3d(SPEC.n_views, SPEC.sid, SPEC.sdd), (height, 48, 48),
                  (SPEC.detector_u, SPEC.detector_v), voxel_spacing=1.0, detector_spacing=SPEC.pitch, backend="cpu")
    res = calibrate(P, y, ("offset_u", "roll"), levels=(2, 1), n_outer=(6, 3))
    print(height, res.table(), *res.notes, sep="\n")
    return {p.name: p for p in res.parameters}, res


@pytest.mark.slow
def test_roll_of_a_volume_shorter_than_the_object_is_not_identifiable(sinogram):
    rows, res = _calibrate(sinogram, 12)
    assert rows["roll"].status == "not identifiable" and rows["roll"].value is None
    assert any(n.startswith("roll: not determined by this scan") for n in res.notes)
    # the geometry keeps the nominal (unrolled) detector
    torch.testing.assert_close(res.trajectory.detector_v[:, 2].abs(), torch.ones(SPEC.n_views), rtol=0, atol=1e-6)
    assert abs(rows["offset_u"].value - SPEC.offset_u_px) < 0.1


@pytest.mark.slow
def test_roll_of_a_tiny_scan_with_a_volume_that_holds_the_object(sinogram):
    rows, _ = _calibrate(sinogram, 40)
    roll = rows["roll"]
    assert roll.status == "estimated"
    assert abs(roll.value - SPEC.roll_deg) < min(0.05, 3 * roll.uncertainty)
