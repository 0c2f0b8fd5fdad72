"""The kernels' L2 size (what the forward's bands and the backprojection's accumulator blocks are sized
to): read from the system, overridable for measurements, and sane where the system says nothing."""

import ctypes
import os
import subprocess
import sys

import pytest

from ctbench.engine.cpu.library import load_cpu_library


def _l2(env: dict | None = None) -> int:
    code = ("import ctypes; from ctbench.engine.cpu.library import load_cpu_library; "
            "f = load_cpu_library('joseph').joseph_l2_cache_bytes; f.restype = ctypes.c_longlong; print(f())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **(env or {})}, check=True,
                         capture_output=True, text=True)
    return int(out.stdout.strip())


def test_l2_size_is_the_systems():
    lib = load_cpu_library("joseph")
    f = lib.joseph_l2_cache_bytes
    f.restype = ctypes.c_longlong
    got = f()
    assert 64 << 10 <= got <= 1 << 30
    if hasattr(os, "sysconf") and "SC_LEVEL2_CACHE_SIZE" in os.sysconf_names:
        told = os.sysconf("SC_LEVEL2_CACHE_SIZE")
        if told >= 64 << 10:
            assert got == told


@pytest.mark.parametrize("value, expected", [("524288", 524288), ("2097152", 2097152)])
@pytest.mark.slow
def test_l2_size_override(value, expected):
    assert _l2({"CTBENCH_L2_BYTES": value}) == expected


@pytest.mark.slow
def test_l2_size_override_out_of_range_is_ignored():
    assert _l2({"CTBENCH_L2_BYTES": "12"}) == _l2({"CTBENCH_L2_BYTES": ""})
