#!/usr/bin/env bash
# Every benchmark, peers in the same run, JSON lines appended to benchmarks/results/,
# then the README table is regenerated.  Run on a quiet machine: timings are wall-clock.
# SKIP_DIFFCT=1 skips diffct's torch backend (it takes minutes per call).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
R=benchmarks/results
mkdir -p "$R"
extra=()
[ "${SKIP_DIFFCT:-0}" = 1 ] && extra+=(--skip-diffct)
$PY benchmarks/bench_projector.py --out $R/bench_projector.jsonl "${extra[@]}"
$PY benchmarks/bench_recon.py --out $R/bench_recon.jsonl
$PY benchmarks/bench_geometry_grad.py --out $R/bench_geometry_grad.jsonl
$PY benchmarks/bench_streaming.py --out $R/bench_streaming.jsonl
$PY benchmarks/bench_distributed.py --out $R/bench_distributed.jsonl
$PY benchmarks/bench_gui.py --out $R/bench_gui.jsonl
$PY benchmarks/bench_jobs.py --out $R/bench_jobs.jsonl
$PY benchmarks/bench_durability.py --out $R/bench_durability.jsonl
$PY benchmarks/bench_preprocessing_peers.py --out $R/bench_preprocessing_peers.jsonl
$PY benchmarks/readme_table.py --write
