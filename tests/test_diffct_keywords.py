"""diffct 2.5's Projector keywords and generator results on ctbench.compat (issue 25):
backend aliases, precision, schedule, chunk shapes, exception types, tuple results."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ctbench
import ctbench.compat as d
from ctbench.compat.operators import slab_planes
from ctbench.projector import Projector as CoreProjector

F64 = torch.float64


def _cone(**kw):
    tr = ctbench.circular_trajectory_3d(6, 80.0, 120.0, dtype=F64)
    return d.Projector(tr, (6, 5, 4), (7, 6), **kw), tr


def test_the_top_level_projector_is_the_diffct_face_with_ctbench_auto():
    # ctbench.Projector takes all of diffct's keywords; only "auto" keeps ctbench's engine
    assert issubclass(ctbench.Projector, d.Projector) and issubclass(d.Projector, CoreProjector)
    tr = ctbench.circular_trajectory_3d(6, 80.0, 120.0, dtype=F64)
    assert ctbench.Projector(tr, (6, 5, 4), (7, 6)).model == "joseph"
    assert d.Projector(tr, (6, 5, 4), (7, 6)).model == "cells"


def test_backend_torch_is_diffct_cell_model_and_keeps_diffct_label():
    # diffct's portable backend is its cell-length model (compat/cells.py), not ctbench's Joseph
    P, tr = _cone(backend="torch")
    joseph = CoreProjector(tr, (6, 5, 4), (7, 6), backend="reference")
    x = torch.rand(6, 5, 4, dtype=F64)
    assert P.backend == "torch" and P.model == "cells"
    assert (P.project(x) - joseph.project(x)).abs().max() > 1e-3
    assert P(x).shape == P.projection_shape


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_backend_numba_needs_cuda_and_fast_precision():
    with pytest.raises(RuntimeError, match="numba requires NVIDIA CUDA"):
        _cone(backend="numba")
    with pytest.raises(ValueError, match="precision='fast'"):
        _cone(backend="numba", precision="float64")


def test_unknown_backend_still_refused():
    with pytest.raises(ValueError, match="backend"):
        _cone(backend="jax")


@pytest.mark.parametrize("precision, dtype", [("fast", torch.float32), ("float32", torch.float32),
                                              ("float64", F64)])
def test_precision_sets_the_result_dtype_and_keeps_gradients(precision, dtype):
    P, _ = _cone(precision=precision)
    assert P.dtype == dtype and P.precision == precision
    other = torch.float32 if dtype == F64 else F64
    x = torch.rand(6, 5, 4, dtype=other, requires_grad=True)
    y = P.project(x)
    assert y.dtype == dtype
    want = _cone(precision="float64")[0].project(x.detach().to(dtype))
    torch.testing.assert_close(y.detach(), want.to(dtype))
    y.sum().backward()
    assert x.grad is not None and x.grad.dtype == other
    assert P.backproject(torch.rand(P.projection_shape, dtype=other)).dtype == dtype


def test_default_precision_is_diffcts_fast_on_the_face_and_the_input_dtype_at_top_level():
    P, tr = _cone()
    assert P.precision == "fast" and P.project(torch.rand(6, 5, 4, dtype=F64)).dtype == torch.float32
    with pytest.raises(ValueError, match="precision must be"):
        _cone(precision=None)  # diffct has no None
    top = ctbench.Projector(tr, (6, 5, 4), (7, 6))
    assert top.project(torch.rand(6, 5, 4)).dtype == torch.float32
    assert top.project(torch.rand(6, 5, 4, dtype=F64)).dtype == F64


@pytest.mark.parametrize("bad", ["half", 32, None.__class__])
def test_bad_precision_is_a_value_error(bad):
    with pytest.raises(ValueError, match="precision must be 'fast', 'float32', or 'float64'"):
        _cone(precision=bad)


def test_schedule_is_validated_and_does_not_change_the_operator():
    x = torch.rand(6, 5, 4, dtype=F64)
    ys = [_cone(schedule=s)[0].project(x) for s in ("auto", "spatial", "views", "window")]
    for y in ys[1:]:
        torch.testing.assert_close(y, ys[0], rtol=0, atol=0)
    assert _cone(schedule="views")[0].schedule == "views"
    for bad in ("fastest", 1):
        with pytest.raises(ValueError, match="schedule must be"):
            _cone(schedule=bad)


def test_volume_chunk_blocks_map_onto_slabs_that_hold_no_more_voxels():
    assert slab_planes((6, 5, 4), (6, 5, 4)) == 6
    assert slab_planes((3, 5, 4), (6, 5, 4)) == 3
    assert slab_planes((4, 5, 2), (6, 5, 4)) == 2      # 40 voxels = 2 planes of 20
    assert slab_planes((1, 2, 2), (6, 5, 4)) == 1      # smaller than a plane: one plane
    assert slab_planes((9, 9, 9), (6, 5, 4)) == 6      # clipped to the volume
    assert slab_planes(2, (6, 5, 4)) == 2              # ctbench's own plane count
    assert slab_planes((3, 3), (5, 5)) is None         # a 2D volume is one window
    with pytest.raises(ValueError, match="3 entries"):
        slab_planes((2, 2), (6, 5, 4))
    with pytest.raises(ValueError, match="positive"):
        slab_planes((2, 0, 2), (6, 5, 4))
    with pytest.raises(TypeError, match="positive integers"):
        slab_planes((2.5, 2, 2), (6, 5, 4))


def test_chunked_projector_is_the_same_operator():
    x = torch.rand(6, 5, 4, dtype=F64)
    plain, _ = _cone()
    chunked, _ = _cone(volume_chunk_shape=(2, 5, 2), view_chunk_size=np.int64(2))
    assert chunked.options["view_chunk_size"] == 2 and type(chunked.options["view_chunk_size"]) is int
    assert chunked.options["volume_chunk_shape"] == 1
    torch.testing.assert_close(chunked.project(x), plain.project(x), rtol=1e-12, atol=1e-12)
    y = torch.rand(plain.projection_shape, dtype=F64)
    torch.testing.assert_close(chunked.backproject(y), plain.backproject(y), rtol=1e-12, atol=1e-12)


def test_2d_chunk_shapes():
    tr = d.circular_trajectory_2d_parallel(5)
    x = torch.rand(6, 6)
    P = d.Projector(tr, (6, 6), 7, beam="parallel", detector_chunk_shape=(2,), volume_chunk_shape=(3, 3))
    torch.testing.assert_close(P.project(x), d.Projector(tr, (6, 6), 7, beam="parallel").project(x))


@pytest.mark.parametrize("count", [2.5, 3.0, True, np.float64(3.0)])
def test_non_integer_view_counts_are_type_errors(count):
    with pytest.raises(TypeError, match="n_views must be a positive integer"):
        ctbench.circular_trajectory_3d(count, 100.0, 200.0)
    with pytest.raises(TypeError, match="n_views"):
        d.circular_trajectory_2d_fan(count, 100.0, 200.0)


def test_view_counts_below_one_are_value_errors():
    with pytest.raises(ValueError, match="n_views"):
        ctbench.circular_trajectory_3d(0, 100.0, 200.0)
    assert ctbench.circular_trajectory_3d(np.int64(4), 100.0, 200.0).n_views == 4


def test_compat_generators_return_diffct_tuples():
    frames = d.circular_trajectory_3d(6, 80.0, 120.0, dtype=F64)
    assert isinstance(frames, tuple) and len(frames) == 4 and frames.diffct_beam == "cone"
    src, det_center, det_u, det_v = frames
    assert frames[0] is src and frames[0].shape == (6, 3)
    frames[0][0, 2] = 3.0  # item assignment into a part reaches the projector's geometry
    P = d.Projector(frames, (6, 5, 4), (7, 6))
    assert float(P.trajectory.source[0, 2]) == 3.0
    fan = d.circular_trajectory_2d_fan(5, 80.0, 120.0)
    assert len(fan) == 3 and fan[1].shape == (5, 2)
    Pf = d.Projector(fan, (4, 4), 6)  # no beam=: the tuple knows it is a fan
    assert Pf.is_2d and Pf.beam == "cone"
    assert isinstance(fan.trajectory(), ctbench.Trajectory)
    assert isinstance(ctbench.circular_trajectory_3d(4), ctbench.Trajectory)  # top level: ctbench's


def test_core_projector_refuses_detector_surface_and_names_the_face():
    tr = ctbench.circular_trajectory_3d(4, 80.0, 120.0)
    with pytest.raises(TypeError, match=r"ctbench\.Projector"):
        CoreProjector(tr, (4, 4, 4), (5, 5), detector_surface=lambda u, v: torch.zeros(*u.shape, 3))
    flat = lambda u, v: torch.stack([u, v, torch.zeros_like(u)], -1)  # noqa: E731  (the plane, as offsets)
    sp = d.Projector(tr, (4, 4, 4), (5, 5), detector_surface=flat, backend="torch")
    x = torch.rand(4, 4, 4)
    torch.testing.assert_close(sp.project(x), d.Projector(tr, (4, 4, 4), (5, 5)).project(x), rtol=1e-5, atol=1e-5)


def test_into_takes_dense_tensors_written_in_place():
    P, _ = _cone(precision="float64")
    x = torch.rand(6, 5, 4, dtype=F64)
    sino = torch.full(P.projection_shape, float("nan"), dtype=F64)
    P.project_into(x, sino)
    torch.testing.assert_close(sino, P.project(x), rtol=1e-12, atol=1e-12)
    back = torch.full((6, 5, 4), float("nan"), dtype=F64)
    P.backproject_into(sino, back)
    torch.testing.assert_close(back, P.backproject(sino), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="output must not require grad"):
        P.project_into(x, torch.zeros(P.projection_shape, dtype=F64, requires_grad=True))
