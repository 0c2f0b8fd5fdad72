"""diffct's distributed face (issue 25, ctbench/compat/distribution.py, compat/_cell_ranks.py):
ownership names and attributes against installed diffct, and real two-rank Gloo runs of the cell
model (views, space, 2D rows, curved detectors, cgls_into refusals) against one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ctbench.compat as face
from ctbench.compat import distribution as cd

diffct = pytest.importorskip("diffct")
import diffct.distribution as dd  # noqa: E402

F64 = torch.float64
GLOO = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def test_balanced_slice_and_single_rank_partition_match_diffct():
    for n in range(9):
        for world in range(1, 5):
            for rank in range(world):
                assert cd.balanced_slice(n, rank, world) == dd.balanced_slice(n, rank, world)
    for partition, grid in (("views", None), ("space", None), ("hybrid", None), ("hybrid", (1, 1))):
        ours = cd.Partition((5, 4, 3), 7, partition=partition, partition_grid=grid)
        theirs = dd.Partition((5, 4, 3), 7, partition=partition, partition_grid=grid)
        for name in ("partition_grid", "volume_slice", "local_volume_shape", "view_slice", "rank", "world_size"):
            assert getattr(ours, name) == getattr(theirs, name), name
    for bad in (dict(partition="slabs"), dict(partition="views", partition_grid=(1, 1)),
                dict(partition="hybrid", partition_grid=(2, 1))):
        with pytest.raises(ValueError, match="partition"):
            cd.Partition((5, 4, 3), 7, **bad)
    with pytest.raises(TypeError, match="distributed"):
        cd.Partition((5, 4, 3), 7, distributed=1)


def test_preflight_on_one_rank_raises_the_error_class_and_message():
    cd.preflight(None, {"a": 1})
    with pytest.raises(FileNotFoundError, match="gone"):
        cd.preflight(FileNotFoundError("gone"), None)
    assert cd.control_status([3, -1]) == [3, -1]


@pytest.mark.parametrize("beam", ["fan", "cone"])
@pytest.mark.parametrize("partition", ["views", "space", "hybrid"])
def test_projector_ownership_attributes_match_diffct_on_one_process(beam, partition):
    if beam == "fan":
        tr, shape, det = face.circular_trajectory_2d_fan(5, 30.0, 45.0, dtype=F64), (5, 7), (9,)
    else:
        tr, shape, det = face.circular_trajectory_3d(5, 30.0, 45.0, dtype=F64), (4, 5, 6), (6, 4)
    kw = dict(beam=beam, backend="torch", precision="float64", partition=partition)
    ours = face.Projector(tuple(tr), shape, det, **kw)
    theirs = diffct.Projector(tuple(t.clone() for t in tr), shape, det, **kw)
    for name in ("partition", "global_volume_shape", "volume_slice", "local_volume_shape", "volume_shape",
                 "view_slice", "projection_shape", "partition_grid"):
        assert getattr(ours, name) == getattr(theirs, name), name
    x = torch.rand(shape, dtype=F64)
    torch.testing.assert_close(ours.project(x), theirs.project(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("value", [None, True, 1, "Space", ""])
def test_partition_refusals_use_diffcts_message(value):
    tr = face.circular_trajectory_3d(3, 30.0, 45.0)
    with pytest.raises(ValueError, match="partition must be 'views', 'space', or 'hybrid'"):
        face.Projector(tr, (3, 4, 5), (4, 3), partition=value)
    with pytest.raises(ValueError, match="partition_grid requires partition='hybrid'"):
        face.Projector(tr, (3, 4, 5), (4, 3), partition="space", partition_grid=(1, 1))


def test_oblique_parallel3d_rays_match_diffct():
    angles = torch.tensor([0.3, 1.1, 2.0], dtype=F64)
    tilt = torch.tensor([0.2, -0.1, 0.25], dtype=F64)
    normal = torch.stack((angles.cos() * tilt.cos(), angles.sin() * tilt.cos(), tilt.sin()), 1)
    u = torch.stack((-angles.sin(), angles.cos(), torch.zeros_like(angles)), 1)
    v = torch.linalg.cross(normal, u, dim=1)
    direction = normal + 0.2 * u - 0.15 * v
    direction = direction / direction.norm(dim=1, keepdim=True)
    frames = (direction, torch.zeros(3, 3, dtype=F64), u, v)
    kw = dict(beam="parallel3d", voxel_spacing=(1.2, 0.9, 0.7), backend="torch", precision="float64")
    ours = face.Projector(frames, (3, 4, 5), (5, 4), **kw)
    theirs = diffct.Projector(tuple(t.clone() for t in frames), (3, 4, 5), (5, 4), **kw)
    x = torch.rand(3, 4, 5, dtype=F64)
    torch.testing.assert_close(ours.project(x), theirs.project(x), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="tangent"):
        face.Projector((u.clone(), frames[1], u, v), (3, 4, 5), (5, 4), **kw)


# ------------------------------------------------------------------------------- two Gloo ranks
def _scan(beam):
    if beam == "fan":
        return face.circular_trajectory_2d_fan(5, 30.0, 45.0, dtype=F64), (5, 7), (9,)
    return face.circular_trajectory_3d(5, 30.0, 45.0, dtype=F64), (5, 4, 6), (7, 3)


def _ranks_worker(rank, init, beam, partition, curved):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        tr, shape, det = _scan(beam)
        radius = torch.tensor(40.0, dtype=F64, requires_grad=True)

        def sampler(u, v, ids, r):
            return torch.stack((u, v, u * u / (2 * r)), -1)

        def build(**kw):
            surface = face.ParameterizedSurface(sampler, (radius,)) if curved else None
            return face.Projector(tuple(tr), shape, det, beam=beam, precision="float64", backend="torch",
                                  detector_surface=surface, **kw)

        one = build()
        both = build(distributed=True, partition=partition)
        reference = diffct.Projector(tuple(t.clone() for t in tr), shape, det, beam=beam, precision="float64",
                                     backend="torch") if not curved else None
        g = torch.Generator().manual_seed(3)
        x = torch.rand(shape, dtype=F64, generator=g)
        y = torch.rand(one.projection_shape, dtype=F64, generator=g)
        vs, sl = both.view_slice, both.volume_slice
        assert both.global_volume_shape == tuple(shape) and both.partition == partition
        local = x[sl].clone().requires_grad_()
        out = both.project(local)
        torch.testing.assert_close(out, one.project(x)[vs], rtol=1e-12, atol=1e-12)
        if reference is not None:  # the cell model is diffct's: its own projector, one process
            torch.testing.assert_close(out, reference.project(x)[vs], rtol=1e-10, atol=1e-10)
        # one global loss: replicated projections (space) are divided by their replicas
        ((out * y[vs]).sum() / both.space_world_size).backward()
        torch.testing.assert_close(local.grad, one.backproject(y)[sl], rtol=1e-12, atol=1e-12)
        back = both.backproject(y[vs])
        torch.testing.assert_close(back, one.backproject(y)[sl], rtol=1e-12, atol=1e-12)
    finally:
        dist.destroy_process_group()


@GLOO
@pytest.mark.parametrize("beam,partition,curved", [("fan", "space", False), ("fan", "views", False),
                                                   ("cone", "space", False), ("cone", "views", True)])
@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_run_the_cell_model_as_one_process(beam, partition, curved, tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_ranks_worker, args=((tmp_path / "rdv").resolve().as_uri(), beam, partition, curved), nprocs=2,
             join=True)


def _workspace_worker(rank, init, root):
    from pathlib import Path

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        tr, shape, det = _scan("fan")
        op = face.Projector(tuple(tr), shape, det, beam="fan", precision="float64", backend="torch",
                            distributed=True, partition="views")
        b = op.project(torch.rand(shape, dtype=F64, generator=torch.Generator().manual_seed(1)))
        out = torch.full(op.volume_shape, 7.0, dtype=F64)
        work = Path(root) / f"work-{rank}"
        if rank == 1:  # this rank's workspace cannot be made: its parent is a file
            (Path(root) / "file").write_text("x")
            work = Path(root) / "file" / "work"
        try:
            face.cgls_into(op, b, out, 2, workspace=work, block_elements=5, rtol=0.0, atol=0.0)
            outcome = None
        except ValueError as error:
            outcome = str(error)
        gathered = [None, None]
        dist.all_gather_object(gathered, outcome)
        assert gathered[0] == gathered[1] and "rank 1" in gathered[0]
        assert bool((out == 7.0).all())  # nothing was written
        # a valid request solves: two ranks equal one process
        good = torch.zeros(op.volume_shape, dtype=F64)
        res = face.cgls_into(op, b, good, 3, workspace=Path(root) / f"ok-{rank}", block_elements=5,
                             rtol=0.0, atol=0.0)
        one = face.Projector(tuple(tr), shape, det, beam="fan", precision="float64", backend="torch")
        full = torch.zeros(shape, dtype=F64)
        b_all = one.project(torch.rand(shape, dtype=F64, generator=torch.Generator().manual_seed(1)))
        ref = face.cgls_into(one, b_all, full, 3, workspace=Path(root) / f"one-{rank}", block_elements=5,
                             rtol=0.0, atol=0.0)
        torch.testing.assert_close(good, full, rtol=1e-9, atol=1e-10)
        assert res.residual_history == pytest.approx(ref.residual_history, rel=1e-9)
    finally:
        dist.destroy_process_group()


@GLOO
@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_cgls_into_refuses_a_bad_workspace_on_every_rank(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_workspace_worker, args=((tmp_path / "rdv").resolve().as_uri(), str(tmp_path)), nprocs=2, join=True)


def test_owned_slices_read_as_the_engines_slab():
    s = cd.owned_slices(slice(2, 4), (6, 3, 5), False)
    assert s == (slice(2, 4), slice(0, 3), slice(0, 5)) and (s.start, s.stop) == (2, 4)
    t = cd.owned_slices(slice(0, 1), (1, 3, 5), True)
    assert t == (slice(0, 3), slice(0, 5)) and (t.start, t.stop) == (0, 1)
    import pickle

    u = pickle.loads(pickle.dumps(s))
    assert u == s and u.planes == slice(2, 4) and (u.start, u.stop) == (2, 4)
