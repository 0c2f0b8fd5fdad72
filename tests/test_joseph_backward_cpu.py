"""The CPU Joseph backprojection (kernels/joseph_backward_cpu.hpp) against the reference backend and its forward.

The kernel scatters a ray's interior planes in blocks of 64 (stencils computed in
a vectorised loop, then the read-modify-writes) and splits z into one chunk per
thread with boundaries balanced by an estimate of the work: these tests use rays
long enough for several blocks and a remainder, along each dominant axis, at
1, 2 and 3 threads, and check the exact-adjoint identity, the reference backend,
determinism (repeated and batched calls) and slab windows.
"""

import math

import pytest
import torch

from ctbench import Projector, circular_trajectory_2d_fan, circular_trajectory_3d, custom_trajectory_3d
from ctbench.engine import Rays, Tile, VolumeGrid, get_backend
from kernel_builds import joseph_library_for

AXES = {"x": 0, "y": 1, "z": 2}
LONG = 150  # interior planes of the long axis: two full blocks of 64 and a remainder


@pytest.fixture
def threads():
    """Set torch's (and so the CPU kernels') thread count for one test; restored afterwards."""
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


def _axis_trajectory(axis: str, cone: bool, n_views: int = 5, dtype=torch.float64):
    """Views whose rays run mostly along `axis` (world x, y or z), tilted a little differently per view."""
    a = AXES[axis]
    g = torch.Generator().manual_seed(7 + a)
    src, ctr, us, vs = [], [], [], []
    for k in range(n_views):
        d = torch.zeros(3, dtype=torch.float64)
        d[a] = 1.0 if k % 2 == 0 else -1.0
        d += 0.35 * (torch.rand(3, generator=g, dtype=torch.float64) - 0.5) * (1 - torch.eye(3, dtype=torch.float64)[a])
        d = d / d.norm()
        helper = torch.tensor([0.0, 0.0, 1.0] if axis != "z" else [1.0, 0.0, 0.0], dtype=torch.float64)
        u = torch.linalg.cross(d, helper)
        u = u / u.norm()
        v = torch.linalg.cross(d, u)
        if cone:
            src.append(-400.0 * d)
            ctr.append(200.0 * d + 0.3 * (torch.rand(3, generator=g, dtype=torch.float64) - 0.5))
        else:
            src.append(d)
            ctr.append(0.3 * (torch.rand(3, generator=g, dtype=torch.float64) - 0.5))
        us.append(u)
        vs.append(v)
    return custom_trajectory_3d(torch.stack(src), torch.stack(ctr), torch.stack(us), torch.stack(vs),
                                beam="cone" if cone else "parallel", dtype=dtype)


def _shape(axis: str):
    """(D, H, W): long along the rays' axis, 6 x 7 across."""
    return {"x": (6, 7, LONG), "y": (6, LONG, 7), "z": (LONG, 6, 7)}[axis]


def _pair(axis, cone, dtype):
    traj = _axis_trajectory(axis, cone, dtype=dtype)
    det_spacing = (1.2, 1.1) if cone else (0.8, 0.7)
    kw = dict(voxel_spacing=(1.0, 0.9, 1.1), detector_spacing=det_spacing)
    det = (11, 12)
    return (Projector(traj, _shape(axis), det, backend="cpu", **kw),
            Projector(traj, _shape(axis), det, backend="reference", **kw))


@pytest.mark.parametrize("cone", [True, False])
@pytest.mark.parametrize("axis", ["x", "y", "z"])
def test_backprojection_matches_reference_along_each_dominant_axis(axis, cone, threads):
    cpu, ref = _pair(axis, cone, torch.float64)
    g = torch.Generator().manual_seed(3)
    y = torch.rand(cpu.projection_shape, generator=g, dtype=torch.float64)
    expected = ref.backproject(y)
    assert expected.abs().max() > 0
    for n in (1, 2, 3):
        threads(n)
        got = cpu.backproject(y)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10 * expected.abs().max().item())


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-11), (torch.float32, 2e-6)])
@pytest.mark.parametrize("cone", [True, False])
@pytest.mark.parametrize("axis", ["x", "y", "z"])
def test_exact_adjoint_along_each_dominant_axis(axis, cone, dtype, tol, threads):
    cpu, _ = _pair(axis, cone, dtype)
    g = torch.Generator().manual_seed(11)
    x = torch.rand(cpu.volume_shape, generator=g, dtype=torch.float64).to(dtype)
    y = torch.rand(cpu.projection_shape, generator=g, dtype=torch.float64).to(dtype)
    for n in (1, 2):
        threads(n)
        lhs = (cpu.project(x).double() * y.double()).sum().item()
        rhs = (x.double() * cpu.backproject(y).double()).sum().item()
        assert lhs > 0
        assert abs(lhs - rhs) <= tol * abs(lhs), (axis, cone, n, lhs, rhs)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_repeated_and_batched_calls_agree_bitwise(n, threads):
    threads(n)
    traj = _axis_trajectory("y", True, n_views=6, dtype=torch.float32)
    op = Projector(traj, (9, LONG, 10), (10, 9), voxel_spacing=1.0, detector_spacing=1.1)
    g = torch.Generator().manual_seed(5)
    y = torch.rand((3, *op.projection_shape), generator=g)
    y[1, :, :4] = 0.0  # pixels zero in one item but not in the others (the zero-pixel skip)
    y[2] = 0.0
    batched = op.backproject(y)
    assert torch.equal(op.backproject(y), batched)
    for q in range(3):
        assert torch.equal(op.backproject(y[q]), batched[q])
    assert batched[2].abs().max().item() == 0.0


def test_slab_windows_and_tiles_of_the_backprojection_match_the_whole(threads):
    """Backend level, 2 threads: z-slabs are slices of the whole; detector tiles and view ranges sum to it."""
    threads(2)
    traj = _axis_trajectory("x", True, n_views=6, dtype=torch.float64)
    grid = VolumeGrid((11, 8, 90), (1.0, 1.0, 1.0))
    du, dv = 1.2, 1.2
    rays = Rays(traj.source, traj.detector_center, traj.detector_u * du, traj.detector_v * dv, True, (10, 11))
    be = get_backend("cpu")
    y = torch.rand(1, 6, 10, 11, dtype=torch.float64)
    whole = be.backproject(y, grid, 0, grid.D, rays, Tile.full(rays.detector_shape))
    assert whole.abs().max() > 0
    for z0, z1 in [(0, 3), (3, 4), (4, 11)]:
        part = be.backproject(y, grid, z0, z1, rays, Tile.full(rays.detector_shape))
        torch.testing.assert_close(part, whole[:, z0:z1], rtol=1e-12, atol=1e-12)
    total = torch.zeros_like(whole)
    for (u0, u1) in [(0, 4), (4, 10)]:
        for (v0, v1) in [(0, 5), (5, 11)]:
            for (k0, k1) in [(0, 2), (2, 6)]:
                be.backproject(y[:, k0:k1, u0:u1, v0:v1].contiguous(), grid, 0, grid.D, rays.views(k0, k1),
                               Tile(u0, u1, v0, v1), out=total)
    torch.testing.assert_close(total, whole, rtol=1e-12, atol=1e-12)


def test_more_threads_than_planes_and_thin_slabs(threads):
    """Fewer planes than 2 x threads take the view-parallel path; a few more take one chunk per thread."""
    for nz in (1, 3, 5):
        traj = _axis_trajectory("x", True, n_views=4, dtype=torch.float64)
        kw = dict(voxel_spacing=1.0, detector_spacing=1.2)
        cpu = Projector(traj, (nz, 8, 70), (9, 8), backend="cpu", **kw)
        ref = Projector(traj, (nz, 8, 70), (9, 8), backend="reference", **kw)
        y = torch.rand(cpu.projection_shape, dtype=torch.float64)
        expected = ref.backproject(y)
        for n in (1, 2, 3):
            threads(n)
            torch.testing.assert_close(cpu.backproject(y), expected, rtol=1e-10, atol=1e-10)


def test_2d_fan_adjoint_and_reference(threads):
    threads(2)
    traj = circular_trajectory_2d_fan(16, 60.0, 120.0, dtype=torch.float64)
    cpu = Projector(traj, (40, 40), 48, backend="cpu")
    ref = Projector(traj, (40, 40), 48, backend="reference")
    x = torch.rand(cpu.volume_shape, dtype=torch.float64)
    y = torch.rand(cpu.projection_shape, dtype=torch.float64)
    bp = cpu.backproject(y)
    torch.testing.assert_close(bp, ref.backproject(y), rtol=1e-10, atol=1e-10)
    lhs = (cpu.project(x) * y).sum().item()
    rhs = (x * bp).sum().item()
    assert abs(lhs - rhs) <= 1e-11 * abs(lhs)


# float32 with contiguous-pair scatter: x-dominant rays go into an x/y-swapped
# accumulator that each thread adds back for its z-chunk.  The kernel takes that
# path when the views have at least a quarter as many rays as the slab has voxels;
# a circular scan has views of both dominant axes (and rows that change axis).
def _circular_f32(shape=(12, 20, 22), det=(16, 14), n_views=24):
    traj = circular_trajectory_3d(n_views, 60.0, 120.0, dtype=torch.float32)
    kw = dict(voxel_spacing=(1.0, 1.1, 0.9), detector_spacing=(1.6, 1.5))
    cpu = Projector(traj, shape, det, backend="cpu", **kw)
    ref = Projector(traj, shape, det, backend="reference", **kw)
    d, h, w = shape
    assert n_views * det[0] * det[1] >= d * h * w / 4  # the swapped-accumulator path is taken
    return cpu, ref


def test_float32_swapped_accumulator_matches_reference_and_adjoint(threads):
    cpu, ref = _circular_f32()
    g = torch.Generator().manual_seed(21)
    y = torch.rand(cpu.projection_shape, generator=g)
    x = torch.rand(cpu.volume_shape, generator=g)
    expected = ref.backproject(y)
    assert expected.abs().max() > 0
    for n in (1, 2, 3):
        threads(n)
        got = cpu.backproject(y)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
        lhs = (cpu.project(x).double() * y.double()).sum().item()
        rhs = (x.double() * got.double()).sum().item()
        assert abs(lhs - rhs) <= 2e-6 * abs(lhs), (n, lhs, rhs)


@pytest.mark.parametrize("n", [1, 2])
def test_float32_swapped_accumulator_is_deterministic_and_batch_consistent(n, threads):
    threads(n)
    cpu, _ = _circular_f32()
    g = torch.Generator().manual_seed(22)
    y = torch.rand((2, *cpu.projection_shape), generator=g)
    y[1, ::3] = 0.0
    batched = cpu.backproject(y)
    assert torch.equal(cpu.backproject(y), batched)
    for q in range(2):
        assert torch.equal(cpu.backproject(y[q]), batched[q])


def test_float32_swapped_accumulator_in_slab_windows(threads):
    """Backend level: z-slabs (the accumulator is indexed from the slab's first plane) are slices of the whole."""
    threads(2)
    d, h, w = 12, 20, 22
    traj = circular_trajectory_3d(24, 60.0, 120.0, dtype=torch.float32)
    grid = VolumeGrid((d, h, w), (0.9, 1.1, 1.0))
    rays = Rays(traj.source, traj.detector_center, traj.detector_u * 1.6, traj.detector_v * 1.5, True, (16, 14))
    be = get_backend("cpu")
    y = torch.rand(1, 24, 16, 14, generator=torch.Generator().manual_seed(23))
    whole = be.backproject(y, grid, 0, d, rays, Tile.full(rays.detector_shape))
    assert whole.abs().max() > 0
    for z0, z1 in [(0, 5), (5, 12), (3, 9)]:
        part = be.backproject(y, grid, z0, z1, rays, Tile.full(rays.detector_shape))
        torch.testing.assert_close(part, whole[:, z0:z1], rtol=1e-6, atol=1e-6 * whole.abs().max().item())


def test_float32_axis_aligned_and_planar_rays_match_reference(threads):
    """Parallel rays along x, y and the diagonal: B == 0 and planar rays, which the vectorised
    set-up leaves to make_ray, next to lanes it sets up, in both accumulators."""
    from ctbench import circular_trajectory_3d_parallel
    angles = torch.tensor([0.0, math.pi / 4, math.pi / 2, math.pi, 0.1, 1.5 * math.pi, -math.pi / 4, 0.2],
                          dtype=torch.float64)
    traj = circular_trajectory_3d_parallel(angles.numel(), angles=angles, dtype=torch.float32)
    shape, det = (9, 21, 21), (21, 9)
    assert angles.numel() * det[0] * det[1] >= 9 * 21 * 21 / 4  # the swapped-accumulator path is taken
    cpu = Projector(traj, shape, det, backend="cpu")
    ref = Projector(traj, shape, det, backend="reference")
    y = torch.rand(cpu.projection_shape, generator=torch.Generator().manual_seed(24))
    expected = ref.backproject(y)
    for n in (1, 2):
        threads(n)
        torch.testing.assert_close(cpu.backproject(y), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


# The pair scatter needs SSE2 and the lane set-up AVX2 or AVX-512 (chosen at compile
# time): the host's native build runs above; the baseline and AVX2 builds here.
@pytest.mark.parametrize("march,needs", [("x86-64", "sse2"), ("x86-64-v3", "avx2")])
@pytest.mark.slow
def test_float32_backprojection_every_instruction_set(tmp_path, march, needs):
    from ctbench.engine.cpu import backend as cpu_backend

    f = joseph_library_for(tmp_path, march, needs).joseph_backward_f32
    f.argtypes = cpu_backend._BACKWARD_ARGS
    f.restype = None
    cpu, ref = _circular_f32()
    y = torch.rand(cpu.projection_shape, generator=torch.Generator().manual_seed(25))
    expected = ref.backproject(y)
    t = cpu.trajectory
    geo = [t.source.contiguous(), t.detector_center.contiguous(), (t.detector_u * 1.6).contiguous(),
           (t.detector_v * 1.5).contiguous()]
    D, H, W = cpu.volume_shape
    (U, V) = (16, 14)
    for nthreads in (1, 2):
        out = torch.zeros(D, H, W)
        f(y.data_ptr(), 1, D, H, W, 0, D, 0.9, 1.1, 1.0, *[g.data_ptr() for g in geo], 1, t.n_views, U, V, 0, U, 0, V,
          out.data_ptr(), D * H * W, nthreads)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
