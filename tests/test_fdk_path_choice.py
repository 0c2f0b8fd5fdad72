"""The FDK backprojection's cpu path chosen by measurement (ctbench.engine.cpu.fdk_paths): the
fastest path wins only by more than the margin, the choice is cached beside the library and reused,
a damaged cache is measured again, and CTBENCH_CPU_PATH still overrides the measured choice."""

import json

import torch

from ctbench.engine import fdk_kernels
from ctbench.engine.cpu import library as cpu_library, fdk_paths


class _Library:
    """A stand-in library object: only what the choice reads of it (its recorded origin)."""

    def __init__(self, folder, sha="ab" * 32):
        self._ctbench_origin = {"source": "jit", "dir": str(folder), "sha256": sha}


KNOWN = {"float32": ["columns", "columns-scalar", "rows"], "float64": ["columns-scalar", "rows"]}


def _measure_counting(calls, seconds):
    def measure(dtype):
        calls.append(dtype)
        return dict(seconds[dtype])
    return measure


def test_fastest_path_is_chosen_cached_and_reused(tmp_path):
    seconds = {"float32": {"columns": 1.0, "columns-scalar": 0.5, "rows": 2.0},
               "float64": {"columns-scalar": 1.0, "rows": 0.97}}  # 3 %: inside the margin, default kept
    calls = []
    lib = _Library(tmp_path)
    choice, source = fdk_paths._choose(lib, KNOWN, _measure_counting(calls, seconds))
    assert source == "measured" and choice == {"float32": "columns-scalar", "float64": "columns-scalar"}
    assert sorted(calls) == ["float32", "float64"]
    (path,) = tmp_path.glob("paths-fdk-*.json")
    doc = json.loads(path.read_text())
    assert doc["choice"] == choice and doc["paths"] == KNOWN and doc["cpu"] == cpu_library.cpu_signature()
    calls.clear()
    assert fdk_paths._choose(lib, KNOWN, _measure_counting(calls, seconds)) == (choice, "cache")
    assert calls == []  # reused, not measured again


def test_damaged_or_foreign_cache_is_measured_again(tmp_path):
    seconds = {"float32": {"columns": 0.2, "columns-scalar": 0.5, "rows": 2.0},
               "float64": {"columns-scalar": 1.0, "rows": 0.5}}
    lib = _Library(tmp_path)
    fdk_paths._choose(lib, KNOWN, _measure_counting([], seconds))
    (path,) = tmp_path.glob("paths-fdk-*.json")
    for damage in (b"{ not json", json.dumps({"format": 1, "choice": {"float32": "warp"}}).encode()):
        path.write_bytes(damage)
        calls = []
        choice, source = fdk_paths._choose(lib, KNOWN, _measure_counting(calls, seconds))
        assert source == "measured" and calls and choice == {"float32": "columns", "float64": "rows"}
    other = _Library(tmp_path, sha="cd" * 32)  # another library: its own file, its own measurement
    calls = []
    assert fdk_paths._choose(other, KNOWN, _measure_counting(calls, seconds))[1] == "measured" and calls


def test_real_library_choice_is_a_known_path_and_the_variable_overrides_it(monkeypatch):
    for dtype in (torch.float32, torch.float64):
        assert fdk_kernels.measured_fdk_path(dtype) in fdk_kernels.fdk_paths(dtype)
        assert fdk_kernels.fdk_path(dtype, 64) == fdk_kernels.measured_fdk_path(dtype)
        monkeypatch.setenv("CTBENCH_CPU_PATH", "fdk=rows")
        assert fdk_kernels.fdk_path(dtype, 64) == "rows"
        monkeypatch.delenv("CTBENCH_CPU_PATH")
    assert fdk_kernels.fdk_path(torch.float32, 1) == "rows"  # thin slabs: rows, whatever was measured


def test_default_names_the_builds_own_path(monkeypatch):
    from ctbench.engine.cpu import library as cpu_library, joseph_paths
    lib = cpu_library.load_cpu_library("joseph")
    known = joseph_paths.known_paths(lib)
    monkeypatch.setenv("CTBENCH_CPU_PATH", "forward=default,back=default,fdk=default")
    assert joseph_paths.active_paths(lib) == {op: names[0] for op, names in known.items()}
    assert fdk_kernels.fdk_path(torch.float32, 64) == fdk_kernels.build_default_fdk_path(torch.float32)
    assert fdk_kernels.fdk_path(torch.float64, 1) == "rows"
