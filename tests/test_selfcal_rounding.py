"""The calibration's answer does not hang on the forward's last float32 bits (ctbench/calibration/acceptance.py).

The known-object calibration of a noiseless, aligned scan of an object symmetric top to bottom (the scan of
tests/test_selfcal_known_bias.py) ends where the loss's changes are at the float32 rounding of the projections.
There a strict ``trial < current`` rejected steps by chance: the damping grew 5x per try, carried into the next
stage, and with the ``-fused-pad-tiles`` forward (projections within 1e-6 of the others) ``sdd`` and ``pitch``
stayed at exactly 0 where the other paths gave sdd 0.508 mm.  Here the same calibration runs with every fused
forward path of this build, with the forward's output perturbed by a few ulps (a different perturbation for every
geometry, as rounding is), and in float64: all must agree to a small fraction of the reported uncertainty.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from ctbench.projector import Projector   # the class the calibration's level projectors are (ctbench.Projector subclasses it)
from ctbench.calibration import calibrate
from ctbench.calibration.acceptance import BETTER, LEVEL, WORSE, judge, predicted_decrease, rounding_scale
from ctbench.calibration.simulate import object_volume
from ctbench.engine.cpu import library as cpu_library, joseph_paths
from selfcal_scans import cone_scan, misaligned, symmetric_object

FREE = ("offset_u", "offset_v", "pitch", "sdd")
OPTS = dict(levels=(2, 1), n_outer=(6, 3))


def _symmetric_scan(dtype=torch.float32):
    P, _ = cone_scan(size=48, views=60, det=48, seed=3)
    ells = symmetric_object()
    y, _ = misaligned(P, ells, {}, photons=0, seed=4)
    return P, y.to(dtype), object_volume(ells, P).to(dtype)


def _run(P, y, obj):
    res = calibrate(P, y, FREE, known_object=obj, **OPTS)
    print(res.table())
    return {p.name: p for p in res.parameters}


def _perturbed_project(ulps: float, seed: int):
    """Projector.project with each output value moved by up to ``ulps`` float32 ulps (relative), the same for
    the same geometry and volume and different for another: what a kernel with another order of additions does."""
    plain = Projector.project

    def project(self, volume, trajectory=None):
        out = plain(self, volume, trajectory)
        traj = self.trajectory if trajectory is None else trajectory
        h = hashlib.sha1(str(seed).encode())
        for t in traj.tensors():
            h.update(t.detach().to(torch.float64).cpu().numpy().tobytes())
        h.update(repr(float(volume.detach().to(torch.float64).sum())).encode())
        gen = torch.Generator().manual_seed(int(h.hexdigest()[:15], 16))
        xi = torch.rand(out.shape, generator=gen, dtype=torch.float64) * 2 - 1
        return out * (1 + ulps * torch.finfo(torch.float32).eps * xi).to(out.dtype)

    return project


def _fused_forward_paths():
    known = joseph_paths.known_paths(cpu_library.load_cpu_library("joseph")).get("forward", [])
    return [n for n in known if n.endswith(("-fused-tiles", "-fused-pad-tiles", "-fused-bands"))]


def _assert_same_answer(rows, ref, label):
    assert all(rows[k].status == "estimated" for k in FREE), label
    for k in FREE:
        # a fiftieth of the reported sd: the loss's rounding must not choose the answer
        assert abs(rows[k].value - ref[k].value) < 0.02 * ref[k].uncertainty, (label, k, rows[k].value, ref[k].value)
    assert 0.05 < abs(rows["sdd"].value) < 1.0, label     # the voxel model's blur of the edges (test_selfcal_known_bias)


@pytest.mark.slow
def test_known_object_answer_is_the_same_for_every_forward_path_and_rounding(monkeypatch):
    P, y, obj = _symmetric_scan()
    paths = _fused_forward_paths()
    if not paths:
        pytest.skip("this build has no fused forward paths")
    P64, y64, obj64 = _symmetric_scan(torch.float64)
    ref = _run(P64, y64, obj64)       # float64 projections: rounding 2^29 times smaller
    assert 0.05 < abs(ref["sdd"].value) < 1.0
    for name in paths:
        monkeypatch.setenv("CTBENCH_CPU_PATH", f"forward={name}")
        _assert_same_answer(_run(P, y, obj), ref, name)
    monkeypatch.delenv("CTBENCH_CPU_PATH")
    for seed in (1, 2, 3):
        with monkeypatch.context() as m:
            m.setattr(Projector, "project", _perturbed_project(2.0, seed))
            _assert_same_answer(_run(P, y, obj), ref, f"perturbed {seed}")


def test_rounding_scale_bounds_the_float32_loss_error():
    P, y, obj = _symmetric_scan()
    P64, y64, obj64 = _symmetric_scan(torch.float64)
    yn = float(y64.square().sum())
    p32 = P.project(obj)
    r32 = p32 - y
    loss32 = float(r32.double().square().sum()) / yn
    loss64 = float((P64.project(obj64) - y64).square().sum()) / yn
    scale = rounding_scale(p32, r32, yn)
    assert abs(loss32 - loss64) < scale              # the scale covers what float32 projections really do
    assert scale < 1e-4 * loss32                     # and is a rounding figure, not the loss itself
    p64 = P64.project(obj64)
    assert rounding_scale(p64, p64 - y64, yn) < 1e-8 * scale


def test_judge_tells_better_level_and_worse():
    assert judge(1.0, 0.9, 0.1, 1e-9) == BETTER
    assert judge(1.0, 1.0 + 5e-10, 1e-10, 1e-9) == LEVEL     # neither the loss nor the model sees a change
    assert judge(1.0, 1.0 - 5e-10, 1e-10, 1e-9) == LEVEL
    assert judge(1.0, 1.0 - 5e-10, 0.1, 1e-9) == WORSE       # the model promised a real gain: damp
    assert judge(1.0, 1.0 + 2e-9, 1e-10, 1e-9) == WORSE      # worse beyond rounding
    assert judge(1.0, 1.0 - 1e-12, 0.0, 0.0) == BETTER       # no tolerance: the strict rule
    assert judge(1.0, float("nan"), 0.0, 1e-9) == WORSE         # a step the projector cannot trace
    assert judge(1.0, float("inf"), 0.0, 1e-9) == WORSE
    assert judge(1.0, 0.5, float("nan"), 1e-9) == WORSE
    with pytest.raises(ValueError, match="current must be a finite loss"):
        judge(float("nan"), 1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="tolerance must be a finite number >= 0"):
        judge(1.0, 1.0, 0.0, -1.0)
    with pytest.raises(ValueError, match="y_norm2 must be positive"):
        rounding_scale(torch.ones(3), torch.ones(3), 0.0)
    with pytest.raises(TypeError, match="p must be a floating-point tensor"):
        rounding_scale(torch.ones(3, dtype=torch.int32), torch.ones(3), 1.0)


def test_predicted_decrease_is_the_quadratic_models():
    J = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64)
    r = torch.tensor([0.5, -1.0, 0.25], dtype=torch.float64)
    d = torch.tensor([-0.2, 0.3], dtype=torch.float64)
    exact = 0.5 * float(r.square().sum()) - 0.5 * float((r + J @ d).square().sum())
    assert predicted_decrease(J.T @ r, J.T @ J, d) == pytest.approx(exact, rel=1e-12)
