"""Ranks that build their Projector with different configurations must all fail, naming the field.

Usage: torchrun --nproc-per-node=2 mismatched_config.py OUT_DIR

Each case changes one field on rank 1 only; every rank records the error it
got (or "ok") in OUT_DIR/rank<r>.json.  A matching case last shows that the
check passes and the group still works after the failures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ctbench import Projector, circular_trajectory_3d
from ctbench.distributed import ConfigurationMismatchError


def build(rank: int, field: str):
    odd = rank == 1
    sid = 45.0 if odd and field == "sid" else 40.0
    n_views = 7 if odd and field == "n_views" else 6
    dtype = torch.float64 if odd and field == "dtype" else torch.float32
    kw = {
        "detector_shape": (8, 5) if odd and field == "detector_shape" else (8, 6),
        "detector_spacing": 1.1 if odd and field == "detector_spacing" else 1.0,
        "voxel_spacing": 0.9 if odd and field == "voxel_spacing" else 1.0,
        "partition": "space" if odd and field == "partition" else "views",
    }
    shape = (8, 8, 9) if odd and field == "volume_shape" else (8, 8, 8)
    traj = circular_trajectory_3d(n_views, sid, 80.0, dtype=dtype)
    return Projector(traj, shape, kw.pop("detector_shape"), distributed=True, **kw)


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {}
    for field in ("sid", "n_views", "detector_shape", "detector_spacing", "volume_shape", "voxel_spacing",
                  "partition", "dtype", "none"):
        try:
            op = build(rank, field)
            y = op.project(torch.ones(op.volume_shape))
            results[field] = f"ok {float(y.sum()):.6g}"
        except ConfigurationMismatchError as e:
            results[field] = f"ConfigurationMismatchError: {e}"
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
