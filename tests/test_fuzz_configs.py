"""Hypothesis fuzz of recon/calibrate configs and trajectory JSON files, in a child process (issue 47).

The fuzz lives in tests/fuzz_configs_main.py (a script: a crash, a hang or a
runaway allocation fails this test with the child's output instead of taking
pytest down).  The child runs under a 4 GiB address-space limit and a time
limit, and every example under its own alarm: each hostile config or file must
give a clear refusal (rc 2, one line naming the problem, none of the
signatures of an internal error) or a correct result.  Before issue 47 it
failed at once: a trajectory with ``"source": {"x": 1}`` was a TypeError
traceback, ``resources.memory`` of 10^400 an OverflowError, a ring filter of
10^30 a TypeError, a 400-digit ``volume_shape`` an OverflowError.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "fuzz_configs_main.py"
ADDRESS_SPACE = 4 << 30
N_CONFIGS, N_TRAJECTORIES = 300, 400


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def test_hostile_configs_and_trajectories_get_a_clear_error_or_a_correct_result(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SCRIPT.parents[1]))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "world"), str(N_CONFIGS), str(N_TRAJECTORIES)],
                          capture_output=True, text=True, timeout=600, env=env, preexec_fn=_limit)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
    assert f"FUZZ OK {N_CONFIGS} configs" in proc.stdout and f"{N_TRAJECTORIES} trajectories" in proc.stdout
    print(proc.stdout.strip().splitlines()[-1])
