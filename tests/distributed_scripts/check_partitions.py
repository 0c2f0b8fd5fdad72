"""One torchrun rank: run every case of a JSON case list and torch.save the local results.

Usage: torchrun --nproc-per-node=N check_partitions.py OUT_DIR CASES_JSON
Each case: {"name", "partition", "partition_grid"?, "n_views", "volume_shape",
"detector_shape", "dtype"?, "kind": "projector" | "solvers"}.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import make_projector, run_projector_case  # noqa: E402


def main() -> None:
    out_dir, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        rank = dist.get_rank()
        results = {}
        # Cases with "jobs": independent projectors on disjoint process groups.
        job_groups = {}
        for case in cases:
            group = None
            if "jobs" in case:
                key = json.dumps(case["jobs"])
                if key not in job_groups:  # every rank creates every group, in the same order
                    job_groups[key] = [dist.new_group(job) for job in case["jobs"]]
                group = next(g for g, job in zip(job_groups[key], case["jobs"]) if rank in job)
            op = make_projector(case, distributed=True, partition=case["partition"],
                                partition_grid=case.get("partition_grid"), process_group=group)
            attrs = {k: getattr(op, k) for k in (
                "rank", "world_size", "partition", "partition_grid", "view_world_size", "space_world_size",
                "view_slice", "volume_slice", "projection_shape", "global_volume_shape", "volume_shape",
                "local_volume_shape")}
            kind = case.get("kind", "projector")
            if kind == "projector":
                res = run_projector_case(op, case)
            elif kind == "solvers":
                from solver_cases import run_solver_case
                res = run_solver_case(op, case)
            else:
                raise ValueError(f"unknown case kind {kind!r}")
            results[case["name"]] = {"attrs": attrs, "results": res}
        torch.save(results, out_dir / f"rank{rank}.pt")
        dist.barrier()  # leave together: a peer vanishing mid-teardown can abort Gloo
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
