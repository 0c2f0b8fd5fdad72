"""Overhead of a job-bridge job over the same solve run directly by torchrun (W1, CGLS-10, 2 ranks).

    python benchmarks/bench_jobs.py --out benchmarks/results/bench_jobs.jsonl [--scale 0.5] [--calls 5]

Both sides run the same worker (``ctbench.jobs.worker``) on the same W1
dataset (Shepp-Logan, 180 views, 128^3 at ``--scale 1``), 2 ranks (Gloo, CPU),
``--threads`` OpenMP threads each:

* ``direct``: ``python -m torch.distributed.run ... -m ctbench.jobs.worker JOB_DIR``
  started by this script; wall time from the launch to the exit, and the time
  until the first event line appears in ``events.jsonl``;
* ``bridge``: ``submit`` to a running bridge (``ctbench bridge serve``, a real
  process on loopback), then long-polled events and status as a client sees
  them: submit-to-first-event latency and submit-to-finished wall time.

Calls interleave (direct, bridge, direct, ...); ``--calls`` each, min and
median reported.  ``overhead_s`` is median(bridge) - median(direct) of the
total wall time; the target is under 2 s.  One JSON line per metric group to
stdout and appended to ``--out``, with the machine (CPU model, load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

DEFAULT_OUT = HERE / "results" / "bench_jobs.jsonl"


def make_w1_dataset(path: Path, scale: float):
    from ctbench.phantoms import shepp_logan_3d
    from ctbench.workbench.dataset import save_dataset
    from ctbench.workbench.design import ScanGeometry
    from workloads import w1_projector

    P = w1_projector("cpu", scale=scale)
    geo = ScanGeometry(P.trajectory, P.detector_shape, P.detector_spacing, P.global_volume_shape, P.voxel_spacing)
    n = P.global_volume_shape[0]
    vol = shepp_logan_3d((n, n, n), P.voxel_spacing[0], modified=True, scale=0.45 * n * P.voxel_spacing[0]).float()
    save_dataset(path, volume=vol, sinogram=P.project(vol.contiguous()), geometry=geo, overwrite=True)
    return geo


def spec(dataset: Path, threads: int) -> dict:
    return {"request": {"algorithm": "cgls", "params": {"n_iter": 10}}, "dataset": str(dataset), "nproc": 2,
            "threads_per_rank": threads, "preview_interval": 1.0}


def run_direct(dataset: Path, work: Path, threads: int) -> dict:
    from ctbench.jobs.launcher import job_environment, torchrun_command

    job = Path(tempfile.mkdtemp(dir=work, prefix="direct-"))
    (job / "spec.json").write_text(json.dumps(spec(dataset, threads)))
    events = job / "events.jsonl"
    t0 = time.perf_counter()
    p = subprocess.Popen(torchrun_command(job, 2), cwd=job, env=job_environment(threads),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    first = None
    while p.poll() is None:
        if first is None and events.exists() and events.stat().st_size:
            first = time.perf_counter() - t0
        time.sleep(0.005)
    total = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"direct torchrun failed: {p.stderr.read().decode()[-2000:]}")
    return {"first_event_s": first, "total_s": total}


def run_bridge(client, dataset: Path, threads: int) -> dict:
    t0 = time.perf_counter()
    job = client.submit(spec(dataset, threads))
    first, after = None, -1
    while True:
        page = client.events(job["id"], after, 10.0)
        if page["events"] and first is None:
            first = time.perf_counter() - t0
        after = page["next"]
        if page["terminal"]:
            break
    total = time.perf_counter() - t0
    st = client.status(job["id"])
    if st["state"] != "succeeded":
        raise RuntimeError(f"bridge job {st['state']}: {st.get('reason')}")
    client.delete(job["id"])
    return {"first_event_s": first, "total_s": total}


def stats(xs) -> dict:
    return {"min": round(min(xs), 4), "median": round(statistics.median(xs), 4), "n": len(xs),
            "all": [round(x, 4) for x in xs]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--scale", type=float, default=1.0, help="W1 size factor (1: 128^3, 180 views)")
    p.add_argument("--calls", type=int, default=5, help="timed calls per side (at least 5)")
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="threads per rank")
    args = p.parse_args(argv)
    if args.calls < 5:
        p.error("--calls must be at least 5")
    from harness import machine_info
    from jobs_support import BridgeProcess

    work = Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    dataset = work / "w1.zarr"
    make_w1_dataset(dataset, args.scale)
    bridge = BridgeProcess(work / "bridge", "--max-jobs", "1")
    direct, via = [], []
    try:
        with bridge.client(timeout=120) as c:
            run_direct(dataset, work, args.threads)      # warm-up: kernel cache, page cache
            run_bridge(c, dataset, args.threads)
            for _ in range(args.calls):
                direct.append(run_direct(dataset, work, args.threads))
                via.append(run_bridge(c, dataset, args.threads))
    finally:
        bridge.stop()
    d_tot, b_tot = [x["total_s"] for x in direct], [x["total_s"] for x in via]
    rec = {"bench": "jobs", "workload": f"W1 scale {args.scale}", "algorithm": "cgls", "n_iter": 10, "ranks": 2,
           "threads_per_rank": args.threads, "direct_total_s": stats(d_tot), "bridge_total_s": stats(b_tot),
           "direct_first_event_s": stats([x["first_event_s"] for x in direct]),
           "bridge_first_event_s": stats([x["first_event_s"] for x in via]),
           "overhead_s": round(statistics.median(b_tot) - statistics.median(d_tot), 4),
           "overhead_paired_median_s": round(statistics.median(b - d for b, d in zip(b_tot, d_tot)), 4),
           "target_overhead_s": 2.0, "machine": machine_info(),
           "note": "wall-clock on the machine described; a shared machine adds noise"}
    rec["meets_target"] = rec["overhead_s"] < rec["target_overhead_s"]
    # Lines in the common schema (a header, then one line per op and side) for the README table.
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    workload = rec["workload"]
    out = [{"bench": "jobs", "run_id": run_id, "kind": "header", "machine": rec["machine"],
            "args": {k: str(v) for k, v in vars(args).items()}}]
    for op, sides in (("total", (("torchrun direct", d_tot), ("bridge job", b_tot))),
                      ("first_event", (("torchrun direct", [x["first_event_s"] for x in direct]),
                                       ("bridge job", [x["first_event_s"] for x in via])))):
        for impl, ts in sides:
            out.append({"bench": "jobs", "run_id": run_id, "workload": workload, "op": op, "impl": impl,
                        "seconds": round(min(ts), 4), "min_s": round(min(ts), 4),
                        "median_s": round(statistics.median(ts), 4), "times": [round(t, 4) for t in ts]})
    verdict = "met" if rec["meets_target"] else "NOT met"
    out.append({**rec, "run_id": run_id, "op": "total", "seconds": rec["overhead_s"],
                "impl": f"overhead: median bridge - median direct (target < 2 s: {verdict})"})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        for line in out:
            print(json.dumps(line))
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
