"""The backprojection's z sub-chunks (kernels/joseph_backward_cpu.hpp, the ``-sNm`` back paths).

A seamless path walks each thread's z-chunk in sub-chunks and scatters every sample whole in the
sub-chunk that holds the lower z row of its stencil (the ray set up one row beyond the sub-chunk).
Here the sub-chunks are thin enough to split every thread's chunk, the cone steep enough that most
rays cross several of them, and the views axis-aligned exactly, so that rays lie on voxel planes:
planar in z on a sub-chunk edge (the central detector row on the central voxel plane) and planar in
x (the central column), whose axes the set-up swaps so that z becomes the stencil's b axis.  Each
path is checked against the reference backend (float32, float64), the exact adjoint identity and
bitwise repeated and batched calls, at 1 and 2 threads.
"""

import os
import re

import pytest
import torch

from ctbench import Projector
from ctbench.engine.cpu import library as cpu_library, joseph_paths, path_choice
from ctbench.geometry.generators import custom_trajectory_3d

F64 = torch.float64
# (D, H, W): planes of 147 x 148 voxels, so 1 MiB of float32 output is 12 planes (float64: 6) and
# the z-centre plane 12 (D odd) is a sub-chunk edge in both; W odd puts a voxel plane at x = 0.
SHAPE = (25, 148, 147)
DET = (41, 45)  # odd: the central row and column pass through z = 0 and through x = 0 (or y = 0)


# Planes of 272 x 271 voxels (288 KiB in float32): 4 MiB of output is 14 planes (float64: 7), so the
# "-fK" paths' floor of ceil(272 / K) planes per sub-chunk (17 for K = 16, 21 for K = 13) moves the
# sub-chunk edge of a 1-thread call.
WIDE = (24, 272, 271)


def _scan(shape=SHAPE):
    sid = 140.0 if shape == SHAPE else 250.0  # the source outside the volume in every view
    sdd = 2 * sid
    src, ctr, u, v = [], [], [], []
    for sx, sy in ((0.0, -1.0), (1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.6, -0.8)):
        s = torch.tensor([sx, sy, 0.0], dtype=F64)
        src.append(s * sid)
        ctr.append(-s * (sdd - sid))
        u.append(torch.tensor([-sy, sx, 0.0], dtype=F64) * 9.0)
        v.append(torch.tensor([0.0, 0.0, 1.0], dtype=F64) * 1.6)
    traj = custom_trajectory_3d(*(torch.stack(t) for t in (src, ctr, u, v)))
    kw = dict(voxel_spacing=1.0, detector_spacing=1.0)
    return Projector(traj, shape, DET, backend="cpu", **kw), Projector(traj, shape, DET, backend="reference", **kw)


@pytest.fixture(scope="module")
def seamless_paths():
    names = [n for n in joseph_paths.known_paths(cpu_library.load_cpu_library("joseph")).get("back", [])
             if "-s" in n]
    if not names:
        pytest.skip("this build has no seamless sub-chunk back paths (float32 pair paths need SSE2)")
    return names


def _check_paths(names, shape, monkeypatch, tol32=1e-5):
    """Each path against the reference (float64, float32: within ``tol32`` of the largest voxel), the
    adjoint identity, bitwise repeated and batched calls, at 1 and 2 threads; returns the float32
    backprojections by (path, threads)."""
    cpu, ref = _scan(shape)
    g = torch.Generator().manual_seed(5)
    y = torch.rand((2, *cpu.projection_shape), generator=g, dtype=F64)
    x = torch.rand(shape, generator=g, dtype=F64)
    want = ref.backproject(y)
    assert bool((want[0] > 0).any()) and bool((want[0] == 0).any())
    scale = float(want.abs().max())
    got = {}
    try:
        for name in names:
            monkeypatch.setenv(path_choice.PATH_ENV, f"back={name}")
            for threads in (1, 2):
                torch.set_num_threads(threads)
                b64, b32 = cpu.backproject(y), cpu.backproject(y.float())
                assert float((b64 - want).abs().max()) <= 1e-12 * scale, (name, threads)
                assert float((b32.double() - want).abs().max()) <= tol32 * scale, (name, threads)
                lhs = float((cpu.project(x) * y[0]).sum())
                rhs = float((x * cpu.backproject(y[0])).sum())
                assert abs(lhs - rhs) <= 1e-12 * abs(lhs), (name, threads)
                assert torch.equal(cpu.backproject(y.float())[1], b32[1]), (name, threads)
                assert torch.equal(cpu.backproject(y[1].float()), b32[1]), (name, threads)
                got[name, threads] = b32
    finally:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    return got


@pytest.mark.slow
def test_seamless_sub_chunks_match_reference_and_are_the_adjoint(seamless_paths, monkeypatch):
    _check_paths(seamless_paths + ["pairs-padded"], SHAPE, monkeypatch)


@pytest.mark.slow
def test_depth_floor_paths_move_the_sub_chunk_edges_and_stay_exact(seamless_paths, monkeypatch):
    """The "-fK" paths (sub-chunks of at least max(H, W) / K planes) on planes large enough for the
    floor to bind: exact as every path, and at 1 thread not bitwise the plain path's result (their
    sub-chunk edge sits elsewhere, so the rays crossing it are set up against other windows: a float32
    rounding)."""
    names = [n for n in seamless_paths if re.search(r"-f\d+$", n)]
    if not names:
        pytest.skip("this build has no -fK back paths")
    # float32: 2.7e-5 of the largest voxel for every back path alike (pairs-padded too), at a voxel 9 from
    # the x edge: the float32 ray coefficients of a 271-voxel-wide volume, not the sub-chunks
    got = _check_paths(names + ["pairs-padded-s4m", "pairs-padded"], WIDE, monkeypatch, tol32=5e-5)
    for name in names:
        assert not torch.equal(got[name, 1], got["pairs-padded-s4m", 1]), name


@pytest.mark.slow
def test_planar_ray_on_a_sub_chunk_edge_is_scattered_once(seamless_paths, monkeypatch):
    """One pixel: the central ray of a view along y lies on the z = 0 voxel plane (plane 12, the
    first voxel of the second float32 sub-chunk, inside the first one's window); it must land
    there once, with the reference's weights."""
    cpu, ref = _scan()
    y = torch.zeros(cpu.projection_shape, dtype=F64)
    y[0, DET[0] // 2, DET[1] // 2] = 1.0
    y[0, DET[0] // 2, DET[1] // 2 + 3] = 1.0  # a ray planar in z, off the x = 0 plane
    y[2, DET[0] // 2 + 2, DET[1] // 2] = 1.0  # on the x = 0 plane, oblique in z: b is z after the swap
    want = ref.backproject(y)
    assert float(want[12].sum()) > 0 and float(want[11].abs().sum()) == 0.0
    for name in seamless_paths:
        monkeypatch.setenv(path_choice.PATH_ENV, f"back={name}")
        torch.set_num_threads(1)
        try:
            got = cpu.backproject(y.float()).double()
        finally:
            torch.set_num_threads(max(1, os.cpu_count() or 1))
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max()), name
        assert abs(float(got.sum()) - float(want.sum())) <= 1e-5 * float(want.sum()), name
