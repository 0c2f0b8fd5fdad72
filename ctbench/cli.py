"""The ``ctbench`` command.

``ctbench demo``   simulate a cone-beam scan of the 3D Shepp-Logan phantom,
                   reconstruct it with FDK, write zarr + PNG, print accuracy
``ctbench gui``    open napari with the ctbench widgets and a sample
``ctbench info``   backends, compiler and kernel cache (``--measure-paths``: time the CPU kernels' inner loops now)
``ctbench samples``  the bundled samples and where they are installed (ctbench/samples.py)
``ctbench recon``  reconstruct a measured scan from a JSON config (ctbench/pipeline/recon.py)
``ctbench calibrate``  calibrate a scan's geometry from its own data (ctbench/pipeline/calibrate.py)
``ctbench inspect``  what a scan file states and where each value came from (ctbench/io/inspect.py)
``ctbench bridge serve``, ``ctbench jobs ...``   background jobs (docs/JOBS.md)

Parsing the arguments (``--help``, a wrong argument) imports neither torch nor the engine: each command
imports what it needs when it runs.  A missing optional package ends in one line naming the extra that
brings it (ctbench/extras.py), never a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from .json_report import dumps as strict_json


def _demo(args) -> int:
    from . import Projector, circular_trajectory_3d
    from .workbench.design import ScanGeometry
    from .phantoms import shepp_logan_3d, shepp_logan_line_integrals
    from .solvers import fdk
    from .workbench.dataset import save_dataset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n, spacing, n_views = args.size, 256.0 / args.size, args.views
    det, pitch = (args.size, args.size), 512.0 / args.size
    scale = 116.0
    t0 = time.perf_counter()
    traj = circular_trajectory_3d(n_views, 600.0, 1200.0)
    sino = shepp_logan_line_integrals(traj, det, pitch, modified=True, scale=scale).float()
    t_sim = time.perf_counter() - t0
    op = Projector(traj, (n, n, n), det, voxel_spacing=spacing, detector_spacing=pitch)
    t0 = time.perf_counter()
    recon = fdk(op, sino)
    t_rec = time.perf_counter() - t0
    truth = shepp_logan_3d((n, n, n), spacing, modified=True, scale=scale)
    mae = (recon - truth).abs().mean().item()
    mse = (recon - truth).square().mean().item()
    peak = truth.max().item()
    psnr = 10 * math.log10(peak ** 2 / mse)

    geometry = ScanGeometry(traj, det, (pitch, pitch), (n, n, n), (spacing,) * 3)
    zpath = save_dataset(out / "demo.zarr", volume=recon, sinogram=sino, geometry=geometry,
                         meta={"phantom": "modified Shepp-Logan", "scale_mm": scale, "algorithm": "fdk"},
                         overwrite=True)
    png = out / "demo.png"
    _slices_png(png, truth, recon)
    report = {"phantom": "modified Shepp-Logan (exact analytic projections)", "volume": [n, n, n],
              "voxel_mm": spacing, "views": n_views, "algorithm": "fdk", "mae": round(mae, 5),
              "psnr_db": round(psnr, 2), "simulate_s": round(t_sim, 3), "reconstruct_s": round(t_rec, 3),
              "zarr": str(zpath), "png": str(png)}
    print(strict_json(report))
    return 0


def _slices_png(path: Path, truth, recon) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d, h, w = truth.shape
    fig, axes = plt.subplots(2, 3, figsize=(9, 6))
    for row, (name, vol) in enumerate((("phantom", truth), ("FDK", recon))):
        views = (vol[d // 2], vol[:, h // 2], vol[:, :, w // 2])
        for col, (img, title) in enumerate(zip(views, ("axial z=0", "coronal y=0", "sagittal x=0"))):
            ax = axes[row, col]
            ax.imshow(img.cpu().numpy(), cmap="gray", vmin=0.0, vmax=0.5, origin="lower")
            ax.set_title(f"{name}: {title}", fontsize=9)
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _gui(args) -> int:
    try:
        import ctbench_napari
    except ModuleNotFoundError as e:
        if e.name != "ctbench_napari":
            raise
        print('ctbench gui: the napari plugin is not installed; it comes with pip install "ctbench[gui]"',
              file=sys.stderr)
        return 2
    try:
        ctbench_napari.launch(sample=args.sample)
    except ValueError as e:  # an unknown --sample
        print(f"ctbench gui: {e}", file=sys.stderr)
        return 2
    return 0


def _samples(args) -> int:
    from .samples import describe_samples

    rows = describe_samples()
    if args.json:
        print(strict_json(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['title']}")
        print(f"{'':<{width}}  path: {r['path'] or ('(computed, no files)' if r['computed'] else '(not installed)')}")
        print(f"{'':<{width}}  use:  {r['use']}")
    return 0


def _info(args) -> int:
    import torch

    from .engine.cpu.library import cache_dir, find_compiler, kernel_dir, load_cpu_library, loaded_libraries
    from .engine.cpu.prebuilt import host_levels

    info = {"torch": torch.__version__, "threads": torch.get_num_threads(), "kernels": str(kernel_dir()),
            "cache": str(cache_dir()), "cuda": torch.cuda.is_available(), "cpu_levels": list(host_levels())}
    try:
        info["compiler"] = find_compiler()
    except RuntimeError:
        info["compiler"] = None  # not needed when the prebuilt kernels load
    try:
        lib = load_cpu_library("joseph")
        info["cpu_backend"] = "ok"
        from .engine.cpu.joseph_paths import describe
        # offered, measured (or cached) and active inner loops; the measurement (seconds) only when asked
        info["cpu_paths"] = describe(lib, measure=args.measure_paths)
    except Exception as e:  # reported, not raised: this is a diagnostic command
        info["cpu_backend"] = info.get("cpu_backend") or f"unavailable: {e}"
        if info["cpu_backend"] == "ok":
            info["cpu_paths"] = f"unavailable: {e}"
    # which build of the kernels is loaded: prebuilt variant (and file) or the JIT build
    info["cpu_kernels"] = loaded_libraries()
    print(strict_json(info, indent=2))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ctbench", description="CT reconstruction workbench")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="simulate, reconstruct and report on the Shepp-Logan phantom")
    p.add_argument("--out", default="out", help="output folder (default: out)")
    p.add_argument("--size", type=int, default=128, help="voxels per axis (default 128)")
    p.add_argument("--views", type=int, default=180, help="projections over 360 degrees (default 180)")
    p.set_defaults(func=_demo)
    p = sub.add_parser("gui", help="open napari with the ctbench widgets")
    p.add_argument("--sample", default="phantom", help="sample to load: phantom, scan, htc2022 or none")
    p.set_defaults(func=_gui)
    p = sub.add_parser("info", help="backends, compiler and kernel cache")
    p.add_argument("--measure-paths", action="store_true",
                   help="time the CPU kernels' inner loops now if no choice is cached (a few seconds; "
                        "otherwise they are timed at the first projector call)")
    p.set_defaults(func=_info)
    p = sub.add_parser("samples", help="the bundled samples and where they are installed")
    p.add_argument("--json", action="store_true", help="a JSON list instead of text")
    p.set_defaults(func=_samples)
    from .pipeline.cli import register_calibrate, register_recon
    register_recon(sub)       # ctbench recon CONFIG.json
    register_calibrate(sub)   # ctbench calibrate CONFIG.json
    from .io.inspect import register_inspect
    register_inspect(sub)     # ctbench inspect SCAN
    from .jobs.cli import add_commands as add_job_commands, run as run_job_command
    add_job_commands(sub)   # ctbench bridge serve, ctbench jobs ...
    args = parser.parse_args(argv)
    from .extras import missing_extra_message
    if getattr(args, "size", 1) <= 0 or getattr(args, "views", 1) <= 0:
        parser.error("--size and --views must be positive")
    if args.command == "gui" and args.sample == "none":
        args.sample = None
    try:
        if args.command in ("bridge", "jobs"):
            return run_job_command(args)
        return args.func(args)
    except (ModuleNotFoundError, ImportError) as e:
        line = missing_extra_message(e, f"ctbench {args.command}")
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
