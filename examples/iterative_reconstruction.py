"""Iterative (or analytic) reconstruction of a simulated scan, end to end.

Simulates exact line integrals of a 3D Shepp-Logan phantom for a circular or
helical cone-beam trajectory, adds Gaussian noise, reconstructs with the
chosen algorithm, and writes

- ``<out>/reconstruction.png``: central slices of phantom and reconstruction,
  and the residual history;
- ``<out>/reconstruction.zarr``: a ctbench dataset (zarr v3) holding the
  volume, the sinogram and the scan geometry.

Examples::

    python examples/iterative_reconstruction.py --algorithm sirt --n-iter 50
    python examples/iterative_reconstruction.py --trajectory helical --algorithm tv --noise 0.02
    python examples/iterative_reconstruction.py --algorithm fdk --size 128 --views 180

``--devices 0 1 2 3`` builds one projector over several devices (views split
in device order, ``Projector(..., devices=[...])``; the data live on the first
device); ``--devices cpu cpu`` runs several CPU "devices" (testing).  Under torchrun
(``torchrun --nproc-per-node=4 examples/iterative_reconstruction.py``) every
process runs one rank of a views-partitioned projector (NCCL on GPUs, Gloo on
CPUs; docs/DISTRIBUTED.md) and rank 0 writes the outputs.  Ctrl-C stops an
iterative solve between iterations and still writes the current estimate.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import torch

from ctbench import Projector, circular_trajectory_3d, spiral_trajectory_3d
from ctbench.phantoms import shepp_logan_3d, shepp_logan_line_integrals
from ctbench.solvers import cgls_iterations, fdk, helical_fdk, sirt_iterations, tv_iterations

ALGORITHMS = ("sirt", "cgls", "tv", "fdk")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phantom", choices=("modified", "original"), default="modified",
                   help="Shepp-Logan table: 'modified' (Toft, high contrast) or 'original' (Kak-Slaney)")
    p.add_argument("--trajectory", choices=("circular", "helical"), default="circular")
    p.add_argument("--size", type=int, default=64, help="volume edge in voxels (cube)")
    p.add_argument("--views", type=int, default=120)
    p.add_argument("--noise", type=float, default=0.0,
                   help="Gaussian noise, standard deviation relative to the largest line integral")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="sirt")
    p.add_argument("--n-iter", type=int, default=None, help="iterations (default: sirt 100, cgls 20, tv 100)")
    p.add_argument("--lam", type=float, default=None, help="TV weight (default: scaled to the problem)")
    p.add_argument("--devices", nargs="*", default=None,
                   help="devices (e.g. 0 1 for cuda:0 and cuda:1, or cpu cpu); several build a multi-device projector")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("out/iterative_reconstruction"))
    return p.parse_args(argv)


def as_device(name) -> torch.device:
    dev = torch.device(f"cuda:{name}" if str(name).isdigit() else name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(f"note: {dev} is not available; running on the CPU", file=sys.stderr)
        return torch.device("cpu")
    return dev


def pick_devices(devices) -> list[torch.device]:
    """The devices of ``--devices`` (CUDA ordinals, cuda:N or cpu); the CPU when none are given."""
    return [as_device(d) for d in devices] if devices else [torch.device("cpu")]


def pick_device(devices) -> torch.device:
    """Where the data live: the first device."""
    return pick_devices(devices)[0]


def init_distributed(args):
    """Under torchrun (LOCAL_RANK set): this process's device after creating the process group, else None."""
    if "LOCAL_RANK" not in os.environ:
        return None
    import torch.distributed as dist

    use_cuda = torch.cuda.is_available() and args.devices != ["cpu"]
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # before creating the NCCL process group
    dist.init_process_group("nccl" if use_cuda else "gloo")
    return device


def build_scan(args, device, dtype, distributed=False, devices=None):
    n = args.size
    voxel = 256.0 / n                      # a 256 mm field of view
    det = (n + n // 2, n + n // 4)         # wide enough for the magnified volume
    pixel = 2 * voxel
    sid, sdd = 600.0, 1200.0
    if args.trajectory == "circular":
        traj = circular_trajectory_3d(args.views, sid, sdd, dtype=torch.float64)
    else:
        traj = spiral_trajectory_3d(args.views, sid, sdd, z_range=0.5 * n * voxel, n_turns=2.0, dtype=torch.float64)
    scale = 0.45 * n * voxel               # phantom half-height in mm: the head fits the volume
    modified = args.phantom == "modified"
    sino = shepp_logan_line_integrals(traj, det, pixel, modified=modified, scale=scale)
    truth = shepp_logan_3d((n, n, n), voxel, modified=modified, scale=scale, dtype=torch.float64)
    if args.noise > 0:
        g = torch.Generator().manual_seed(args.seed)
        sino = sino + args.noise * float(sino.max()) * torch.randn(sino.shape, generator=g, dtype=sino.dtype)
    traj = traj.to(device=device, dtype=dtype)
    opts = {"distributed": True} if distributed else {}  # views partition
    if devices is not None and len(devices) > 1 and not distributed:
        opts["devices"] = devices  # one process, several devices: views split in device order
    projector = Projector(traj, (n, n, n), det, voxel_spacing=voxel, detector_spacing=pixel, **opts)
    return projector, sino.to(device=device, dtype=dtype), truth.to(dtype=dtype)


def reconstruct(args, projector, sino):
    """Run the algorithm; returns (volume, residual history, seconds, stop reason)."""
    t0 = time.perf_counter()
    if args.algorithm == "fdk":
        fn = helical_fdk if args.trajectory == "helical" else fdk
        return fn(projector, sino), [], time.perf_counter() - t0, "analytic"
    n_iter = args.n_iter if args.n_iter is not None else {"sirt": 100, "cgls": 20, "tv": 100}[args.algorithm]
    cancel = threading.Event()
    if args.algorithm == "sirt":
        gen = sirt_iterations(projector, sino, n_iter, bounds=(0.0, None), cancel=cancel)
    elif args.algorithm == "cgls":
        gen = cgls_iterations(projector, sino, n_iter, cancel=cancel)
    else:
        # TV weight: a fraction of the data term's scale (line integrals ~ mm, TV per voxel step)
        lam = args.lam if args.lam is not None else 0.02 * float(sino.abs().max())
        gen = tv_iterations(projector, sino, n_iter, lam=lam, cancel=cancel)
    volume = torch.zeros(projector.volume_shape, dtype=sino.dtype, device=sino.device)
    residuals = []
    reason = "completed"
    try:
        while True:
            try:
                state = next(gen)
            except StopIteration as stop:
                reason = stop.value or reason
                break
            volume = state.volume
            residuals.append(state.residual)
            if getattr(projector, "rank", 0) == 0:
                print(f"iteration {state.iteration:4d}  residual {state.residual:.5g}  "
                      f"relative {state.extra['relative_residual']:.4f}", flush=True)
    except KeyboardInterrupt:
        cancel.set()
        reason = "interrupted"
    return volume, residuals, time.perf_counter() - t0, reason


def write_figure(path: Path, truth, volume, residuals, title: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no figure (pip install matplotlib)", file=sys.stderr)
        return False
    n = truth.shape[0]
    vmax = float(truth.max())
    fig, ax = plt.subplots(2, 3, figsize=(12, 8))
    for col, (name, img) in enumerate((("axial", lambda v: v[n // 2]), ("coronal", lambda v: v[:, n // 2]),
                                       ("sagittal", lambda v: v[:, :, n // 2]))):
        ax[0, col].imshow(img(truth).cpu(), cmap="gray", vmin=0, vmax=vmax, origin="lower")
        ax[0, col].set_title(f"phantom, {name}")
        ax[1, col].imshow(img(volume).cpu(), cmap="gray", vmin=0, vmax=vmax, origin="lower")
        ax[1, col].set_title(f"reconstruction, {name}")
    for a in ax.flat:
        a.set_axis_off()
    if residuals:
        inset = fig.add_axes([0.70, 0.07, 0.25, 0.15])
        inset.semilogy(range(1, len(residuals) + 1), residuals)
        inset.set_xlabel("iteration")
        inset.set_ylabel("||Ax - b||")
    fig.suptitle(title)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.size < 8 or args.views < 2:
        raise SystemExit("--size must be >= 8 and --views >= 2")
    dist_device = init_distributed(args)
    if dist_device is None:
        return _run(args, None)
    import torch.distributed as dist
    try:
        rc = _run(args, dist_device)
        dist.barrier()  # leave together while rank 0 writes
        return rc
    finally:
        dist.destroy_process_group()


def _run(args, dist_device) -> int:
    devices = pick_devices(args.devices) if dist_device is None else None
    device = dist_device if dist_device is not None else devices[0]
    dtype = getattr(torch, args.dtype)
    projector, sino, truth = build_scan(args, device, dtype, distributed=dist_device is not None, devices=devices)
    if devices is not None and len(devices) > 1:
        print(f"projector over {len(devices)} devices: {', '.join(map(str, devices))}")
    if args.algorithm == "tv" and args.lam is None:
        args.lam = 0.02 * float(sino.abs().max())  # the default weight, from the full data on every rank
    volume, residuals, seconds, reason = reconstruct(args, projector, sino[projector.view_slice])
    volume = volume.detach().cpu()
    if projector.rank != 0:  # views partition: every rank holds the full volume; rank 0 writes
        return 0
    err = float((volume.double() - truth.double()).norm() / truth.double().norm())
    title = (f"{args.algorithm} on a {args.trajectory} scan, {args.views} views, noise {args.noise:g}: "
             f"relative error {err:.3f}, {seconds:.1f} s ({reason})")
    print(title)
    args.out.mkdir(parents=True, exist_ok=True)
    write_figure(args.out / "reconstruction.png", truth, volume, residuals, title)
    from ctbench.workbench.design import ScanGeometry
    from ctbench.workbench.dataset import save_dataset

    geometry = ScanGeometry(projector.trajectory.to(device="cpu"), projector.detector_shape,
                            projector.detector_spacing, projector.volume_shape, projector.voxel_spacing)
    path = save_dataset(args.out / "reconstruction.zarr", volume=volume, sinogram=sino.cpu(), geometry=geometry,
                        voxel_spacing=projector.voxel_spacing, overwrite=True,
                        meta={"algorithm": args.algorithm, "residuals": residuals, "stopped": reason,
                              "relative_error": err, "seconds": seconds, "noise": args.noise,
                              "phantom": args.phantom})
    print(f"wrote {args.out / 'reconstruction.png'} and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
