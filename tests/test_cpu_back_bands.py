"""The backprojection's banded paths (``-bR``: detector rows in bands of R, every view per band) and
the z-row-pair accumulators (``dup-``), kernels/joseph_backward_cpu.hpp.

A banded path visits the same rays as the view-by-view ones in another order (band, view, row), so
its float32 sums differ from theirs by rounding only.  A ``dup-`` path keeps, per accumulator slot
z, the rows z and z + 1 of each voxel side by side; row z of the output is the first half of slot z
plus the second half of slot z - 1, whose samples another z-chunk (a thread's halo plane) may have
scattered.  Here the scan has more rays than voxels (so the padded accumulators, and with them the
pair slots, are taken), an odd depth whose centre plane carries rays planar in z (the central
detector row) and 1, 2 and 3 threads (0, 1 and 2 z-chunk edges, each a
halo): each path against the reference backend (float64 exactly, float32 within rounding), the exact
adjoint identity, and bitwise repeated and batched calls.  The ``-rs-`` paths split 2 threads' work by
detector rows instead (the z-chunks at 3 threads, where the parts would overlap too much).
"""

import math
import os
import re

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.cpu import library as cpu_library, joseph_paths, path_choice

F64 = torch.float64
SHAPE = (25, 40, 38)
DET = (45, 33)  # odd: the central row passes through z = 0, the centre of voxel plane 12


@pytest.fixture(scope="module")
def band_paths():
    names = [n for n in joseph_paths.known_paths(cpu_library.load_cpu_library("joseph")).get("back", [])
             if re.search(r"-b\d+$", n)]
    if not names:
        pytest.skip("this build has no banded back paths (float32 pair paths need SSE2)")
    return names


def _scan(n_views=24, offset=0.05):
    # the central detector row's rays are planar in z on plane 12 in every view.  Angles turned by
    # 0.05 rad: unturned, one detector column of the 45-degree view runs exactly along the voxel
    # diagonal, a tie of the dominant axis that the backends break differently (see
    # test_a_dominant_axis_tie_is_the_only_difference_from_the_reference)
    angles = torch.arange(n_views, dtype=F64) * (2 * math.pi / n_views) + offset
    traj = circular_trajectory_3d(n_views, 90.0, 180.0, angles=angles, dtype=F64)
    kw = dict(voxel_spacing=(1.0, 1.1, 0.9), detector_spacing=(2.0, 1.7))
    return Projector(traj, SHAPE, DET, backend="cpu", **kw), Projector(traj, SHAPE, DET, backend="reference", **kw)


@pytest.mark.slow
def test_banded_and_pair_slot_paths_match_reference_and_are_the_adjoint(band_paths, monkeypatch):
    cpu, ref = _scan()
    assert 24 * DET[0] * DET[1] >= math.prod(SHAPE) / 4  # the padded accumulators are taken
    g = torch.Generator().manual_seed(7)
    y = torch.rand((2, *cpu.projection_shape), generator=g, dtype=F64)
    x = torch.rand(SHAPE, generator=g, dtype=F64)
    want = ref.backproject(y)
    scale = float(want.abs().max())
    assert float(want[0, 12].abs().sum()) > 0
    try:
        for name in band_paths + ["pairs-padded-s4m-f16"]:
            monkeypatch.setenv(path_choice.PATH_ENV, f"back={name}")
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                b64, b32 = cpu.backproject(y), cpu.backproject(y.float())
                assert float((b64 - want).abs().max()) <= 1e-12 * scale, (name, threads)
                assert float((b32.double() - want).abs().max()) <= 1e-5 * scale, (name, threads)
                # every plane of the slab, the chunk edges' included: nothing lost or counted twice
                per_plane = (b32.double() - want).abs().sum(dim=(2, 3)).max()
                assert float(per_plane) <= 1e-5 * float(want.abs().sum(dim=(2, 3)).max()), (name, threads)
                lhs = float((cpu.project(x) * y[0]).sum())
                rhs = float((x * cpu.backproject(y[0])).sum())
                assert abs(lhs - rhs) <= 1e-12 * abs(lhs), (name, threads)
                assert torch.equal(cpu.backproject(y.float())[1], b32[1]), (name, threads)
                assert torch.equal(cpu.backproject(y[1].float()), b32[1]), (name, threads)
    finally:
        torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.mark.slow
def test_rays_planar_on_a_chunk_edge_land_once(band_paths, monkeypatch):
    """Only the central detector row, whose rays lie on voxel plane 12, and its neighbour: the rows a
    halo or a pair slot's second half carries, alone."""
    cpu, ref = _scan()
    y = torch.zeros(cpu.projection_shape, dtype=F64)
    y[:, :, DET[1] // 2] = 1.0
    y[:, :, DET[1] // 2 + 1] = 0.5
    want = ref.backproject(y)
    try:
        for name in band_paths:
            monkeypatch.setenv(path_choice.PATH_ENV, f"back={name}")
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                got = cpu.backproject(y.float()).double()
                assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max()), (name, threads)
                assert abs(float(got.sum()) - float(want.sum())) <= 1e-5 * float(want.sum()), (name, threads)
    finally:
        torch.set_num_threads(max(1, os.cpu_count() or 1))


def test_measurement_ranks_the_banded_back_paths(band_paths):
    """The measurement's slab (16 planes, in cache) cannot show what the bands pay for on a real
    volume, so where the library has banded back paths only they are ranked."""
    known = joseph_paths.known_paths(cpu_library.load_cpu_library("joseph"))
    # a z-chunk path beside its row-split twin (-rs-) is not ranked: on the 1-thread slab they run the same code
    twins = [n for n in band_paths if "-rs-" not in n and re.sub(r"-b(\d+)$", r"-rs-b\1", n) in band_paths]
    assert "pairs-padded-b8" in twins
    assert joseph_paths.candidates("back", known["back"]) == [n for n in band_paths if n not in twins]
    # the build's default (its first path) is banded with the row split: pair slots where the build has
    # hand-vectorised pair stencils (AVX-512, or AVX2 with FMA)
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    simd = (" avx512f" in flags or (" avx2" in flags and " fma" in flags)) and \
        os.environ.get("CTBENCH_MARCH", "native") in ("native", "haswell", "x86-64-v3")
    assert known["back"][0] == ("dup-padded-rs-b8" if simd else "pairs-padded-rs-b8")
    assert {"pairs-padded-rs-b8", "pairs-padded-b8", "pairs-padded-b4"} <= set(band_paths)


@pytest.mark.slow
def test_row_split_is_taken_at_two_threads_and_falls_back_at_three(band_paths, monkeypatch):
    """The -rs- paths split the detector rows between 2 threads (this scan's two parts reach 15 + 15 of its
    25 planes) and take the z-chunks at 3 (9 + 23 + 9 planes: too much overlap).  A split sums each voxel in
    another order than its z-chunk twin, so its float32 result differs from the twin's in rounding at
    2 threads; at 1 thread (no split) and where it falls back (3 threads) the two run the same code."""
    cpu, ref = _scan()
    g = torch.Generator().manual_seed(3)
    y = torch.rand((1, *cpu.projection_shape), generator=g, dtype=torch.float32)
    want = ref.backproject(y.double())
    pairs = [(n, n.replace("-rs-", "-")) for n in band_paths if "-rs-" in n and n.replace("-rs-", "-") in band_paths]
    assert pairs
    try:
        for rs, twin in pairs:
            got = {}
            for name in (rs, twin):
                monkeypatch.setenv(path_choice.PATH_ENV, f"back={name}")
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    got[name, threads] = cpu.backproject(y)
            assert torch.equal(got[rs, 1], got[twin, 1]), rs
            assert not torch.equal(got[rs, 2], got[twin, 2]), rs  # the row split ran
            assert torch.equal(got[rs, 3], got[twin, 3]), rs      # the z-chunks ran
            err = float((got[rs, 2].double() - want).abs().max())
            assert err <= 1e-5 * float(want.abs().max()), rs
    finally:
        torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.mark.slow
def test_a_dominant_axis_tie_is_the_only_difference_from_the_reference():
    """Unturned views of this scan: in the 45-degree view (k = 3) detector column 13's rays have
    |dx / 0.9| = |dy / 1.1| exactly (the voxel diagonal).  The CPU kernels scale by the reciprocal
    spacing, which rounds the two equal and takes x (the first); the reference divides, rounds
    |fd_y| one unit in the last place above and takes y.  Both are Joseph projectors of that ray, each
    the exact adjoint of its own backprojection; every other ray agrees to rounding, and a turn by
    1e-9 rad removes the tie."""
    cpu, ref = _scan(offset=0.0)
    g = torch.Generator().manual_seed(3)
    x = torch.rand(SHAPE, generator=g, dtype=F64)
    y = torch.rand(cpu.projection_shape, generator=g, dtype=F64)
    fc, fr = cpu.project(x), ref.project(x)
    scale = float(fr.abs().max())
    tie = torch.zeros(cpu.projection_shape, dtype=torch.bool)
    tie[3, 13, :] = True
    assert float((fc - fr).abs()[tie].max()) > 1e-3 * scale  # the two interpolations of the tied rays
    assert float((fc - fr).abs()[~tie].max()) <= 1e-12 * scale
    # the backprojections of everything but the tied rays agree; each backend is its own exact adjoint
    y_off = y.masked_fill(tie, 0.0)
    assert float((cpu.backproject(y_off) - ref.backproject(y_off)).abs().max()) <= 1e-12 * float(
        ref.backproject(y_off).abs().max())
    for p in (cpu, ref):
        lhs, rhs = float((p.project(x) * y).sum()), float((x * p.backproject(y)).sum())
        assert abs(lhs - rhs) <= 1e-12 * abs(lhs)
    cpu_t, ref_t = _scan(offset=1e-9)
    assert float((cpu_t.project(x) - ref_t.project(x)).abs().max()) <= 1e-12 * scale


@pytest.mark.slow
def test_view_tiles_keep_every_sample(band_paths, monkeypatch):
    """Planes of 232 x 232 voxels: a band's accumulator planes exceed 2 MiB, so the -rs- paths scatter runs of
    views tile by tile of their rays' dominant axis.  A voxel then still gets its rays' additions in the same
    order (one tile holds it), so at 1 thread the result is bitwise the untiled z-chunk path's; against the
    reference, the exact adjoint identity (float64, tiled too) and batched against per item at 1 and 2 threads."""
    shape, det = (4, 232, 232), (96, 48)
    traj = circular_trajectory_3d(12, 300.0, 600.0, angles=torch.arange(12, dtype=F64) * 0.52 + 0.05, dtype=F64)
    kw = dict(voxel_spacing=(1.0, 1.0, 1.0), detector_spacing=(5.0, 0.5))
    cpu, ref = (Projector(traj, shape, det, backend=b, **kw) for b in ("cpu", "reference"))
    assert 12 * det[0] * det[1] >= math.prod(shape) / 4 and 10 * shape[1] * shape[2] * 4 > 2 << 20
    g = torch.Generator().manual_seed(11)
    y = torch.rand((2, *cpu.projection_shape), generator=g, dtype=F64)
    x = torch.rand(shape, generator=g, dtype=F64)
    want = ref.backproject(y)
    scale = float(want.abs().max())
    tiled = [n for n in band_paths if "-rs-" in n]
    assert tiled
    try:
        for name in tiled:
            # the untiled z-chunk twin: the same bands (and pair slots, which planes this size do not take)
            twin = name.replace("-rs-", "-")
            assert twin in band_paths, name
            torch.set_num_threads(1)
            monkeypatch.setenv(path_choice.PATH_ENV, f"back={twin}")
            untiled = cpu.backproject(y.float())
            monkeypatch.setenv(path_choice.PATH_ENV, f"back={name}")
            for threads in (1, 2):
                torch.set_num_threads(threads)
                b32 = cpu.backproject(y.float())
                if threads == 1:
                    assert torch.equal(b32, untiled), name
                assert float((b32.double() - want).abs().max()) <= 1e-5 * scale, (name, threads)
                assert float((cpu.backproject(y) - want).abs().max()) <= 1e-12 * scale, (name, threads)
                lhs = float((cpu.project(x) * y[0]).sum())
                rhs = float((x * cpu.backproject(y[0])).sum())
                assert abs(lhs - rhs) <= 1e-12 * abs(lhs), (name, threads)
                assert torch.equal(cpu.backproject(y[1].float()), b32[1]), (name, threads)
    finally:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
