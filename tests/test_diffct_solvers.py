"""diffct's solver checkpoints, block-bounded cgls_into, request agreement and store aliases in
``ctbench.compat`` (issue 25), checked against independent recurrences and against installed diffct."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ctbench import compat
from ctbench.compat import _blocks

F64 = torch.float64


class MatrixOperator:
    """A dense positive linear map with diffct's operator interface (project/backproject and the
    ``*_into`` block forms), counting its calls."""

    beam, voxel_spacing, detector_spacing = "parallel", 0.7, (0.9,)
    volume_shape, projection_shape = (2, 3), (5, 3)
    # what diffct's own checkpoint signature reads of an operator (its ownership and detector)
    global_volume_shape, volume_slice, view_slice, detector_shape = (2, 3), (slice(0, 2), slice(0, 3)), slice(0, 5), (3,)

    def __init__(self, dtype=F64, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.matrix = torch.rand(15, 6, generator=g, dtype=dtype) * 0.1 + 0.02
        self.matrix[:6] += torch.eye(6, dtype=dtype)
        self._trajectory = (torch.linspace(0, 1, 5, dtype=dtype),)
        self.calls = []

    def project(self, x):
        self.calls.append("project")
        return (self.matrix.to(x) @ x.reshape(-1)).reshape(self.projection_shape)

    def backproject(self, y):
        self.calls.append("backproject")
        return (self.matrix.to(y).T @ y.reshape(-1)).reshape(self.volume_shape)

    def project_into(self, src, dst):
        self.calls.append("project_into")
        dst.write((slice(None), slice(None)), self.project(src.read((slice(None), slice(None)))).to(dst.dtype))
        return dst

    def backproject_into(self, src, dst):
        self.calls.append("backproject_into")
        dst.write((slice(None), slice(None)), self.backproject(src.read((slice(None), slice(None)))).to(dst.dtype))
        return dst


def _problem(dtype=F64):
    op = MatrixOperator(dtype)
    b = op.project(torch.tensor([[-0.3, 0.7, 1.1], [0.2, -0.15, 0.9]], dtype=dtype))
    op.calls.clear()
    return op, b


def _cgls_reference(A, b, n):
    A, b = A.numpy(), b.numpy().ravel()
    x, r = np.zeros(A.shape[1]), b.copy()
    s = A.T @ r
    p, gamma, hist = s.copy(), s @ s, [np.linalg.norm(r)]
    for _ in range(n):
        q = A @ p
        alpha = gamma / (q @ q)
        x, r = x + alpha * p, r - alpha * q
        s = A.T @ r
        gamma, p = s @ s, s + (s @ s) / gamma * p
        hist.append(np.linalg.norm(r))
    return x, hist


def test_blocks_are_row_major_bounded_and_cover_every_element():
    shape = (3, 4, 5)
    for limit in (1, 3, 7, 20, 21, 60, 1000):
        seen = np.zeros(shape, dtype=int)
        order = []
        for w in _blocks.boxes(shape, limit):
            block = seen[w]
            assert block.size <= limit
            block += 1
            order.extend(np.arange(60).reshape(shape)[w].ravel().tolist())
        assert (seen == 1).all() and order == list(range(60))  # C order: fingerprints ignore the limit
    t = torch.rand(shape, dtype=F64)
    assert len({_blocks.fingerprint(t, n) for n in (1, 7, 1000)}) == 1


@pytest.mark.parametrize("name", ["cgls", "sirt", "tv_reconstruction"])
def test_checkpoint_layout_and_resume_equal_an_uninterrupted_run(name, tmp_path):
    op, b = _problem()
    fn = getattr(compat, name)
    full = fn(op, b, 5, rtol=0.0, atol=0.0)
    fn(op, b, 2, rtol=0.0, atol=0.0, checkpoint_directory=tmp_path / "ck")
    saved = tmp_path / "ck" / "step-000002" / "rank-00000"
    meta = json.loads((saved / "metadata.json").read_text())
    assert meta["iteration"] == 2 and meta["algorithm"] == name and len(meta["residual_history"]) == 3
    for state, spec in meta["states"].items():  # every state on disk is the one recorded
        assert np.load(saved / f"{state}.npy").shape == tuple(spec["shape"])
    assert not list(saved.glob("*.tmp"))
    op.calls.clear()
    resumed = fn(op, b, 5, rtol=0.0, atol=0.0, resume=saved)
    assert resumed.iterations == 5
    assert torch.equal(resumed.volume, full.volume)
    assert resumed.residual_history == full.residual_history
    if name == "cgls":  # and both equal the textbook recurrence
        x, hist = _cgls_reference(op.matrix, b, 5)
        np.testing.assert_allclose(resumed.volume.numpy().ravel(), x, rtol=1e-10)
        np.testing.assert_allclose(resumed.residual_history, hist, rtol=1e-10)


def test_checkpoint_layout_is_diffcts(tmp_path):
    diffct = pytest.importorskip("diffct")
    op, b = _problem()
    ours = compat.cgls(op, b, 3, rtol=0.0, atol=0.0, checkpoint_directory=tmp_path / "ours")
    theirs = diffct.cgls(op, b, 3, rtol=0.0, atol=0.0, checkpoint_directory=tmp_path / "theirs")
    torch.testing.assert_close(ours.volume, theirs.volume, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ours.residual_history, theirs.residual_history, rtol=1e-12)
    for root in ("ours", "theirs"):
        listing = sorted(str(p.relative_to(tmp_path / root)) for p in (tmp_path / root).rglob("*"))
        if root == "ours":
            first = listing
    assert first == listing  # the same folders and files, step by step
    for state in ("x", "s", "p", "r", "q"):
        np.testing.assert_allclose(np.load(tmp_path / "ours/step-000003/rank-00000" / f"{state}.npy"),
                                   np.load(tmp_path / "theirs/step-000003/rank-00000" / f"{state}.npy"),
                                   rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("change", ["data", "dtype", "spacing", "geometry", "algorithm", "iterations",
                                    "root", "manifest", "state-bytes", "relaxation"])
def test_resume_refuses_another_request_or_a_damaged_checkpoint_before_computing(change, tmp_path):
    op, b = _problem()
    name = "sirt" if change == "relaxation" else "cgls"
    getattr(compat, name)(op, b, 2, checkpoint_directory=tmp_path / "ck")
    saved = tmp_path / "ck" / "step-000002" / "rank-00000"
    fn, n, kwargs = getattr(compat, name), 4, {}
    if change == "data":
        b = b.clone()
        b[0, 0] += 1e-9
    elif change == "dtype":
        b = b.float()
    elif change == "spacing":
        op.voxel_spacing = 0.71
    elif change == "geometry":
        op._trajectory[0][1] += 1e-12
    elif change == "algorithm":
        fn = compat.sirt
    elif change == "iterations":
        n = 1
    elif change == "relaxation":
        kwargs["relaxation"] = 0.5
    else:
        path = saved / ("x.npy" if change == "state-bytes" else "metadata.json")
        if change == "state-bytes":
            arr = np.load(path)
            arr[0, 0] += 1.0
            np.save(path, arr)
        else:
            doc = json.loads(path.read_text())
            doc = [] if change == "root" else dict(doc, states=list(doc["states"]))
            path.write_text(json.dumps(doc))
    before = {p.name: p.read_bytes() for p in saved.iterdir()}
    op.calls.clear()
    with pytest.raises((ValueError, TypeError)):
        fn(op, b, n, resume=saved, checkpoint_directory=tmp_path / "next", **kwargs)
    assert op.calls == [] and not (tmp_path / "next").exists()
    assert before == {p.name: p.read_bytes() for p in saved.iterdir()}


def test_a_failed_state_write_publishes_no_metadata(tmp_path, monkeypatch):
    op, b = _problem()
    real = compat.NpyStore.write

    def failing(store, window, value, **kw):
        if store.path.name == "q.npy" and "step-" in str(store.path):
            raise OSError("disk full (injected)")
        return real(store, window, value, **kw)

    monkeypatch.setattr(compat.NpyStore, "write", failing)
    with pytest.raises(OSError, match="injected"):
        compat.cgls(op, b, 2, checkpoint_directory=tmp_path / "ck")
    assert list((tmp_path / "ck").rglob("metadata.json")) == []
    with pytest.raises(FileNotFoundError, match="resume: no checkpoint"):
        compat.cgls(op, b, 2, resume=tmp_path / "ck")


def test_a_directory_with_later_checkpoints_is_not_overwritten(tmp_path):
    op, b = _problem()
    compat.cgls(op, b, 3, checkpoint_directory=tmp_path / "ck")
    with pytest.raises(FileExistsError, match="holds checkpoints of an earlier run"):
        compat.cgls(op, b, 3, checkpoint_directory=tmp_path / "ck")
    # resuming the newest step into the same directory continues it
    again = compat.cgls(op, b, 5, resume=tmp_path / "ck", checkpoint_directory=tmp_path / "ck")
    assert again.iterations == 5 and (tmp_path / "ck" / "step-000005" / "rank-00000" / "metadata.json").is_file()


class _BoundedStore:
    """A diffct-protocol store over a tensor that refuses reads and writes above ``limit`` elements."""

    def __init__(self, tensor, limit):
        self.tensor, self.limit, self.shape, self.dtype = tensor, limit, tuple(tensor.shape), tensor.dtype
        self.reads = 0

    def read(self, w):
        block = self.tensor[w]
        assert block.numel() <= self.limit
        self.reads += 1
        return block.clone()

    def write(self, w, value, *, accumulate=False):
        assert value.numel() <= self.limit
        self.tensor[w] = value

    def flush(self):
        pass


def test_cgls_into_is_block_bounded_writes_the_callers_output_and_resumes(tmp_path):
    op, b = _problem()
    x_ref, hist = _cgls_reference(op.matrix, b, 4)
    source = _BoundedStore(b.clone(), 5)
    out = _BoundedStore(torch.full(op.volume_shape, float("nan"), dtype=F64), 5)
    seen = []
    res = compat.cgls_into(op, source, out, 4, workspace=tmp_path / "ws", block_elements=5, rtol=0.0, atol=0.0,
                           callback=lambda k, r, v: seen.append((k, v is out, v.tensor.clone())))
    assert res.volume is out and res.iterations == 4 and source.reads
    np.testing.assert_allclose(out.tensor.numpy().ravel(), x_ref, rtol=1e-10)
    np.testing.assert_allclose(res.residual_history, hist, rtol=1e-10)
    assert [k for k, _, _ in seen] == [1, 2, 3, 4] and all(same for _, same, _ in seen)
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["p.npy", "q.npy", "r.npy", "s.npy"]
    # interrupted, then resumed from its checkpoint into a fresh output: the same answer
    part = compat.NpyStore.create(tmp_path / "part.npy", op.volume_shape, dtype=F64)
    compat.cgls_into(op, b, part, 2, workspace=tmp_path / "ws2", block_elements=5, rtol=0.0, atol=0.0,
                     checkpoint_directory=tmp_path / "ck")
    done = torch.zeros(op.volume_shape, dtype=F64)
    r2 = compat.cgls_into(op, b, done, 4, workspace=tmp_path / "ws3", block_elements=5, rtol=0.0, atol=0.0,
                          resume=tmp_path / "ck" / "step-000002" / "rank-00000")
    assert r2.volume is done and r2.iterations == 4
    np.testing.assert_allclose(done.numpy().ravel(), x_ref, rtol=1e-10)


@pytest.mark.parametrize("problem", ["readonly", "workspace", "callback", "nonfinite"])
def test_cgls_into_refuses_before_touching_output_or_workspace(problem, tmp_path):
    op, b = _problem()
    np.save(tmp_path / "out.npy", np.full(op.volume_shape, 7.0))
    out = compat.NpyStore(tmp_path / "out.npy", mode="r" if problem == "readonly" else "r+")
    ws, kwargs = tmp_path / "ws", {}
    if problem == "workspace":
        ws.mkdir()
    elif problem == "callback":
        kwargs["callback"] = 7
    elif problem == "nonfinite":
        b = b.clone()
        b[-1, -1] = float("inf")
    with pytest.raises((ValueError, TypeError, PermissionError)):
        compat.cgls_into(op, b, out, 2, workspace=ws, block_elements=5, **kwargs)
    assert op.calls == [] and (np.load(tmp_path / "out.npy") == 7.0).all()
    assert ws.exists() == (problem == "workspace")


def test_npy_store_aliases_through_links_are_refused(tmp_path):
    P = compat.Projector(compat.circular_trajectory_2d_parallel(5), (5, 5), 5, beam="parallel")  # sinogram (5, 5)
    a = tmp_path / "a.npy"
    np.save(a, np.zeros((5, 5), dtype=np.float32))
    os.link(a, tmp_path / "hard.npy")
    (tmp_path / "soft.npy").symlink_to(a)
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "sino.npy", np.zeros(P.projection_shape, dtype=np.float32))
    for other in ("hard.npy", "soft.npy", "sub/../a.npy"):
        assert compat.NpyStore(a).location() == compat.NpyStore(tmp_path / other).location()
    assert compat.NpyStore(a).location() != compat.NpyStore(tmp_path / "sino.npy").location()
    # a store object passed as both input and output is refused as an alias, before any work
    guarded = _BoundedStore(torch.zeros(5, 5), 100)
    with pytest.raises(ValueError, match="alias"):
        P.backproject_into(guarded, guarded)
    with pytest.raises(PermissionError, match="read-only"):
        P.project_into(compat.NpyStore(a, mode="r"), compat.NpyStore(tmp_path / "sino.npy", mode="r"))


def _agreement_worker(rank, init, name, branch):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        op, b = _problem()
        op.world_size, op.rank, op.process_group = 2, rank, None
        kwargs = {}
        if branch == "x0" and rank == 1:
            kwargs["x0"] = torch.zeros(op.volume_shape, dtype=F64)
        if branch == "iterations":
            kwargs["iterations"] = 2 + rank
        else:
            kwargs["iterations"] = 2
        try:
            getattr(compat, name)(op, b, rtol=0.0, atol=0.0, **kwargs)
            outcome = None
        except ValueError as error:
            outcome = str(error)
        gathered = [None, None]
        dist.all_gather_object(gathered, (outcome, op.calls))
        assert gathered[0] == gathered[1] and gathered[0][0] is not None and gathered[0][1] == []
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name,branch", [("cgls", "x0"), ("sirt", "iterations")])
@pytest.mark.slow
@pytest.mark.distributed
def test_ranks_refuse_a_mixed_request_together_instead_of_hanging(name, branch, tmp_path):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    mp.spawn(_agreement_worker, args=((tmp_path / "rdv").resolve().as_uri(), name, branch), nprocs=2, join=True)
