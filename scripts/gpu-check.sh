#!/usr/bin/env bash
# One run on a machine with an NVIDIA GPU: the CUDA-vs-CPU parity tests and the
# GPU benchmark (G1, diffct's native backend in the same run), logs and JSON to $OUT.
# Fits the device's 8-minute slot: parity <= 4 min, benchmark <= 4 min (timeouts below).
#
#   scripts/gpu-check.sh             on the GPU machine (its python3 holds torch and CuPy;
#                                    wheels carried in .whl/ supply what it lacks: make gpu-wheels)
#   scripts/gpu-check.sh --rehearse  here, on the CPU: the same script through backend='cuda-emulated'
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu-check}
PY=${PY:-python3}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ctbench-site .whl/*.whl \
    || { echo "gpu-check: installing the carried wheels failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/ctbench-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/plugins${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
"$PY" -c "import ctbench, zarr, pydantic" || { echo "gpu-check: ctbench does not import (run make gpu-wheels and carry .whl)" >&2; exit 1; }
rc=0
if [ "${1:-}" = "--rehearse" ]; then
  timeout 600 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_emulation.py tests/test_cuda_compile.py \
    2>&1 | tee "$OUT/gpu-tests.log" || rc=1
  timeout 300 "$PY" benchmarks/bench_gpu.py --rehearse --out "$OUT/bench_gpu.jsonl" || rc=1
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$OUT/nvidia-smi.csv" 2>&1
  timeout 240 "$PY" -m pytest -q -p no:cacheprovider -p no:xvfb -m gpu tests/test_gpu_parity.py \
    2>&1 | tee "$OUT/gpu-tests.log" || rc=1
  timeout 300 "$PY" benchmarks/bench_gpu.py --out "$OUT/bench_gpu.jsonl" 2>&1 | tee "$OUT/bench_gpu.log" || rc=1
fi
echo "gpu-check: exit $rc; results in $OUT"
exit $rc
