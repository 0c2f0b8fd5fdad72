"""A scanner-sized job end to end (issue 42): a raw TIFF scan streamed by ``ctbench recon`` to an OME-Zarr.

1. **The scan**: a simulated lab scan of the chiral phantom (exact analytic line integrals, Poisson counts around
   a beam with a fall-off and a fixed gain pattern, dark current, read noise), one uncompressed uint16 TIFF per
   view plus flats and darks, generated a few views at a time (the generator never holds the scan either).
   ``--size default``: 1500 views of 1024^2 to a 1024^3 volume; ``--size large``: 3000 views of 2048^2 to 2048^3;
   ``--size small``: 360 views of 256^2 (minutes: a check of the script). ``--views N`` overrides the number of
   views (the rates per voxel-view stay measurable at full detector and volume size with fewer views).
2. **The job**: ``ctbench recon --json --memory M --threads T`` in a child process. Its JSON progress lines
   give every stage's wall time and rate; its report gives the time inside the FDK kernels; the peak resident
   memory of the process and its children is sampled every 50 ms (psutil). ``--slabs K`` stops the job once
   its first K slabs are backprojected (the stages before run in full) and states the projected total from
   the backprojection's rate; the run folder it leaves is removed.
3. **The in-memory peer** (``--compare``, where it fits in memory): ctbench's in-memory chain on the same
   files (the whole stack corrected as the streamed job does, then one ``fdk`` call at the same thread count),
   interleaved call by call with the streamed job, ``--repeats`` times each; the ratio of the streamed job's
   whole-process time to the in-memory ``fdk`` call (target: at most 1.25) and the largest difference of the
   two volumes.
4. **Ranks** (``--ranks R``): the same job as ``ctbench recon --ranks R`` (torchrun, Gloo; each rank
   ``threads // R`` kernel threads, the ranks sharing the budget), interleaved call by call with the
   single-process job; the speed-up of the medians and whether the two volumes are equal bit for bit.

Output: JSON lines on stdout, appended to ``--out`` (benchmarks/results/bench_large_scan.jsonl).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Emitter, machine_info  # noqa: E402

BENCH = "large_scan"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_large_scan.jsonl"
SIZES = {"small": (256, 360), "default": (1024, 1500), "large": (2048, 3000)}   # detector N (N^2), views
TARGET_RATIO = 1.25
PITCH_MM, SID_MM, SDD_MM = 0.1, 200.0, 400.0     # the volume's voxel at the axis: 0.05 mm


# ---------------------------------------------------------------------------------------------- the scan
def write_scan(folder: Path, n: int, views: int, *, seed: int = 5, chunk: int = 4) -> dict:
    """Write the raw scan (module doc, 1) into ``folder``; returns what was written and how long it took."""
    import tifffile
    import torch

    from ctbench.geometry import circular_trajectory_3d
    from ctbench.io.scan import sinogram_to_images
    from ctbench.io.scanner import SCANNER_JSON, scanner_json
    from ctbench.phantoms import chiral_line_integrals, default_scale

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    scale = float(default_scale((n,) * 3, PITCH_MM * SID_MM / SDD_MM))
    r, c = np.mgrid[:n, :n]
    rr = ((r - (n - 1) / 2) / n) ** 2 + ((c - (n - 1) / 2) / n) ** 2
    beam = 12000.0 * (1 - 0.3 * rr) * rng.normal(1.0, 0.02, (n, n))
    dark = 100.0 * rng.normal(1.0, 0.05, (n, n))
    attenuation = 0.6 / (n * PITCH_MM * SID_MM / SDD_MM)    # per mm per unit of the phantom: e^-0.6 or so

    def frame(mean):
        counts = rng.poisson(mean).astype(np.float32) + dark + rng.normal(0.0, 3.0, mean.shape)
        return np.clip(np.rint(counts), 0, 65535).astype(np.uint16)

    tmp = folder.with_name(folder.name + ".writing")
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("projections", "flats", "darks"):
        (tmp / sub).mkdir(parents=True)
    for i in range(8):
        tifffile.imwrite(tmp / "flats" / f"flat_{i:02d}.tif", frame(beam))
        tifffile.imwrite(tmp / "darks" / f"dark_{i:02d}.tif", frame(np.zeros_like(beam)))
    angles = 2 * np.pi * np.arange(views) / views
    for a in range(0, views, chunk):
        b = min(views, a + chunk)
        traj = circular_trajectory_3d(sid=SID_MM, sdd=SDD_MM, angles=torch.from_numpy(angles[a:b]),
                                      dtype=torch.float64)
        line = chiral_line_integrals(traj, (n, n), PITCH_MM, scale=scale).numpy() * attenuation   # (view, U, V)
        for k, img in enumerate(sinogram_to_images(line)):               # ctbench's images: row 0 at +v
            tifffile.imwrite(tmp / "projections" / f"proj_{a + k:05d}.tif", frame(beam * np.exp(-img)))
    doc = scanner_json(sid=SID_MM, sdd=SDD_MM, pixel_size=(PITCH_MM, PITCH_MM), n_projections=views,
                       scanner="ctbench simulated lab micro-CT (bench_large_scan)")
    (tmp / SCANNER_JSON).write_text(json.dumps(doc, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    size = sum(p.stat().st_size for p in folder.rglob("*.tif"))
    return {"views": views, "detector": [n, n], "bytes": size, "seconds": round(time.perf_counter() - t0, 1)}


# ---------------------------------------------------------------------------------------------- the job
def _tree_rss(proc) -> int:
    import psutil
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_recon_process(config: Path, out_path: Path, memory: str, threads: int, slabs: int | None,
                      ranks: int = 1) -> dict:
    """One ``ctbench recon`` child process (module doc, 2), ``--ranks ranks`` when more than one."""
    import psutil

    cmd = [sys.executable, "-m", "ctbench.cli", "recon", str(config), "--out", str(out_path), "--json",
           "--memory", memory, "--threads", str(threads), "--overwrite"] + \
        (["--ranks", str(ranks)] if ranks > 1 else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    proc = psutil.Process(child.pid)
    peak = [0]
    running = [True]

    def sample():
        while running[0]:
            peak[0] = max(peak[0], _tree_rss(proc))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stages: dict[str, dict] = {}
    report, plan_slab, stopped = None, None, False
    for line in child.stdout:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("event") == "progress":
            stages[ev["stage"]] = {k: ev.get(k) for k in ("done", "total", "unit", "elapsed_s", "rate")}
            if ev["stage"] == "backproject" and slabs is not None:
                plan_slab = plan_slab or _plan_slab(out_path)
                if plan_slab and ev["done"] >= slabs * plan_slab and ev["done"] < ev["total"]:
                    stopped = True
                    child.kill()
                    break
        elif "algorithm" in ev or "plan" in ev:
            report = ev
    child.wait()
    wall = time.perf_counter() - t0
    running[0] = False
    sampler.join()
    err = child.stderr.read()
    if not stopped and child.returncode != 0:
        raise RuntimeError(f"ctbench recon failed ({child.returncode}): {err[-2000:]}")
    if stopped:
        shutil.rmtree(out_path.with_name(f".{out_path.name}.ctbench-run"), ignore_errors=True)
    return {"wall_s": round(wall, 2), "peak_rss_bytes": peak[0], "stages": stages, "stopped_after_slabs": stopped,
            "kernel_s": (report or {}).get("kernel_s"), "plan": (report or {}).get("plan"),
            "output": (report or {}).get("output")}


def _plan_slab(out_path: Path) -> int | None:
    run_json = out_path.with_name(f".{out_path.name}.ctbench-run") / "run.json"
    try:
        return int(json.loads(run_json.read_text())["plan"]["slab"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------------------------------- the peer
def in_memory_inputs(config: Path):
    """The in-memory chain's geometry and line integrals for the config (corrected as the streamed job does)."""
    import torch

    from ctbench.io.scan import images_to_sinogram
    from ctbench.pipeline import parse_config
    from ctbench.pipeline.steps import build_geometry, find_offset, oriented_scan

    cfg = parse_config(json.loads(config.read_text()))
    scan, prep, sid, sdd, angles, resolved, cfg = oriented_scan(cfg, lambda m: None)
    centre = find_offset(prep, angles, sid, sdd, cfg.geometry.detector_offset_v_mm)
    geo = build_geometry(prep, cfg.geometry, sid, sdd, angles, centre.offset_mm)
    sino = torch.from_numpy(np.ascontiguousarray(images_to_sinogram(prep.images)))
    return geo, sino


def time_in_memory(geo, sino) -> tuple[float, object]:
    from ctbench.workbench.workflow import ReconRequest, run
    t = time.perf_counter()
    vol = run(geo, sino, ReconRequest("fbp").validated()).volume
    return time.perf_counter() - t, vol


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="default")
    ap.add_argument("--views", type=int, help="number of views (default: the size's)")
    ap.add_argument("--memory", default="2GB", help="the job's memory budget (ctbench recon --memory)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--slabs", type=int, help="stop after the first K slabs are backprojected")
    ap.add_argument("--compare", action="store_true", help="interleave the in-memory fdk call (module doc, 3)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ranks", type=int, help="interleave the job run as this many torchrun ranks (module doc, 4)")
    ap.add_argument("--workdir", type=Path, help="where the scan and the volume go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the scan and the volume")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    n, views = SIZES[args.size]
    views = args.views or views
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ctbench-large-"))
    work.mkdir(parents=True, exist_ok=True)
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    emit = Emitter(args.out, run_id, bench=BENCH)
    import torch
    machine = machine_info()
    emit(kind="header", machine=machine, avx512="avx512f" in machine["simd"], threads=args.threads,
         torch=torch.__version__, size=args.size, detector=n, views=views, volume=n, memory=args.memory,
         slabs=args.slabs)
    try:
        scan = work / f"scan_{n}_{views}"
        if not (scan / "scan.json").is_file():
            emit(kind="scan", **write_scan(scan, n, views))
        config = work / "recon.json"
        config.write_text(json.dumps({"input": {"path": str(scan)}, "algorithm": {"name": "fdk"},
                                      "geometry": {"volume_shape": [n, n, n]}}))
        out_path = work / "volume.ome.zarr"
        peer = in_memory_inputs(config) if args.compare else None
        if peer is not None:
            torch.set_num_threads(args.threads)
        walls, peer_walls, peaks, last = [], [], [], None
        ranked_walls, ranked_path = [], work / "ranked.ome.zarr"
        rank_threads = max(1, args.threads // args.ranks) if args.ranks else None
        for i in range(args.repeats if (args.compare or args.ranks) else 1):
            rec = run_recon_process(config, out_path, args.memory, args.threads, args.slabs)
            walls.append(rec["wall_s"])
            peaks.append(rec["peak_rss_bytes"])
            last = rec
            line = {"kind": "streamed", "call": i} | rec
            bp = rec["stages"].get("backproject")
            if args.slabs and bp and bp.get("rate"):
                rest = (bp["total"] - bp["done"]) / bp["rate"]
                line["projected_total_s"] = round(rec["wall_s"] + rest, 1)
            emit(**line)
            if args.ranks:
                rec_r = run_recon_process(config, ranked_path, args.memory, rank_threads, args.slabs, args.ranks)
                ranked_walls.append(rec_r["wall_s"])
                emit(**({"kind": "ranked", "call": i, "ranks": args.ranks, "threads_per_rank": rank_threads}
                        | rec_r))
            if peer is not None:
                t, vol = time_in_memory(*peer)
                peer_walls.append(t)
                emit(kind="in_memory_fdk", call=i, wall_s=round(t, 2))
        summary = {"kind": "summary", "streamed_wall_min_s": min(walls),
                   "streamed_wall_median_s": statistics.median(walls), "peak_rss_max_bytes": max(peaks),
                   "budget": args.memory}
        if peer_walls:
            from ctbench.io.ome_zarr import OmeZarrVolume
            streamed = torch.from_numpy(OmeZarrVolume.open(out_path).read())
            summary |= {"in_memory_fdk_min_s": round(min(peer_walls), 2),
                        "in_memory_fdk_median_s": round(statistics.median(peer_walls), 2),
                        "ratio_median": round(statistics.median(walls) / statistics.median(peer_walls), 3),
                        "ratio_min": round(min(walls) / min(peer_walls), 3), "target_ratio": TARGET_RATIO,
                        "max_abs_difference": float((streamed - vol).abs().max()),
                        "volume_max": float(vol.abs().max())}
        if ranked_walls:
            from ctbench.io.ome_zarr import OmeZarrVolume
            a, b = OmeZarrVolume.open(out_path), OmeZarrVolume.open(ranked_path)
            summary |= {"ranks": args.ranks, "threads_per_rank": rank_threads,
                        "ranked_wall_min_s": min(ranked_walls),
                        "ranked_wall_median_s": statistics.median(ranked_walls),
                        "rank_speedup_median": round(statistics.median(walls) / statistics.median(ranked_walls), 3),
                        "same_volume_bit_for_bit": all(np.array_equal(a.read(level=k), b.read(level=k))
                                                       for k in range(a.n_levels)),
                        # the ranks share the budget, so each plans smaller windows: other sums, same volume
                        # up to float32 round-off (bit for bit where the plans agree)
                        "ranked_max_abs_difference": float(np.abs(a.read() - b.read()).max())}
        if last and last["kernel_s"]:
            summary["kernel_s"] = last["kernel_s"]
        emit(**summary)
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
