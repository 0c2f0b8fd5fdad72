"""The wheel a user installs: prebuilt CPU kernels for every level, loaded with no compiler (issue 21).

One wheel is built from the repository (scikit-build-core + CMake: 3 kernel
families x 3 x86-64 levels) and installed into a fresh virtual environment
whose dependencies (torch, numpy, ...) come from this environment through a
.pth file instead of the network.  It then runs with no compiler on PATH, CXX
unset and an empty kernel cache; its outputs are compared bit for bit with
the JIT build (cpu_build) of the same instruction set in this checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
import torch

from ctbench.engine import cpu_prebuilt

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "prebuilt_probe.py"
FAMILIES = ("joseph", "joseph_grad", "fdk")
MARCH = {"x86_64": "x86-64", "x86_64_v3": "x86-64-v3", "x86_64_v4": "x86-64-v4"}
COMPILERS = ("g++", "c++", "cc", "gcc", "clang", "clang++")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(cpu_prebuilt.machine() != "x86_64", reason="the x86-64 wheel test")]


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    wheels = tmp / "wheels"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--config-settings", f"build-dir={tmp / 'build'}", "-w", str(wheels), str(ROOT)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    build_s = time.perf_counter() - t0
    (wheel,) = wheels.glob("ctbench-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    Path(site, "ctbench_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    nocc = tmp / "empty-bin"  # PATH holds no compiler (nothing at all)
    nocc.mkdir()
    return {"wheel": wheel, "python": vpy, "site": Path(site), "tmp": tmp, "path": str(nocc), "build_s": build_s}


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CXX", "CC", "CTBENCH_MARCH", "CTBENCH_CXXFLAGS", "CTBENCH_CPU_BUILD",
                        "CTBENCH_CPU_VARIANT")}
    env.update(extra)
    return env


def _probe(python, out: Path, env: dict) -> dict:
    proc = subprocess.run([str(python), str(PROBE), str(out)], cwd=out.parent, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


def _installed(wheel_env, tmp_path, name: str, **extra) -> dict:
    cache = tmp_path / f"cache-{name}"
    r = _probe(wheel_env["python"], tmp_path / f"{name}.pt",
               _env(PATH=wheel_env["path"], CTBENCH_CACHE_DIR=str(cache), **extra))
    assert r["compiler"] is None, r["compiler"]
    assert not cache.exists() or not any(cache.rglob("*.so")), "the installed wheel compiled something"
    return r


def _jit(tmp_path, march: str) -> dict:
    r = _probe(sys.executable, tmp_path / f"jit-{march}.pt",
               _env(CTBENCH_CPU_BUILD="native", CTBENCH_MARCH=march, CTBENCH_CACHE_DIR=str(tmp_path / "jit-cache")))
    assert {v["source"] for v in r["loaded"].values()} == {"jit"}
    assert {v["variant"] for v in r["loaded"].values()} == {f"march={march}"}
    return r


def _assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), \
            (k, float((a[k].double() - b[k].double()).abs().max()))


def test_wheel_holds_every_family_and_level(wheel_env):
    names = set(zipfile.ZipFile(wheel_env["wheel"]).namelist())
    for required in ("ctbench/kernels/joseph.cuh", "ctbench/kernels/joseph_cpu.cpp", "ctbench/kernels/common.cuh",
                     "ctbench/kernels/joseph_cuda.cu", "ctbench_napari/napari.yaml", "ctbench/_prebuilt/manifest.json"):
        assert required in names, f"{required} missing from the wheel"
    manifest = json.loads(zipfile.ZipFile(wheel_env["wheel"]).read("ctbench/_prebuilt/manifest.json"))
    got = {(e["family"], e["variant"]) for e in manifest["libraries"]}
    assert got == {(f, v) for f in FAMILIES for v in MARCH}
    for e in manifest["libraries"]:
        assert f"ctbench/_prebuilt/{e['file']}" in names
    print(f"wheel build: {wheel_env['build_s']:.0f} s (load {open('/proc/loadavg').read().split()[0]})")


def test_installed_wheel_runs_without_compiler_and_equals_jit_bit_for_bit(wheel_env, tmp_path):
    """No compiler on PATH, CXX unset, empty cache: the prebuilt library for this CPU's best level
    loads, and every kernel family's output equals the JIT build of that level bit for bit."""
    best = cpu_prebuilt.host_levels()[0]
    r = _installed(wheel_env, tmp_path, "best")
    assert set(r["loaded"]) == set(FAMILIES)
    for fam, info in r["loaded"].items():
        assert info["source"] == "prebuilt" and info["variant"] == best, info
        assert info["file"].startswith(str(wheel_env["site"])), info["file"]
    _assert_bitwise_equal(r["outputs"], _jit(tmp_path, MARCH[best])["outputs"])
    # ctbench info names the variant, with no compiler
    proc = subprocess.run([str(wheel_env["python"]), "-m", "ctbench.cli", "info"], cwd=tmp_path, capture_output=True,
                          text=True, env=_env(PATH=wheel_env["path"], CTBENCH_CACHE_DIR=str(tmp_path / "c")))
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["compiler"] is None and info["cpu_backend"] == "ok"
    assert info["cpu_kernels"]["joseph"]["variant"] == best


@pytest.mark.parametrize("variant", ["x86_64_v3", "x86_64"])
def test_lower_levels_equal_their_jit_builds(wheel_env, tmp_path, variant):
    """Each lower level this CPU runs (forced with CTBENCH_CPU_VARIANT) equals its JIT build bit for bit."""
    if variant not in cpu_prebuilt.host_levels():
        pytest.skip(f"this CPU does not run {variant}")
    r = _installed(wheel_env, tmp_path, variant, CTBENCH_CPU_VARIANT=variant)
    assert {v["variant"] for v in r["loaded"].values()} == {variant}
    _assert_bitwise_equal(r["outputs"], _jit(tmp_path, MARCH[variant])["outputs"])


def test_wheel_without_the_best_level_falls_back_to_the_next(wheel_env, tmp_path):
    """A wheel whose manifest lacks this CPU's best level loads the next lower one, never an error."""
    levels = cpu_prebuilt.host_levels()
    if len(levels) < 2:
        pytest.skip("this CPU runs only the baseline")
    path = wheel_env["site"] / "ctbench" / "_prebuilt" / "manifest.json"
    original = path.read_bytes()
    m = json.loads(original)
    m["libraries"] = [e for e in m["libraries"] if e["variant"] != levels[0]]
    try:
        path.write_text(json.dumps(m))
        r = _installed(wheel_env, tmp_path, "fallback")
    finally:
        path.write_bytes(original)
    assert {v["variant"] for v in r["loaded"].values()} == {levels[1]}


def test_cibuildwheel_test_command_passes_in_the_installed_wheel(wheel_env, tmp_path):
    """The test cibuildwheel runs on each built wheel ([tool.cibuildwheel] test-command) passes here."""
    proc = subprocess.run([str(wheel_env["python"]), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                           str(ROOT / "tests" / "test_prebuilt_kernels.py"), "-k", "installed"],
                          cwd=tmp_path, env=_env(PATH=wheel_env["path"], CTBENCH_CACHE_DIR=str(tmp_path / "c")),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout, proc.stdout[-2000:]


def test_native_option_uses_the_jit_build_in_the_installed_wheel(wheel_env, tmp_path):
    """CTBENCH_CPU_BUILD=native in an installed wheel, with a compiler: the -march=native JIT build loads,
    through the trusted cache (its record and library appear there)."""
    cache = tmp_path / "cache"
    r = _probe(wheel_env["python"], tmp_path / "native.pt", _env(CTBENCH_CPU_BUILD="native", CTBENCH_CACHE_DIR=str(cache)))
    assert r["compiler"] is not None
    assert {v["source"] for v in r["loaded"].values()} == {"jit"}
    assert {v["variant"] for v in r["loaded"].values()} == {"march=native"}
    assert len(list(cache.rglob("*.json"))) == len(FAMILIES) and len(list(cache.rglob("*.so"))) == len(FAMILIES)
