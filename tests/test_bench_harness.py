"""benchmarks/harness.py, the timing and output every benchmark shares: call-by-call interleaving, the
statistics it reports, the machine header, another build of the kernels through the same Python path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import harness  # noqa: E402


def test_calls_are_warmed_once_then_interleaved_and_synced_inside_their_timing():
    order, synced = [], []
    calls = {k: (lambda k=k: order.append(k) or k) for k in "abc"}
    stats, outs = harness.interleaved(calls, repeats=4, sync=lambda: synced.append(order[-1]))
    assert order == list("abc") + list("abc") * 4
    assert synced == order  # after every call, warm-up included
    assert outs == {"a": "a", "b": "b", "c": "c"}
    for s in stats.values():
        assert len(s["times"]) == len(s["cpu_times"]) == 4
        assert s["seconds"] <= s["median_s"] and s["cpu_min_s"] <= s["cpu_median_s"]
        assert s["warmup_s"] is not None


def test_statistics_are_the_min_and_median_of_the_recorded_calls(monkeypatch):
    # a clock that advances by a known amount per call: 3, 1, 2 (wall) and 6, 2, 4 (CPU) seconds
    walls, cpus = iter([0, 100, 100, 103, 103, 104, 104, 106]), iter([0, 6, 6, 8, 8, 12])
    monkeypatch.setattr(harness.time, "perf_counter", lambda: next(walls))
    monkeypatch.setattr(harness.time, "process_time", lambda: next(cpus))
    stats, _ = harness.interleaved({"f": lambda: None}, repeats=3)
    s = stats["f"]
    assert s["times"] == [3, 1, 2] and s["cpu_times"] == [6, 2, 4]
    assert (s["seconds"], s["median_s"], s["cpu_s"], s["cpu_min_s"], s["cpu_median_s"]) == (1, 2, 2, 2, 4)
    short = harness.interleaved_summary
    monkeypatch.setattr(harness, "interleaved", lambda fns, r: (stats, {}))
    assert short({"f": None}, 3)["f"] == {"min_s": 1, "median_s": 2, "cpu_min_s": 2, "cpu_median_s": 4, "n": 3}


def test_ratios_put_the_peer_over_ours():
    peer = {"seconds": 3.0, "median_s": 4.0, "cpu_s": 6.0, "cpu_median_s": 8.0}
    ours = {"seconds": 1.0, "median_s": 2.0, "cpu_s": 2.0, "cpu_median_s": 2.0}
    assert harness.ratio_fields(peer, ours) == {"value": 3.0, "value_cpu_s": 3.0, "value_median": 2.0,
                                                 "value_cpu_median_s": 4.0}


def test_emitter_tags_every_line_and_appends(tmp_path, capsys):
    out = tmp_path / "sub" / "r.jsonl"
    emit = harness.Emitter(out, "RUN", bench="b")
    emit(x=1, t=torch.tensor([1.5]))
    emit(y=2)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines == [{"bench": "b", "run_id": "RUN", "x": 1, "t": [1.5]}, {"bench": "b", "run_id": "RUN", "y": 2}]
    assert capsys.readouterr().out.count("\n") == 2


def test_machine_header_names_the_cpu_and_its_avx512_flag():
    m = harness.machine_info()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    assert m["avx512"] == (" avx512f" in flags) and isinstance(m["cpu"], str) and m["cpu"]
    assert m["torch_threads"] == torch.get_num_threads()


def test_parse_list_names_the_option():
    assert harness.parse_list("2, 1,2", "--threads", int) == [2, 1]
    with pytest.raises(SystemExit, match="--threads"):
        harness.parse_list("0", "--threads", int)


def test_revision_kernels_are_the_files_git_holds(tmp_path):
    dest = harness.revision_kernels("HEAD", tmp_path / "k")
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", "HEAD:kernels"], check=True,
                           capture_output=True, text=True).stdout.split()
    assert sorted(p.name for p in dest.iterdir()) == sorted(names) and "joseph_cpu.cpp" in names
    want = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:kernels/joseph_cpu.cpp"], check=True,
                          capture_output=True).stdout
    assert (dest / "joseph_cpu.cpp").read_bytes() == want


def test_another_library_runs_through_the_same_python_path_and_the_loader_is_restored():
    from ctbench.engine.cpu import backend, library

    class Marker(Exception):
        pass

    class FakeLib:  # any use of it by the backend shows up as this error
        def __getattr__(self, name):
            raise Marker(name)

    before = library.load_cpu_library
    seen = []
    call = harness.with_cpu_library(FakeLib(), lambda: seen.append(
        (library.load_cpu_library("joseph"), backend.load_cpu_library("joseph"), library.load_cpu_library("fdk"))))
    call()
    fake, fake_too, real = seen[0]
    assert isinstance(fake, FakeLib) and isinstance(fake_too, FakeLib) and not isinstance(real, FakeLib)
    assert library.load_cpu_library is before and backend.load_cpu_library is before
    from ctbench import Projector, circular_trajectory_3d
    P = Projector(circular_trajectory_3d(2, 60.0, 120.0), (4, 4, 4), (4, 4), backend="cpu")
    with pytest.raises(Marker):  # the projector's call went to the substitute
        harness.with_cpu_library(FakeLib(), lambda: P.project(torch.ones(4, 4, 4)))()
    assert library.load_cpu_library is before and float(P.project(torch.ones(4, 4, 4)).sum()) > 0
