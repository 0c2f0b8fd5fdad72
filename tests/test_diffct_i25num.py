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


# ---------------------------------------------------------------- i25more: derivatives, stats, backend label, ranks

def _small_cone(views=4):
    a = torch.linspace(0, 2 * math.pi, views + 1, dtype=F64)[:-1] + 0.137
    radial = torch.stack((a.cos(), a.sin(), torch.zeros_like(a)), 1)
    u = torch.stack((-a.sin(), a.cos(), torch.zeros_like(a)), 1)
    v = torch.tensor([[0.0, 0.0, 1.0]], dtype=F64).expand(views, 3).clone()
    return (-30 * radial + 0.11, 20 * radial - 0.07, u, v)


def _small_operator(module, **kw):
    return module.Projector(_small_cone(), (4, 6, 5), (5, 4), beam="cone", detector_spacing=(0.95, 0.9),
                            voxel_spacing=(0.9, 0.8, 0.85), backend="torch", precision="float64", **kw)


@pytest.mark.parametrize("module", [cc, diffct], ids=["ctbench", "diffct"])
def test_trajectory_second_derivative_and_forward_mode_raise_on_the_diffct_face(module):
    op = _small_operator(module)
    image = torch.rand((4, 6, 5), dtype=F64, generator=torch.Generator().manual_seed(1))
    base = _small_cone()
    source = base[0].clone().requires_grad_()
    loss = (op.project(image, trajectory=(source, *base[1:])) ** 2).sum()
    first, = torch.autograd.grad(loss, source, create_graph=True)
    assert first.abs().max() > 0  # the first order is there
    with pytest.raises(RuntimeError, match="(?i)second|not supported"):
        torch.autograd.grad(first.square().sum(), source)
    with pytest.raises(RuntimeError, match="(?i)forward|jvp|not supported"):
        torch.func.jvp(lambda s: op.project(image, trajectory=(s, *base[1:])), (base[0].clone(),),
                       (torch.ones_like(base[0]),))


def test_first_order_trajectory_gradient_matches_diffct_and_data_transforms_still_work():
    image = torch.rand((4, 6, 5), dtype=F64, generator=torch.Generator().manual_seed(2))
    grads = []
    for module in (cc, diffct):
        base = _small_cone()
        source = base[0].clone().requires_grad_()
        op = _small_operator(module)
        (op.project(image, trajectory=(source, *base[1:])) * 0.5).sum().backward()
        grads.append(source.grad)
    assert grads[1].abs().max() > 1e-6
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-12)
    # forward mode and second order in the data are untouched (the projection is linear in it)
    op = _small_operator(cc)
    tangent = torch.rand_like(image)
    out, jvp = torch.func.jvp(op.project, (image,), (tangent,))
    torch.testing.assert_close(jvp, op.project(tangent), rtol=1e-12, atol=1e-12)


def test_ctbench_top_level_keeps_true_second_derivatives_of_the_geometry():
    import ctbench

    base = _small_cone()
    image = torch.rand((4, 6, 5), dtype=F64, generator=torch.Generator().manual_seed(3))
    op = ctbench.Projector(base, (4, 6, 5), (5, 4), beam="cone", detector_spacing=(0.95, 0.9),
                           voxel_spacing=(0.9, 0.8, 0.85), backend="torch", precision="float64")

    def gradient(src, create_graph):
        src = src if src.requires_grad else src.clone().requires_grad_()
        loss = (op.project(image, trajectory=(src, *base[1:])) ** 2).sum()
        return torch.autograd.grad(loss, src, create_graph=create_graph)[0]

    source = base[0].clone().requires_grad_()
    direction = torch.zeros_like(source)
    direction[:, 0] = 1.0
    hvp, = torch.autograd.grad((gradient(source, True) * direction).sum(), source)
    step = 1e-5
    finite = (gradient(base[0] + step * direction, False) - gradient(base[0] - step * direction, False)) / (2 * step)
    torch.testing.assert_close((hvp * direction).sum(), (finite * direction).sum(), rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("surface", [False, True])
def test_last_execution_stats_report_a_plan_that_reproduces_the_bits(surface):
    kw = {}
    if surface:
        kw["detector_surface"] = cc.ParameterizedSurface(
            lambda u, v, views, r: torch.stack((r * torch.sin(u / r), v + 0 * u, r * (torch.cos(u / r) - 1)), -1),
            (torch.tensor(50.0, dtype=F64),))
    op = _small_operator(cc, **kw)
    assert op.last_execution_stats is None  # before any call, as diffct's
    image = torch.rand((4, 6, 5), dtype=F64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        first = op.project(image)
    stats = op.last_execution_stats
    assert stats["operation"] == "project" and stats["devices"] == ["cpu"] and stats["ray_tile_pairs"] >= 1
    hints = dict(volume_chunk_shape=tuple(stats["chunk_shape"]), view_chunk_size=stats["view_chunk_size"],
                 detector_chunk_shape=tuple(stats["detector_chunk_shape"]))
    assert hints["volume_chunk_shape"] == (4, 6, 5) and len(hints["detector_chunk_shape"]) == 2
    with torch.no_grad():
        again = _small_operator(cc, **kw, **hints).project(image)
    assert torch.equal(first, again)
    op.backproject(first)
    assert op.last_execution_stats["operation"] == "backproject"


def test_last_execution_stats_count_the_ray_groups_of_explicit_chunks():
    op = _small_operator(cc, view_chunk_size=3, detector_chunk_shape=(2, 4))
    op.project(torch.ones((4, 6, 5), dtype=F64))
    stats = op.last_execution_stats
    assert (stats["view_chunk_size"], stats["detector_chunk_shape"]) == (3, (2, 4))
    assert stats["ray_tile_pairs"] == math.ceil(4 / 3) * math.ceil(5 / 2)  # one volume tile: the cell model's


_AUTO_CASES = [dict(precision="fast"), dict(precision="float32"), dict(precision="float64"),
               dict(precision="fast", voxel_spacing=(1.0, 1.0, 2e4)), dict(precision="fast", beam="parallel3d")]


@pytest.mark.parametrize("platform", ["nvidia", "rocm", "none"])
@pytest.mark.parametrize("case", range(len(_AUTO_CASES)))
def test_auto_backend_label_and_fallback_warning_follow_diffct(case, platform, monkeypatch):
    import warnings

    from diffct.backends import select_backend

    from ctbench.compat.backend_choice import auto_label, warn_auto_fallback

    options = dict(_AUTO_CASES[case])
    precision = options.pop("precision")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: platform != "none")
    monkeypatch.setattr(torch.version, "hip", "7.0-test" if platform == "rocm" else None)
    expected = "torch" if options.get("beam") == "parallel3d" else \
        select_backend("auto", precision, options.get("voxel_spacing", 1.0))
    assert auto_label(precision, options) == expected
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        warn_auto_fallback(precision, options)
    warned = [str(r.message) for r in records if issubclass(r.category, UserWarning)]
    assert len(warned) == (1 if platform == "nvidia" and expected == "torch" else 0), warned
    if warned and precision != "fast":
        assert f"precision={precision!r}" in warned[0] and "backend='torch'" in warned[0]


def test_auto_fallback_warns_once_per_projector_not_per_call(monkeypatch):
    import warnings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        op = cc.Projector(_small_cone(), (4, 6, 5), (5, 4), beam="cone", precision="float64")
        op.backproject(op.project(torch.ones((4, 6, 5), dtype=F64)))
    assert op.backend == "torch"
    assert len([r for r in records if issubclass(r.category, UserWarning)]) == 1


def _two_rank_worker(rank, rendezvous, results):
    import torch.distributed as dist

    torch.set_num_threads(1)
    for index, partition in enumerate(("views", "space")):
        dist.init_process_group("gloo", init_method=f"{rendezvous}-{index}", rank=rank, world_size=2)
        try:
            reference = _small_operator(cc)
            op = _small_operator(cc, distributed=True, partition=partition)
            g = torch.Generator().manual_seed(9)
            volume, sinogram = torch.rand((4, 6, 5), dtype=F64, generator=g), torch.rand((4, 5, 4), dtype=F64,
                                                                                          generator=g)
            local_sino = (sinogram[op.view_slice] if partition == "views" else sinogram).clone().requires_grad_()
            adjoint = op.backproject(local_sino)
            ((adjoint * volume[op.volume_slice]).sum() / op.view_world_size).backward()
            want_sino_grad = reference.project(volume)
            want_sino_grad = want_sino_grad[op.view_slice] if partition == "views" else want_sino_grad
            local_volume = volume[op.volume_slice].clone()
            torch.testing.assert_close(op.project(local_volume),
                                       reference.project(volume)[op.view_slice] if partition == "views"
                                       else reference.project(volume), rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(adjoint, reference.backproject(sinogram)[op.volume_slice], rtol=1e-10,
                                       atol=1e-12)
            # diffct's rule: a replicated backproject input gets the full (summed) gradient
            torch.testing.assert_close(local_sino.grad, want_sino_grad, rtol=1e-10, atol=1e-12)
            assert op.model == "cells"
        finally:
            dist.destroy_process_group()
    results.put(rank)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_diffct_face_runs_the_cell_model_and_matches_one_process(tmp_path):
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    rendezvous = (tmp_path / "ranks").resolve().as_uri()
    processes = [context.Process(target=_two_rank_worker, args=(rank, rendezvous, results)) for rank in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=240)
        if p.is_alive():
            p.terminate()
    assert [p.exitcode for p in processes] == [0, 0]
    assert sorted(results.get(timeout=5) for _ in range(2)) == [0, 1]
