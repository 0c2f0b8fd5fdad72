"""Windows far down a large grid: the CPU kernels on planes whose global voxel numbers pass 2^31.

The kernels' vector lanes (forward, geometry gradient) and the back projection's scatter offsets index a
plane by 32-bit global voxel numbers: an 8-plane window at z = 2100 of a 2200 x 1024 x 1024 grid (z * H * W
= 2.2e9, as z >= 1024 of a 2048^3 volume streamed in windows) segfaulted every lane forward path and every
back path, float64 too.  cpu.backend.standalone_window traces such a window as a volume of its own planes with the
rays moved.  Independent truth: the reference backend (pure torch, float64) on the same window; the
translation itself against the untranslated call on a small grid.  The far-window checks run in a child
process (this file run as a script), so a regression is a failed test, not a dead session.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.cpu import backend as cpu_backend
from ctbench.engine.base import Rays, Tile
from ctbench.engine.cpu import CpuBackend
from ctbench.engine.executor import reference_geometry_vjp
from ctbench.engine.fdk_kernels import weighted_backproject
from ctbench.engine.reference import ReferenceBackend

F64 = torch.float64
ANGLES = torch.tensor([0.0, 0.3, math.pi / 4, 1.2, math.pi / 2], dtype=F64)


def window_case(D, H, W, z0, z1, det, sid=3000.0):
    """A projector on a D x H x W grid and rays moved along z so that the detector sees planes [z0, z1)."""
    traj = circular_trajectory_3d(ANGLES.numel(), sid, 2 * sid, angles=ANGLES, dtype=F64)
    p = Projector(traj, (D, H, W), det, voxel_spacing=1.0, detector_spacing=2.0, backend="cpu")

    def rays(dtype):
        r = p._rays(None, dtype, torch.device("cpu"))
        move = torch.zeros(3, dtype=dtype)
        move[2] = (z0 + z1) / 2 - D / 2
        return Rays(r.source + move, r.center + move, r.ustep, r.vstep, r.cone, r.detector_shape)
    return p.grid, rays


def far_checks():
    """Relative errors against the reference of forward (each named path), back, FDK and the geometry vjp."""
    D, H, W, z0, z1, det = 2200, 1024, 1024, 2100, 2108, (128, 16)
    assert z0 * H * W > 2**31
    grid, rays = window_case(D, H, W, z0, z1, det)
    tile = Tile.full(det)
    g = torch.Generator().manual_seed(4)
    slab = torch.rand((1, z1 - z0, H, W), generator=g)
    sino = torch.rand((1, ANGLES.numel(), *det), generator=g)
    r32, r64 = rays(torch.float32), rays(F64)
    rel = lambda got, want: float((got.double() - want).abs().max()) / float(want.abs().max())  # noqa: E731
    out = {}
    want = ReferenceBackend().project(slab.double(), grid, z0, r64, tile)
    assert float((want > 0).double().mean()) > 0.3
    for name in sys.argv[2:]:
        os.environ["CTBENCH_CPU_PATH"] = f"forward={name}"
        out[f"forward {name}"] = rel(CpuBackend().project(slab, grid, z0, r32, tile), want)
    os.environ.pop("CTBENCH_CPU_PATH", None)
    out["forward float64"] = rel(CpuBackend().project(slab.double(), grid, z0, r64, tile), want)
    want = ReferenceBackend().backproject(sino.double(), grid, z0, z1, r64, tile)
    out["back float32"] = rel(CpuBackend().backproject(sino, grid, z0, z1, r32, tile), want)
    out["back float64"] = rel(CpuBackend().backproject(sino.double(), grid, z0, z1, r64, tile), want)
    w = torch.ones(ANGLES.numel())
    want = weighted_backproject(sino[0].double(), r64, grid, w.double(), z0=z0, z1=z1, backend="reference")
    out["fdk float32"] = rel(weighted_backproject(sino[0], r32, grid, w, z0=z0, z1=z1, backend="cpu"), want)
    small = slab[:, :, 384:640, 384:640].contiguous()  # the vjp's truth is autograd: a narrower grid
    grid_s, rays_s = window_case(D, 256, 256, z0, z1, (48, 12))
    tile_s = Tile.full((48, 12))
    gs = torch.rand((1, ANGLES.numel(), 48, 12), generator=g, dtype=F64)
    want = reference_geometry_vjp(small.double(), grid_s, z0, gs, rays_s(F64), tile_s)
    got = CpuBackend().geometry_vjp(small.double(), grid_s, z0, gs, rays_s(F64), tile_s)
    out["vjp float64"] = max(rel(a, b) for a, b in zip(got, want) if float(b.abs().max()) > 0)
    print(json.dumps(out))


@pytest.mark.slow
def test_far_windows_match_the_reference():
    from ctbench.engine.cpu import library as cpu_library, joseph_paths
    known = joseph_paths.known_paths(cpu_library.load_cpu_library("joseph"))["forward"]
    # the default, the scalar-load and AVX2 lanes where the build has them, and the scalar beams
    paths = [known[0]] + [n for n in ("avx512-loads-bands", "avx2-gather-fused-pad-tiles", "avx2-loads", "beams")
                          if n in known]
    env = {k: v for k, v in os.environ.items() if k != "CTBENCH_CPU_PATH"}
    done = subprocess.run([sys.executable, __file__, "far", *paths], capture_output=True, text=True, timeout=900,
                          env=env)
    assert done.returncode == 0, f"rc {done.returncode} (-11: a stray access)\n{done.stderr[-3000:]}"
    err = json.loads(done.stdout.strip().splitlines()[-1])
    assert {f"forward {n}" for n in paths} <= set(err)
    for key, e in err.items():
        assert e <= (1e-10 if "float64" in key else 5e-4 if "fdk" in key else 2e-4), (key, e)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_the_standalone_window_equals_the_global_one(monkeypatch, dtype):
    """The translation is exact geometry: forced on a small grid it gives what the global window gives."""
    D, H, W, z0, z1, det = 40, 24, 28, 23, 31, (36, 20)
    grid, rays = window_case(D, H, W, z0, z1, det, sid=60.0)
    tile, r = Tile.full(det), rays(dtype)
    g = torch.Generator().manual_seed(2)
    slab = torch.rand((2, z1 - z0, H, W), generator=g, dtype=dtype)
    sino = torch.rand((2, ANGLES.numel(), *det), generator=g, dtype=dtype)
    gs = torch.rand((1, ANGLES.numel(), *det), generator=g, dtype=dtype)
    before = (CpuBackend().project(slab, grid, z0, r, tile), CpuBackend().backproject(sino, grid, z0, z1, r, tile),
              CpuBackend().geometry_vjp(slab[:1], grid, z0, gs, r, tile))
    assert cpu_backend.standalone_window(grid, z0, z1, r)[1] == z0  # small: untouched
    monkeypatch.setattr(cpu_backend, "_INDEX_LIMIT", 0)
    local_grid, local_z0, moved = cpu_backend.standalone_window(grid, z0, z1, r)
    assert (local_grid.shape, local_z0) == ((z1 - z0, H, W), 0)
    assert float((moved.ustep - r.ustep).abs().max()) == 0 and float((moved.source - r.source)[:, :2].abs().max()) == 0
    after = (CpuBackend().project(slab, grid, z0, r, tile), CpuBackend().backproject(sino, grid, z0, z1, r, tile),
             CpuBackend().geometry_vjp(slab[:1], grid, z0, gs, r, tile))
    tol = 1e-12 if dtype == F64 else 2e-5
    assert float(before[0].abs().max()) > 0 and float(before[1].abs().max()) > 0
    for a, b in [(before[0], after[0]), (before[1], after[1]), *zip(before[2], after[2])]:
        assert float((a - b).abs().max()) <= tol * max(float(a.abs().max()), 1e-30)


if __name__ == "__main__" and sys.argv[1:2] == ["far"]:
    far_checks()
