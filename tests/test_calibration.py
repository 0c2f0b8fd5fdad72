"""The geometry-calibration example recovers hidden scan errors (issue 5).

Noiseless data from a scan with a detector shift (u, v), an in-plane detector
rotation and a source-distance error; the example starts from the nominal
geometry and must land within 0.05 pixel and 0.05 degree of the truth.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "geometry_calibration.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("geometry_calibration", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype, truth", [
    (torch.float32, (1.7, -0.9, 0.8, 8.0)),
    (torch.float64, (-2.3, 1.4, -1.5, -12.0)),
])
@pytest.mark.slow
def test_calibration_recovers_hidden_geometry(example, dtype, truth):
    true, rec, history = example.run(size=24, views=12, truth=truth, dtype=dtype, n_iter=60)
    assert true == dict(zip(example.PARAMETERS, truth))
    # The nominal start is visibly wrong; the end fits the data.
    assert history[-1] < 1e-6 * history[0]
    assert abs(rec["shift_u_px"] - truth[0]) < 0.05
    assert abs(rec["shift_v_px"] - truth[1]) < 0.05
    assert abs(rec["rotation_deg"] - truth[2]) < 0.05
    assert abs(rec["source_distance_error_mm"] - truth[3]) < 0.5


def test_geometry_is_nominal_at_zero_and_differentiable(example):
    """scan_geometry(0) is the generator's orbit, and the loss gradient reaches all four parameters."""
    from ctbench import circular_trajectory_3d

    scan = example.Scan(n_views=6, volume_shape=(16, 16, 16), detector_shape=(20, 20))
    zero = example.scan_geometry(scan, torch.zeros(4, dtype=torch.float64))
    nominal = circular_trajectory_3d(6, scan.sid, scan.sdd, dtype=scan.dtype)
    for a, b in zip(zero.tensors(), nominal.tensors()):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-12)
    P = example.make_projector(scan)
    phantom = example.calibration_phantom(scan)
    p = torch.tensor([0.3, -0.2, 0.4, 2.0], dtype=torch.float64, requires_grad=True)
    P.project(phantom, trajectory=example.scan_geometry(scan, p)).square().sum().backward()
    assert torch.all(p.grad.abs() > 0)


@pytest.mark.slow
def test_example_prints_true_and_recovered_values(example, capsys):
    example.main(["--size", "16", "--views", "8", "--float32"])
    out = capsys.readouterr().out
    for name in example.PARAMETERS:
        assert name in out
    assert "true" in out and "recovered" in out
