"""Disk-backed CGLS of a simulated scan, with rank-local checkpoints.

Simulates exact line integrals of a 3D Shepp-Logan phantom on a circular cone-beam orbit, writes
them to ``<output>/sinogram.zarr``, and reconstructs with CGLS whose vectors (x, s, p and the ray
vectors r, q) live in zarr stores under ``<output>/work``, processed window by window within
``--memory-budget``.  The result is ``<output>/volume.zarr`` (zarr v3, float32 unless
``--dtype float64``).  The capacity estimate (memory and disk per rank) is printed first.

Examples::

    python examples/disk_reconstruction.py --output out/disk --size 64 --iterations 10
    python examples/disk_reconstruction.py --output out/disk --size 384 --memory-budget "256 MiB" \\
        --iterations 5 --checkpoint-every 1
    python examples/disk_reconstruction.py --output out/disk --resume        # after an interruption
    torchrun --nproc-per-node=2 examples/disk_reconstruction.py --output out/disk --partition space

Under torchrun every process is one rank (Gloo; the CPU kernels) of a projector partitioned by
views or space (the hybrid partition is refused): each rank writes only what it owns and keeps its
checkpoints under ``<output>/work/rank-NNNNN``.  ``--resume`` continues from the newest checkpoint
that every rank completed; the final volume then equals that of an uninterrupted run bit for bit.
Rank 0 shows a progress bar (tqdm).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.plan import PlanError, parse_bytes
from ctbench.phantoms import shepp_logan_line_integrals
from ctbench.solvers import CheckpointError, disk_cgls_iterations, plan_disk_cgls
from ctbench.solvers.disk_cgls import write_owned
from ctbench.storage import ZarrStore


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("out/disk_reconstruction"),
                   help="folder for sinogram.zarr, volume.zarr and the work stores")
    p.add_argument("--size", type=int, default=64, help="volume edge N of the N^3 volume (default 64)")
    p.add_argument("--views", type=int, default=None, help="projections over 360 degrees (default: N)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=0, help="iterations between checkpoints (0: none)")
    p.add_argument("--memory-budget", default="256 MiB", help='bytes for the windows, e.g. "256 MiB"')
    p.add_argument("--partition", default="views", help="under torchrun: views or space")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = p.parse_args(argv)
    if args.partition not in ("views", "space"):
        p.error(f"--partition must be views or space, got {args.partition!r}: the disk example accepts only "
                "the views and space partitions (each rank then owns whole ray shards or whole slabs)")
    if args.size < 4:
        p.error(f"--size must be at least 4, got {args.size}")
    if args.iterations < 0 or args.checkpoint_every < 0:
        p.error("--iterations and --checkpoint-every must be non-negative")
    try:
        parse_bytes(args.memory_budget, "--memory-budget")
    except ValueError as e:
        p.error(str(e))
    args.views = args.views or args.size
    if args.views < 2:
        p.error("--views must be at least 2")
    return args


def scan(args, distributed: bool) -> Projector:
    n = args.size
    voxel = 256.0 / n  # a 256 mm field of view
    det = (n + n // 2, n + n // 4)
    traj = circular_trajectory_3d(args.views, 600.0, 1200.0, dtype=torch.float64)
    opts = {"distributed": True, "partition": args.partition} if distributed else {}
    return Projector(traj, (n, n, n), det, voxel_spacing=voxel, detector_spacing=2 * voxel, **opts)


def simulate(args, P: Projector, path: Path) -> ZarrStore:
    """The exact line integrals in ``path`` (written once, through a temporary folder and a rename)."""
    dtype = getattr(torch, args.dtype)
    want = {"size": args.size, "views": args.views, "dtype": args.dtype}
    if path.exists():
        store = ZarrStore.open(path, mode="r")
        if store.attrs.get("simulation") == want:
            return store
        if args.resume:
            raise SystemExit(f"{path} holds another simulation ({store.attrs.get('simulation')}); --resume needs "
                             f"the same --size, --views and --dtype")
    n = args.size
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    store = ZarrStore.create(tmp, (args.views, *P.detector_shape), dtype, chunks=(8, *P.detector_shape),
                             attrs={"simulation": want})
    for a in range(0, args.views, 8):  # view batches: the whole sinogram is never in memory
        b = min(a + 8, args.views)
        store.write((slice(a, b),), shepp_logan_line_integrals(P.trajectory[a:b], P.detector_shape, P.detector_spacing,
                                                               scale=0.45 * 256.0).to(dtype))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return ZarrStore.open(path, mode="r")


def main(argv=None) -> int:
    args = parse_args(argv)
    distributed = "LOCAL_RANK" in os.environ
    if distributed:
        import torch.distributed as dist
        dist.init_process_group("gloo")
    try:
        return run(args, distributed)
    finally:
        if distributed:
            dist.destroy_process_group()


def run(args, distributed: bool) -> int:
    from ctbench.solvers.checkpoint import barrier

    P = scan(args, distributed)
    lead = P.rank == 0
    args.output.mkdir(parents=True, exist_ok=True)
    sino_path = args.output / "sinogram.zarr"
    if lead:
        simulate(args, P, sino_path)
    barrier(P.process_group)
    sino = ZarrStore.open(sino_path, mode="r")
    dtype = getattr(torch, args.dtype)
    try:
        plan = plan_disk_cgls(P, sino, dtype=dtype, memory_budget=args.memory_budget,
                              with_x0=False)
    except PlanError as e:
        raise SystemExit(f"rank {P.rank}: {e}") from None
    if lead:
        print(f"capacity estimate (rank 0 of {P.world_size}, partition {P.partition or 'single process'}):")
        print(plan.summary(), flush=True)
    try:
        gen = disk_cgls_iterations(P, sino, args.output / "work", args.iterations,
                                   checkpoint_every=args.checkpoint_every, resume=args.resume,
                                   memory_budget=args.memory_budget, dtype=dtype)
        bar = None
        if lead:
            from tqdm import tqdm
            bar = tqdm(total=args.iterations, desc="disk CGLS", unit="it", file=sys.stdout, mininterval=0)
        state = None
        for state in gen:
            if bar is not None:
                bar.n = state.iteration
                bar.set_postfix(residual=f"{state.residual:.4g}",
                                checkpoint="yes" if state.extra["checkpoint"] else "no")
                bar.refresh()
        if bar is not None:
            bar.close()
    except (CheckpointError, FileExistsError) as e:
        print(f"rank {P.rank}: {e}", file=sys.stderr)
        return 2
    # The result: every rank writes what it owns into a temporary store, then rank 0 renames it.
    x_path = args.output / "work" / f"rank-{P.rank:05d}" / "state" / "x.zarr"
    out = args.output / "volume.zarr"
    tmp = args.output / ".volume.zarr.partial"
    if lead:
        shutil.rmtree(tmp, ignore_errors=True)
        ZarrStore.create(tmp, P.global_volume_shape, dtype, chunks=(min(16, args.size), args.size, args.size))
    barrier(P.process_group)
    write_owned(P, ZarrStore.open(x_path, mode="r"), ZarrStore.open(tmp))
    if lead:
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        it = state.iteration if state is not None else args.iterations
        res = f", residual {state.residual:.6g}" if state is not None else ""
        print(f"wrote {out} after {it} iterations{res}", flush=True)
    barrier(P.process_group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
