"""Issue 25 (i25num): diffct's analytic execution (learned weights, view batches), curved-detector batches,
surface fingerprints in checkpoints and a few construction rules on ctbench's diffct face, checked
against the installed diffct where it computes the same thing (docs/FROM_DIFFCT.md)."""

import math

import numpy as np
import pytest
import torch

diffct = pytest.importorskip("diffct")

import ctbench.compat as cc  # noqa: E402
from ctbench.compat.analytical_execution import AnalyticalExecution  # noqa: E402
from ctbench.compat.distribution import Partition  # noqa: E402
from ctbench.compat.surfaces import pixel_trajectory, sample_offsets  # noqa: E402
from ctbench.geometry import as_trajectory  # noqa: E402

F64 = torch.float64


def _parallel(n, full=False):
    a = torch.linspace(0, (2 if full else 1) * math.pi, n + 1, dtype=F64)[:-1]
    ray = torch.stack((a.cos(), a.sin()), 1)
    return a, (ray, torch.zeros_like(ray), torch.stack((-a.sin(), a.cos()), 1))


def _fan(n):
    a = torch.linspace(0, 2 * math.pi, n + 1, dtype=F64)[:-1]
    radial = torch.stack((a.cos(), a.sin()), 1)
    return a, (-20 * radial, 10 * radial, torch.stack((-a.sin(), a.cos()), 1))


def _cone(n):
    a, (src, det, u) = _fan(n)
    z = torch.zeros(n, 1, dtype=F64)
    v = torch.tensor([[0.0, 0.0, 1.0]], dtype=F64).expand(n, 3).clone()
    return a, (torch.cat((src, z), 1), torch.cat((det, z), 1), torch.cat((u, z), 1), v)


def _learned(option, n, U, pad=2):
    g = torch.Generator().manual_seed(5)
    shapes = {"angular_weights": (n,), "projection_weights": (n, U), "filter_response": (pad * U // 2 + 1,)}
    return {} if option is None else {option: torch.rand(shapes[option], generator=g, dtype=F64)}


# ------------------------------------------------------------------ learned analytic options


@pytest.mark.parametrize("option", [None, "angular_weights", "projection_weights", "filter_response"])
def test_parallel_fbp_with_learned_options_matches_diffct(option):
    n, U = 12, 20
    angles, frames = _parallel(n)
    sino = torch.rand(n, U, generator=torch.Generator().manual_seed(1), dtype=F64)
    kw = dict(backend="torch", precision="float64", view_chunk_size=5, **_learned(option, n, U))
    ours = cc.fbp(sino, frames, (7, 7), angles, **kw)
    theirs = diffct.fbp(sino, frames, (7, 7), angles, **kw)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_fan_fbp_with_learned_angular_weights_matches_diffct_and_its_gradients():
    # the detector covers the volume: the two gathers differ only beyond the outer pixel centres
    n, U = 12, 40
    angles, frames = _fan(n)
    sino = torch.rand(n, U, generator=torch.Generator().manual_seed(2), dtype=F64)
    weights = torch.rand(n, generator=torch.Generator().manual_seed(3), dtype=F64)
    results = []
    for lib in (cc, diffct):
        s, w = sino.clone().requires_grad_(), weights.clone().requires_grad_()
        out = lib.fbp(s, frames, (7, 7), angles, beam="fan", backend="torch", precision="float64",
                      view_chunk_size=4, angular_weights=w)
        cot = torch.linspace(-1, 1, out.numel(), dtype=F64).reshape(out.shape)
        results.append((out.detach(), *torch.autograd.grad((out * cot).sum(), (s, w))))
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-11)


def test_learned_weight_gradient_matches_finite_differences():
    n, U = 8, 16
    angles, frames = _parallel(n)
    sino = torch.rand(n, U, generator=torch.Generator().manual_seed(4), dtype=F64)
    response = torch.rand(U + 1, generator=torch.Generator().manual_seed(6), dtype=F64).requires_grad_()

    def loss(r):
        return cc.fbp(sino, frames, (5, 5), angles, backend="torch", precision="float64", view_chunk_size=3,
                      filter_response=r).square().sum()

    grad, = torch.autograd.grad(loss(response), response)
    direction = torch.linspace(-1, 1, U + 1, dtype=F64)
    h = 1e-6
    fd = (loss(response.detach() + h * direction) - loss(response.detach() - h * direction)) / (2 * h)
    assert float((grad * direction).sum()) == pytest.approx(float(fd), rel=1e-6)


def test_fdk_and_fdk_into_agree_exactly_with_view_batches():
    n = 10
    angles, frames = _cone(n)
    sino = torch.rand(n, 24, 12, generator=torch.Generator().manual_seed(7))
    kw = dict(backend="torch", precision="float32", view_chunk_size=3, volume_chunk_shape=(1, 8, 8))
    full = cc.fdk(sino, frames, (4, 8, 8), angles, **kw)
    out = torch.full((4, 8, 8), float("nan"))
    sink = cc.TensorStore(out)
    assert cc.fdk_into(cc.TensorStore(sino), sink, frames, (4, 8, 8), angles, **kw) is sink
    torch.testing.assert_close(out, full, rtol=0, atol=0)
    assert full.abs().max() > 0


class _Counting(cc.TensorStore):
    writable = True

    def __init__(self, tensor, writable=True):
        super().__init__(tensor)
        self.writable = writable
        self.reads, self.writes = 0, 0

    def read(self, window=None):
        self.reads += 1
        return super().read(window)

    def write(self, window, value, *, accumulate=False):
        self.writes += 1
        return super().write(window, value, accumulate=accumulate)


@pytest.mark.parametrize("problem", ["autograd-source", "read-only-output", "aliased-output"])
def test_into_refuses_before_any_read_or_write(problem):
    n, U = 6, 10
    angles, frames = _parallel(n)
    data = torch.rand(n, U, dtype=F64)
    source, output = _Counting(data.clone()), _Counting(torch.zeros(n, U, dtype=F64) if problem == "aliased-output"
                                                      else torch.zeros(5, 5, dtype=F64))
    shape = (n, U) if problem == "aliased-output" else (5, 5)
    if problem == "autograd-source":
        source = data.clone().requires_grad_()
    elif problem == "read-only-output":
        output.writable = False
    else:
        source = output = data.clone()
    with pytest.raises((ValueError, PermissionError), match="numerical|read-only|share"):
        cc.fbp_into(source, output, frames, shape, angles, backend="torch", precision="float64", view_chunk_size=2)
    for store in (source, output):
        assert getattr(store, "reads", 0) == 0 and getattr(store, "writes", 0) == 0


def test_request_digest_tells_angle_dtypes_apart(monkeypatch):
    seen = []
    original = Partition.preflight

    def capture(self, error=None, request=None):
        original(self, error, request)
        seen.append(request)

    monkeypatch.setattr(Partition, "preflight", capture)
    _, frames = _parallel(4)
    for angles in (torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.float16)):
        AnalyticalExecution(torch.zeros(4, 8), frames, (1, 1), angles, beam="parallel", angular_weights=torch.ones(4))
    assert len(seen) == 2 and seen[0] != seen[1]
    with pytest.raises(ValueError, match="angular_weights"):
        AnalyticalExecution(torch.zeros(4, 8), frames, (1, 1), torch.zeros(4), beam="parallel",
                            angular_weights=torch.ones(3))


# ------------------------------------------------------------------ curved detectors


def _arc(u, v, ids, radius):
    return torch.stack((radius * torch.sin(u / radius), v, radius * (1 - torch.cos(u / radius))), dim=-1)


def _surface_projector(lib, frames, radius, **kw):
    return lib.Projector(frames, (6, 7), (8,), beam="fan", detector_surface=lib.ParameterizedSurface(_arc, (radius,)),
                         backend="torch", precision="float64", **kw)


def test_surface_world_points_in_view_batches_match_whole_scan_and_diffct():
    _, frames = _fan(5)
    radius = torch.tensor(6.0, dtype=F64)
    traj = as_trajectory(frames, beam="fan")
    off = sample_offsets(cc.ParameterizedSurface(_arc, (radius,)), (8, 1), (1.0, 1.0), True, 5)
    whole = pixel_trajectory(traj, off, F64, "cpu")
    batched = pixel_trajectory(traj, off, F64, "cpu", view_chunk_size=2)
    for a, b in zip(whole.tensors(), batched.tensors()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    image = torch.linspace(0.2, 1.0, 42, dtype=F64).reshape(6, 7)
    ours = _surface_projector(cc, frames, radius, view_chunk_size=2).project(image)
    theirs = _surface_projector(diffct, frames, radius, view_chunk_size=2).project(image)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_surface_range_rule_reads_the_raw_frames():
    # both raw endpoints lie beyond 1e6 voxels; float32 rounds them onto the bound
    src = torch.tensor([[-1.0, 0.0]], dtype=F64)
    det = torch.tensor([[1.0, 0.0]], dtype=F64).requires_grad_()
    frames = (src, det, torch.tensor([[0.0, 1.0]], dtype=F64))

    def flat(u, v, ids):
        return torch.stack((u, v, torch.zeros_like(u)), dim=-1)

    for lib in (cc, diffct):
        op = lib.Projector(frames, (1, 1), (1,), beam="fan", detector_surface=lib.ParameterizedSurface(flat),
                           backend="torch", precision="float32")
        with torch.no_grad():
            moved = (torch.tensor([[-1000000.01, 0.0]], dtype=F64), torch.tensor([[1000000.01, 0.0]], dtype=F64),
                     frames[2])
        with pytest.raises(ValueError, match="1e6"):
            op.project(torch.ones(1, 1), trajectory=moved)


def test_checkpoint_resume_refuses_a_changed_surface(tmp_path):
    _, frames = _fan(5)
    radius = torch.tensor(6.0, dtype=F64)
    for lib in (cc, diffct):
        op = _surface_projector(lib, frames, radius)
        data = op.project(torch.linspace(0.2, 1.0, 42, dtype=F64).reshape(6, 7)).detach()
        folder = tmp_path / lib.__name__
        lib.cgls(op, data, 2, rtol=0.0, atol=0.0, checkpoint_directory=folder)
        step = sorted(folder.glob("step-*"))[-1]
        resume = next(step.glob("rank-*"))
        lib.cgls(op, data, 3, rtol=0.0, atol=0.0, resume=resume)  # unchanged: accepted

        def wider(u, v, ids, r):
            return _arc(u, v, ids, r) + torch.stack((0.05 * u.square(), 0 * u, 0 * u), -1)

        op.detector_surface = lib.ParameterizedSurface(wider, (radius,))
        with pytest.raises(ValueError):
            lib.cgls(op, data, 3, rtol=0.0, atol=0.0, resume=resume)


# ------------------------------------------------------------------ small construction rules


@pytest.mark.parametrize("lib", [cc, diffct], ids=["ctbench", "diffct"])
def test_process_group_is_read_only(lib):
    _, frames = _parallel(4)
    op = lib.Projector(frames, (4, 4), 6, beam="parallel")
    assert op.process_group is None
    with pytest.raises(AttributeError):
        op.process_group = object()
    assert op.process_group is None


@pytest.mark.parametrize("lib", [cc, diffct], ids=["ctbench", "diffct"])
def test_into_refuses_an_output_of_another_dtype(lib):
    _, frames = _parallel(4)
    op = lib.Projector(frames, (4, 4), 6, beam="parallel", backend="torch")  # precision "fast": float32
    out = torch.zeros(4, 6, dtype=F64)
    with pytest.raises((TypeError, ValueError), match="float32|dtype"):
        op.project_into(torch.ones(4, 4), out)
    assert not out.any()


def test_custom_trajectory_docstring_example_runs():
    import doctest

    globs = {"torch": torch, "custom_trajectory_3d": cc.custom_trajectory_3d}
    test = doctest.DocTestParser().get_doctest(cc.custom_trajectory_3d.__doc__, globs, "custom_trajectory_3d", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test, clear_globs=False)
    assert runner.failures == 0 and runner.tries >= 3
    src = test.globs["src_pos"]
    assert torch.isfinite(src).all() and np.isclose(float(src[:, 2].abs().max()), 50.0, rtol=0.05)
