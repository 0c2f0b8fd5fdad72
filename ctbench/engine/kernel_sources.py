"""What the compiled backends share: where the kernel sources are and which host compiler builds them.

The cpu backend compiles ``kernels/<family>_cpu.cpp`` with the host compiler; the cuda backend hands
``kernels/<family>_cuda.cu`` to NVRTC, and its emulation compiles the same file with the host compiler.
Both import this module rather than each other, so the backends stay independent (pyproject.toml).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def kernel_dir() -> Path:
    """Folder holding the kernel sources: inside the installed package, or the checkout's kernels/."""
    try:
        from importlib.resources import files
        p = Path(str(files("ctbench.kernels")))
        if (p / "common.cuh").exists():
            return p
    except (ModuleNotFoundError, TypeError):
        pass
    p = Path(__file__).resolve().parents[2] / "kernels"
    if (p / "common.cuh").exists():
        return p
    raise FileNotFoundError("ctbench kernel sources not found (expected ctbench/kernels or the checkout's kernels/)")


def find_compiler() -> str:
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)  # type: ignore[return-value]
    raise RuntimeError(
        "no C++ compiler found for ctbench's CPU kernels: install one (e.g. `apt-get install g++`) "
        "or set CXX; backend='reference' works without a compiler (slowly)")
