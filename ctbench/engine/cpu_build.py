"""Compile the single-source kernels for the CPU at first use.

The C++ entry file of a kernel family (``kernels/<family>_cpu.cpp``) is
compiled with the host compiler (``-O3 -fopenmp`` and the host's best
``-march``), cached under a hash of the sources, flags and compiler, and
loaded with ctypes (calls release the GIL).  Concurrent processes (torchrun
ranks) may race to build: each writes to a private temporary file and
renames it into place, so a half-written library is never loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

_LOCK = threading.Lock()


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


def cache_dir() -> Path:
    root = os.environ.get("CTBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ctbench")
    return Path(root) / "kernels"


def find_compiler() -> str:
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)  # type: ignore[return-value]
    raise RuntimeError(
        "no C++ compiler found for ctbench's CPU kernels: install one (e.g. `apt-get install g++`) "
        "or set CXX; backend='reference' works without a compiler (slowly)")


@lru_cache(maxsize=None)
def _compiler_id(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return cxx


@lru_cache(maxsize=None)
def _arch_flags(cxx: str) -> tuple[str, ...]:
    """The host's best -march if the compiler accepts it (CTBENCH_MARCH overrides)."""
    want = os.environ.get("CTBENCH_MARCH", "native")
    if want == "none":
        return ()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "t.cpp"
        src.write_text("int main(){return 0;}\n")
        ok = subprocess.run([cxx, f"-march={want}", str(src), "-o", str(Path(tmp) / "t")],
                            capture_output=True).returncode == 0
    return (f"-march={want}",) if ok else ()


def compile_flags(cxx: str) -> list[str]:
    return ["-O3", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", *_arch_flags(cxx)]


def _source_hash(family: str, flags: list[str], cxx: str) -> str:
    h = hashlib.sha256()
    d = kernel_dir()
    for p in sorted(d.glob("*.cuh")) + sorted(d.glob("*.hpp")) + [d / f"{family}_cpu.cpp"]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(flags).encode())
    h.update(_compiler_id(cxx).encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=None)
def load_cpu_library(family: str) -> ctypes.CDLL:
    """Build (if needed) and load ``kernels/<family>_cpu.cpp``."""
    src = kernel_dir() / f"{family}_cpu.cpp"
    if not src.exists():
        raise FileNotFoundError(f"no CPU entry file for kernel family {family!r}: {src}")
    cxx = find_compiler()
    flags = compile_flags(cxx)
    out_dir = cache_dir() / _source_hash(family, flags, cxx)
    lib = out_dir / f"lib{family}.so"
    with _LOCK:
        if not lib.exists():
            out_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{family}.", suffix=".so", dir=out_dir)
            os.close(fd)
            cmd = [cxx, *flags, f"-I{kernel_dir()}", str(src), "-o", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                os.unlink(tmp)
                raise RuntimeError(f"compiling the CPU kernels failed:\n$ {' '.join(cmd)}\n{proc.stderr}")
            os.replace(tmp, lib)
    return ctypes.CDLL(str(lib))


# ctypes argument types of the kernels' extern "C" entries, and the dtype suffix
# every entry carries (<name>_f32, <name>_f64).
PTR, INT, I64, F64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_double
DTYPE_SUFFIX = {"torch.float32": "f32", "torch.float64": "f64"}


def cpu_function(family: str, name: str, dtype, argtypes):
    """The entry ``<name>_<f32|f64>`` of kernel family ``family`` for ``dtype``, with its ctypes signature."""
    f = getattr(load_cpu_library(family), f"{name}_{DTYPE_SUFFIX[str(dtype)]}")
    f.argtypes = argtypes
    f.restype = None
    return f
