"""Hypothesis fuzz of random geometries through every kernel family, in a subprocess (issue 10).

The fuzz itself lives in tests/fuzz_kernels_main.py (a script, so that the
same run can be repeated under AddressSanitizer, see docs/RELIABILITY.md).
Running it in a child process turns a crash (SIGSEGV, SIGBUS) into a test
failure with the child's output instead of killing pytest.  Before the fix it
failed: non-finite views contributed to projections, and the issue's case (a
NaN source coordinate, an explicit example) died with SIGSEGV.
"""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "fuzz_kernels_main.py"


@pytest.mark.slow
def test_random_and_non_finite_geometry_never_crashes_any_kernel():
    proc = subprocess.run([sys.executable, str(SCRIPT), "250"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    assert "FUZZ OK 250 examples" in proc.stdout
