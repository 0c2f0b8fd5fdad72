"""The kernel caches never hang and never read a bomb (issue 47, "Hangs" and "Crashes").

The CPU path-choice cache, the JIT library record and the prebuilt manifest
were opened without ``O_NONBLOCK`` (a FIFO in their place blocked the first
projection forever) and read whole (a 4 GiB sparse file was 4 GiB of memory); a
manifest whose ``sources`` is a list raised AttributeError.  Each FIFO case
runs in a child process with a timeout, so a regression fails instead of
hanging the suite; the sparse file's child runs under a 1 GiB address-space
limit.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ctbench.engine import library_trust
from ctbench.engine.cpu import library as cpu_build
from ctbench.engine.cpu import path_choice as cpu_paths
from ctbench.engine.cpu import prebuilt as cpu_prebuilt

ROOT = Path(__file__).resolve().parents[1]


def _child(code: str, limit_bytes: int | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    def pre():
        if limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=pre)


KNOWN = {"forward": ["a", "b"]}


def test_a_fifo_as_the_path_choice_cache_is_ignored_without_blocking(tmp_path):
    path = cpu_paths.choice_file(tmp_path, "joseph", "ab" * 32)
    os.mkfifo(path)
    p = _child(f"""
        from pathlib import Path
        from ctbench.engine.cpu import path_choice as cpu_paths
        choice, why = cpu_paths.read_choice(Path({str(path)!r}), "joseph", {"ab" * 32!r}, "cpu", {KNOWN!r})
        assert choice is None, choice
        print("WHY", why)
    """)
    assert p.returncode == 0, p.stderr
    assert "not a regular file" in p.stdout


def test_a_sparse_4_gib_path_choice_cache_is_not_read_whole(tmp_path):
    path = cpu_paths.choice_file(tmp_path, "joseph", "cd" * 32)
    with open(path, "wb") as f:
        f.truncate(4 << 30)
    p = _child(f"""
        from pathlib import Path
        from ctbench.engine.cpu import path_choice as cpu_paths
        choice, why = cpu_paths.read_choice(Path({str(path)!r}), "joseph", {"cd" * 32!r}, "cpu", {KNOWN!r})
        assert choice is None
        print("WHY", why)
    """, limit_bytes=3 << 30)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"more than {library_trust.MAX_JSON_BYTES} bytes" in p.stdout


def test_a_damaged_path_choice_is_measured_again_and_replaced(tmp_path):
    from ctbench.engine.cpu.path_cache import cached_or_measured

    sha = "ef" * 32
    info = {"source": "jit", "dir": str(tmp_path), "sha256": sha}
    path = cpu_paths.choice_file(tmp_path, "fam", sha)
    path.write_text("[" * 100000)                                  # nested too deeply: unreadable, not a crash
    known = {"forward": ["x", "y"]}
    choice, where = cached_or_measured(info, "fam", known, lambda: {"forward": {"x": 2.0, "y": 1.0}}, "")
    assert choice == {"forward": "y"} and where == "measured"
    assert json.loads(path.read_text())["choice"] == {"forward": "y"}
    assert cached_or_measured(info, "fam", known, lambda: pytest.fail("measured again"), "") == (choice, "cache")


def test_a_fifo_library_record_is_refused_without_blocking_and_cleaned_up(tmp_path):
    rec = tmp_path / "libjoseph-gcc.json"
    os.mkfifo(rec)
    p = _child(f"""
        from pathlib import Path
        from ctbench.engine import library_trust
        from ctbench.engine.cpu import library as cpu_build
        rec = Path({str(rec)!r})
        try:
            cpu_build._verified_load(rec, "joseph")
        except library_trust.CorruptLibrary as e:
            print("REFUSED", e)
        assert cpu_build._record_file(rec) == ""       # the clean-up's own read does not block either
        cpu_build._discard(rec, "")
        print("GONE", not rec.exists())
    """)
    assert p.returncode == 0, p.stderr
    assert "REFUSED" in p.stdout and "not a regular file" in p.stdout and "GONE True" in p.stdout


def test_a_record_stating_an_impossible_size_is_corrupt_not_a_crash(tmp_path):
    lib = tmp_path / "libjoseph-gcc-abc.so"
    lib.write_bytes(b"\x7fELF")
    lib.chmod(0o600)
    for size in ("12", 1 << 40, -1, True, None):
        with pytest.raises(library_trust.CorruptLibrary, match="invalid size"):
            library_trust.load_verified(lib, size, "00" * 32, record_name=lib.name)


def _manifest_folder(tmp_path, doc) -> Path:
    folder = tmp_path / "_prebuilt"
    folder.mkdir(mode=0o755)
    (folder / cpu_prebuilt.MANIFEST).write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    os.chmod(folder / cpu_prebuilt.MANIFEST, 0o644)
    return folder


@pytest.mark.parametrize("doc, words", [
    ({"format": cpu_prebuilt.MANIFEST_FORMAT, "libraries": [], "sources": ["joseph_cpu.cpp"]}, "'sources' must map"),
    ({"format": cpu_prebuilt.MANIFEST_FORMAT, "libraries": [{"family": "joseph", "variant": ["x86_64"],
                                                              "file": "libx.so"}]}, "libraries[0]"),
    ({"format": cpu_prebuilt.MANIFEST_FORMAT, "libraries": ["libx.so"]}, "libraries[0]"),
    ("[" * 100000, "nested too deeply"),
])
def test_an_unusable_manifest_is_a_reason_to_skip_the_prebuilt_kernels_not_a_crash(tmp_path, doc, words):
    folder = _manifest_folder(tmp_path, doc)
    with pytest.raises(ValueError, match=words.replace("[", r"\[")):
        cpu_prebuilt.load("joseph", [], folder)


def test_a_fifo_manifest_is_refused_without_blocking(tmp_path):
    folder = tmp_path / "_prebuilt"
    folder.mkdir(mode=0o755)
    os.mkfifo(folder / cpu_prebuilt.MANIFEST, 0o644)
    p = _child(f"""
        from pathlib import Path
        from ctbench.engine.cpu import prebuilt as cpu_prebuilt
        try:
            cpu_prebuilt.load("joseph", [], Path({str(folder)!r}))
        except ValueError as e:
            print("REFUSED", e)
    """)
    assert p.returncode == 0, p.stderr
    assert "REFUSED" in p.stdout and "not a regular file" in p.stdout


@pytest.mark.slow
def test_the_jit_cache_survives_a_record_replaced_by_a_fifo(tmp_path):
    """End to end: a FIFO where the kernel library's record was; the next load rebuilds (two real compiles)."""
    try:
        cpu_build.find_compiler()
    except RuntimeError:
        pytest.skip("no C++ compiler")
    code = """
        import os, sys
        from pathlib import Path
        from ctbench.engine.cpu import library as cpu_build
        root = Path(sys.argv[1])
        cpu_build.load_library("joseph_grad", cpu_build.kernel_dir(), root)
        recs = sorted(root.rglob("libjoseph_grad-*.json"))
        rec = recs[0]
        rec.unlink()
        os.mkfifo(rec, 0o600)
        cpu_build.load_library("joseph_grad", cpu_build.kernel_dir(), root)
        print("REBUILT", rec.is_file())
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "cache")], capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "REBUILT True" in p.stdout
