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
