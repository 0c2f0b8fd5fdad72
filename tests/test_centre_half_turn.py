"""find_centre on parallel scans of a half turn: with both end views (0 and 180 degrees), and without the last one.

Truth: exact analytic line integrals of the chiral and Shepp-Logan phantoms with a planted non-integer offset
(Poisson noise where said).  A quarter turn holds no centre and is still refused.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ctbench.geometry import circular_trajectory_2d_parallel, circular_trajectory_3d_parallel
from ctbench.io.scan import sinogram_to_images
from ctbench.phantoms import chiral_line_integrals, shepp_logan_line_integrals
from ctbench.preprocessing import find_centre
from ctbench.preprocessing.centre import half_turn_parallel, opposite_view_pairs


def _half_turn_sino(offset_px, n=181, U=128, photons=None, seed=0, end_view=True):
    ang = torch.linspace(0, math.pi, n, dtype=torch.float64)
    if not end_view:
        ang = ang[:-1]
    traj = circular_trajectory_2d_parallel(angles=ang, detector_offset=float(offset_px), dtype=torch.float64)
    p = shepp_logan_line_integrals(traj, U, 1.0, scale=50.0).numpy() * 0.02
    if photons is not None:
        counts = np.random.default_rng(seed).poisson(photons * np.exp(-p)).astype(np.float64)
        p = -np.log(np.clip(counts, 1, None) / photons)
    return p, ang.numpy()


def test_opposite_view_pairs_are_the_end_views_of_a_half_turn():
    a = np.radians(np.linspace(0, 180, 91))
    assert opposite_view_pairs(a) == [(0, 90)]
    assert opposite_view_pairs(a[:-1]) == []
    assert half_turn_parallel(a) and half_turn_parallel(a[:-1])
    assert not half_turn_parallel(a, sid=200.0)                        # cone beams keep the full-turn method
    assert not half_turn_parallel(np.radians(np.arange(360.0)))         # a full turn pairs every ray
    assert not half_turn_parallel(np.radians(np.linspace(0, 90, 46)))   # a quarter turn is not enough


@pytest.mark.parametrize("offset", [-4.6, 2.37])
@pytest.mark.parametrize("photons", [None, 5000.0])
def test_half_turn_with_both_end_views_finds_the_known_offset(offset, photons):
    sino, ang = _half_turn_sino(offset, photons=photons, seed=int(10 * abs(offset)))
    res = find_centre(sino, ang, 1.0)
    assert res.method.startswith("double-wedge")
    assert res.offset_px == pytest.approx(offset, abs=0.1)
    assert res.cross_check_method.startswith("registration of the views 180")
    assert res.cross_check_px == pytest.approx(offset, abs=0.2)
    assert res.agreement_px < 0.5 and not res.low_confidence
    # both follow the data: content moved one column to the left puts the axis one column left (offset + 1)
    shifted = np.concatenate([sino[:, 1:], sino[:, -1:]], axis=1)
    r2 = find_centre(shifted, ang, 1.0)
    assert r2.offset_px == pytest.approx(res.offset_px + 1.0, abs=0.1)
    assert r2.cross_check_px == pytest.approx(res.cross_check_px + 1.0, abs=0.15)


@pytest.mark.slow
def test_half_turn_without_the_last_view_and_3d_rows():
    sino, ang = _half_turn_sino(-1.3, end_view=False, photons=20000.0)
    res = find_centre(sino, ang, 1.0)
    assert res.offset_px == pytest.approx(-1.3, abs=0.1)
    assert res.cross_check_px is None                     # no views 180 degrees apart: no second method
    # A 3D parallel scan (chiral phantom): the opposite views are registered over all rows.
    angles = torch.linspace(0, math.pi, 121, dtype=torch.float64)
    traj = circular_trajectory_3d_parallel(angles=angles, detector_offset=(1.7, 0.0), dtype=torch.float64)
    images = sinogram_to_images(chiral_line_integrals(traj, (64, 12), 1.0, scale=20.0).numpy() * 0.05)
    r3 = find_centre(images, angles.numpy(), 1.0)
    assert r3.offset_px == pytest.approx(1.7, abs=0.1)
    assert r3.cross_check_px == pytest.approx(1.7, abs=0.1)


def test_a_quarter_turn_is_still_refused():
    ang = np.radians(np.linspace(0, 90, 46))
    traj = circular_trajectory_2d_parallel(angles=torch.from_numpy(ang), detector_offset=1.0, dtype=torch.float64)
    sino = shepp_logan_line_integrals(traj, 64, 1.0, scale=25.0).numpy()
    with pytest.raises(ValueError, match="does not cover enough angles"):
        find_centre(sino, ang, 1.0)


@pytest.mark.slow
def test_dxchange_half_turn_through_ctbench_recon(tmp_path):
    """A beamline scan as DXchange writes it (theta 0..180 inclusive): the pipeline finds the offset, no warning."""
    from ctbench.pipeline import load_config, run_recon
    from ctbench.io.sample_scan import LabScanSpec

    from vendor_files import write_dxchange

    spec = LabScanSpec(n_views=97, detector_u=64, detector_v=12, pitch=1.0, offset_px=2.6, phantom_name="chiral",
                       beam="parallel", seed=5)
    deg = np.linspace(0.0, 180.0, spec.n_views)
    traj = circular_trajectory_3d_parallel(angles=torch.from_numpy(np.radians(deg)),
                                           detector_offset=(spec.offset_px, 0.0), dtype=torch.float64)
    line = sinogram_to_images(spec.line_integrals(traj))
    rng = np.random.default_rng(5)
    flat = np.full((4, 12, 64), 20000.0)
    proj = rng.poisson(20000.0 * np.exp(-line)).astype(np.uint16)
    darks = np.zeros((2, 12, 64), np.uint16)
    dx = write_dxchange(tmp_path / "half.h5", proj, flat.astype(np.uint16), darks, deg, resolution_um=1000.0)
    cfg = tmp_path / "recon.json"
    cfg.write_text(json.dumps({"input": {"path": str(dx)},
                               "geometry": {"image_seen_from": "detector", "rotation_direction": "ccw"}}))
    report = run_recon(load_config(cfg))
    assert report["centre"]["offset_px"] == pytest.approx(spec.offset_px, abs=0.15)
    assert report["centre"]["agreement_px"] < 0.5
    assert not [w for w in report["warnings"] if "disagree" in w]
    vol = report["volume"].numpy()
    truth = spec.truth(vol.shape, report["geometry"]["voxel_spacing"][0])
    a, b = vol - vol.mean(), truth - truth.mean()
    assert float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum())) > 0.8
