"""Build the Joseph CPU kernel for one instruction set (outside the kernel cache), for tests that
check every compile-time SIMD path the host can run against the reference backend."""

from __future__ import annotations

import ctypes
import platform
import re
import subprocess
from pathlib import Path

import pytest


def host_flags() -> set[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.MULTILINE)
    return set(m.group(1).split()) if m else set()


def joseph_library_for(tmp_path: Path, march: str, needs: str, family: str = "joseph") -> ctypes.CDLL:
    """kernels/<family>_cpu.cpp (default: the projector's joseph_cpu.cpp; "joseph_grad": the geometry
    VJP) built with ``-march=march`` into tmp_path; skips the test where the host lacks ``needs`` (a
    /proc/cpuinfo flag) or has no C++ compiler."""
    from ctbench.engine.cpu import library as cpu_library

    if platform.machine() not in ("x86_64", "AMD64") or needs not in host_flags():
        pytest.skip(f"host cannot run -march={march}")
    try:
        cxx = cpu_library.find_compiler()
    except RuntimeError:
        pytest.skip("no C++ compiler")
    src = cpu_library.kernel_dir()
    lib_path = tmp_path / f"{family}-{march}.so"
    subprocess.run([cxx, *cpu_library.BASE_FLAGS, f"-march={march}", f"-I{src}", str(src / f"{family}_cpu.cpp"), "-o",
                    str(lib_path)], check=True, capture_output=True)
    return ctypes.CDLL(str(lib_path))
