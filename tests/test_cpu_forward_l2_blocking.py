"""The forward's blocking sized from the core's L2 (kernels/joseph_forward_cpu.hpp: forward_band_rows,
forward_tile_planes read ct::l2_cache_bytes()): forced L2 sizes of 512 KiB, 1 MiB, 2 MiB and 8 MiB pick
different bands and plane tiles (16, 32, 64 planes, none) for the same scan, and each gives the reference's
projection within float32 round-off.  The override is read once per process, so each size runs in its own."""

import math
import os
import subprocess
import sys

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.cpu import library as cpu_library, joseph_paths

F64 = torch.float64
PATH = "avx512-gather-fused-pad-tiles"
SIZES = (512 << 10, 1 << 20, 2 << 20, 8 << 20)

# 260 x 250 planes (260 KB each): a band of 4-8 rows exceeds 512 KiB .. 2 MiB, not 8 MiB
CASE = """
import math, sys, torch
from ctbench import Projector, circular_trajectory_3d
F64 = torch.float64
angles = torch.tensor([0.0, 0.3, math.pi / 4, 1.2, math.pi / 2, 2.6], dtype=F64)
traj = circular_trajectory_3d(angles.numel(), 700.0, 1400.0, angles=angles, dtype=F64)
shape, det = (7, 260, 250), (61, 9)
def projector(backend):
    return Projector(traj, shape, det, backend=backend, voxel_spacing=(1.0, 1.0, 1.0), detector_spacing=(2.1, 1.7))
x = torch.rand((2, *shape), generator=torch.Generator().manual_seed(7), dtype=F64) + 0.1
"""


def _forward_with_l2(l2: int, path: str, out_file: str) -> torch.Tensor:
    code = CASE + f"torch.set_num_threads(1); torch.save(projector('cpu').project(x.float()), {out_file!r})"
    env = {**os.environ, "CTBENCH_L2_BYTES": str(l2), "CTBENCH_CPU_PATH": f"forward={path}"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return torch.load(out_file)


@pytest.mark.slow
def test_forward_is_the_same_for_every_l2_size(tmp_path):
    known = joseph_paths.known_paths(cpu_library.load_cpu_library("joseph")).get("forward", [])
    path = PATH if PATH in known else "avx2-gather-fused-pad-tiles"
    if path not in known:
        pytest.skip("this build has no -fused-pad-tiles forward path")
    scope: dict = {}
    exec(CASE, scope)
    want = scope["projector"]("reference").project(scope["x"])
    got = {l2: _forward_with_l2(l2, path, str(tmp_path / f"l2-{l2}.pt")) for l2 in SIZES}
    for l2, g in got.items():
        err = (g.double() - want).abs()
        assert bool((err <= 1e-5 * want.abs() + 2e-6 * float(want.abs().max())).all()), (l2, float(err.max()))
    # tiles of 16 planes (512 KiB) against none (8 MiB): segment sums round differently, so a bitwise match
    # would mean the L2 size chose nothing
    assert not torch.equal(got[512 << 10], got[8 << 20])
    assert not torch.equal(got[512 << 10], got[2 << 20])
