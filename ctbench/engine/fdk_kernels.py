"""The voxel-driven weighted backprojector of FDK/FBP on the cpu, cuda and reference backends.

``weighted_backproject`` adds, for every voxel ``x`` of a slab ``[z0, z1)``
and every view ``k`` of a view range,

    view_weight[k] * m_k(x)**2 * q_k(i_k(x), j_k(x))        (cone beam)
    view_weight[k] * q_k(i_k(x), j_k(x))                     (parallel beam)

where ``(i_k, j_k)`` are the continuous detector pixel indices of the ray
through ``x`` (pixel centres at integers, bilinear interpolation, zero off the
detector) and ``m_k(x) = (c - s).n / (x - s).n`` the magnification of ``x``
(source ``s``, detector centre ``c``, detector normal ``n``).  Views use the
same general vectors as the projector, so one kernel serves circular cone
beam, helical orbits, fan 2D (D=1) and parallel beams.  ``Rays(..., cone=CYLINDER)``
(2) describes a cylindrical detector centred on the source: ``u`` is the arc
length along the cylinder, ``(i, j)`` are the column of the ray's fan angle and
its height on the cylinder, and ``m_k(x) = R / rho`` with ``rho`` the voxel's
distance to the source in the plane perpendicular to ``v``.

The cpu and cuda backends run ``kernels/fdk_*``; the reference backend is an
independent torch implementation (rays intersected with the detector plane
and pixel offsets solved from the 2x2 Gram system) that the tests compare
the kernels against.

The cpu kernel has paths (:func:`fdk_paths`), equal within round-off:
``columns`` (voxel columns, the z loop in SIMD lanes; the default where the
build has lanes), ``columns-scalar`` (the same with a scalar z loop) and
``rows`` (voxel rows, compiler-vectorised with gathers).
``CTBENCH_CPU_PATH=fdk=NAME`` forces one (:mod:`ctbench.engine.cpu.path_choice`); ``columns``
forced where the build has no lanes for the dtype runs as ``columns-scalar``.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np
import torch

from .base import Rays, VolumeGrid
from .cpu import num_threads
from .cpu.library import DTYPE_SUFFIX, F64, I64, INT, PTR, cpu_function, load_cpu_library
from .cpu.fdk_paths import measured_paths
from .cpu.path_choice import DEFAULT_PATH, PATH_ENV, forced_path

_P, _I, _L, _D = PTR, INT, I64, F64
_CPU_ARGS = [_P, _L, _L, _L, _I, _I, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I, _D, _D, _D, _P, _I, _I, _I]
FDK_BACKENDS = ("auto", "cpu", "cuda", "reference", "cuda-emulated")
# Path names and their codes in kernels/fdk_cpu.cpp (enum FdkPath).
FDK_PATHS = {"rows": 1, "columns-scalar": 2, "columns": 3}
# Below this many z-voxels in a slab the columns' per-(view, column) set-up does not pay.
COLUMNS_MIN_Z = 8


def _cpu_fn(dtype: torch.dtype):
    return cpu_function("fdk", "fdk_backproject_path", dtype, _CPU_ARGS)


def fdk_lanes(dtype: torch.dtype = torch.float32) -> int:
    """SIMD lanes of the columns path's z loop in the loaded cpu library for ``dtype`` (0: none)."""
    f = getattr(load_cpu_library("fdk"), f"fdk_lanes_{DTYPE_SUFFIX[str(dtype)]}")
    f.argtypes, f.restype = [], ctypes.c_int
    return int(f())


def fdk_paths(dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """The cpu FDK paths this library runs for ``dtype`` (``columns`` only where it has lanes)."""
    return tuple(p for p in FDK_PATHS if p != "columns" or fdk_lanes(dtype) > 0)


def build_default_fdk_path(dtype: torch.dtype = torch.float32) -> str:
    """The build's default for slabs of ``COLUMNS_MIN_Z`` or more planes: columns in lanes where the
    build has them, else columns with a scalar z loop (docs/INTERNALS.md, "FDK on the CPU")."""
    return "columns" if fdk_lanes(dtype) > 0 else "columns-scalar"


def default_fdk_path(dtype: torch.dtype = torch.float32, nz: int = COLUMNS_MIN_Z) -> str:
    """The path a call runs unless ``CTBENCH_CPU_PATH`` forces one: rows for slabs thinner than
    ``COLUMNS_MIN_Z`` (fan 2D), else the path measured fastest on this CPU and cached beside the
    library (:mod:`ctbench.engine.cpu.fdk_paths`; the build's default unless another beats it by more
    than 10 %)."""
    if nz < COLUMNS_MIN_Z:
        return "rows"
    return measured_fdk_path(dtype)


def measured_fdk_path(dtype: torch.dtype = torch.float32) -> str:
    """The path measured fastest on this CPU for ``dtype`` (measured once, then cached)."""
    known = {}
    for name in ("float32", "float64"):
        dt = getattr(torch, name)
        first = build_default_fdk_path(dt)
        known[name] = [first] + [p for p in fdk_paths(dt) if p != first]
    choice, _source = measured_paths(load_cpu_library("fdk"), known,
                                     lambda name: measure_fdk_paths(getattr(torch, name)))
    return choice[str(dtype).removeprefix("torch.")]


def fdk_path(dtype: torch.dtype, nz: int) -> str:
    """The path a call runs: the one ``CTBENCH_CPU_PATH`` forces (``fdk=NAME``), else the default."""
    name = forced_path("fdk")
    if name is None:
        return default_fdk_path(dtype, nz)
    if name == DEFAULT_PATH:  # the build's default, whatever was measured
        return "rows" if nz < COLUMNS_MIN_Z else build_default_fdk_path(dtype)
    if name not in FDK_PATHS:
        raise ValueError(f"{PATH_ENV}: unknown fdk path {name!r}; expected one of {', '.join(FDK_PATHS)} "
                         f"(this cpu library runs {', '.join(fdk_paths(dtype))} for {dtype})")
    # "columns" where the build has no lanes for dtype runs the scalar z loop (the kernel falls back),
    # so one forced name serves a whole test run in float32 and float64.
    return name


def measure_fdk_paths(dtype: torch.dtype = torch.float32, n: int = 48, repeats: int = 3) -> dict[str, float]:
    """Seconds (best of ``repeats``) of each cpu path on a small circular cone-beam problem
    (n^3 voxels, n views, n x n detector): what a per-CPU choice of the fastest path measures."""
    from ..geometry import circular_trajectory_3d

    tr = circular_trajectory_3d(n, 3.0 * n, 6.0 * n, dtype=dtype)
    rays = Rays(tr.source, tr.detector_center, tr.detector_u * 2.0, tr.detector_v * 2.0, True, (n, n))
    grid = VolumeGrid((n, n, n), (1.0, 1.0, 1.0))
    q = torch.randn((n, n, n), generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    w = torch.ones(n, dtype=dtype)
    times = {}
    for name in fdk_paths(dtype):
        best = float("inf")
        for _ in range(max(1, repeats) + 1):  # the first call warms up
            t0 = time.perf_counter()
            _cpu_backproject(q, rays, grid, w, 0, n, 0, n, torch.empty((n, n, n), dtype=dtype), False, name)
            best = min(best, time.perf_counter() - t0)
        times[name] = best
    return times


def _layout_for(filtered: torch.Tensor, path: str) -> torch.Tensor:
    """The projections with the axis the path walks contiguous: u for rows (a voxel row mostly
    walks along u), v for columns (a voxel column walks along v)."""
    axis = 1 if path == "rows" else 2
    if filtered.stride(axis) == 1:
        return filtered
    other = 3 - axis
    return filtered.transpose(axis, other).contiguous().transpose(axis, other)


def _cpu_backproject(q, rays: Rays, grid: VolumeGrid, w, z0, z1, k0, k1, out_t, accumulate, path):
    n, U, V = q.shape
    q = _layout_for(q, path)
    geo = [t.detach().to(dtype=q.dtype).contiguous() for t in rays.tensors()]
    dz, dy, dx = grid.spacing
    _cpu_fn(q.dtype)(q.data_ptr(), q.stride(0), q.stride(1), q.stride(2), U, V, *(t.data_ptr() for t in geo),
                     w.data_ptr(), int(rays.cone), k0, k1, grid.D, grid.H, grid.W, z0, z1, dx, dy, dz,
                     out_t.data_ptr(), int(accumulate), num_threads(), FDK_PATHS[path])
    return out_t


def _resolve(backend: str, device: torch.device) -> str:
    if backend not in FDK_BACKENDS:
        raise ValueError(f"backend must be one of {FDK_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "cuda" if device.type == "cuda" else "cpu"
    if backend == "cpu" and device.type != "cpu":
        raise ValueError(f"backend 'cpu' needs CPU tensors, got {device}")
    if backend == "cuda" and device.type != "cuda":
        raise ValueError(f"backend 'cuda' needs CUDA tensors, got {device}")
    if backend == "cuda-emulated" and device.type != "cpu":
        raise ValueError(f"backend 'cuda-emulated' runs the CUDA kernels on the host and needs CPU tensors, got {device}")
    return backend


def weighted_backproject(filtered: torch.Tensor, rays: Rays, grid: VolumeGrid, view_weight: torch.Tensor, *,
                         z0: int = 0, z1: int | None = None, views: tuple[int, int] | None = None,
                         out: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """Weighted voxel-driven backprojection of ``filtered`` (n_views, U, V) into the slab ``[z0, z1)``.

    ``rays`` holds the per-view vectors (source or ray direction, detector
    centre, u*du, v*dv) of all ``n_views`` views; ``views=(k0, k1)``
    restricts the sum to that view range (default all).  ``view_weight`` is
    ``(n_views,)``.  Returns ``(z1-z0, H, W)`` in the dtype and on the device
    of ``filtered``; with ``out`` given, adds into it and returns it.
    """
    if filtered.ndim != 3:
        raise ValueError(f"filtered projections must have shape (n_views, U, V), got {tuple(filtered.shape)}")
    n, U, V = filtered.shape
    if (U, V) != tuple(rays.detector_shape) or rays.n_views != n:
        raise ValueError(f"filtered projections {tuple(filtered.shape)} do not match the rays "
                         f"({rays.n_views} views, detector {tuple(rays.detector_shape)})")
    if view_weight.shape != (n,):
        raise ValueError(f"view_weight must have shape ({n},), got {tuple(view_weight.shape)}")
    z1 = grid.D if z1 is None else int(z1)
    z0 = int(z0)
    if not 0 <= z0 <= z1 <= grid.D:
        raise ValueError(f"slab [z0, z1) = [{z0}, {z1}) must lie within [0, {grid.D}]")
    k0, k1 = (0, n) if views is None else (int(views[0]), int(views[1]))
    if not 0 <= k0 <= k1 <= n:
        raise ValueError(f"views (k0, k1) = ({k0}, {k1}) must lie within [0, {n}]")
    dtype, device = filtered.dtype, filtered.device
    shape = (z1 - z0, grid.H, grid.W)
    if out is None:
        out_t, accumulate = torch.empty(shape, dtype=dtype, device=device), False
    else:
        if tuple(out.shape) != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous {dtype} tensor of shape {shape} on {device}")
        out_t, accumulate = out, True
    which = _resolve(backend, device)
    q = filtered.detach()
    geo = [t.detach().to(device=device, dtype=dtype).contiguous() for t in rays.tensors()]
    w = view_weight.detach().to(device=device, dtype=dtype).contiguous()
    if z1 == z0 or k1 == k0:
        if not accumulate:
            out_t.zero_()
        return out_t
    if which == "reference":
        res = reference_weighted_backproject(q, Rays(*geo, rays.cone, rays.detector_shape), grid, w, z0, z1, k0, k1)
        return out_t.add_(res) if accumulate else out_t.copy_(res)
    if which == "cpu":
        return _cpu_backproject(q, Rays(*geo, rays.cone, rays.detector_shape), grid, w, z0, z1, k0, k1, out_t,
                                accumulate, fdk_path(dtype, z1 - z0))
    q = _layout_for(q, "rows")  # the CUDA kernel's threads walk u
    from .cuda import runtime_for
    return _cuda_backproject(q, geo, w, rays, grid, z0, z1, k0, k1, out_t, accumulate, runtime_for(which))


# The ``cone`` value of a Rays whose detector is a cylinder centred on the source (kernels/fdk.cuh, kFdkCylinder):
# the weighted backprojection's only curved detector.
CYLINDER = 2

CUDA_FDK_ZPT = 4  # voxels along z per thread: FDK_ZPT in kernels/fdk_cuda.cu
CUDA_FDK_MAT = 14  # constants per view: FDK_MAT in kernels/fdk_cuda.cu


def _cuda_backproject(q, geo, w, rays: Rays, grid: VolumeGrid, z0, z1, k0, k1, out_t, accumulate, runtime):
    from .cuda import launch

    as_cupy = runtime.array

    dtype, device = q.dtype, q.device
    n, U, V = q.shape
    dz, dy, dx = grid.spacing
    mats = torch.empty((n, CUDA_FDK_MAT), dtype=dtype, device=device)
    k_mat = runtime.kernel("fdk", "fdk_view_matrices", dtype, device)
    launch(runtime, k_mat, n, (*[as_cupy(t) for t in geo], as_cupy(w), np.int32(rays.cone), np.int32(n), np.int32(U),
                      np.int32(V), np.int32(grid.D), np.int32(grid.H), np.int32(grid.W), np.float64(dx),
                      np.float64(dy), np.float64(dz), as_cupy(mats)), device)
    k_bp = runtime.kernel("fdk", "fdk_backproject", dtype, device)
    launch(runtime, k_bp, -(-(z1 - z0) // CUDA_FDK_ZPT) * grid.H * grid.W,
           (as_cupy(q), np.int64(q.stride(0)), np.int64(q.stride(1)), np.int64(q.stride(2)), np.int32(U),
            np.int32(V), as_cupy(mats), np.int32(rays.cone), np.int32(k0), np.int32(k1), np.int32(grid.H),
            np.int32(grid.W), np.int32(z0), np.int32(z1), as_cupy(out_t), np.int32(accumulate)), device)
    return out_t


# --------------------------------------------------------------- reference
def _bilinear_zero(img: torch.Tensor, fi: torch.Tensor, fj: torch.Tensor) -> torch.Tensor:
    """Bilinear interpolation of img (U, V) at continuous indices, zero outside [0, U-1] x [0, V-1]."""
    U, V = img.shape
    padded = torch.zeros((U + 2, V + 2), dtype=img.dtype, device=img.device)
    padded[1:-1, 1:-1] = img
    # Shift by one for the zero border; clamp far-away points onto it.
    gi = (fi + 1).clamp(0, U + 1)
    gj = (fj + 1).clamp(0, V + 1)
    i0 = gi.floor().clamp(max=U).long()
    j0 = gj.floor().clamp(max=V).long()
    ti, tj = gi - i0, gj - j0
    return ((1 - ti) * (1 - tj) * padded[i0, j0] + ti * (1 - tj) * padded[i0 + 1, j0]
            + (1 - ti) * tj * padded[i0, j0 + 1] + ti * tj * padded[i0 + 1, j0 + 1])


def voxel_centres(grid: VolumeGrid, z0: int, z1: int, device=None) -> torch.Tensor:
    """World coordinates (x, y, z) of the voxel centres of the slab [z0, z1), shape ((z1-z0)*H*W, 3), float64."""
    f64 = torch.float64
    dz, dy, dx = grid.spacing
    D, H, W = grid.shape
    zs = (torch.arange(z0, z1, dtype=f64, device=device) - (D - 1) / 2) * dz
    ys = (torch.arange(H, dtype=f64, device=device) - (H - 1) / 2) * dy
    xs = (torch.arange(W, dtype=f64, device=device) - (W - 1) / 2) * dx
    Z, Y, X = torch.meshgrid(zs, ys, xs, indexing="ij")
    return torch.stack([X, Y, Z], dim=-1).reshape(-1, 3)


def detector_coordinates(rays: Rays, k: int, pts: torch.Tensor):
    """Where the ray of view ``k`` through each point meets the detector.

    Returns ``(fi, fj, mag, front)``: continuous pixel indices, the
    magnification ``(c - s).n / (x - s).n`` (ones for parallel beams; ``R / rho`` on a cylindrical
    detector, ``rho`` the point's distance to the source in the plane perpendicular to v) and
    whether the point lies on the detector's side of the source.  float64.
    """
    f64 = torch.float64
    s, c, u, v = (t[k].to(device=pts.device, dtype=f64) for t in rays.tensors())
    n = torch.linalg.cross(u, v, dim=0)
    if rays.cone == CYLINDER:
        return _cylinder_coordinates(rays, s, c, u, v, n, pts)
    if rays.cone:
        d = pts - s
        denom = d @ n
        num = (c - s) @ n
        front = denom * num > 0
        t = num / torch.where(denom == 0, torch.ones_like(denom), denom)
        hit = s + t[:, None] * d
        mag = t
    else:
        t = ((c - pts) @ n) / (s @ n)
        hit = pts + t[:, None] * s
        mag = torch.ones_like(t)
        front = torch.ones_like(t, dtype=torch.bool)
    r = hit - c
    # Pixel offsets from the Gram system of the (possibly oblique) detector axes.
    uu, uv, vv = u @ u, u @ v, v @ v
    ru, rv = r @ u, r @ v
    det = uu * vv - uv * uv
    U, V = rays.detector_shape
    fi = (vv * ru - uv * rv) / det + (U - 1) / 2
    fj = (uu * rv - uv * ru) / det + (V - 1) / 2
    return fi, fj, mag, front


def _cylinder_coordinates(rays: Rays, s, c, u, v, n, pts):
    """Where the ray from the source through each point meets a cylindrical detector centred on the source:
    the cylinder of radius R = |(c - s).n| about the line through s along v; pixel i at arc length
    (i - (U-1)/2) du from the centre c, row j at height (j - (V-1)/2) dv."""
    du, dv = float(u.norm()), float(v.norm())
    uh, vh, nh = u / du, v / dv, n / n.norm()
    depth = float((c - s) @ nh)
    if depth < 0:
        nh, depth = -nh, -depth
    d = pts - s
    a, b, w = d @ uh, d @ vh, d @ nh
    rho = torch.sqrt(a * a + w * w)
    front = w > 0
    U, V = rays.detector_shape
    fi = depth * torch.atan2(a, w) / du + (U - 1) / 2
    safe = torch.where(rho > 0, rho, torch.ones_like(rho))
    fj = depth * b / (safe * dv) + (V - 1) / 2
    return fi, fj, depth / safe, front


def reference_weighted_backproject(filtered: torch.Tensor, rays: Rays, grid: VolumeGrid, view_weight: torch.Tensor,
                                   z0: int, z1: int, k0: int, k1: int) -> torch.Tensor:
    """Pure-torch oracle of :func:`weighted_backproject` (slow, simple, independent)."""
    dtype, dev = filtered.dtype, filtered.device
    f64 = torch.float64
    pts = voxel_centres(grid, z0, z1, dev)
    out = torch.zeros(pts.shape[0], dtype=f64, device=dev)
    for k in range(k0, k1):
        fi, fj, mag, front = detector_coordinates(rays, k, pts)
        val = _bilinear_zero(filtered[k].to(f64), fi, fj)
        weight = mag * mag if rays.cone else mag
        out += torch.where(front, view_weight[k].to(f64) * weight * val, torch.zeros_like(val))
    return out.reshape(z1 - z0, grid.H, grid.W).to(dtype)
