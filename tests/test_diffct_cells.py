"""diffct's cell-length model on the diffct face (ctbench/compat/cells.py), checked against the
installed diffct 2.5 (its torch backend) and against exact chords worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

import ctbench
import ctbench.compat as face

diffct = pytest.importorskip("diffct")
F64 = torch.float64


def _fan(n=5):
    return face.circular_trajectory_2d_fan(n, sid=30.0, sdd=45.0, dtype=F64)


def _cone(n=4):
    return face.circular_trajectory_3d(n, sid=30.0, sdd=45.0, dtype=F64)


@pytest.mark.parametrize("beam", ["parallel", "fan", "cone"])
def test_forward_and_adjoint_match_diffct_torch_backend(beam):
    if beam == "parallel":
        tr, shape, det, sp = face.circular_trajectory_2d_parallel(5, dtype=F64), (6, 7), (9,), (1.1, 0.7)
    elif beam == "fan":
        tr, shape, det, sp = _fan(), (6, 7), (9,), (1.1, 0.7)
    else:
        # even detector sizes: no ray runs exactly in a cell face (ties are diffct's round-off)
        tr, shape, det, sp = _cone(), (4, 5, 6), (6, 4), (1.3, 0.9, 0.6)
    kw = dict(beam=beam, voxel_spacing=sp, backend="torch", precision="float64")
    ours = face.Projector(tuple(tr), shape, det, **kw)
    theirs = diffct.Projector(tuple(t.clone() for t in tr), shape, det, **kw)
    x = torch.rand(shape, dtype=F64)
    y = torch.rand(ours.projection_shape, dtype=F64)
    torch.testing.assert_close(ours.project(x), theirs.project(x), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.backproject(y), theirs.backproject(y), rtol=1e-10, atol=1e-10)


def test_geometry_gradient_matches_diffct():
    tr = _cone(3)
    x = torch.rand(4, 5, 6, dtype=F64)
    w = torch.rand(3, 7, 5, dtype=F64)
    grads = []
    for lib in (face, diffct):
        src = tr[0].clone().requires_grad_()
        P = lib.Projector((src, *[t.clone() for t in tr[1:]]), (4, 5, 6), (7, 5), backend="torch",
                          precision="float64")
        (P.project(x) * w).sum().backward()
        grads.append(src.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-8, atol=1e-10)


def test_clipped_segment_chord_by_hand():
    # source inside the volume: the segment from x=-0.5 to the detector at x=0.75 crosses 1.25 mm of
    # unit cells (the volume spans x in [-2.5, 2.5])
    src = torch.tensor([[-0.5, 0.13]], dtype=F64)
    ctr = torch.tensor([[0.75, 0.13]], dtype=F64)
    u = torch.tensor([[0.0, 1.0]], dtype=F64)
    P = face.Projector((src, ctr, u), (3, 5), (1,), beam="fan", backend="torch", precision="float64")
    torch.testing.assert_close(P.project(torch.ones(3, 5, dtype=F64)), torch.full((1, 1), 1.25, dtype=F64))


def test_far_endpoint_keeps_the_chord_in_float64():
    src = torch.tensor([[-1e15, 0.0]], dtype=F64)
    ctr = torch.tensor([[100.0, 0.0]], dtype=F64)
    u = torch.tensor([[0.0, 1.0]], dtype=F64)
    P = face.Projector((src, ctr, u), (5, 7), (1,), beam="fan", backend="torch", precision="float64")
    torch.testing.assert_close(P.project(torch.full((5, 7), 1.25, dtype=F64)),
                               torch.full((1, 1), 1.25 * 7, dtype=F64), rtol=1e-11, atol=1e-11)


def test_diffct_checks_with_its_messages():
    src = torch.tensor([[-20.0, 0.0]] * 2, dtype=F64)
    ctr = torch.tensor([[20.0, 0.0]] * 2, dtype=F64)
    u = torch.tensor([[0.0, 1.0]] * 2, dtype=F64)
    edge_on = u.clone()
    edge_on[1] = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match="edge-on"):
        face.Projector((src, ctr, edge_on), (6, 7), (5,), beam="fan")
    with pytest.raises(ValueError, match="source and detector center must differ"):
        face.Projector((src, src.clone(), u), (6, 7), (5,), beam="fan")
    with pytest.raises(ValueError, match="within 1e6 voxels"):
        face.Projector((src * 1e5, ctr * 1e5, u), (6, 7), (5,), beam="fan")


def test_live_frames_are_rechecked_and_frozen_frames_are_snapshotted():
    src = torch.tensor([[-20.0, 0.0]], dtype=F64)
    u = torch.tensor([[0.0, 1.0]], dtype=F64)
    live_ctr = torch.tensor([[20.0, 0.0]], dtype=F64, requires_grad=True)
    live = face.Projector((src, live_ctr, u), (6, 7), (5,), beam="fan", precision="float64")
    frozen_ctr = torch.tensor([[20.0, 0.0]], dtype=F64)
    frozen = face.Projector((src, frozen_ctr, u), (6, 7), (5,), beam="fan", precision="float64")
    x = torch.ones(6, 7, dtype=F64)
    before = frozen.project(x)
    with torch.no_grad():
        live_ctr.copy_(src)
        frozen_ctr.copy_(src)
    with pytest.raises(ValueError, match="must differ"):
        live.project(x)
    torch.testing.assert_close(frozen.project(x), before, rtol=0, atol=0)


def test_top_level_keeps_ctbench_engine_and_positional_trajectory():
    tr = ctbench.circular_trajectory_3d(4, 30.0, 45.0, dtype=F64)
    top = ctbench.Projector(tr, (4, 5, 6), (7, 5))
    assert top.model == "joseph" and top.backend_name == "auto"
    x = torch.rand(4, 5, 6, dtype=F64)
    torch.testing.assert_close(top.project(x, tr), top.project(x))
    with pytest.raises(TypeError):
        face.Projector(tr, (4, 5, 6), (7, 5)).project(x, tr)  # diffct: trajectory= is keyword-only


def test_into_streams_the_cell_model_and_returns_the_output():
    tr = _cone(3)
    P = face.Projector(tuple(tr), (4, 5, 6), (7, 5), precision="float64", view_chunk_size=2,
                       volume_chunk_shape=(2, 5, 6))
    x = torch.rand(4, 5, 6, dtype=F64)
    sino = torch.full(P.projection_shape, math.nan, dtype=F64)
    assert P.project_into(x, sino) is sino
    torch.testing.assert_close(sino, P.project(x), rtol=1e-12, atol=1e-12)
    back = torch.full((4, 5, 6), math.nan, dtype=F64)
    assert P.backproject_into(sino, back) is back
    torch.testing.assert_close(back, P.backproject(sino), rtol=1e-12, atol=1e-12)
