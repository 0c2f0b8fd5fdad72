"""Child process of test_cpu_fenced_windows: every CPU Joseph path on a z-window whose memory is fenced.

The window (B, nz, H, W) float32 lies in an anonymous mapping between two PROT_NONE regions, each larger than
the whole volume, so an access to any global voxel outside the window faults (the process dies by SIGSEGV)
instead of touching a neighbour's memory.  Forward (argv[1] == "forward"): each path's projection of the
fenced window; back ("back"): each path's backprojection into a fenced window; "vjp": the geometry gradient of
the fenced window's projection; "fdk": each FDK path's weighted backprojection into a fenced window.  All are
compared with the reference backend (pure torch, float64) on the same window.  Further arguments name the
paths (default: all that this machine's library has).  Prints one JSON line: {"paths": [...], "worst": relative max error}.
"""

from __future__ import annotations

import ctypes
import json
import math
import mmap
import os
import sys

import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.cpu import library as cpu_library, joseph_paths, path_choice
from ctbench.engine.base import Tile
from ctbench.engine.cpu import CpuBackend
from ctbench.engine.executor import reference_geometry_vjp
from ctbench.engine.fdk_kernels import fdk_paths, weighted_backproject
from ctbench.engine.reference import ReferenceBackend

PAGE = mmap.PAGESIZE


def fenced_window(shape, guard_bytes):
    """A float32 tensor of `shape` (page-sized multiple) with inaccessible memory on both sides."""
    nbytes = 4 * math.prod(shape)
    assert nbytes % PAGE == 0
    guard = -(-guard_bytes // PAGE) * PAGE
    buf = mmap.mmap(-1, guard + nbytes + guard, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for start in (base, base + guard + nbytes):
        if libc.mprotect(start, guard, 0) != 0:  # PROT_NONE
            raise OSError(ctypes.get_errno(), "mprotect failed")
    t = torch.frombuffer(buf, dtype=torch.float32, count=math.prod(shape), offset=guard).view(shape)
    return t, buf


def main():
    shape, (z0, z1) = (24, 64, 64), (8, 16)
    # views along x, y and diagonals; a detector wider and taller than the volume: lane groups whose
    # rays enter through the sides (masked lanes at many planes) and rays that miss
    angles = torch.tensor([0.0, 0.3, math.pi / 4, 1.2, math.pi / 2, 2.0, 3 * math.pi / 4, 4.0], dtype=torch.float64)
    traj = circular_trajectory_3d(angles.numel(), 90.0, 180.0, angles=angles, dtype=torch.float64)
    det = (112, 40)
    p = Projector(traj, shape, det, voxel_spacing=1.0, detector_spacing=2.0, backend="cpu")
    whole = torch.rand((1, *shape), generator=torch.Generator().manual_seed(5))
    slab, buf = fenced_window((1, z1 - z0, shape[1], shape[2]), guard_bytes=4 * math.prod(shape) * 2)
    slab.copy_(whole[:, z0:z1])
    rays32 = p._rays(None, torch.float32, torch.device("cpu"))
    rays64 = p._rays(None, torch.float64, torch.device("cpu"))
    tile = Tile.full(det)
    want = ReferenceBackend().project(whole[:, z0:z1].double(), p.grid, z0, rays64, tile)
    assert float(want.abs().max()) > 0
    op, names = sys.argv[1], sys.argv[2:]
    rel = lambda got, want: float((got.double() - want).abs().max()) / float(want.abs().max())  # noqa: E731
    if op in ("vjp", "fdk"):
        return other_kernels(op, names, p, slab, whole[:, z0:z1], z0, z1, rays32, rays64, tile, rel)
    names = names or joseph_paths.known_paths(cpu_library.load_cpu_library("joseph"))[op]
    if op == "back":
        sino = torch.rand((1, angles.numel(), *det), generator=torch.Generator().manual_seed(6))
        want = ReferenceBackend().backproject(sino.double(), p.grid, z0, z1, rays64, tile)
    worst = 0.0
    for name in names:
        os.environ[path_choice.PATH_ENV] = f"{op}={name}"
        if op == "forward":
            got = CpuBackend().project(slab, p.grid, z0, rays32, tile)
        else:
            slab.zero_()
            got = CpuBackend().backproject(sino, p.grid, z0, z1, rays32, tile, out=slab)
            assert got.data_ptr() == slab.data_ptr()
        assert joseph_paths.active_paths(cpu_library.load_cpu_library("joseph"))[op] == name
        err = rel(got, want)
        worst = max(worst, err)
        if err > 1e-5:
            raise SystemExit(f"{op} path {name}: relative error {err:.3g}")
    print(json.dumps({"paths": list(names), "worst": worst}))
    del slab
    buf.close()


def other_kernels(op, names, p, slab, window, z0, z1, rays32, rays64, tile, rel):
    """The geometry VJP reading the fenced window, or each FDK path writing into it."""
    n_views = rays32.n_views
    g = torch.Generator().manual_seed(7)
    worst, done = 0.0, []
    if op == "vjp":
        gs = torch.rand((1, n_views, *tile.shape), generator=g)
        want = reference_geometry_vjp(window.double(), p.grid, z0, gs.double(), rays64, tile)
        got = CpuBackend().geometry_vjp(slab, p.grid, z0, gs, rays32, tile)
        worst = max(rel(a, b) for a, b in zip(got, want) if float(b.abs().max()) > 0)
        done = ["float32"]
        bound = 1e-3  # float32 derivatives of bilinear samples
    else:
        q = torch.rand((n_views, *tile.shape), generator=g)
        w = torch.rand(n_views, generator=g) + 0.5
        want = weighted_backproject(q.double(), rays64, p.grid, w.double(), z0=z0, z1=z1, backend="reference")
        for name in names or fdk_paths(torch.float32):
            os.environ[path_choice.PATH_ENV] = f"fdk={name}"
            view = slab[0]
            view.zero_()
            got = weighted_backproject(q, rays32, p.grid, w, z0=z0, z1=z1, out=view, backend="cpu")
            assert got.data_ptr() == view.data_ptr()
            worst = max(worst, rel(got, want))
            done.append(name)
        bound = 1e-5
    if worst > bound:
        raise SystemExit(f"{op}: relative error {worst:.3g}")
    print(json.dumps({"paths": done, "worst": worst}))


if __name__ == "__main__":
    main()
