"""The GPU benchmark script runs end to end on the CPU (``--rehearse``: backend='cuda-emulated').

A lent GPU is short-lived: this keeps bench_gpu.py's argument handling, interleaving,
statistics and JSON lines working before one is at hand.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_gpu_rehearsal_writes_every_operation(tmp_path):
    out = tmp_path / "bench_gpu.jsonl"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu.py"), "--rehearse", "--no-peers",
                          "--repeats", "5", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    header = lines[0]
    assert header["kind"] == "header" and header["backend"] == "cuda-emulated"
    assert header["workload"]["n_views"] == 12
    timed = {x["op"]: x for x in lines if "median_s" in x}
    assert set(timed) == {"forward", "back", "cgls_iteration", "fdk"}
    for op, x in timed.items():
        assert len(x["times"]) == 5 and x["min_s"] <= x["median_s"], op
        assert x["gups"] > 0 and 0 < x["bound_fraction"], op
        assert x["impl"] == "ctbench-cuda-emulated"
    assert not any("failed" in x for x in lines)


@pytest.mark.slow
def test_bench_gpu_without_a_gpu_exits_2_with_the_reason(tmp_path):
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu.py"), "--out",
                          str(tmp_path / "x.jsonl")], capture_output=True, text=True, timeout=300)
    if run.returncode == 0:  # a machine with a GPU: the real run worked
        return
    assert run.returncode == 2
    assert "no CUDA device" in run.stderr or "CuPy" in run.stderr
