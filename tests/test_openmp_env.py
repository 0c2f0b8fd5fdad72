"""ctbench shortens libgomp's idle spin when it is imported before torch, and leaves the user's choice and an
already loaded torch alone (ctbench/openmp_env.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ctbench.openmp_env import SPIN_COUNT, USER_SETTINGS


def _spin_seen(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    out = subprocess.run([sys.executable, "-c", code + "\nimport os; print(os.environ.get('GOMP_SPINCOUNT'))"],
                         env={**clean, **env}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_importing_ctbench_first_sets_the_short_spin_before_torch_loads():
    assert _spin_seen("import ctbench, torch; torch.ones(4).sum()") == SPIN_COUNT


@pytest.mark.slow
def test_torch_loaded_first_keeps_libgomps_default():
    # libgomp has read its environment by then: setting it would only mislead
    assert _spin_seen("import torch, ctbench") == "None"


@pytest.mark.parametrize("name, value", [("GOMP_SPINCOUNT", "123"), ("OMP_WAIT_POLICY", "passive")])
def test_the_users_own_wait_policy_wins(name, value):
    seen = _spin_seen("import ctbench", **{name: value})
    assert seen == (value if name == "GOMP_SPINCOUNT" else "None")
