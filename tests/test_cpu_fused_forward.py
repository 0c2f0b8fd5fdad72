"""The -fused forward paths (kernels/joseph_forward_cpu.hpp, fused_group): the ray set-up in AVX-512
or AVX2 lanes and the edge planes traced in lanes (every fused path this build has), checked against
the pure-torch reference backend on the cases their code treats apart: views at 45 degrees (a row group's rays split between two dominant axes),
odd detectors whose centre row and column are parallel to a voxel plane (lanes handed to make_ray),
b axes too narrow for pair reads, z-slab windows whose sum is the whole projection, and detector tiles;
and the -fused-tiles paths' view runs traced in plane tiles (volumes whose bands exceed the L2), and the
-pad paths' rays through zero-bordered copies of the slab (scans with at least as many rays as voxels).
"""

import math
import os

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.cpu import library as cpu_library, joseph_paths, path_choice
from ctbench.engine.cpu.joseph_paths import FORWARD_ARGS

F64 = torch.float64
FUSED = ("avx512-gather-fused", "avx512-gather-fused-bands", "avx512-gather-fused-tiles", "avx512-gather-fused-pad-tiles",
         "avx2-gather-fused", "avx2-gather-fused-bands", "avx2-gather-fused-tiles", "avx2-gather-fused-pad-tiles")
TILED = ("avx512-gather-fused-tiles", "avx512-gather-fused-pad-tiles", "avx2-gather-fused-tiles",
         "avx2-gather-fused-pad-tiles")
PADDED = ("avx512-gather-fused-pad-tiles", "avx2-gather-fused-pad-tiles")


@pytest.fixture(scope="module")
def fused():
    known = joseph_paths.known_paths(cpu_library.load_cpu_library("joseph")).get("forward", [])
    names = [n for n in FUSED if n in known]
    if not names:
        pytest.skip("this build has no AVX-512 or AVX2 lanes (no -fused forward paths)")
    return names


def _pair(shape, det, angles, sid=None, spacing=(1.0, 1.1, 0.9)):
    angles = torch.tensor(angles, dtype=F64)
    sid = sid or 3.0 * max(shape)
    traj = circular_trajectory_3d(angles.numel(), sid, 2 * sid, angles=angles, dtype=F64)
    kw = dict(voxel_spacing=spacing, detector_spacing=(2.1, 1.7))
    return (Projector(traj, shape, det, backend="cpu", **kw), Projector(traj, shape, det, backend="reference", **kw))


def _close32(got, want):
    err = (got.double() - want).abs()
    return bool((err <= 1e-5 * want.abs() + 2e-6 * float(want.abs().max())).all())


@pytest.mark.parametrize("shape,det,angles", [
    # 45 degrees and near it: a 16-ray group's dominant axis changes inside the group (two passes)
    ((12, 40, 40), (57, 13), [math.pi / 4, math.pi / 4 + 0.01, 3 * math.pi / 4 - 0.02, 1.1]),
    # odd detector on axis-aligned views: the centre row / column are parallel to voxel planes (make_ray)
    ((9, 33, 31), (33, 9), [0.0, math.pi / 2, math.pi, 0.7]),
    # b axes of width 1 and 2 (no room for a clamped pair read): the 32-bit checked stencil
    ((7, 2, 30), (19, 11), [0.0, 0.4, math.pi / 2, 2.5]),
    ((7, 30, 1), (19, 11), [math.pi / 2, 1.9, 0.05]),
])
def test_fused_forward_matches_reference(fused, monkeypatch, shape, det, angles):
    cpu, ref = _pair(shape, det, angles)
    x = torch.rand((2, *shape), generator=torch.Generator().manual_seed(5), dtype=F64) + 0.1
    want = ref.project(x)
    assert bool((want > 0).any())
    for name in fused:
        monkeypatch.setenv(path_choice.PATH_ENV, f"forward={name}")
        got = cpu.project(x.float())
        assert _close32(got, want), (name, float((got.double() - want).abs().max()))
        # per item bitwise the same as in the batch
        assert torch.equal(cpu.project(x[1].float()), got[1]), name


def _geom(cpu):
    """The kernels' float32 geometry of a _pair projector (detector steps of 2.1 and 1.7)."""
    traj = cpu.trajectory
    return [t.to(torch.float32).contiguous() for t in
            (traj.source, traj.detector_center, traj.detector_u * 2.1, traj.detector_v * 1.7)]


def _kernel_forward(vol, z0, z1, D, geom, det, views, spacing, out, accumulate, tile=None, threads=1):
    lib = cpu_library.load_cpu_library("joseph")
    joseph_paths.apply(lib)
    fwd = getattr(lib, "joseph_forward_f32")
    fwd.argtypes, fwd.restype = FORWARD_ARGS, None
    U, V = det
    u0, u1, v0, v1 = tile or (0, U, 0, V)
    dz, dy, dx = spacing
    _, H, W = vol.shape
    fwd(vol.data_ptr(), vol.numel(), 1, D, H, W, z0, z1, dx, dy, dz, *[t.data_ptr() for t in geom], 1, views, U, V,
        u0, u1, v0, v1, out.data_ptr(), int(accumulate), threads)


def test_fused_slab_windows_add_up_to_the_projection(fused, monkeypatch):
    """The kernel's z-slab windows (rays clipped to [z0, z1): edge planes where they cross the slab's
    faces): the sum over slabs that tile the volume equals the reference projection, at 1 and 2 threads,
    and for a detector tile."""
    D, H, W = 21, 36, 34
    det, angles = (41, 29), [0.2, math.pi / 4, 1.3, 2.9]
    cpu, ref = _pair((D, H, W), det, angles, spacing=(1.0, 1.0, 1.0))
    x = torch.rand((D, H, W), generator=torch.Generator().manual_seed(6), dtype=F64) + 0.1
    want = ref.project(x)
    geom = _geom(cpu)
    xf = x.float()
    for name in fused:
        monkeypatch.setenv(path_choice.PATH_ENV, f"forward={name}")
        for threads in (1, 2):
            out = torch.zeros((len(angles), *det), dtype=torch.float32)
            for z0, z1 in ((0, 5), (5, 6), (6, 14), (14, D)):
                _kernel_forward(xf[z0:z1].contiguous(), z0, z1, D, geom, det, len(angles), (1.0, 1.0, 1.0), out,
                                accumulate=True, threads=threads)
            assert _close32(out, want), (name, threads, float((out.double() - want).abs().max()))
            tile = torch.zeros((len(angles), 17, 10), dtype=torch.float32)
            _kernel_forward(xf, 0, D, D, geom, det, len(angles), (1.0, 1.0, 1.0), tile, accumulate=False,
                            tile=(20, 37, 5, 15), threads=threads)
            assert _close32(tile, want[:, 20:37, 5:15]), (name, threads)


def test_tiled_forward_matches_reference(fused, monkeypatch):
    """The -fused-tiles paths on planes large enough for view tiles (a band of 8 rows of 260 x 250 planes
    exceeds 2 MiB; 260 planes: 5 tiles): a short last band and view run, a 45-degree view (groups in two
    passes), axis-aligned views with an odd detector (lanes left to make_ray), against the reference; per
    item and at 2 threads bitwise the same as in the batch at 1 thread; a detector tile."""
    tiled = [n for n in TILED if n in fused]
    if not tiled:
        pytest.skip("no -fused-tiles path in this build")
    shape, det = (7, 260, 250), (61, 9)
    angles = [0.0, 0.3, math.pi / 4, 1.2, math.pi / 2, 2.6]
    cpu, ref = _pair(shape, det, angles, sid=700.0, spacing=(1.0, 1.0, 1.0))
    x = torch.rand((2, *shape), generator=torch.Generator().manual_seed(7), dtype=F64) + 0.1
    want = ref.project(x)
    assert bool((want > 0).all())
    monkeypatch.setenv(path_choice.PATH_ENV, "forward=avx2-gather-fused-bands")
    banded = cpu.project(x.float())
    geom = _geom(cpu)
    try:
        for name in tiled:
            monkeypatch.setenv(path_choice.PATH_ENV, f"forward={name}")
            torch.set_num_threads(1)
            got = cpu.project(x.float())
            assert _close32(got, want), (name, float((got.double() - want).abs().max()))
            # segment sums round differently from whole rays: a bitwise match would mean no tiles ran
            assert not torch.equal(got, banded), name
            assert torch.equal(cpu.project(x[1].float()), got[1]), name
            torch.set_num_threads(2)
            assert torch.equal(cpu.project(x.float()), got), name
            # a detector tile of 8 rows (still tiled; its row groups start at the tile's edge)
            tile = torch.zeros((len(angles), 23, 8), dtype=torch.float32)
            _kernel_forward(x[0].float().contiguous(), 0, shape[0], shape[0], geom, det, len(angles),
                            (1.0, 1.0, 1.0), tile, accumulate=False, tile=(30, 53, 1, 9), threads=2)
            assert _close32(tile, want[0][:, 30:53, 1:9]), name
    finally:
        torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.mark.parametrize("shape,det,angles", [
    # rays entering through every face, a 45-degree view (two passes), axis-aligned views with an odd detector
    ((13, 30, 28), (47, 23), [0.0, 0.25, math.pi / 4, 1.3, math.pi / 2, 2.2, math.pi, 4.0, 4.4, 5.0, 5.5, 6.1]),
    # b axes of 1 and 2 voxels (no interior planes without the border)
    ((7, 2, 30), (19, 11), [0.0, 0.4, math.pi / 2, 2.5]),
    ((7, 30, 2), (19, 11), [math.pi / 2, 1.9, 0.05]),
])
def test_padded_forward_matches_reference(fused, monkeypatch, shape, det, angles):
    """The -pad paths on scans with at least as many rays as voxels (where they copy the slab with a zero
    border): against the reference, per item bitwise as in the batch, z-slab
    windows adding up to the projection, at 1 and 2 threads."""
    padded = [n for n in PADDED if n in fused]
    if not padded:
        pytest.skip("no -pad path in this build")
    D, H, W = shape
    assert len(angles) * det[0] * det[1] >= D * H * W  # at least as many rays as voxels: the copies are made
    cpu, ref = _pair(shape, det, angles, spacing=(1.0, 1.0, 1.0))
    x = torch.rand((2, *shape), generator=torch.Generator().manual_seed(8), dtype=F64) + 0.1
    want = ref.project(x)
    assert bool((want > 0).any()) and bool((want == 0).any())
    monkeypatch.setenv(path_choice.PATH_ENV, "forward=avx2-gather-fused-bands")
    unpadded = cpu.project(x.float())
    geom = _geom(cpu)
    xf = x[0].float()
    for name in padded:
        monkeypatch.setenv(path_choice.PATH_ENV, f"forward={name}")
        got = cpu.project(x.float())
        assert _close32(got, want), (name, float((got.double() - want).abs().max()))
        # edge samples through the pair loop round differently from the checked stencil's: equal would mean
        # the copies were not used
        assert not torch.equal(got, unpadded), name
        assert torch.equal(cpu.project(x[1].float()), got[1]), name
        for threads in (1, 2):
            out = torch.zeros((len(angles), *det), dtype=torch.float32)
            cuts = (0, D // 3, D // 3 + 1, D)
            for z0, z1 in zip(cuts[:-1], cuts[1:]):
                _kernel_forward(xf[z0:z1].contiguous(), z0, z1, D, geom, det, len(angles), (1.0, 1.0, 1.0), out,
                                accumulate=True, threads=threads)
            assert _close32(out, want[0]), (name, threads, float((out.double() - want[0]).abs().max()))
