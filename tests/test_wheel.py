"""The wheel a user installs: prebuilt CPU kernels for every level, loaded with no compiler (issue 21).

One wheel is built from the repository (scikit-build-core + CMake: 3 kernel
families x 3 x86-64 levels; the session's ``built_wheel``, tests/conftest.py) and
installed into a fresh virtual environment whose dependencies (torch, numpy, ...)
come from this environment through a .pth file instead of the network
(tests/wheel_install.py).  It then runs with no compiler on PATH, CXX
unset and an empty kernel cache; its outputs are compared bit for bit with
the JIT build (ctbench.engine.cpu.library) of the same instruction set in this checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from ctbench.engine.cpu import prebuilt as cpu_prebuilt
from wheel_install import install_wheel

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "prebuilt_probe.py"
FAMILIES = ("joseph", "joseph_grad", "fdk")
MARCH = {"x86_64": "x86-64", "x86_64_v3": "x86-64-v3", "x86_64_v4": "x86-64-v4"}
COMPILERS = ("g++", "c++", "cc", "gcc", "clang", "clang++")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(cpu_prebuilt.machine() != "x86_64", reason="the x86-64 wheel test")]


@pytest.fixture(scope="module")
def wheel_env(built_wheel, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel-env")
    wheel = built_wheel["wheel"]   # tests/conftest.py: one build per session
    vpy, site = install_wheel(wheel, tmp / "venv")
    nocc = tmp / "empty-bin"  # PATH holds no compiler (nothing at all)
    nocc.mkdir()
    return {"wheel": wheel, "python": vpy, "site": site, "tmp": tmp, "path": str(nocc), "build_s": built_wheel["build_s"]}


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CXX", "CC", "CTBENCH_MARCH", "CTBENCH_CXXFLAGS", "CTBENCH_CPU_BUILD",
                        "CTBENCH_CPU_VARIANT")}
    # the builds' own default paths, not each library's measured choice (which may differ by round-off)
    env["CTBENCH_CPU_PATH"] = "forward=default,back=default,fdk=default"
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
    # this checkout's ctbench (on PYTHONPATH: an environment may not have it installed)
    r = _probe(sys.executable, tmp_path / f"jit-{march}.pt",
               _env(CTBENCH_CPU_BUILD="native", CTBENCH_MARCH=march, CTBENCH_CACHE_DIR=str(tmp_path / "jit-cache"),
                    PYTHONPATH=str(ROOT)))
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
    records = [p for p in cache.rglob("*.json") if not p.name.startswith("paths-")]  # not the path choices
    assert len(records) == len(FAMILIES) and len(list(cache.rglob("*.so"))) == len(FAMILIES)


def test_repaired_wheel_is_rehashed(wheel_env, tmp_path):
    """A repair tool that patches the kernels (auditwheel/delocate/delvewheel change their bytes) makes
    the recorded SHA-256 stale, so the patched level is refused; scripts/rehash_wheel_manifest.py
    (cibuildwheel's repair-wheel-command) records the shipped bytes, and the level loads again."""
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        pytest.skip("objcopy (binutils) is needed to patch a library the way a repair tool does")
    best = cpu_prebuilt.host_levels()[0]
    target = f"ctbench/_prebuilt/libjoseph-{best}.so"
    repaired = tmp_path / wheel_env["wheel"].name
    note = tmp_path / "note.txt"
    note.write_text("added by a repair tool\n")
    with zipfile.ZipFile(wheel_env["wheel"]) as src, zipfile.ZipFile(repaired, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == target:  # a new section: a valid library with other bytes
                lib = tmp_path / "lib.so"
                lib.write_bytes(data)
                subprocess.run([objcopy, "--add-section", f".ctbench_repair={note}", str(lib)], check=True)
                data = lib.read_bytes()
            dst.writestr(info, data)

    script = ("import json; from ctbench.engine.cpu import library as cpu_library; cpu_library.load_cpu_library('joseph'); "
              "print(json.dumps(cpu_library.loaded_libraries()['joseph']))")

    def loaded(name):
        vpy, _ = install_wheel(repaired, tmp_path / name)
        proc = subprocess.run([str(vpy), "-c", script], cwd=tmp_path, capture_output=True, text=True,
                              env=_env(PATH=wheel_env["path"], CTBENCH_CACHE_DIR=str(tmp_path / f"cache-{name}")))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    stale = loaded("stale")
    assert stale["variant"] != best and any("does not match its record" in p for p in stale["skipped"])
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "rehash_wheel_manifest.py"), str(tmp_path / "*.whl")],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "1 libraries changed" in proc.stdout, proc.stdout + proc.stderr
    fixed = loaded("rehashed")
    assert fixed["source"] == "prebuilt" and fixed["variant"] == best and not fixed["skipped"]
    with zipfile.ZipFile(repaired) as zf:  # the RECORD matches the new manifest (pip checks it)
        rec = next(n for n in zf.namelist() if n.endswith("RECORD"))
        data = zf.read("ctbench/_prebuilt/manifest.json")
        import base64
        import hashlib
        want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert f"ctbench/_prebuilt/manifest.json,{want},{len(data)}" in zf.read(rec).decode()
