"""diffct 2.5's detector-surface API on ctbench.compat (issue 25): the segment-wise surface
gradient replay and the surface projector's diffct behaviours.

Truth: diffct itself (installed in the dev extra) and whole-batch autograd of the pixel positions.
"""

from __future__ import annotations

import pytest
import torch

diffct = pytest.importorskip("diffct")
from diffct.surface_gradients import surface_batch_vjp as diffct_vjp  # noqa: E402

from ctbench.compat.surface_gradients import surface_batch_vjp  # noqa: E402
from ctbench.compat.surfaces import ParameterizedSurface  # noqa: E402

F64 = torch.float64


def _frames(beam, n, seed):
    r = 3 if beam == "cone" else 2
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4 if r == 3 else 3):
        f = 0.3 * torch.randn(n, r, generator=g, dtype=F64)
        f[:, 0] += (-5.0, 4.0, 0.0, 0.0)[i]
        if i >= 2:
            f[:, i - 1] += 1.0
        out.append(f.requires_grad_())
    return tuple(out)


@pytest.mark.parametrize("beam", ["cone", "fan"])
@pytest.mark.parametrize("capacity", [1, 3, 100])
def test_surface_batch_vjp_matches_diffct_and_whole_batch_autograd(beam, capacity):
    det = (4, 6) if beam == "cone" else (7,)
    pixels = (slice(1, 3), slice(0, 5)) if beam == "cone" else (slice(2, 7),)
    shape = tuple(s.stop - s.start for s in pixels)
    n = 3
    r = len(det) + 1

    def make():
        frames = _frames(beam, n, 5)
        radius = torch.tensor(7.0, dtype=F64, requires_grad=True)

        def sampler(u, v, ids, radius):
            t = radius * torch.sin(u / radius) * (1 + 0.01 * ids.reshape(-1, *[1] * u.ndim))
            w = v if beam == "cone" else torch.zeros_like(u)
            return torch.stack((t, w + 0 * t, radius * (1 - torch.cos(u / radius)) + 0 * t), -1)

        surface = ParameterizedSurface(sampler, (radius,))
        axes = [(torch.arange(s.start, s.stop, dtype=F64) + 0.5 - m / 2) * 0.9 for s, m in zip(pixels, det)]
        u, v = torch.meshgrid(*axes, indexing="ij") if beam == "cone" else (axes[0], torch.zeros_like(axes[0]))
        offsets = surface(u, v, torch.arange(n))
        return (*frames, radius), offsets

    g = torch.Generator().manual_seed(11)
    weights = (torch.randn(n, r, generator=g, dtype=F64), torch.randn(n, *shape, r, generator=g, dtype=F64))
    inputs, offsets = make()
    ours = surface_batch_vjp(beam, det, (0.9,) * len(det), inputs, offsets, slice(0, n), pixels, 1.0,
                             torch.device("cpu"), weights, capacity, native_legacy=False)
    inputs2, offsets2 = make()
    theirs = diffct_vjp(beam, det, (0.9,) * len(det), inputs2, offsets2, slice(0, n), pixels, 1.0,
                        torch.device("cpu"), weights, capacity, native_legacy=False)
    # independent truth: the whole batch's points in one autograd graph
    inputs3, offsets3 = make()
    src, ctr, u_ax, *rest = inputs3[:len(inputs3) - 1]
    t, w, h = offsets3.unbind(-1)
    shp = (n, *[1] * len(shape), r)
    uu = u_ax.reshape(shp)
    if beam == "cone":
        vv = rest[0].reshape(shp)
        pts = ctr.reshape(shp) + t[..., None] * uu + w[..., None] * vv + h[..., None] * torch.linalg.cross(uu, vv, dim=-1)
    else:
        pts = ctr.reshape(shp) + t[..., None] * uu + h[..., None] * torch.stack((uu[..., 1], -uu[..., 0]), -1)
    loss = (src * weights[0]).sum() + (pts * weights[1]).sum()
    truth = torch.autograd.grad(loss, inputs3)
    assert len(ours) == len(inputs)
    for a, b, c in zip(ours, theirs, truth):
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [0, -2, True, 1.5, "3"])
def test_surface_batch_vjp_refuses_a_bad_capacity(bad):
    frames = _frames("fan", 1, 1)
    offsets = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(ValueError, match="capacity"):
        surface_batch_vjp("fan", (2,), (1.0,), (*frames, offsets), offsets, slice(0, 1), (slice(0, 2),), 1.0,
                          torch.device("cpu"), (torch.zeros(1, 2), torch.zeros(1, 2, 2)), bad, native_legacy=True)


# ------------------------------------------------------------ the surface projector's diffct behaviours
from ctbench.compat import Projector  # noqa: E402


def _fan(views=2):
    src = torch.zeros(views, 2, dtype=F64)
    ctr, u = torch.zeros_like(src), torch.zeros_like(src)
    src[:, 0], ctr[:, 0], u[:, 1] = -20.0, 20.0, 1.0
    return src, ctr, u


def _arc(radius):
    def sampler(u, v, ids, r):
        return torch.stack((r * torch.sin(u / r), torch.zeros_like(u), r * (1 - torch.cos(u / r))), -1)
    return ParameterizedSurface(sampler, (radius,))


def test_surface_project_into_writes_the_projection_and_returns_the_output():
    radius = torch.tensor(30.0, dtype=F64)
    op = Projector(_fan(), (6, 6), (5,), beam="fan", detector_surface=_arc(radius), precision="float64")
    x = torch.rand(6, 6, dtype=F64)
    sink = torch.full(op.projection_shape, 7.0, dtype=F64)
    out = op.project_into(x, sink)
    assert out is sink
    torch.testing.assert_close(sink, op.project(x), rtol=0, atol=0)
    y = torch.rand(op.projection_shape, dtype=F64)
    vol = torch.zeros(6, 6, dtype=F64)
    assert op.backproject_into(y, vol) is vol
    torch.testing.assert_close(vol, op.backproject(y), rtol=0, atol=0)
    # the adjoint pair through the *_into spellings
    torch.testing.assert_close((sink * y).sum(), (x * vol).sum(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("kind", ["coincident", "nan", "middle"])
def test_surface_updated_in_place_is_checked_again_before_any_write(kind):
    radius = torch.tensor(30.0, dtype=F64)
    bump = torch.zeros(3, dtype=F64)

    def sampler(u, v, ids, r, b):
        local = torch.stack((u, torch.zeros_like(u), torch.zeros_like(u)), -1)
        return local + b  # b moves every pixel of every view
    surface = ParameterizedSurface(sampler, (radius, bump))
    frames = _fan()
    op = Projector(frames, (4, 4), (3,), beam="fan", detector_surface=surface, precision="float64")
    diffct_op = diffct.Projector(frames, (4, 4), (3,), beam="fan", backend="torch", precision="float64",
                                 detector_surface=diffct.ParameterizedSurface(sampler, (radius, bump)))
    x = torch.ones(4, 4, dtype=F64)
    op.project(x)
    with torch.no_grad():
        if kind == "coincident":
            bump.copy_(torch.tensor([0.0, 0.0, -40.0]))  # h = -40 puts the middle pixel on the source
        elif kind == "nan":
            bump[0] = float("nan")
        else:
            bump[1] = 1e-9  # a 2D surface has no w
    sink = torch.full(op.projection_shape, 5.0, dtype=F64)
    for projector in (op, diffct_op):  # diffct refuses the same update
        with pytest.raises(ValueError):
            projector.project_into(x, sink.clone() if projector is diffct_op else sink)
    torch.testing.assert_close(sink, torch.full_like(sink, 5.0), rtol=0, atol=0)


def test_surface_frames_edited_in_place_are_read_at_the_next_call():
    radius = torch.tensor(30.0, dtype=F64)
    frames = _fan(1)
    op = Projector(frames, (6, 6), (5,), beam="fan", detector_surface=_arc(radius), precision="float64")
    x = torch.rand(6, 6, dtype=F64)
    before = op.project(x)
    with torch.no_grad():
        frames[1][0, 1] = 2.5  # shift the detector along its u axis
    moved = op.project(x)
    fresh = Projector(frames, (6, 6), (5,), beam="fan", detector_surface=_arc(radius), precision="float64")
    assert not torch.equal(before, moved)
    torch.testing.assert_close(moved, fresh.project(x), rtol=0, atol=0)


def test_surface_construction_checks_the_precision_arithmetic():
    # distinct in float64, the same point in float32 (diffct's default arithmetic)
    src, ctr, u = _fan(1)
    src[0, 0], ctr[0, 0] = 1.0, 1.0 + 1e-9
    def flat(uu, vv):
        return torch.stack((uu, vv, torch.zeros_like(uu)), -1)
    with pytest.raises(ValueError, match="source and detector surface pixels must differ"):
        Projector((src, ctr, u), (1, 1), (1,), beam="fan", detector_surface=flat, precision="float32")
    with pytest.raises(ValueError, match="source and detector surface pixels must differ"):
        diffct.Projector((src, ctr, u), (1, 1), (1,), beam="fan", detector_surface=flat, backend="torch")


def test_surface_pixels_far_away_are_refused_with_diffct_bounds():
    src, ctr, u = _fan(1)
    src[0, 0] = -1.5e6
    def far(uu, vv):  # every pixel 1.5e6 voxels out too
        return torch.stack((uu, vv, torch.full_like(uu, 1.5e6)), -1)
    with pytest.raises(ValueError, match="1e6"):
        Projector((src, ctr, u), (4, 4), (3,), beam="fan", detector_surface=far, precision="float64")
    def very_far(uu, vv):
        return torch.stack((uu, vv, torch.full_like(uu, 1e16)), -1)
    with pytest.raises(ValueError, match="1e15"):
        Projector(_fan(1), (4, 4), (3,), beam="fan", detector_surface=very_far, precision="float64")


def test_detector_chunk_shape_takes_numpy_integers_and_refuses_two_entries_for_a_2d_scan():
    np = pytest.importorskip("numpy")
    frames = _fan(3)
    for make in (Projector, lambda *a, **k: diffct.Projector(*a, backend="torch", **k)):
        p = make(frames, (4, 4), (5,), beam="fan", detector_chunk_shape=(np.int64(12),))
        assert p.projection_shape == (3, 5)
        with pytest.raises((TypeError, ValueError), match="detector_chunk_shape"):  # diffct: TypeError
            make(frames, (4, 4), (5,), beam="fan", detector_chunk_shape=(3, 2))
    # the chunked projection is the unchunked one
    x = torch.rand(4, 4, dtype=F64)
    a = Projector(frames, (4, 4), (5,), beam="fan", detector_chunk_shape=(np.int64(2),)).project(x)
    torch.testing.assert_close(a, Projector(frames, (4, 4), (5,), beam="fan").project(x), rtol=1e-12, atol=1e-12)
