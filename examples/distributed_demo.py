"""One process per GPU: the distributed demo of the specification.

Each rank creates the same volume, computes its local measurements, and
differentiates one global data term.  Launch on one node with two GPUs:

    torchrun --standalone --nproc-per-node=2 examples/distributed_demo.py

Two nodes with two GPUs each (same command on both, only --node-rank changes):

    torchrun --nnodes=2 --node-rank=0 --nproc-per-node=2 \\
        --master-addr=<node0-hostname> --master-port=29500 examples/distributed_demo.py

Without CUDA the same script runs on CPU ranks with the Gloo backend, and
``python examples/distributed_demo.py`` (no torchrun) runs it as a single
rank, printing the same global half-MSE.
"""

import os

import torch
import torch.distributed as dist

from ctbench import Projector, spiral_trajectory_3d

# Portable launch: a single rank when started without torchrun.
for key, value in (("LOCAL_RANK", "0"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                   ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29512")):
    os.environ.setdefault(key, value)

if torch.cuda.is_available():
    # Select this process's GPU before creating the NCCL process group.
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo")
try:
    n_views = 31
    detector_shape = (48, 40)  # (U, V)
    trajectory = spiral_trajectory_3d(
        n_views, sid=80.0, sdd=128.0, z_range=8.0, n_turns=1.0, device="cpu")
    operator = Projector(trajectory, (32, 32, 32), detector_shape,
                         distributed=True)

    truth = torch.ones(operator.volume_shape, device=device)
    local_measurements = operator.project(truth)  # this rank's views only
    volume = torch.zeros_like(truth, requires_grad=True)
    local_prediction = operator.project(volume)

    # Divide the local sum by the global ray count, not by the shard size.
    total_rays = n_views * detector_shape[0] * detector_shape[1]
    local_loss = (0.5 * (local_prediction - local_measurements).square().sum()
                  / total_rays)
    local_loss.backward()  # every rank receives the full volume gradient

    # Reduce a detached copy for reporting only.
    report = local_loss.detach().clone()
    dist.all_reduce(report, op=dist.ReduceOp.SUM)
    if operator.rank == 0:
        print(f"global half-MSE: {report.item():.6g}")
finally:
    dist.destroy_process_group()
