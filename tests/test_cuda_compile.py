"""Every CUDA entry point compiles to PTX for sm_80 and sm_90, without a GPU.

CI has no GPU; this keeps CUDA compile errors from landing.  nvcc is used
when present, otherwise NVRTC through CuPy; the test skips (with the reason)
only where neither exists.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ctbench.engine.kernel_sources import kernel_dir

ENTRY_FILES = sorted(kernel_dir().glob("*_cuda.cu"))


def _compile_nvcc(src: Path, arch: str, out: Path) -> str:
    cmd = [shutil.which("nvcc"), "-ptx", f"-arch={arch}", "-std=c++17", f"-I{kernel_dir()}", str(src), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc failed for {src.name} ({arch}):\n{proc.stderr}"
    return out.read_text()


def _compile_nvrtc(src: Path, arch: str) -> str:
    cupy = pytest.importorskip("cupy", reason="neither nvcc nor CuPy/NVRTC is available")
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(src.read_text(), src.name, [], [])
    opts = [f"--gpu-architecture=compute_{arch[3:]}", "-std=c++17", f"-I{kernel_dir()}"]
    nvrtc.compileProgram(prog, opts)
    return nvrtc.getPTX(prog).decode()


def test_there_are_cuda_entry_files():
    names = {p.name for p in ENTRY_FILES}
    assert "joseph_cuda.cu" in names


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("src", ENTRY_FILES, ids=lambda p: p.name)
def test_cuda_entry_compiles_to_ptx(src, arch, tmp_path):
    if shutil.which("nvcc"):
        ptx = _compile_nvcc(src, arch, tmp_path / "out.ptx")
    else:
        ptx = _compile_nvrtc(src, arch)
    # every __global__ template declared in the file is instantiated in the PTX
    kernels = set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)", src.read_text()))
    assert kernels, f"{src.name} declares no __global__ kernels"
    for name in kernels:
        assert re.search(rf"\.entry\s+\S*{name}", ptx), f"{name} missing from the PTX of {src.name}"


# ------------------------------------------------------------------ NVRTC
# What CuPy's RawModule compiles: the backend's own (source, options, name
# expressions), through NVRTC itself (cuda-bindings), without a device.
from ctbench.engine.cuda import CUDA_KERNELS, name_expressions, nvrtc_program  # noqa: E402


def _nvrtc_compile(family: str, arch: str):
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC check needs cuda-bindings (dev extra)")
    source, options, exprs = nvrtc_program(family, name_expressions(family))
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{family}_cuda.cu".encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    for e in exprs:
        (err,) = nvrtc.nvrtcAddNameExpression(prog, e.encode())
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, (e, err)
    opts = [o.encode() for o in options] + [f"--gpu-architecture={arch}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"NVRTC failed for {family} ({arch}):\n{log.decode(errors='replace')}"
    lowered = {}
    for e in exprs:
        err, name = nvrtc.nvrtcGetLoweredName(prog, e.encode())
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS and name, f"{e} has no lowered name"
        lowered[e] = name.decode()
    err, size = nvrtc.nvrtcGetCUBINSize(prog)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS and size > 0
    return lowered


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("family", sorted(CUDA_KERNELS))
def test_nvrtc_compiles_what_cupy_compiles(family, arch):
    lowered = _nvrtc_compile(family, arch)
    # every kernel the backend asks for, in both dtypes, exists in the compiled module
    assert set(lowered) == {f"{n}<{t}>" for n in CUDA_KERNELS[family] for t in ("float", "double")}
    assert len(set(lowered.values())) == len(lowered)


def test_the_kernel_registry_lists_every_entry_file_and_kernel():
    """CUDA_KERNELS names each *_cuda.cu and every __global__ template it declares (no kernel left unchecked)."""
    files = {p.name[: -len("_cuda.cu")] for p in ENTRY_FILES}
    assert files == set(CUDA_KERNELS)
    for family, names in CUDA_KERNELS.items():
        src = (kernel_dir() / f"{family}_cuda.cu").read_text()
        declared = set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", src))
        assert declared == set(names), family
