"""One torchrun rank of the disk CGLS checks: run a list of steps, write what each gave.

Usage: torchrun --nproc-per-node=N disk_cgls_ranks.py OUT_DIR STEPS_JSON
Each step: {"name", "partition", "partition_grid"?, "work", "n_iter", "checkpoint_every"?, "resume"?,
"volume"?: path of a result store to create and fill}.  Rank r writes OUT_DIR/rank{r}.json with, per
step, {"error": message, "type": class name} or {"residuals": [...]}.  ``disk_case`` builds the scan
that the test also builds in its own process.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch

F64 = torch.float64


def disk_case(**opts):
    from ctbench import Projector, circular_trajectory_3d
    traj = circular_trajectory_3d(10, 100.0, 200.0, dtype=F64)
    P = Projector(traj, (9, 14, 14), (18, 13), detector_spacing=1.6, **opts)
    z, y, x = torch.meshgrid(*(torch.linspace(-1, 1, n, dtype=F64) for n in (9, 14, 14)), indexing="ij")
    truth = ((x ** 2 + y ** 2 + z ** 2) < 0.6).to(F64) + 0.2 * torch.cos(3 * x)
    return P, truth


def main() -> None:
    import torch.distributed as dist

    from ctbench.solvers import disk_cgls
    from ctbench.solvers.checkpoint import barrier
    from ctbench.storage import ZarrStore

    out, steps = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    results = {}
    try:
        for step in steps:
            try:
                P, _ = disk_case(distributed=True, partition=step["partition"],
                                 partition_grid=step.get("partition_grid"))
                sino = ZarrStore.open(out / "b.zarr", mode="r")
                volume = None
                if step.get("volume"):
                    if rank == 0:
                        ZarrStore.create(step["volume"], P.global_volume_shape, F64, chunks=(4, 14, 14),
                                         overwrite=True)
                    barrier(P.process_group)
                    volume = ZarrStore.open(step["volume"])
                res = disk_cgls(P, sino, step["work"], step["n_iter"], checkpoint_every=step.get("checkpoint_every", 0),
                                resume=step.get("resume", False), volume_store=volume,
                                memory_budget=step.get("memory_budget"))
                results[step["name"]] = {"residuals": res.residuals}
            except Exception as e:  # noqa: BLE001 - the test checks the message
                results[step["name"]] = {"error": str(e), "type": type(e).__name__}
            dist.barrier()
    finally:
        (out / f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
