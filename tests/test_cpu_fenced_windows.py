"""The CPU Joseph kernels touch nothing outside the z-window they are given.

Every forward, back and FDK path, forced one after another, and the geometry VJP, on a window of planes [8, 16)
of a 24x64x64 volume that lies between inaccessible (PROT_NONE) regions larger than the whole volume
(tests/guarded_slab_paths.py, in a child process, so a stray access is a failed test and not a dead
session).  The scalar-load forward lanes used to read a global row outside the window for lanes switched off
at a plane, which segfaulted on windows of 384^3 and 512^3 volumes (session 12).  Independent truth: the
reference backend on the same window.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("guarded_slab_paths.py")


@pytest.mark.parametrize("op", ["forward", "back", "vjp", "fdk"])
@pytest.mark.slow
def test_every_path_stays_inside_a_fenced_window(op):
    env = {k: v for k, v in os.environ.items() if k != "CTBENCH_CPU_PATH"}
    done = subprocess.run([sys.executable, str(CHILD), op], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"rc {done.returncode} (-11: an access outside the window)\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["paths"] and report["worst"] <= (1e-3 if op == "vjp" else 1e-5)
    if op == "forward":
        # the paths that faulted before the fix are among those checked where the build has them
        flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
        if " avx2" in flags:
            assert {"avx2-loads", "avx2-loads-bands"} <= set(report["paths"])
        if " avx512f" in flags and os.environ.get("CTBENCH_MARCH", "native") == "native":
            assert {"avx512-loads", "avx512-loads-bands"} <= set(report["paths"])
