"""The CUDA entry files, run on the host: a verification runtime for machines without a GPU.

``kernels/<family>_cuda.cu`` is compiled by the host C++ compiler together with
``kernels/cuda_host_shim.h`` (host meanings for ``__global__``, ``threadIdx``,
``__syncthreads``, warp shuffles and atomics) and one generated ``extern "C"``
launcher per explicit instantiation in the file.  A launcher runs the kernel over
a grid block by block, each block's threads as cooperative fibers, with the grid
and block the cuda backend computed (:func:`ctbench.engine.cuda.launch_config`).

:class:`EmulatedRuntime` stands in for CuPy in :mod:`ctbench.engine.cuda`, so the
backend's own argument marshalling, windows and launch arithmetic run unchanged
on CPU tensors: ``backend="cuda-emulated"``.  It is slow by design (one fiber per
CUDA thread); it exists so that indexing, window and launch-configuration bugs of
the CUDA path fail tests on a CPU-only machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import subprocess
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from .kernel_sources import find_compiler, kernel_dir

_LOCK = threading.Lock()
_INSTANTIATION = re.compile(r"template\s+__global__\s+void\s+(\w+)<(\w+)>\s*\(([^;]*)\)\s*;", re.S)
_CTYPES = {"int": ctypes.c_int, "i64": ctypes.c_longlong, "double": ctypes.c_double, "float": ctypes.c_float,
           "unsigned int": ctypes.c_uint}


def instantiations(source: str) -> list[tuple[str, str, list[str]]]:
    """(kernel, template argument, parameter types) of every explicit instantiation in a CUDA entry file."""
    out = []
    for name, targ, params in _INSTANTIATION.findall(source):
        types = [" ".join(p.split()) for p in params.split(",") if p.strip()]
        out.append((name, targ, types))
    return out


def _ctype(c_type: str):
    return ctypes.c_void_p if "*" in c_type else _CTYPES[c_type]


def _launcher_source(family: str, source: str) -> str:
    lines = ['#include "cuda_host_shim.h"', f'#include "{family}_cuda.cu"', ""]
    for name, targ, types in instantiations(source):
        params = ", ".join(f"{t} a{i}" for i, t in enumerate(types))
        args = ", ".join(f"a{i}" for i in range(len(types)))
        fields = "; ".join(f"{t} a{i}" for i, t in enumerate(types))
        lines += [
            f"struct args_{name}_{targ} {{ {fields}; }};",
            f"static void body_{name}_{targ}(void* p) {{",
            f"  auto* a = static_cast<args_{name}_{targ}*>(p);",
            f"  {name}<{targ}>({', '.join(f'a->a{i}' for i in range(len(types)))});",
            "}",
            f'extern "C" void emulate_{name}_{targ}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,',
            f"                                     unsigned bz, {params}) {{",
            f"  args_{name}_{targ} a{{{args}}};",
            f"  ct_emu::launch(ct_dim3{{gx, gy, gz}}, ct_dim3{{bx, by, bz}}, body_{name}_{targ}, &a);",
            "}",
            "",
        ]
    return "\n".join(lines)


@lru_cache(maxsize=None)
def emulation_library(family: str) -> tuple[ctypes.CDLL, dict]:
    """Compile ``kernels/<family>_cuda.cu`` for the host (once per process); returns (library, signatures)."""
    source = (kernel_dir() / f"{family}_cuda.cu").read_text()
    with _LOCK:
        build = Path(tempfile.mkdtemp(prefix=f"ctbench-cuda-emulation-{family}-"))
        unit = build / f"{family}_emulation.cpp"
        unit.write_text(_launcher_source(family, source))
        lib = build / f"lib{family}_emulation.so"
        cmd = [find_compiler(), "-O1", "-g", "-std=c++17", "-shared", "-fPIC", f"-I{kernel_dir()}", str(unit),
               "-o", str(lib)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling the CUDA emulation of {family!r} failed:\n$ {' '.join(cmd)}\n"
                               f"{proc.stderr[-6000:]}")
        return ctypes.CDLL(str(lib)), {(n, t): types for n, t, types in instantiations(source)}


class EmulatedKernel:
    """A kernel of the emulation library, called like a CuPy RawKernel: ``k(grid, block, args)``."""

    def __init__(self, family: str, name: str, targ: str):
        lib, signatures = emulation_library(family)
        if (name, targ) not in signatures:
            raise KeyError(f"{family}_cuda.cu has no explicit instantiation {name}<{targ}>")
        self.name = f"{name}<{targ}>"
        self.param_types = signatures[(name, targ)]
        self.fn = getattr(lib, f"emulate_{name}_{targ}")
        self.fn.argtypes = [ctypes.c_uint] * 6 + [_ctype(t) for t in self.param_types]
        self.fn.restype = None
        self.launches: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def __call__(self, grid, block, args):
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        if len(args) != len(self.param_types):
            raise TypeError(f"{self.name} takes {len(self.param_types)} arguments, got {len(args)}")
        values = []
        for a, t in zip(args, self.param_types):
            if "*" in t:
                if not isinstance(a, _Pointer):
                    raise TypeError(f"{self.name}: parameter of type {t!r} got {type(a).__name__}")
                values.append(a.address)
            else:
                if isinstance(a, _Pointer):
                    raise TypeError(f"{self.name}: parameter of type {t!r} got a pointer")
                want = np.int64 if t == "i64" else np.int32 if t == "int" else np.float64 if t == "double" else None
                if want is not None and not isinstance(a, want):
                    raise TypeError(f"{self.name}: parameter of type {t!r} got {type(a).__name__} "
                                    f"(the CUDA launch would pass the wrong width)")
                values.append(a.item() if hasattr(a, "item") else a)
        self.launches.append((grid, block))
        self.fn(*grid, *block, *values)


class _Pointer:
    """A tensor's device pointer, as CuPy's ndarray view stands for it in a real launch."""

    def __init__(self, t: torch.Tensor):
        self.tensor = t  # keeps it alive for the launch
        self.address = t.data_ptr()


class EmulatedRuntime:
    """What :mod:`ctbench.engine.cuda` needs from CuPy, on the host: kernels, arrays, streams."""

    name = "cuda-emulated"

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def kernel(self, family: str, name: str, dtype: torch.dtype, device: torch.device):
        return _kernel(family, name, {torch.float32: "float", torch.float64: "double"}[dtype])

    def array(self, t: torch.Tensor):
        if t.device.type != "cpu":
            raise ValueError(f"the CUDA emulation runs on CPU tensors, got one on {t.device}")
        return _Pointer(t)

    def on_stream(self, device: torch.device):
        return contextlib.nullcontext()


@lru_cache(maxsize=None)
def _kernel(family: str, name: str, targ: str) -> EmulatedKernel:
    return EmulatedKernel(family, name, targ)
