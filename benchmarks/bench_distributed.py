"""CPU strong scaling of distributed CGLS on W1 and the communication volume per iteration.

    python benchmarks/bench_distributed.py --out benchmarks/results/bench_distributed.jsonl

launches torchrun (Gloo, CPU) for each configuration and writes one JSON
line per configuration to --out and stdout:

* ``cgls_scaling``: seconds per CGLS iteration with 1 and 2 processes
  (views and space partitions), each process pinned to ``--threads`` threads;
  the 1-process baseline is the plain single-process Projector.
* ``communication``: payload bytes each rank hands to collectives per CGLS
  iteration (views and space on 2 ranks, hybrid 2x2 on 4 ranks), measured
  by ``ctbench.distributed.COMM_STATS``, next to the bytes the partition
  model predicts.  A ring all-reduce moves about 2(P-1)/P times the payload
  per rank over the wire.

Times are wall-clock medians of the iterations after the first.  The machine
and its core count are recorded; on a shared machine the 2-process runs
compete with other work.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


# ------------------------------------------------------------------- worker
def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from ctbench.distributed import COMM_STATS
    from ctbench.solvers import cgls_iterations
    from workloads import W1, w1_projector

    torch.set_num_threads(args.threads)
    distributed = args.partition != "single"
    if distributed:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    try:
        kw = {}
        if distributed:
            kw = dict(distributed=True, partition=args.partition)
            if args.partition == "hybrid":
                kw["partition_grid"] = tuple(args.grid)
        op = w1_projector("cpu", scale=args.scale, **kw)
        # Measurements of a smooth test object, made by the same (distributed) projector.
        D, H, W = op.global_volume_shape
        z = torch.linspace(-1, 1, D)[op.volume_slice].view(-1, 1, 1)
        y = torch.linspace(-1, 1, H).view(1, -1, 1)
        x = torch.linspace(-1, 1, W).view(1, 1, -1)
        truth = ((x ** 2 + y ** 2 + z ** 2) < 0.6).to(W1["dtype"])
        sino = op.project(truth)
        times, stamps, bytes_per_iter = [], [time.perf_counter()], []
        COMM_STATS.reset()
        last_bytes = 0
        for state in cgls_iterations(op, sino, args.iters):
            stamps.append(time.perf_counter())
            total = COMM_STATS.total_bytes
            bytes_per_iter.append(total - last_bytes)
            last_bytes = total
        times = [b - a for a, b in zip(stamps[:-1], stamps[1:])]
        result = {
            "partition": args.partition, "world_size": dist.get_world_size() if distributed else 1,
            "grid": list(getattr(op, "partition_grid", (1, 1))),
            "volume_shape": list(op.global_volume_shape), "n_views": op.n_views,
            "detector_shape": list(op.detector_shape),
            "iteration_times_s": times, "final_residual": float(state.residual),
            "bytes_per_iteration": bytes_per_iter[1:] or bytes_per_iter,
            "calls": COMM_STATS.snapshot()["calls"],
        }
        if not distributed or dist.get_rank() == 0:
            Path(args.result).write_text(json.dumps(result))
        if distributed:
            dist.barrier()  # leave together: a peer vanishing mid-teardown can abort Gloo
    finally:
        if distributed:
            dist.destroy_process_group()


# ----------------------------------------------------------------- launcher
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nproc: int, partition: str, args, grid=None, iters=None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        worker_args = [str(Path(__file__).resolve()), "--worker", "--partition", partition, "--result", str(result),
                       "--scale", str(args.scale), "--iters", str(iters or args.iters),
                       "--threads", str(args.threads)]
        if grid:
            worker_args += ["--grid", *map(str, grid)]
        if partition == "single":
            cmd = [sys.executable, *worker_args]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--max-restarts=0",
                   *worker_args]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{partition} on {nproc} processes failed:\n{proc.stderr[-4000:]}")
        return json.loads(result.read_text())


def _predicted_bytes(r: dict) -> int:
    """Collective payload per CGLS iteration (one project, one backproject, three inner products)."""
    D, H, W = r["volume_shape"]
    n, (U, V) = r["n_views"], r["detector_shape"]
    vr, sr = r["grid"]
    n_local = -(-n // vr)  # rank 0 holds the larger shard
    d_local = -(-D // sr)
    proj = n_local * U * V * 4 if sr > 1 else 0
    back = d_local * H * W * 4 if vr > 1 else 0
    return proj + back


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="JSON lines file to append to")
    ap.add_argument("--scale", type=float, default=1.0, help="W1 scale (1 = 128^3, 180 views, 128^2 detector)")
    ap.add_argument("--iters", type=int, default=4, help="CGLS iterations per run")
    ap.add_argument("--threads", type=int, default=1, help="threads per process")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--partition", default="single", help=argparse.SUPPRESS)
    ap.add_argument("--grid", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    import torch

    env = {"machine": platform.machine(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
           "torch": torch.__version__, "backend": "gloo", "threads_per_process": args.threads,
           "workload": "W1", "scale": args.scale,
           "load_average_1min_at_start": round(os.getloadavg()[0], 2)}
    lines = []
    base = _launch(1, "single", args)
    t1 = statistics.median(base["iteration_times_s"][1:] or base["iteration_times_s"])
    lines.append({"benchmark": "cgls_scaling", "partition": "single", "processes": 1, "seconds_per_iteration": t1,
                  "speedup": 1.0, **env})
    runs = {}
    for part in ("views", "space"):
        r = runs[part] = _launch(2, part, args)
        t = statistics.median(r["iteration_times_s"][1:] or r["iteration_times_s"])
        lines.append({"benchmark": "cgls_scaling", "partition": part, "processes": 2, "seconds_per_iteration": t,
                      "speedup": t1 / t, "parallel_efficiency": t1 / t / 2,
                      "residual_matches_single": abs(r["final_residual"] - base["final_residual"])
                      <= 1e-4 * abs(base["final_residual"]), **env})
    runs["hybrid"] = _launch(4, "hybrid", args, grid=(2, 2), iters=2)
    for part, r in runs.items():
        measured = statistics.median(r["bytes_per_iteration"])
        lines.append({"benchmark": "communication", "partition": part, "processes": r["world_size"],
                      "grid": r["grid"], "payload_bytes_per_iteration_rank0": measured,
                      "predicted_array_bytes": _predicted_bytes(r),
                      "collective_calls_rank0_all_iterations": r["calls"],
                      "iterations": len(r["iteration_times_s"]), **env})
    for line in lines:
        text = json.dumps(line)
        print(text, flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as f:
                f.write(text + "\n")


if __name__ == "__main__":
    main()
