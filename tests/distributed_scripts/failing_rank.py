"""One torchrun rank of a job in which rank 1 fails: it raises, or it hangs.

Usage: torchrun --nproc-per-node=N failing_rank.py raise|hang TIMEOUT_S

The other ranks enter a distributed projection and must leave it with a
DistributedError (peer closed the connection, or the process-group timeout
expired) instead of waiting forever.
"""

from __future__ import annotations

import datetime
import sys
import time

import torch
import torch.distributed as dist

from ctbench import Projector, circular_trajectory_3d


def main() -> None:
    mode, timeout = sys.argv[1], float(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    op = Projector(circular_trajectory_3d(6, 40.0, 80.0), (8, 8, 8), (8, 6), distributed=True, partition="space")
    if op.rank == 1:
        if mode == "raise":
            raise ValueError("deliberate failure on rank 1")
        time.sleep(10 * timeout)  # stops joining collectives
    op.project(torch.ones(op.volume_shape))
    print(f"rank {op.rank} finished a projection it should not have finished", flush=True)


if __name__ == "__main__":
    main()
