"""The CPU kernels for aarch64 (ARMv8), cross-compiled here and run under qemu-user (issue 21).

CMakeLists.txt is configured with cmake/aarch64-linux-gnu.cmake (Debian's
g++-aarch64-linux-gnu) exactly as a wheel build on an ARM machine would be, and
the installed libraries are checked (ARM64 ELF files matching the manifest).
A small C++ harness, cross-compiled too, dlopens the aarch64 Joseph library
under qemu-aarch64 and runs forward and back projections (and the joseph_grad
library's geometry VJP) on inputs written by this test; the outputs are
compared with the reference backend computed on the host; the FDK library's
weighted backprojection runs too, against its pure-torch oracle.  Correctness only: emulated timings say nothing about ARM speed.
Set up with scripts/install-cross-deps.sh (``make test-cross`` runs it, then these tests).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ctbench import circular_trajectory_3d, circular_trajectory_3d_parallel
from ctbench.engine import Rays, Tile, VolumeGrid, get_backend
from ctbench.engine.executor import reference_geometry_vjp
from ctbench.engine.fdk_kernels import reference_weighted_backproject

ROOT = Path(__file__).resolve().parents[1]
CXX = "aarch64-linux-gnu-g++"
SYSROOT = "/usr/aarch64-linux-gnu"
FAMILIES = ("joseph", "joseph_grad", "fdk")


def _tool(name: str) -> str | None:
    """A build tool: this environment's (the dev extra installs cmake and ninja from PyPI), else PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)

_missing = [t for t in (CXX, "qemu-aarch64") if shutil.which(t) is None] + [t for t in ("cmake",) if _tool(t) is None]
pytestmark = [pytest.mark.slow, pytest.mark.cross,
              pytest.mark.skipif(bool(_missing), reason=f"{', '.join(_missing)} not found: run make test-cross "
                                 "(scripts/install-cross-deps.sh; Debian: g++-aarch64-linux-gnu, qemu-user)")]


@pytest.fixture(scope="module")
def aarch64_build(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aarch64")
    cmake = _tool("cmake")
    gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"] if _tool("ninja") else []
    for cmd in ([cmake, "-S", str(ROOT), "-B", str(tmp / "build"), *gen,
                 f"-DCMAKE_TOOLCHAIN_FILE={ROOT / 'cmake' / 'aarch64-linux-gnu.cmake'}",
                 f"-DCMAKE_INSTALL_PREFIX={tmp / 'install'}"],
                [cmake, "--build", str(tmp / "build")],
                [cmake, "--install", str(tmp / "build")],
                [CXX, "-O2", "-std=c++17", str(ROOT / "tests" / "aarch64" / "joseph_harness.cpp"), "-o",
                 str(tmp / "harness"), "-ldl"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"$ {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {"prebuilt": tmp / "install" / "ctbench" / "_prebuilt", "harness": tmp / "harness", "tmp": tmp}


def _elf_machine(path: Path) -> int:
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", path
    return struct.unpack_from("<H", head, 18)[0]


def test_every_family_cross_builds_for_aarch64(aarch64_build):
    folder = aarch64_build["prebuilt"]
    m = json.loads((folder / "manifest.json").read_text())
    assert m["machine"] == "aarch64"
    assert {(e["family"], e["variant"]) for e in m["libraries"]} == {(f, "aarch64") for f in FAMILIES}
    for e in m["libraries"]:
        data = (folder / e["file"]).read_bytes()
        assert len(data) == e["size"] and hashlib.sha256(data).hexdigest() == e["sha256"]
        assert _elf_machine(folder / e["file"]) == 183  # EM_AARCH64
        assert "-march=armv8-a" in e["flags"]


def _run(build, name: str, op: int, rays: Rays, grid: VolumeGrid, z0: int, z1: int, tile: Tile,
         data: torch.Tensor, cot: torch.Tensor | None = None, nthreads: int = 2) -> torch.Tensor:
    real = data.dtype
    src, ctr, us, vs = (t.to(real).contiguous() for t in rays.tensors())
    U, V = rays.detector_shape
    dz, dy, dx = grid.spacing
    header = struct.pack("<4s17i3d", b"CTBH", data.element_size(), op, data.shape[0], grid.D, grid.H, grid.W, z0, z1,
                         int(rays.cone), rays.n_views, U, V, tile.u0, tile.u1, tile.v0, tile.v1, nthreads, dx, dy, dz)
    inp, out = build["tmp"] / f"{name}.in", build["tmp"] / f"{name}.out"
    arrays = (src, ctr, us, vs, data.contiguous()) + (() if cot is None else (cot.contiguous(),))
    inp.write_bytes(header + b"".join(t.numpy().tobytes() for t in arrays))
    lib = {2: "libjoseph_grad-aarch64.so", 3: "libfdk-aarch64.so"}.get(op, "libjoseph-aarch64.so")
    proc = subprocess.run(["qemu-aarch64", "-L", SYSROOT, str(build["harness"]), str(build["prebuilt"] / lib),
                           str(inp), str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    B = data.shape[0]
    shape = {0: (B, rays.n_views, *tile.shape), 1: (B, z1 - z0, grid.H, grid.W), 2: (rays.n_views, 4, 3),
             3: (z1 - z0, grid.H, grid.W)}[op]
    np_dtype = np.float32 if real == torch.float32 and op != 2 else np.float64
    return torch.from_numpy(np.frombuffer(out.read_bytes(), dtype=np_dtype).copy()).reshape(shape)


CASES = {
    # name: (cone, dtype, slab [z0, z1), tile (u0, u1, v0, v1))
    "cone-f64-full": (True, torch.float64, (0, 9), None),
    "cone-f32-full": (True, torch.float32, (0, 9), None),
    "cone-f64-slab-tile": (True, torch.float64, (3, 7), (2, 13, 1, 10)),
    "parallel-f64-full": (False, torch.float64, (0, 9), None),
    "parallel-f32-slab": (False, torch.float32, (2, 9), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_aarch64_joseph_matches_reference_under_qemu(aarch64_build, case):
    cone, dtype, (z0, z1), tile = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    n_views, det = 7, (15, 11)
    if cone:
        tr = circular_trajectory_3d(n_views, 40.0, 80.0, dtype=torch.float64)
        src = tr.source
    else:
        tr = circular_trajectory_3d_parallel(n_views, dtype=torch.float64)
        src = tr.source
    rays = Rays(src, tr.detector_center, tr.detector_u * 1.4, tr.detector_v * 1.3, cone, det)
    rays = Rays(*(t.to(dtype) for t in rays.tensors()), cone, det)
    grid = VolumeGrid((9, 10, 12), (1.0, 0.9, 1.1))
    tile = Tile.full(det) if tile is None else Tile(*tile)
    ref = get_backend("reference")
    vol = torch.rand((2, z1 - z0, grid.H, grid.W), generator=g, dtype=torch.float64).to(dtype)
    sino = torch.rand((2, n_views, *tile.shape), generator=g, dtype=torch.float64).to(dtype)
    fwd = _run(aarch64_build, case + "-fwd", 0, rays, grid, z0, z1, tile, vol)
    bwd = _run(aarch64_build, case + "-bwd", 1, rays, grid, z0, z1, tile, sino)
    want_fwd = ref.project(vol, grid, z0, rays, tile)
    want_bwd = ref.backproject(sino, grid, z0, z1, rays, tile)
    # float64: round-off; float32: a few ulps of the largest line integral (sums of ~20 samples)
    tol = 1e-12 if dtype == torch.float64 else 2e-6 * math.sqrt(grid.W * grid.H)
    for got, want in ((fwd, want_fwd), (bwd, want_bwd)):
        assert want.abs().max() > 0
        err = float((got.double() - want.double()).abs().max() / want.abs().max())
        assert err <= tol, (case, err)


@pytest.mark.parametrize("cone", [True, False])
def test_aarch64_geometry_vjp_matches_reference_autograd_under_qemu(aarch64_build, cone):
    """The joseph_grad library (geometry VJP) for aarch64 == autograd through the reference backend."""
    g = torch.Generator().manual_seed(5 + cone)
    n_views, det = 5, (9, 7)
    tr = (circular_trajectory_3d(n_views, 40.0, 80.0, dtype=torch.float64) if cone
          else circular_trajectory_3d_parallel(n_views, dtype=torch.float64))
    rays = Rays(tr.source, tr.detector_center, tr.detector_u * 1.7, tr.detector_v * 1.6, cone, det)
    grid = VolumeGrid((6, 8, 10), (1.0, 1.1, 0.9))
    tile = Tile.full(det)
    vol = torch.rand((1, 6, 8, 10), generator=g, dtype=torch.float64)
    cot = torch.randn((1, n_views, *det), generator=g, dtype=torch.float64)
    got = _run(aarch64_build, f"vjp-{cone}", 2, rays, grid, 0, 6, tile, vol, cot)
    want = torch.stack(reference_geometry_vjp(vol, grid, 0, cot, rays, tile), dim=1)
    assert want.abs().max() > 0
    err = float((got - want).norm() / want.norm())
    assert err <= 1e-10, err


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_aarch64_fdk_backprojection_matches_reference_under_qemu(aarch64_build, dtype):
    """The fdk library's weighted voxel-driven backprojection for aarch64 == its pure-torch oracle
    (a slab and a view range, cone beam)."""
    g = torch.Generator().manual_seed(11)
    n_views, det = 8, (14, 10)
    tr = circular_trajectory_3d(n_views, 40.0, 80.0, dtype=torch.float64)
    rays = Rays(*(t.to(dtype) for t in (tr.source, tr.detector_center, tr.detector_u * 1.5, tr.detector_v * 1.4)),
                True, det)
    grid = VolumeGrid((8, 9, 11), (1.0, 1.0, 1.1))
    z0, z1, k0, k1 = 2, 7, 1, 7
    weights = torch.rand(n_views, generator=g, dtype=torch.float64).to(dtype)
    q = torch.randn((n_views, *det), generator=g, dtype=torch.float64).to(dtype)
    got = _run(aarch64_build, f"fdk-{dtype}", 3, rays, grid, z0, z1, Tile(k0, k1, 0, 0),
               weights[None], q.transpose(1, 2).contiguous())
    want = reference_weighted_backproject(q, rays, grid, weights, z0, z1, k0, k1)
    assert want.abs().max() > 0
    err = float((got.double() - want.double()).abs().max() / want.abs().max())
    assert err <= (1e-12 if dtype == torch.float64 else 1e-5), err
