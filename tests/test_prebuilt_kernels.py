"""Choosing and trusting the prebuilt CPU kernels (ctbench/engine/cpu/prebuilt.py, issue 21).

The selection tests build a tiny kernel family with the host compiler, once per
level, each returning a different number, into a folder laid out like the
wheel's ``ctbench/_prebuilt`` (manifest with sizes, SHA-256 and source hashes;
tests/test_wheel.py checks the manifest CMake really writes).  The number a
loaded library returns says which file was loaded.  ``test_installed_*`` runs
the kernels of an installed wheel against the reference backend (cibuildwheel's
test command); in a checkout it skips.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctbench.engine.cpu import library as cb
from ctbench.engine.cpu import prebuilt as cp
from ctbench.engine.library_trust import UntrustedCache

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
VALUES = {"x86_64_v4": 4, "x86_64_v3": 3, "x86_64": 1, "aarch64": 8}


def _build_folder(tmp_path: Path, levels=None) -> tuple[Path, list[Path]]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "tiny_cpu.cpp").write_text('extern "C" int tiny_value() { return TINY_VALUE; }\n')
    folder = tmp_path / "_prebuilt"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    levels = cp.LEVELS[cp.machine()] if levels is None else levels
    entries = []
    for lv in levels:
        lib = folder / f"libtiny-{lv}.so"
        subprocess.run([cb.find_compiler(), "-shared", "-fPIC", f"-DTINY_VALUE={VALUES[lv]}", str(src / "tiny_cpu.cpp"),
                        "-o", str(lib)], check=True)
        os.chmod(lib, 0o755)
        data = lib.read_bytes()
        entries.append({"family": "tiny", "variant": lv, "file": lib.name, "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(), "flags": ""})
    manifest = {"format": cp.MANIFEST_FORMAT, "version": 1, "machine": cp.machine(), "compiler": "test",
                "libraries": entries,
                "sources": {"tiny_cpu.cpp": hashlib.sha256((src / "tiny_cpu.cpp").read_bytes()).hexdigest()}}
    (folder / cp.MANIFEST).write_text(json.dumps(manifest))
    os.chmod(folder / cp.MANIFEST, 0o644)
    return folder, [src / "tiny_cpu.cpp"]


@pytest.fixture
def prebuilt(tmp_path, monkeypatch):
    if cp.machine() not in cp.LEVELS:
        pytest.skip(f"no prebuilt levels for {cp.machine()}")
    try:
        cb.find_compiler()
    except RuntimeError:
        pytest.skip("no C++ compiler to build the test libraries")
    monkeypatch.delenv(cp.VARIANT_ENV, raising=False)
    return _build_folder(tmp_path)


def _value(folder, sources) -> tuple[int, dict]:
    lib, info = cp.load("tiny", sources, folder)
    return int(lib.tiny_value()), info


def test_best_level_of_this_cpu_is_loaded(prebuilt):
    best = cp.host_levels()[0]
    value, info = _value(*prebuilt)
    assert value == VALUES[best] and info["variant"] == best and info["source"] == "prebuilt"


def test_host_levels_follow_the_cpu_flags():
    """archspec's answer agrees with the CPU's own feature flags (/proc/cpuinfo) on Linux x86-64."""
    if cp.machine() != "x86_64" or not Path("/proc/cpuinfo").exists():
        pytest.skip("x86-64 Linux")
    import re
    flags = set(re.search(r"^flags\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    v3 = {"avx2", "fma", "bmi2", "movbe"} <= flags
    v4 = v3 and {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags
    assert ("x86_64_v3" in cp.host_levels()) == v3
    assert ("x86_64_v4" in cp.host_levels()) == v4
    assert cp.host_levels()[-1] == "x86_64"


def test_missing_best_level_falls_back_to_the_next(prebuilt):
    folder, sources = prebuilt
    levels = cp.host_levels()
    if len(levels) < 2:
        pytest.skip("this CPU runs only the baseline")
    m = json.loads((folder / cp.MANIFEST).read_text())
    m["libraries"] = [e for e in m["libraries"] if e["variant"] != levels[0]]
    (folder / cp.MANIFEST).write_text(json.dumps(m))
    assert _value(folder, sources)[0] == VALUES[levels[1]]


def test_corrupt_library_is_skipped_for_the_next_level(prebuilt):
    folder, sources = prebuilt
    levels = cp.host_levels()
    if len(levels) < 2:
        pytest.skip("this CPU runs only the baseline")
    lib = folder / f"libtiny-{levels[0]}.so"
    data = bytearray(lib.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte: SHA-256 differs
    lib.write_bytes(bytes(data))
    value, info = _value(folder, sources)
    assert value == VALUES[levels[1]]
    assert any("does not match its record" in p for p in info["skipped"])


def _loaded_value_or_none(folder, sources):
    try:
        return _value(folder, sources)[0]
    except cp.NoPrebuilt:  # the refused file was the only level this CPU runs
        return None


def test_group_writable_library_is_refused(prebuilt):
    folder, sources = prebuilt
    best = cp.host_levels()[0]
    os.chmod(folder / f"libtiny-{best}.so", 0o775)
    assert _loaded_value_or_none(folder, sources) != VALUES[best]


def test_linked_library_is_refused(prebuilt, tmp_path):
    folder, sources = prebuilt
    best = cp.host_levels()[0]
    lib = folder / f"libtiny-{best}.so"
    real = tmp_path / "elsewhere.so"
    lib.rename(real)
    lib.symlink_to(real)  # same bytes, same SHA-256: refused for being a link
    assert _loaded_value_or_none(folder, sources) != VALUES[best]


@pytest.mark.skipif(not ROOT, reason="chown to another uid needs root")
def test_library_of_another_user_is_refused(prebuilt):
    folder, sources = prebuilt
    best = cp.host_levels()[0]
    os.chown(folder / f"libtiny-{best}.so", 65534, 65534)
    try:
        value, info = _value(folder, sources)
    except cp.NoPrebuilt as e:
        assert "owned by uid 65534" in str(e)
        return
    assert value != VALUES[best] and any("owned by uid 65534" in p for p in info["skipped"])


def test_group_writable_folder_is_refused(prebuilt):
    folder, sources = prebuilt
    os.chmod(folder, 0o775)
    with pytest.raises(UntrustedCache, match="writable by group or others"):
        cp.load("tiny", sources, folder)


def test_linked_folder_is_refused(prebuilt, tmp_path):
    folder, sources = prebuilt
    link = tmp_path / "linked_prebuilt"
    link.symlink_to(folder)
    with pytest.raises(UntrustedCache, match="not a plain folder"):
        cp.load("tiny", sources, link)


def test_library_built_from_other_sources_is_not_used(prebuilt):
    folder, sources = prebuilt
    sources[0].write_text(sources[0].read_text() + "// edited after the build\n")
    with pytest.raises(cp.NoPrebuilt, match="built from other sources.*tiny_cpu.cpp"):
        cp.load("tiny", sources, folder)


def test_manifest_of_another_machine_is_not_used(prebuilt):
    folder, sources = prebuilt
    m = json.loads((folder / cp.MANIFEST).read_text())
    m["machine"] = "riscv64"
    (folder / cp.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(cp.NoPrebuilt, match="are for riscv64"):
        cp.load("tiny", sources, folder)


def test_no_manifest_means_no_prebuilt(tmp_path):
    with pytest.raises(cp.NoPrebuilt, match="no prebuilt kernels"):
        cp.load("tiny", [], tmp_path)


@pytest.mark.parametrize("text", ["{", "[]", '{"format": "other", "libraries": []}'])
def test_unusable_manifest_is_a_clear_error(prebuilt, text):
    folder, sources = prebuilt
    (folder / cp.MANIFEST).write_text(text)
    with pytest.raises(ValueError, match="manifest"):
        cp.load("tiny", sources, folder)


def test_forced_variant(prebuilt, monkeypatch):
    folder, sources = prebuilt
    lowest = cp.host_levels()[-1]
    monkeypatch.setenv(cp.VARIANT_ENV, lowest)
    assert _value(folder, sources)[0] == VALUES[lowest]
    monkeypatch.setenv(cp.VARIANT_ENV, "x86_64_v9")
    with pytest.raises(ValueError, match=r"CTBENCH_CPU_VARIANT='x86_64_v9'.*runs only"):
        cp.load("tiny", sources, folder)


def test_build_mode_is_checked(monkeypatch):
    monkeypatch.setenv(cb.BUILD_ENV, "fastest")
    with pytest.raises(ValueError, match="CTBENCH_CPU_BUILD='fastest': expected one of auto, prebuilt, native"):
        cb.build_mode()


def test_prebuilt_mode_without_prebuilt_kernels_names_the_fix(monkeypatch):
    if (cp.prebuilt_dir() / cp.MANIFEST).exists():
        pytest.skip("this ctbench has prebuilt kernels")
    monkeypatch.setenv(cb.BUILD_ENV, "prebuilt")
    with pytest.raises(RuntimeError, match="CTBENCH_CPU_BUILD=prebuilt but no prebuilt kernels.*unset"):
        cb.load_cpu_library.__wrapped__("joseph")


_INSTALLED_SCRIPT = """
import json, torch
from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.cpu import library as cpu_library
g = torch.Generator().manual_seed(3)
worst = 0.0
for dtype, tol in ((torch.float32, 2e-4), (torch.float64, 1e-10)):
    tr = circular_trajectory_3d(10, 60.0, 120.0, dtype=dtype)
    vol = torch.rand((9, 11, 13), generator=g, dtype=torch.float64).to(dtype)
    sino = torch.rand((10, 14, 12), generator=g, dtype=torch.float64).to(dtype)
    out = {}
    for backend in ("cpu", "reference"):
        op = Projector(tr, vol.shape, (14, 12), voxel_spacing=1.0, detector_spacing=1.5, backend=backend)
        out[backend] = (op.project(vol), op.backproject(sino))
    for a, b in zip(out["cpu"], out["reference"]):
        err = float((a - b).abs().max() / b.abs().max())
        assert err < tol, (str(dtype), err)
        worst = max(worst, err)
print(json.dumps({"loaded": cpu_library.loaded_libraries(), "worst": worst}))
"""


def test_installed_prebuilt_levels_match_the_reference_backend(tmp_path):
    """Every level of an installed wheel that this CPU runs agrees with the reference backend."""
    if not (cp.prebuilt_dir() / cp.MANIFEST).exists():
        pytest.skip("ctbench is not installed from a wheel (a checkout uses the JIT build)")
    for lv in cp.host_levels():
        env = {**os.environ, cp.VARIANT_ENV: lv, "CTBENCH_CACHE_DIR": str(tmp_path / "cache")}
        proc = subprocess.run([sys.executable, "-c", _INSTALLED_SCRIPT], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        assert r["loaded"]["joseph"]["source"] == "prebuilt" and r["loaded"]["joseph"]["variant"] == lv
