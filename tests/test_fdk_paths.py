"""Every cpu path of the voxel-driven FDK backprojection against the pure-torch oracle.

Each path (rows, columns-scalar, columns in SIMD lanes) is forced through
``CTBENCH_CPU_PATH=fdk=NAME`` and compared with
``reference_weighted_backproject`` (rays intersected with the detector plane,
independent of the kernels' projective matrices), in float64 and float32, on
geometries that reach the columns path's corners: every beam type, a falling
detector row index (v pointing down), a v step too wide for the permute
window, a tilted detector (views with z terms: the general stencil), slabs
thicker than one z-chunk, more views than one view block, slabs and view
ranges.  The AVX2 and baseline builds are compiled and run here too.
"""

from __future__ import annotations

import math

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.base import Rays, VolumeGrid
from ctbench.engine.fdk_kernels import (
    _CPU_ARGS,
    FDK_PATHS,
    default_fdk_path,
    fdk_lanes,
    fdk_path,
    fdk_paths,
    measure_fdk_paths,
    reference_weighted_backproject,
    weighted_backproject,
)
from kernel_builds import joseph_library_for
from sample_geometries import sample_geometries

F64, F32 = torch.float64, torch.float32


def _rays(traj, du, dv, det, dtype, flip_v=False, tilt=0.0):
    """Rays of a trajectory with pixel steps du, dv; flip_v points v down, tilt (rad) turns the
    detector about its u axis (views with z terms in a and w)."""
    u = traj.detector_u.to(F64) * du
    v = traj.detector_v.to(F64) * dv * (-1.0 if flip_v else 1.0)
    if tilt:
        n = torch.linalg.cross(u, v, dim=1)
        n = n / n.norm(dim=1, keepdim=True) * v.norm(dim=1, keepdim=True)
        v = math.cos(tilt) * v + math.sin(tilt) * n
    t = [traj.source.to(F64), traj.detector_center.to(F64), u, v]
    return Rays(*(x.to(dtype) for x in t), True, det)


def _case(name, dtype):
    """(rays, grid, q, w) of a named test geometry."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    if name == "cone":
        tr, det, grid = circular_trajectory_3d(40, 40.0, 80.0, detector_offset=(1.3, -0.7)), (23, 37), \
            VolumeGrid((37, 11, 13), (1.0, 1.1, 0.9))
        rays = _rays(tr, 1.5, 1.4, det, dtype)
    elif name == "flipped-v":
        tr, det, grid = circular_trajectory_3d(9, 40.0, 80.0), (19, 29), VolumeGrid((21, 9, 10), (1.0, 1.0, 1.1))
        rays = _rays(tr, 1.5, 1.4, det, dtype, flip_v=True)
    elif name == "wide-v-step":  # dz / dv * magnification > 2: beyond the permute window
        tr, det, grid = circular_trajectory_3d(7, 40.0, 80.0), (17, 61), VolumeGrid((19, 8, 9), (2.5, 1.0, 1.0))
        rays = _rays(tr, 1.5, 1.2, det, dtype)
    elif name == "tilted":
        tr, det, grid = circular_trajectory_3d(8, 40.0, 80.0), (17, 23), VolumeGrid((17, 9, 10), (1.0, 1.0, 1.1))
        rays = _rays(tr, 1.5, 1.4, det, dtype, tilt=0.05)
    elif name == "tall":  # more z-voxels than one chunk of the columns path (128)
        tr, det, grid = circular_trajectory_3d(6, 60.0, 120.0), (9, 150), VolumeGrid((133, 3, 5), (0.5, 1.0, 1.0))
        rays = _rays(tr, 1.5, 1.0, det, dtype)
    else:
        raise KeyError(name)
    q = torch.randn((rays.n_views, *det), generator=g, dtype=F64).to(dtype)
    w = (torch.rand(rays.n_views, generator=g, dtype=F64) + 0.5).to(dtype)
    return rays, grid, q, w


CASES = ("cone", "flipped-v", "wide-v-step", "tilted", "tall")


def _tol(dtype):
    return 1e-10 if dtype == F64 else 5e-5  # float32: pixel indices up to ~150 rounded to 24 bits


def _check(got, want, dtype):
    scale = float(want.abs().max())
    assert scale > 0.1, "the test geometry must put data into the volume"
    err = float((got.double() - want.double()).abs().max()) / scale
    assert err <= _tol(dtype), err


@pytest.mark.parametrize("dtype", [F64, F32])
def test_paths_listed(dtype):
    paths = fdk_paths(dtype)
    assert set(paths) <= set(FDK_PATHS) and {"rows", "columns-scalar"} <= set(paths)
    assert ("columns" in paths) == (fdk_lanes(dtype) > 0)
    assert default_fdk_path(dtype, nz=1) == "rows"
    assert default_fdk_path(dtype, nz=64) in paths


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("case", CASES)
def test_every_path_matches_reference(monkeypatch, case, dtype):
    rays, grid, q, w = _case(case, dtype)
    want = reference_weighted_backproject(q, rays, grid, w, 0, grid.D, 0, rays.n_views)
    for path in fdk_paths(dtype):
        monkeypatch.setenv("CTBENCH_CPU_PATH", f"fdk={path}")
        assert fdk_path(dtype, grid.D) == path
        _check(weighted_backproject(q, rays, grid, w, backend="cpu"), want, dtype)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("index", range(5), ids=lambda i: sample_geometries(F64)[i][0])
def test_every_path_on_every_beam_type(monkeypatch, index, dtype):
    """cone, helical, parallel 3D, fan 2D and parallel 2D (D = 1: one z-voxel per column)."""
    name, traj, vs, ds, kw = sample_geometries(dtype)[index]
    p = Projector(traj, vs, ds, **kw)
    rays = p._rays(None, dtype, torch.device("cpu"))
    g = torch.Generator().manual_seed(index)
    q = torch.randn((traj.n_views, *p.detector_shape), generator=g, dtype=F64).to(dtype)
    w = (torch.rand(traj.n_views, generator=g, dtype=F64) + 0.5).to(dtype)
    want = reference_weighted_backproject(q, rays, p.grid, w, 0, p.grid.D, 0, traj.n_views)
    for path in fdk_paths(dtype):
        monkeypatch.setenv("CTBENCH_CPU_PATH", f"fdk={path}")
        _check(weighted_backproject(q, rays, p.grid, w, backend="cpu"), want, dtype)


@pytest.mark.parametrize("dtype", [F64, F32])
def test_every_path_slabs_view_ranges_and_threads(monkeypatch, dtype):
    """A slab and a view range against the oracle; accumulation into ``out``; 1 and 2 threads."""
    rays, grid, q, w = _case("cone", dtype)
    n = rays.n_views
    want = reference_weighted_backproject(q, rays, grid, w, 5, 30, 3, n - 2)
    saved = torch.get_num_threads()
    for path, nthreads in [(p, t) for p in fdk_paths(dtype) for t in (1, 2)]:
        monkeypatch.setenv("CTBENCH_CPU_PATH", f"fdk={path}")
        torch.set_num_threads(nthreads)
        try:
            got = weighted_backproject(q, rays, grid, w, z0=5, z1=30, views=(3, n - 2))
            out = torch.zeros_like(got)
            for a, b in [(3, 10), (10, 10), (10, n - 2)]:  # the second range is empty
                weighted_backproject(q, rays, grid, w, z0=5, z1=30, views=(a, b), out=out)
        finally:
            torch.set_num_threads(saved)
        _check(got, want, dtype)
        _check(out, want, dtype)


def test_zero_weight_views_give_zero(monkeypatch):
    """Views that contribute nothing (zero weights) leave a written slab at zero, on every path."""
    rays, grid, q, w = _case("cone", F32)
    for path in fdk_paths(F32):
        monkeypatch.setenv("CTBENCH_CPU_PATH", f"fdk={path}")
        out = weighted_backproject(q, rays, grid, torch.zeros_like(w))
        assert out.shape == (grid.D, grid.H, grid.W) and not out.any()


def test_unknown_path_is_a_clear_error(monkeypatch):
    rays, grid, q, w = _case("flipped-v", F32)
    monkeypatch.setenv("CTBENCH_CPU_PATH", "fdk=diagonal")
    with pytest.raises(ValueError, match="CTBENCH_CPU_PATH.*'diagonal'.*rows"):
        weighted_backproject(q, rays, grid, w)


def test_forced_columns_runs_in_every_dtype(monkeypatch):
    """``fdk=columns`` forced for a whole run also serves a dtype without lanes (scalar z loop)."""
    monkeypatch.setenv("CTBENCH_CPU_PATH", "fdk=columns")
    for dtype in (F64, F32):
        rays, grid, q, w = _case("flipped-v", dtype)
        assert fdk_path(dtype, grid.D) == "columns"
        want = reference_weighted_backproject(q, rays, grid, w, 0, grid.D, 0, rays.n_views)
        _check(weighted_backproject(q, rays, grid, w), want, dtype)


def test_measure_fdk_paths_times_every_path():
    times = measure_fdk_paths(F32, n=16, repeats=1)
    assert set(times) == set(fdk_paths(F32)) and all(t > 0 for t in times.values())


# The lanes are chosen at compile time: the host's native build runs above; the AVX2 build
# (8 float lanes, scalar z loop in float64) and the baseline build (no lanes) here.
@pytest.mark.parametrize("march,needs", [("x86-64", "sse2"), ("x86-64-v3", "avx2"), ("x86-64-v4", "avx512f")])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_every_instruction_set_build(tmp_path, march, needs, dtype):
    lib = joseph_library_for(tmp_path, march, needs, family="fdk")
    sfx = "f32" if dtype == F32 else "f64"
    lanes = getattr(lib, f"fdk_lanes_{sfx}")
    lanes.restype = __import__("ctypes").c_int
    expect = {"x86-64": 0, "x86-64-v3": 8 if dtype == F32 else 0, "x86-64-v4": 16 if dtype == F32 else 8}[march]
    assert lanes() == expect
    f = getattr(lib, f"fdk_backproject_path_{sfx}")
    f.argtypes, f.restype = _CPU_ARGS, None
    for case in ("cone", "flipped-v", "wide-v-step", "tall"):
        rays, grid, q, w = _case(case, dtype)
        want = reference_weighted_backproject(q, rays, grid, w, 0, grid.D, 0, rays.n_views)
        geo = [t.contiguous() for t in rays.tensors()]
        U, V = rays.detector_shape
        dz, dy, dx = grid.spacing
        for code in (FDK_PATHS["columns"], FDK_PATHS["columns-scalar"], 0):  # 0: the library's own choice
            for nthreads in (1, 2):
                out = torch.zeros(grid.shape, dtype=dtype)
                f(q.data_ptr(), q.stride(0), q.stride(1), q.stride(2), U, V, *(t.data_ptr() for t in geo),
                  w.data_ptr(), 1, 0, rays.n_views, grid.D, grid.H, grid.W, 0, grid.D, dx, dy, dz, out.data_ptr(),
                  0, nthreads, code)
                _check(out, want, dtype)
