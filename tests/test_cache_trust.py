"""The CPU kernel library cache: trust, integrity, CPU-specific keys, crash-safe builds (issue 10).

Every test drives the real cache code (``cpu_library.load_library``) with the
real host compiler on a tiny kernel family, so builds take a fraction of a
second; the joseph/fdk families go through the very same function.  Files
"planted by another user" are real files chowned to uid 65534 (the tests run
as root; they skip where chown is not allowed).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ctbench.engine.cpu import library as cb

NOBODY = 65534
ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
needs_root = pytest.mark.skipif(not ROOT, reason="planting files owned by another uid needs root (chown)")
REPO = Path(__file__).resolve().parents[1]


def _tiny_sources(d: Path, value: int = 42) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "tiny_cpu.cpp").write_text(f'extern "C" int tiny_value() {{ return {value}; }}\n')
    return d


@pytest.fixture
def src(tmp_path):
    return _tiny_sources(tmp_path / "src")


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache" / "kernels"


def _value(lib) -> int:
    return int(lib.tiny_value())


def _evil_library(tmp_path: Path) -> Path:
    """A library with the same entry point that returns 666: what an attacker would plant."""
    d = _tiny_sources(tmp_path / "evil", value=666)
    out = tmp_path / "evil" / "libtiny-evil.so"
    subprocess.run([cb.find_compiler(), "-shared", "-fPIC", str(d / "tiny_cpu.cpp"), "-o", str(out)], check=True)
    return out


def _plant(cache: Path, src: Path, lib: Path, *, owner: int | None, dir_mode: int = 0o700) -> Path:
    """Put ``lib`` and a record that matches it at the exact place the cache looks (key and compiler tag)."""
    key_dir = cache / cb.cache_key("tiny", src)
    key_dir.mkdir(parents=True, exist_ok=True)
    data = lib.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    tag = cb._compiler_tag(cb.find_compiler())
    target = key_dir / f"libtiny-{tag}-{digest[:16]}.so"
    target.write_bytes(data)
    rec = key_dir / f"libtiny-{tag}.json"
    rec.write_text(json.dumps({"format": "ctbench.kernel-library", "family": "tiny", "file": target.name,
                               "size": len(data), "sha256": digest}))
    for p in (target, rec):
        os.chmod(p, 0o600)
    os.chmod(key_dir, dir_mode)
    if owner is not None:
        for p in (target, rec, key_dir):
            os.chown(p, owner, owner)
    return key_dir


def _record(key_dir: Path) -> dict:
    (rec,) = key_dir.glob("libtiny-*.json")
    return json.loads(rec.read_text())


def test_fresh_cache_is_private_and_recorded(src, cache):
    lib = cb.load_library("tiny", src, cache)
    assert _value(lib) == 42
    key_dir = cache / cb.cache_key("tiny", src)
    for d in (cache, key_dir):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    rec = _record(key_dir)
    data = (key_dir / rec["file"]).read_bytes()
    assert rec["size"] == len(data) and rec["sha256"] == hashlib.sha256(data).hexdigest()
    assert not stat.S_IMODE(os.stat(key_dir / rec["file"]).st_mode) & 0o022
    # warm: loads the recorded file without building again
    mtime = (key_dir / rec["file"]).stat().st_mtime_ns
    assert _value(cb.load_library("tiny", src, cache)) == 42
    assert (key_dir / rec["file"]).stat().st_mtime_ns == mtime


@needs_root
def test_directory_of_another_user_is_refused(src, cache, tmp_path):
    key_dir = _plant(cache, src, _evil_library(tmp_path), owner=NOBODY)
    with pytest.warns(RuntimeWarning, match="owned by uid 65534"):
        lib = cb.load_library("tiny", src, cache)
    assert _value(lib) == 42  # built elsewhere, the planted 666 never ran
    assert all(p.stat().st_uid == NOBODY for p in key_dir.iterdir())  # and nothing of theirs was touched


@needs_root
def test_library_of_another_user_in_own_directory_is_refused(src, cache, tmp_path):
    key_dir = _plant(cache, src, _evil_library(tmp_path), owner=None)
    for p in key_dir.iterdir():
        os.chown(p, NOBODY, NOBODY)
    with pytest.warns(RuntimeWarning, match="owned by uid 65534"):
        lib = cb.load_library("tiny", src, cache)
    assert _value(lib) == 42


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_group_or_other_writable_directory_is_refused(src, cache, tmp_path, mode):
    key_dir = _plant(cache, src, _evil_library(tmp_path), owner=None, dir_mode=mode)
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        lib = cb.load_library("tiny", src, cache)
    assert _value(lib) == 42
    assert stat.S_IMODE(os.stat(key_dir).st_mode) == mode  # left as found


def test_group_writable_parent_cache_folder_is_refused(src, cache, tmp_path):
    cb.load_library("tiny", src, cache)
    os.chmod(cache, 0o777)
    try:
        with pytest.warns(RuntimeWarning, match="writable by group or others"):
            assert _value(cb.load_library("tiny", src, cache)) == 42
    finally:
        os.chmod(cache, 0o700)


@pytest.mark.slow
def test_library_that_does_not_match_its_record_is_rebuilt(src, cache, tmp_path):
    # Built by another process: this one must never map a file the test then overwrites in place
    # (a mapped library rewritten under the process makes the dynamic linker die with SIGBUS later).
    assert "VALUE 42" in _load_in_subprocess(src, cache).stdout
    key_dir = cache / cb.cache_key("tiny", src)
    rec = _record(key_dir)
    (key_dir / rec["file"]).write_bytes(_evil_library(tmp_path).read_bytes())  # same owner, same name
    with pytest.warns(RuntimeWarning, match="does not match its record"):
        lib = cb.load_library("tiny", src, cache)
    assert _value(lib) == 42
    rec2 = _record(key_dir)
    data = (key_dir / rec2["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == rec2["sha256"]


def _load_in_subprocess(src: Path, cache: Path, env_extra=None, timeout=300) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from ctbench.engine.cpu import library as cb
        print("VALUE", cb.load_library("tiny", Path({str(src)!r}), Path({str(cache)!r})).tiny_value())
    """)
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.parametrize("damage", ["truncated", "empty"])
@pytest.mark.slow
def test_corrupt_library_is_rebuilt_not_crashed_on(src, cache, damage):
    assert "VALUE 42" in _load_in_subprocess(src, cache).stdout  # built elsewhere: see above
    key_dir = cache / cb.cache_key("tiny", src)
    lib = key_dir / _record(key_dir)["file"]
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"")
    proc = _load_in_subprocess(src, cache)  # the old cache died here with SIGBUS / "file too short"
    assert proc.returncode == 0, proc.stderr
    assert "VALUE 42" in proc.stdout
    assert "does not match its record" in proc.stderr
    rec = _record(key_dir)
    assert (key_dir / rec["file"]).stat().st_size == rec["size"] > 0


@pytest.mark.slow
def test_warm_cache_loads_without_a_compiler(src, cache, tmp_path):
    cb.load_library("tiny", src, cache)
    no_compiler = {"PATH": str(tmp_path / "empty-bin"), "CXX": ""}
    proc = _load_in_subprocess(src, cache, no_compiler)
    assert proc.returncode == 0, proc.stderr
    assert "VALUE 42" in proc.stdout
    # cold cache and no compiler: a clear error, not a crash
    proc = _load_in_subprocess(src, tmp_path / "cold" / "kernels", no_compiler)
    assert proc.returncode == 1
    assert "no C++ compiler" in proc.stderr and "Traceback" in proc.stderr


def test_failed_build_leaves_no_temporary_files(src, cache, tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "broken-cxx"
    fake.parent.mkdir()
    # writes part of an output, then fails like a compiler error
    fake.write_text('#!/bin/sh\nfor a; do out=$a; done\ncase "$out" in *.tmp.so) ;; *) exit 1;; esac\n'
                    'echo partial > "$out"\necho "error: boom" >&2\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(RuntimeError, match="compiling the CPU kernels failed"):
        cb.load_library("tiny", src, cache)
    key_dir = cache / cb.cache_key("tiny", src)
    assert list(key_dir.iterdir()) == []


@pytest.mark.slow
def test_killed_builder_leftovers_are_cleaned_by_the_next_build(src, cache, tmp_path):
    fake = tmp_path / "bin" / "slow-cxx"
    fake.parent.mkdir()
    # a compiler that has written half its output when the builder is killed
    # (only for the library: the -march probe it answers with a failure)
    fake.write_text('#!/bin/sh\nfor a; do out=$a; done\ncase "$out" in *.tmp.so) ;; *) exit 1;; esac\n'
                    'echo partial > "$out"\nexec sleep 120\n')
    fake.chmod(0o755)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from ctbench.engine.cpu import library as cb
        cb.load_library("tiny", Path({str(src)!r}), Path({str(cache)!r}))
    """)
    builder = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "CXX": str(fake)},
                               start_new_session=True)
    key_dir = cache / cb.cache_key("tiny", src)
    try:
        deadline = time.time() + 120  # until the "compiler" has written part of its output
        while time.time() < deadline and not [p for p in key_dir.glob(".tiny.*.tmp*") if p.stat().st_size]:
            time.sleep(0.2)
        (tmp,) = list(key_dir.glob(".tiny.*.tmp*"))
        os.killpg(builder.pid, signal.SIGKILL)  # the builder and its (fake) compiler: real SIGKILL
        builder.wait(timeout=60)
    finally:
        if builder.poll() is None:
            os.killpg(builder.pid, signal.SIGKILL)
            builder.wait()
    assert builder.returncode == -signal.SIGKILL
    assert tmp.exists() and tmp.read_text() == "partial\n"
    assert _value(cb.load_library("tiny", src, cache)) == 42
    assert not tmp.exists()
    assert list(key_dir.glob(".tiny.*")) == []


def test_cache_key_holds_the_resolved_cpu(src, monkeypatch):
    sig = cb.cpu_signature()
    assert sig.split("|")[0] == os.uname().machine
    if Path("/proc/cpuinfo").exists() and os.uname().machine in ("x86_64", "AMD64"):
        assert " sse2 " in f" {sig} "  # the host's actual feature flags
    monkeypatch.delenv("CTBENCH_MARCH", raising=False)
    monkeypatch.setattr(cb, "cpu_signature", lambda: "x86_64|avx avx2 avx512f fma sse2")
    with_avx512 = cb.cache_key("tiny", src)
    monkeypatch.setattr(cb, "cpu_signature", lambda: "x86_64|avx avx2 fma sse2")
    without = cb.cache_key("tiny", src)
    assert with_avx512 != without  # a node without AVX-512 never finds the other node's build
    # an explicit target is the resolved target itself: the key no longer depends on the host
    monkeypatch.setenv("CTBENCH_MARCH", "x86-64-v2")
    a = cb.cache_key("tiny", src)
    monkeypatch.setattr(cb, "cpu_signature", lambda: "x86_64|avx avx2 avx512f fma sse2")
    assert cb.cache_key("tiny", src) == a != with_avx512


def test_node_with_another_cpu_builds_its_own_library(src, cache, monkeypatch):
    monkeypatch.delenv("CTBENCH_MARCH", raising=False)
    monkeypatch.setattr(cb, "cpu_signature", lambda: "x86_64|avx avx2 avx512f fma sse2")
    cb.load_library("tiny", src, cache)
    monkeypatch.setattr(cb, "cpu_signature", lambda: "x86_64|avx avx2 fma sse2")
    cb.load_library("tiny", src, cache)
    dirs = [d for d in cache.iterdir() if d.is_dir()]
    assert len(dirs) == 2 and all(list(d.glob("libtiny-*.json")) for d in dirs)
