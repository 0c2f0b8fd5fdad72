"""diffct's ``view_chunk_size`` is a memory bound the user sets: ``fdk_into``, ``fbp_into`` and
``cgls_into`` never read more views of the measurements at once (instrumented reads, issue 25)."""

from __future__ import annotations

import math

import pytest
import torch

import ctbench

F64 = torch.float64


class RecordingStore:
    """A block store that records how many views (first axis) every read covers."""

    def __init__(self, tensor):
        self.inner = ctbench.TensorStore(tensor)
        self.shape, self.dtype, self.chunks = self.inner.shape, self.inner.dtype, getattr(self.inner, "chunks", None)
        self.views_per_read = []

    def read(self, window=None):
        block = self.inner.read(window)
        self.views_per_read.append(int(block.shape[0]))
        return block

    def __getattr__(self, name):
        return getattr(self.__dict__["inner"], name)


def _cone(n=10):
    return ctbench.circular_trajectory_3d(n, 60.0, 90.0, dtype=F64), (4, 6, 6), (8, 5)


def _parallel(n=10):
    return ctbench.circular_trajectory_2d_parallel(n, dtype=F64), (6, 6), 9


@pytest.mark.parametrize("chunk", [1, 3, 4])
def test_fdk_into_reads_at_most_view_chunk_size_views(chunk):
    tr, vol_shape, det = _cone()
    torch.manual_seed(0)
    sino = torch.rand(tr.n_views, *det, dtype=F64)
    angles = torch.linspace(0, 2 * math.pi, tr.n_views + 1, dtype=F64)[:-1]
    source = RecordingStore(sino)
    out = torch.full(vol_shape, float("nan"), dtype=F64)
    got = ctbench.fdk_into(source, out, tr, vol_shape, angles, precision="float64", view_chunk_size=chunk)
    assert got is out
    assert source.views_per_read and max(source.views_per_read) <= chunk
    assert sum(source.views_per_read) >= tr.n_views  # every view was read
    want = ctbench.fdk(sino, tr, vol_shape, angles, precision="float64")
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)


def test_fbp_into_reads_at_most_view_chunk_size_views():
    tr, vol_shape, det = _parallel()
    torch.manual_seed(1)
    sino = torch.rand(tr.n_views, det, dtype=F64)
    angles = torch.linspace(0, math.pi, tr.n_views + 1, dtype=F64)[:-1]
    source = RecordingStore(sino)
    out = ctbench.TensorStore(torch.zeros(vol_shape, dtype=F64))
    ctbench.fbp_into(source, out, tr, vol_shape, angles, beam="parallel", precision="float64", view_chunk_size=2)
    assert source.views_per_read and max(source.views_per_read) <= 2
    want = ctbench.fbp(sino, tr, vol_shape, angles, beam="parallel", precision="float64")
    torch.testing.assert_close(out.read(None), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", [_cone, _parallel], ids=["cone-3d", "parallel-2d"])
def test_cgls_into_reads_at_most_view_chunk_size_views(case, tmp_path):
    tr, vol_shape, det = case()
    P = ctbench.Projector(tr, vol_shape, det, view_chunk_size=3)
    torch.manual_seed(2)
    x = torch.rand(vol_shape, dtype=F64)
    b = P.project(x)
    source = RecordingStore(b)
    out = torch.zeros(vol_shape, dtype=F64)
    res = ctbench.cgls_into(P, source, out, 4, workspace=tmp_path / "work")
    assert res.iterations == 4
    assert source.views_per_read and max(source.views_per_read) <= 3
    # the same iterates as in-memory CGLS
    want = ctbench.cgls(P, b, 4)
    torch.testing.assert_close(out, want.volume, rtol=1e-6, atol=1e-8)
