"""The backprojection's cache blocking sized to the core's L2 (kernels/joseph_backward_cpu.hpp, view tiles).

Where the view tiles start and how deep they are follow ``ct::l2_cache_bytes`` (``CTBENCH_L2_BYTES``
overrides it, read once per process), so each forced L2 runs in its own subprocess.  A (4, 290, 290) slab
has 328 KiB float32 planes (no padding: 1160-byte rows), so a band of 8 rows (10 planes) holds 3.2 MiB: above
the 2 MiB where tiles start, and tiled 16, 32 and 64 planes deep for an L2 of 256 KiB, 512 KiB and 1 MiB; a
4 MiB L2 takes no tiles in float32 (float64's 6.4 MiB bands tile at every size).  Every result must equal the reference backend's (float64 to round-off, float32 to its rounding),
at 1 and 2 threads (the row split's parts at 2).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from ctbench.engine.cpu import library as cpu_library, joseph_paths, path_choice

SHAPE, DET, VIEWS = (4, 290, 290), (120, 96), 8

CHILD = r"""
import json, math, sys, torch
from ctbench import Projector, circular_trajectory_3d
shape, det, views = json.loads(sys.argv[1])
angles = torch.tensor([0.0, 0.3, math.pi / 4, 1.2, math.pi / 2, 2.0, 3 * math.pi / 4, 4.0], dtype=torch.float64)
traj = circular_trajectory_3d(views, 400.0, 800.0, angles=angles[:views], dtype=torch.float64)
p = Projector(traj, tuple(shape), tuple(det), backend=sys.argv[2], voxel_spacing=(1.0, 1.1, 0.9),
              detector_spacing=(4.1, 0.6))
y = torch.rand((views, *det), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
out = {}
oracle = sys.argv[2] == "reference"   # the oracle: float64 at one thread is all the test compares with
for t in ((1,) if oracle else (1, 2)):
    torch.set_num_threads(t)
    out[t] = (p.backproject(y), None if oracle else p.backproject(y.float()))
torch.save(out, sys.argv[3])
"""


def _run(tmp_path, backend, l2=None, path=None):
    env = dict(os.environ)
    env.pop("CTBENCH_L2_BYTES", None)
    if l2 is not None:
        env["CTBENCH_L2_BYTES"] = str(l2)
    if path is not None:
        env[path_choice.PATH_ENV] = f"back={path}"
    f = tmp_path / f"{backend}-{l2}.pt"
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps([SHAPE, DET, VIEWS]), backend, str(f)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return torch.load(f)


@pytest.mark.slow
def test_view_tiles_sized_to_any_l2_equal_the_reference(tmp_path):
    known = joseph_paths.known_paths(cpu_library.load_cpu_library("joseph"))
    tiled = [n for n in known["back"] if n.endswith("-rs-b8")]
    assert tiled, known["back"]
    want = _run(tmp_path, "reference")[1][0]
    scale = float(want.abs().max())
    assert scale > 0
    results = {}
    for l2 in (256 << 10, 512 << 10, 1 << 20, 4 << 20):
        got = _run(tmp_path, "cpu", l2, tiled[0])
        for t, (b64, b32) in got.items():
            assert float((b64 - want).abs().max()) <= 1e-12 * scale, (l2, t)
            # float32: each voxel sums a few thousand samples (its rounding, about 2e-5 of the largest voxel)
            assert float((b32.double() - want).abs().max()) <= 1e-4 * scale, (l2, t)
        results[l2] = got
    # a voxel lies in one tile of its rays' dominant axis, so tiling keeps the order of its additions: with
    # no z-dominant ray here every tile depth and the untiled call (4 MiB) agree bitwise, per thread count
    for t in (1, 2):
        base = results[4 << 20][t][1]
        for l2, got in results.items():
            assert torch.equal(got[t][1], base), (l2, t)
