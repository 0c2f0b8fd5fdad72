"""Projector benchmark (issue 2): ctbench's CPU Joseph pair against its peers, same workload, same run.

Workload W1 (benchmarks/workloads.py): circular cone beam, 128^3 volume of 2 mm
voxels, 180 views over 360 degrees, 128x128 detector of 4 mm pixels, SID 600,
SDD 1200, float32.  Measured here, on that identical geometry:

- ctbench ``backend="cpu"`` forward and backprojection, interleaved call by call
  with RTK in the same process (A B A B ..., ``--repeats`` timed calls each after
  a warm-up call that also compiles the kernels if the cache is cold; min and
  median reported), at all threads (workload ``W1``) and at 1 thread
  (``W1 1-thread``); targets: forward >= 3.5x RTK, back >= 5x RTK, judged on the
  stricter of the CPU-seconds ratio and the median wall-clock ratio;
- RTK (itk-rtk) JosephForwardProjectionImageFilter / JosephBackProjectionImageFilter
  with a ThreeDCircularProjectionGeometry built from the same angles, checked two
  ways: the world positions of RTK's source and detector pixels against
  ctbench's (``geometry_max_dev_mm``) and the relative difference of the outputs
  (``rel_diff_vs_ctbench``);
- diffct 2.5 ``backend="torch"`` (cell-constant Siddon, so outputs differ from
  Joseph by the model, not the geometry: a mismatched geometry gives O(1));
- a 2D section against ASTRA's CPU projectors (parallel ``linear`` = Joseph and
  ``line``; fan ``line_fanflat``) on a 512^2 image, 720 views, 768 pixels;
- a plain memory-streaming loop (torch copy) giving GB/s, both for arrays far
  larger than the caches and for arrays the size of the W1 volume.

Counting.  ``samples`` is the number of ray/plane samples whose bilinear stencil
touches the volume: for each ray, the dominant-axis voxel planes at which the
ray lies within one voxel of the box on the other two axes (computed in float64
from the geometry, the same count for every implementation).  The kernels march
at most two spare planes per ray more (``samples_marched``).  Each forward
sample reads 4 voxels; each backprojection sample reads and writes 4 voxels, so
``touched_bytes_per_s`` = samples/s x 4 x itemsize (x2 for back).  Dividing it by
the streaming bandwidth gives ``bandwidth_fraction``: the speed relative to a
loop that fetched every stencil voxel from memory.  Values above 1 mean the
caches serve the reuse between neighbouring rays (the W1 volume is 8 MiB).

Kernel paths (issue 24).  The header records the Joseph library's paths (offered, measured
fastest on this CPU, active: ``ctbench.engine.cpu.joseph_paths``).  After each W1 row set, the AVX2
forward lanes are timed forced by ``CTBENCH_CPU_PATH`` on an AVX-512 CPU, labelled "forced AVX2 on
an AVX-512 CPU: not the speed of an AVX2-only core" (``--all-paths``: every forward and back path),
with their RTK ratio in CPU seconds.  ``--flat-cost`` runs only the flat-cost sweep: ``--flat-ops``
(default forward and back) on W1's geometry at ``--flat-sizes`` (default N = 64 .. 320: N^3 volume,
N x N detector, 180 views) and ``--flat-threads`` (default all threads and 1), every (N, op, threads)
interleaved call by call (one warm-up each, then ``--repeats`` rounds); one ``flat_cost`` line per
(N, op, threads) with every call's wall and CPU seconds and the rates (samples/s) from the median
wall time and the median CPU seconds, then ``flat_cost_summary`` lines per (op, threads) with the
rate's min/max over N from both (goal >= 0.8); written as bench ``projector_flat_cost`` to
``results/bench_projector_flat_cost.jsonl`` unless ``--out`` says otherwise.

Output: JSON lines on stdout, appended to ``--out``; one header line with the
machine (CPU model, cores, cache sizes, SIMD levels, load average), then one
line per (workload, op, impl) with ``seconds`` (min) and ``median_s``, then ratio lines
``{"ratio": "rtk/ctbench", "value": min ratio, "value_median": median ratio}`` (>1: ctbench faster).
The 2D/ASTRA and diffct sections time each implementation in turn (not interleaved).
Peers are optional: a missing one gives ``{"impl": ..., "skipped": "not installed"}``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata as _md
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

import ctbench  # noqa: F401  before torch, as the GUI and the CLI load it: its OpenMP defaults (ctbench/openmp_env.py)
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import W1, w1_projector  # noqa: E402

from ctbench import Projector, circular_trajectory_2d_fan, circular_trajectory_2d_parallel  # noqa: E402

BENCH = "projector"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_projector.jsonl"
FLAT_OUT = Path(__file__).resolve().parent / "results" / "bench_projector_flat_cost.jsonl"
# Issue 24's goals: forward >= 3.5x and back >= 5x RTK, in CPU seconds (RTK's back runs on one thread, so a
# wall-clock ratio at 2 threads would flatter ctbench by the second core).
TARGETS = {("forward", "rtk/ctbench"): 3.5, ("back", "rtk/ctbench"): 5.0, "diffct/ctbench": 30.0}
CPU_S_TARGETS = {"rtk/ctbench"}


# ------------------------------------------------------------------ output
class Emitter:
    """Prints JSON lines and appends them to a file; every line carries the bench name and run id."""

    def __init__(self, out: Path | None, run_id: str, bench: str = BENCH):
        self.out = out
        self.run_id = run_id
        self.bench = bench
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, **fields) -> dict:
        line = {"bench": self.bench, "run_id": self.run_id, **fields}
        text = json.dumps(line, default=_jsonable)
        print(text, flush=True)
        if self.out is not None:
            with open(self.out, "a") as f:
                f.write(text + "\n")
        return line


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, torch.Tensor):
        return x.tolist()
    return str(x)


def _round(x, digits=4):
    return float(f"{x:.{digits}g}") if x is not None and math.isfinite(x) else x


# ------------------------------------------------------------------ machine
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_versions(names) -> dict:
    out = {}
    for n in names:
        try:
            out[n] = _md.version(n)
        except _md.PackageNotFoundError:
            out[n] = None
    return out


def cpu_caches() -> dict:
    """Cache sizes of CPU 0 from sysfs: {"L1d": "48K", "L2": "1024K", "L3": "32768K", ...}."""
    out = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for d in sorted(base.glob("index*")):
        try:
            level = (d / "level").read_text().strip()
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        name = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[name] = size
    return out


def cpu_flags() -> list[str]:
    """The SIMD levels the CPU reports (what -march=native can use)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512vl") if f in flags]
    except OSError:
        pass
    return []


def physical_cores() -> int | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    cores = {(b.get("physical id"), b.get("core id"))
             for b in ({k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in blk.splitlines())}
                       for blk in text.split("\n\n") if blk.strip())}
    return len(cores) or None


def machine_info() -> dict:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"cpu": cpu_model(), "nproc": os.cpu_count(), "cores": physical_cores(), "caches": cpu_caches(),
            "simd": cpu_flags(), "cpus_usable": affinity,
            "torch_threads": torch.get_num_threads(), "loadavg": load,
            "openmp_env": {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}, "python": platform.python_version(),
            "platform": platform.platform(),
            "versions": package_versions(["ctbench", "torch", "numpy", "itk-rtk", "itk", "astra-toolbox",
                                          "diffct"])}


# ------------------------------------------------------------------ timing
def best_of(fn, repeats: int, warmup: bool = True):
    """Run ``fn`` (once more first when ``warmup``); return the fastest call and its statistics.

    CPU seconds are the process's (all threads), so ``cpu_s / seconds`` is the
    parallelism the call reached.
    """
    warm_s = None
    out = None
    if warmup:
        t0 = time.perf_counter()
        out = fn()
        warm_s = time.perf_counter() - t0
    times, cpus = [], []
    for _ in range(max(1, repeats)):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    i = int(np.argmin(times))
    return {"seconds": times[i], "median_s": float(np.median(times)), "cpu_s": cpus[i],
            "times": [_round(t) for t in times], "warmup_s": None if warm_s is None else _round(warm_s)}, out


def interleaved(calls: dict, repeats: int, warmup: bool = True) -> tuple[dict, dict]:
    """Time several implementations call by call in turn: A B A B ... (a noisy, shared machine
    then slows all of them alike instead of whichever ran during a busy spell).

    ``calls``: {name: fn}.  One warm-up call each, then ``repeats`` rounds.
    Returns ({name: stats}, {name: output of its last call}); stats hold the
    fastest time (``seconds``), the median (``median_s``), every time, and
    the process CPU seconds of the fastest call.
    """
    outs, warm = {}, {}
    if warmup:
        for name, fn in calls.items():
            t0 = time.perf_counter()
            outs[name] = fn()
            warm[name] = time.perf_counter() - t0
    times = {n: [] for n in calls}
    cpus = {n: [] for n in calls}
    for _ in range(max(1, repeats)):
        for name, fn in calls.items():
            c0, t0 = time.process_time(), time.perf_counter()
            outs[name] = fn()
            times[name].append(time.perf_counter() - t0)
            cpus[name].append(time.process_time() - c0)
    stats = {}
    for name in calls:
        t = times[name]
        i = int(np.argmin(t))
        stats[name] = {"seconds": t[i], "median_s": float(np.median(t)), "cpu_s": cpus[name][i],
                       "cpu_median_s": float(np.median(cpus[name])), "times": [_round(x) for x in t],
                       "cpu_times": [_round(x) for x in cpus[name]],
                       "warmup_s": _round(warm[name]) if name in warm else None}
    return stats, outs


def _summary(times: list[float], cpu: list[float]) -> dict:
    return {"min_s": round(min(times), 6), "median_s": round(statistics.median(times), 6),
            "cpu_min_s": round(min(cpu), 6), "cpu_median_s": round(statistics.median(cpu), 6), "n": len(times)}


def interleaved_summary(fns: dict, repeat: int) -> dict:
    """Time each callable ``repeat`` times, alternating between them call by call (after one warm-up each).

    Returns {name: {"min_s", "median_s", "cpu_min_s", "cpu_median_s", "n"}} (rounded to the microsecond):
    wall seconds and the process's CPU seconds (all threads); on an oversubscribed
    machine the CPU time is the steadier measure of the work a call does.
    """
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    cpus = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
            cpus[k].append(time.process_time() - c0)
    return {k: _summary(times[k], cpus[k]) for k in fns}


def with_cpu_library(lib, fn, family: str = "joseph"):
    """``fn`` wrapped so that, while it runs, ``cpu_library.load_cpu_library(family)`` returns ``lib``.

    The same Python path then calls another build of the kernels (a baseline
    revision, a prebuilt variant); the loader is restored after each call.
    """
    from ctbench.engine.cpu import backend as cpu_backend, library as cpu_library

    original = cpu_library.load_cpu_library

    def call():
        # ctbench.engine.cpu.backend holds its own reference (it selects the run-time paths on that library): patch
        # both, else the paths are set on the default build while the substitute runs its default path
        cpu_library.load_cpu_library = cpu_backend.load_cpu_library = lambda f: lib if f == family else original(f)
        try:
            return fn()
        finally:
            cpu_library.load_cpu_library = cpu_backend.load_cpu_library = original
    return call


def rel_diff(a, b, volume: bool = False) -> dict:
    """Relative L2 and max differences of ``a`` against the reference ``b``.

    For volumes (``volume=True``) also the L2 difference without the outermost
    voxel layer: RTK's Joseph stops at the box faces half a voxel outside the
    border voxel centres, ctbench's stencil (like ASTRA's) reaches one voxel
    beyond, so border voxels legitimately differ between the models.
    """
    a = torch.as_tensor(np.ascontiguousarray(a)).to(torch.float64)
    b = torch.as_tensor(np.ascontiguousarray(b)).to(torch.float64)
    d = a - b
    out = {"rel_diff_vs_ctbench": _round(float(d.norm() / b.norm())),
           "max_diff_vs_ctbench": _round(float(d.abs().max() / b.abs().max()))}
    if volume:
        inner = tuple(slice(1, -1) if n > 2 else slice(None) for n in b.shape)
        out["rel_diff_interior_vs_ctbench"] = _round(float(d[inner].norm() / b[inner].norm()))
    return out


# ------------------------------------------------------------------ bandwidth
def stream_bandwidth(n_bytes: int, repeats: int = 15) -> dict:
    """Best streaming rate of ``dst.copy_(src)`` on float32 arrays of ``n_bytes`` each, torch's threads.

    Counted as read + write (2 x n_bytes per copy), as STREAM does; the
    write-allocate traffic the hardware may add is not counted.  Many short
    timings, best kept: on a shared machine one descheduled thread stalls a
    whole parallel copy, and the best timing is the one that escaped that.
    """
    n = max(1, n_bytes // 4)
    src = torch.rand(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    inner = max(1, int(5e7 // n_bytes))  # keep each timed call >~ 5 ms for small arrays
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            dst.copy_(src)
        best = min(best, (time.perf_counter() - t0) / inner)
    return {"array_bytes": 4 * n, "seconds": best, "gb_per_s": 2 * 4 * n / best / 1e9}


# ------------------------------------------------------------------ sample count
def ray_plane_samples(projector: Projector, views_per_chunk: int = 8) -> dict:
    """Count the ray/plane samples of every ray of ``projector`` (float64, from the geometry).

    ``useful``: dominant-axis planes where the ray lies within one voxel of the
    box on the other two axes (the bilinear stencil touches a voxel).
    ``marched``: the planes the kernels iterate, which add up to two spare planes
    per ray (same rule as kernels/joseph.cuh make_ray).
    """
    D, H, W = projector.grid.shape
    dz, dy, dx = projector.grid.spacing
    size = torch.tensor([W, H, D], dtype=torch.float64)
    spacing = torch.tensor([dx, dy, dz], dtype=torch.float64)
    half = (size - 1) / 2
    du, dv = projector.detector_spacing
    U, V = projector.detector_shape
    src, ctr, uu, vv = (t.detach().to("cpu", torch.float64) for t in projector.trajectory.tensors())
    su = torch.arange(U, dtype=torch.float64) - (U - 1) / 2
    sv = torch.arange(V, dtype=torch.float64) - (V - 1) / 2
    cone = projector.beam == "cone"
    useful = marched = 0
    n_rays = 0
    for k0 in range(0, src.shape[0], views_per_chunk):
        sl = slice(k0, k0 + views_per_chunk)
        pix = (ctr[sl, None, None] + su[None, :, None, None] * du * uu[sl, None, None]
               + sv[None, None, :, None] * dv * vv[sl, None, None]).reshape(-1, 3)
        s = src[sl, None, None].expand(-1, U, V, 3).reshape(-1, 3)
        o, d = (s, pix - s) if cone else (pix, s)
        fo, fd = o / spacing + half, d / spacing
        a = fd.abs().argmax(dim=1)
        # parameter interval where each axis' coordinate lies in (-1, N)
        t1 = (-1 - fo) / fd  # +-inf or nan where fd == 0: replaced just below
        t2 = (size - fo) / fd
        tlo, thi = torch.minimum(t1, t2), torch.maximum(t1, t2)
        inside = (fo > -1) & (fo < size)
        zero = fd == 0
        tlo = torch.where(zero, torch.where(inside, -math.inf, math.inf), tlo)
        thi = torch.where(zero, torch.where(inside, math.inf, -math.inf), thi)
        own = torch.nn.functional.one_hot(a, 3).bool()
        tlo = torch.where(own, -math.inf, tlo).amax(dim=1)
        thi = torch.where(own, math.inf, thi).amin(dim=1)
        fa_o, fa_d = fo.gather(1, a[:, None])[:, 0], fd.gather(1, a[:, None])[:, 0]
        na, nb = fa_o + tlo.clamp(-1e12, 1e12) * fa_d, fa_o + thi.clamp(-1e12, 1e12) * fa_d
        nlo, nhi = torch.minimum(na, nb), torch.maximum(na, nb)
        nlo = torch.where(tlo <= thi, nlo, torch.full_like(nlo, math.inf))
        last = size[a] - 1
        lo_i = torch.clamp(torch.ceil(nlo), min=0)
        hi_i = torch.minimum(torch.floor(nhi), last)
        useful += int(torch.clamp(hi_i - lo_i + 1, min=0).sum())
        n0 = torch.clamp(torch.floor(torch.maximum(nlo, torch.zeros_like(nlo))), min=0)
        n1 = torch.minimum(torch.floor(torch.minimum(nhi, last)) + 2, size[a])
        marched += int(torch.where(nlo <= nhi + 1, torch.clamp(n1 - n0, min=0), torch.zeros_like(n0)).sum())
        n_rays += fo.shape[0]
    return {"samples": useful, "samples_marched": marched, "rays": n_rays}


def throughput(stats: dict, samples: dict, itemsize: int, op: str, bandwidth: dict) -> dict:
    """samples/s, bytes touched per second and the fractions of the measured streaming rates."""
    sps = samples["samples"] / stats["seconds"]
    per_sample = 4 * itemsize * (2 if op == "back" else 1)
    touched = sps * per_sample
    out = {"samples": samples["samples"], "samples_marched": samples["samples_marched"],
           "samples_per_s": _round(sps), "bytes_per_sample": per_sample, "touched_gb_per_s": _round(touched / 1e9)}
    for name, bw in bandwidth.items():
        out[f"bandwidth_fraction_{name}"] = _round(touched / 1e9 / bw["gb_per_s"])
    return out


def timing_fields(stats: dict) -> dict:
    extra = {"median_s": _round(stats["median_s"])} if "median_s" in stats else {}
    return {"seconds": _round(stats["seconds"]), **extra, "cpu_s": _round(stats["cpu_s"]),
            "parallelism": _round(stats["cpu_s"] / stats["seconds"], 3), "times": stats["times"],
            "warmup_s": stats["warmup_s"]}


# ------------------------------------------------------------------ test data
def smooth_volume(shape, dtype=torch.float32) -> torch.Tensor:
    """An asymmetric smooth object, positive everywhere and small at the borders.

    Positive everywhere so every ray that meets the box carries a non-zero
    value (no implementation can skip work on zeros); small at the borders so
    the implementations' different edge handling hardly shows in the
    comparison; off-centre blobs so a mirrored or rotated geometry gives O(1).
    """
    axes = [torch.linspace(-1, 1, n, dtype=torch.float64) if n > 1 else torch.zeros(1, dtype=torch.float64)
            for n in shape]
    grids = torch.meshgrid(*axes, indexing="ij")
    if len(shape) == 3:
        z, y, x = grids
    else:
        (y, x), z = grids, torch.zeros_like(grids[0])
    f = torch.exp(-0.5 * (x * x + y * y + z * z) / 0.3 ** 2)
    f = f + 0.8 * torch.exp(-((x - 0.35) ** 2 + (y + 0.2) ** 2 + (z - 0.15) ** 2) / (2 * 0.12 ** 2))
    f = f + 0.5 * torch.exp(-((x + 0.3) ** 2 + (y - 0.4) ** 2 + (z + 0.25) ** 2) / (2 * 0.08 ** 2))
    return f.to(dtype).contiguous()


# ------------------------------------------------------------------ ctbench
def run_ctbench(emit, projector: Projector, volume, workload: str, repeats: int, bandwidth: dict, samples: dict):
    """Time project and backproject; returns {op: (timing stats, output)}."""
    results = {}
    stats, sino = best_of(lambda: projector.project(volume), repeats)
    emit(workload=workload, op="forward", impl="ctbench-cpu", threads=torch.get_num_threads(),
         dtype=str(volume.dtype).replace("torch.", ""), **timing_fields(stats),
         **throughput(stats, samples, volume.element_size(), "forward", bandwidth))
    results["forward"] = (stats, sino)
    stats, back = best_of(lambda: projector.backproject(sino), repeats)
    emit(workload=workload, op="back", impl="ctbench-cpu", threads=torch.get_num_threads(),
         dtype=str(volume.dtype).replace("torch.", ""), **timing_fields(stats),
         **throughput(stats, samples, volume.element_size(), "back", bandwidth))
    results["back"] = (stats, back)
    return results


# ------------------------------------------------------------------ RTK
# ctbench world (x, y, z), rotation about z, maps to RTK's world (X, Y, Z) =
# (x, z, -y), rotation about Y: a rotation of the frame, so every line integral
# is preserved.  Then ctbench's source sid*(-sin t, cos t, 0) (diffct's frame,
# docs/GEOMETRY.md) becomes sid*(sin s, 0, cos s) with s = t + pi, which is RTK's
# source at gantry angle s; the detector u axis (cos t, sin t, 0) becomes
# (-cos s, 0, sin s), minus RTK's detector x axis, so RTK's columns run the other
# way (projections are reversed along u, and the u offset negated); v = +z becomes
# +Y, RTK's detector y axis.  The script checks this numerically.
def _to_rtk_world(p: np.ndarray) -> np.ndarray:
    return np.stack([p[..., 0], p[..., 2], -p[..., 1]], axis=-1)


def rtk_geometry(projector: Projector):
    """RTK circular geometry from the trajectory's generator parameters (angles in degrees)."""
    from itk import RTK as rtk

    meta = projector.trajectory.meta
    if meta.get("kind") != "circular":
        raise ValueError("the RTK comparison needs a circular trajectory")
    g = rtk.ThreeDCircularProjectionGeometry.New()
    off_u, off_v = meta.get("detector_offset", (0.0, 0.0))
    for t in meta["angles"]:
        g.AddProjection(float(meta["sid"]), float(meta["sdd"]), math.degrees(t) + 180.0, -float(off_u), float(off_v))
    return g


def rtk_geometry_deviation(g, projector: Projector) -> float:
    """Largest distance (mm) between RTK's and ctbench's source and corner-pixel positions over all views."""
    import itk

    U, V = projector.detector_shape
    du, dv = projector.detector_spacing
    src, ctr, u, v = (t.detach().to(torch.float64).numpy() for t in projector.trajectory.tensors())
    dev = 0.0
    for k in range(projector.n_views):
        s_rtk = np.asarray(g.GetSourcePosition(k), dtype=np.float64).ravel()[:3]
        dev = max(dev, float(np.abs(s_rtk - _to_rtk_world(src[k])).max()))
        M = np.asarray(itk.array_from_matrix(g.GetProjectionCoordinatesToFixedSystemMatrix(k)), dtype=np.float64)
        for iu, iv in ((0, 0), (U - 1, 0), (0, V - 1), (U - 1, V - 1)):
            a, b = (iu - (U - 1) / 2) * du, (iv - (V - 1) / 2) * dv
            p_rtk = (M @ np.array([a, b, 0.0, 1.0]))[:3]
            p_ct = ctr[k] - a * u[k] + b * v[k]  # RTK's detector x is -u
            dev = max(dev, float(np.abs(p_rtk - _to_rtk_world(p_ct)).max()))
    return dev


def _rtk_volume_image(vol_zyx: np.ndarray, spacing_zyx):
    """ctbench volume [z, y, x] as an ITK image on RTK's axes: array [Z, Y, X] = [-y, z, x]."""
    import itk

    D, H, W = vol_zyx.shape
    dz, dy, dx = spacing_zyx
    arr = np.ascontiguousarray(vol_zyx.transpose(1, 0, 2)[::-1], dtype=np.float32)  # (H, D, W)
    img = itk.image_from_array(arr)
    img.SetSpacing([dx, dz, dy])
    img.SetOrigin([-(W - 1) / 2 * dx, -(D - 1) / 2 * dz, -(H - 1) / 2 * dy])
    return img


def _from_rtk_volume(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr[::-1].transpose(1, 0, 2))


def _rtk_projection_image(sino_kuv: np.ndarray, detector_spacing):
    """ctbench sinogram [view, u, v] as RTK's projection stack: array [view, v, u], origin at the detector centre."""
    import itk

    n, U, V = sino_kuv.shape
    du, dv = detector_spacing
    # RTK's detector x runs along -u (see above): reverse the columns
    img = itk.image_from_array(np.ascontiguousarray(sino_kuv[:, ::-1].transpose(0, 2, 1), dtype=np.float32))
    img.SetSpacing([du, dv, 1.0])
    img.SetOrigin([-(U - 1) / 2 * du, -(V - 1) / 2 * dv, 0.0])
    return img


def rtk_calls(projector: Projector, volume, sino_ct, threads: int, n_calls: int):
    """RTK's Joseph pair on the same geometry: {op: [prebuilt filters]} (inputs built outside the
    timing, one filter per call) and a function turning a filter's output into ctbench's layout.
    Raises ImportError when itk-rtk is missing."""
    import itk
    from itk import RTK as rtk

    itk.MultiThreaderBase.SetGlobalDefaultNumberOfThreads(threads)
    g = rtk_geometry(projector)
    IT = itk.Image[itk.F, 3]
    vol_np = volume.numpy()
    n = projector.n_views
    U, V = projector.detector_shape
    vol_img = _rtk_volume_image(vol_np, projector.grid.spacing)
    sino_in = _rtk_projection_image(sino_ct.numpy(), projector.detector_spacing)

    def forward():
        zeros = _rtk_projection_image(np.zeros((n, U, V), np.float32), projector.detector_spacing)
        f = rtk.JosephForwardProjectionImageFilter[IT, IT].New()
        f.SetInput(0, zeros)
        f.SetInput(1, vol_img)
        f.SetGeometry(g)
        f.SetNumberOfWorkUnits(threads)
        return f

    def back():
        zeros = _rtk_volume_image(np.zeros_like(vol_np), projector.grid.spacing)
        f = rtk.JosephBackProjectionImageFilter[IT, IT].New()
        f.SetInput(0, zeros)
        f.SetInput(1, sino_in)
        f.SetGeometry(g)
        f.SetNumberOfWorkUnits(threads)
        return f

    def output(op, f):
        arr = itk.array_from_image(f.GetOutput())
        return arr.transpose(0, 2, 1)[:, ::-1] if op == "forward" else _from_rtk_volume(arr)

    filters = {"forward": [forward() for _ in range(n_calls)], "back": [back() for _ in range(n_calls)]}
    return g, filters, output


def run_w1(emit, projector: Projector, volume, workload: str, repeats: int, threads: int, samples: dict,
           bandwidth: dict, with_rtk: bool):
    """ctbench and RTK on W1 at ``threads`` threads, interleaved call by call; returns
    ({op: {impl: stats}}, {op: ctbench output})."""
    torch.set_num_threads(threads)
    sino = projector.project(volume)
    ct_calls = {"forward": lambda: projector.project(volume), "back": lambda: projector.backproject(sino)}
    rtk = None
    if with_rtk:
        try:
            g, filters, rtk_output = rtk_calls(projector, volume, sino, threads, repeats + 1)
            rtk = (rtk_geometry_deviation(g, projector), filters, rtk_output)
        except ImportError as e:
            emit(workload=workload, impl="rtk", skipped="not installed", error=str(e))
    all_stats, ct_out = {}, {}
    for op in ("forward", "back"):
        calls = {"ctbench-cpu": ct_calls[op]}
        if rtk is not None:
            it = iter(rtk[1][op])

            def rtk_call(it=it):
                f = next(it)
                f.Update()
                return f

            calls["rtk"] = rtk_call
        stats, outs = interleaved(calls, repeats)
        ct_out[op] = outs["ctbench-cpu"]
        all_stats[op] = stats
        emit(workload=workload, op=op, impl="ctbench-cpu", threads=threads,
             dtype=str(volume.dtype).replace("torch.", ""), **timing_fields(stats["ctbench-cpu"]),
             **throughput(stats["ctbench-cpu"], samples, volume.element_size(), op, bandwidth),
             timing="interleaved with the peers, call by call")
        if rtk is not None:
            emit(workload=workload, op=op, impl="rtk", threads=threads, dtype="float32",
                 **timing_fields(stats["rtk"]), **throughput(stats["rtk"], samples, 4, op, bandwidth),
                 geometry_max_dev_mm=_round(rtk[0]), **rel_diff(rtk[2](op, outs["rtk"]), ct_out[op].numpy(),
                                                               op == "back"),
                 filter=f"Joseph{'Forward' if op == 'forward' else 'Back'}ProjectionImageFilter",
                 timing="interleaved with ctbench, call by call")
            emit_ratio(emit, workload, op, "rtk", stats["rtk"], stats["ctbench-cpu"])
        if rtk is not None:
            rtk[1][op].clear()
    return all_stats, ct_out


# ------------------------------------------------------------------ diffct
def run_diffct(emit, projector: Projector, volume, ct_results, workload: str, repeats: int, samples: dict,
               bandwidth: dict):
    try:
        import diffct
    except ImportError as e:
        emit(workload=workload, impl="diffct-torch", skipped="not installed", error=str(e))
        return {}
    # ctbench's trajectory vectors passed unchanged: diffct takes the same
    # (source, detector centre, unit u, unit v) per view and a centred volume.
    traj = tuple(t.detach().clone() for t in projector.trajectory.tensors())
    dp = diffct.Projector(traj, tuple(projector.volume_shape), tuple(projector.detector_shape), beam="cone",
                          detector_spacing=tuple(projector.detector_spacing),
                          voxel_spacing=tuple(projector.voxel_spacing), backend="torch")
    results = {}
    sino_ct = ct_results["forward"][1]
    for op, fn in (("forward", lambda: dp.project(volume)), ("back", lambda: dp.backproject(sino_ct))):
        stats, out = best_of(fn, repeats, warmup=False)
        emit(workload=workload, op=op, impl="diffct-torch", threads=torch.get_num_threads(), dtype="float32",
             **timing_fields(stats), **throughput(stats, samples, 4, op, bandwidth),
             **rel_diff(out.detach().numpy(), ct_results[op][1].numpy(), op == "back"), model="cell-constant Siddon",
             note="no warm-up call (each call takes about a minute)")
        results[op] = stats
    return results


# ------------------------------------------------------------------ 2D / ASTRA
def projector_2d(kind: str, size: int, n_views: int, n_det: int) -> Projector:
    """2D workloads: 1 mm pixels; the detector covers the image diagonal at the isocentre."""
    if kind == "parallel":
        tr = circular_trajectory_2d_parallel(n_views)
        du = 1.0
    else:
        tr = circular_trajectory_2d_fan(n_views, 1000.0, 1500.0)
        du = 1.5
    return Projector(tr, (size, size), n_det, detector_spacing=du, voxel_spacing=1.0, backend="cpu")


def astra_vectors(projector: Projector) -> np.ndarray:
    """ASTRA parallel_vec / fanflat_vec rows (ray or source, detector centre, pixel step) from the trajectory."""
    src, ctr, u = (t.detach().to(torch.float64).numpy() for t in projector.trajectory.tensors()[:3])
    du = projector.detector_spacing[0]
    return np.concatenate([src[:, :2], ctr[:, :2], u[:, :2] * du], axis=1)


def run_astra(emit, projector: Projector, kind: str, volume, ct_results, workload: str, repeats: int,
              samples: dict, bandwidth: dict):
    try:
        import astra
    except ImportError as e:
        emit(workload=workload, impl="astra", skipped="not installed", error=str(e))
        return {}
    H, W = projector.volume_shape
    U = projector.detector_shape[0]
    geom = "parallel_vec" if kind == "parallel" else "fanflat_vec"
    pg = astra.create_proj_geom(geom, U, astra_vectors(projector))
    # ASTRA's row 0 is the top of the image (largest y), ctbench's the smallest y: flip rows.
    vg = astra.create_vol_geom(H, W)
    vol_np = np.ascontiguousarray(volume.numpy()[::-1], dtype=np.float32)
    sino_ct = ct_results["forward"][1].numpy()
    types = ("linear", "line") if kind == "parallel" else ("line_fanflat",)
    results = {}
    for ptype in types:
        impl = f"astra-{ptype}"
        pid = astra.create_projector(ptype, pg, vg)
        vid = astra.data2d.create("-vol", vg, vol_np)
        sid = astra.data2d.create("-sino", pg, 0)
        bid = astra.data2d.create("-vol", vg, 0)
        sin_in = astra.data2d.create("-sino", pg, np.ascontiguousarray(sino_ct, dtype=np.float32))
        fp = astra.algorithm.create({"type": "FP", "ProjectorId": pid, "ProjectionDataId": sid,
                                     "VolumeDataId": vid})
        bp = astra.algorithm.create({"type": "BP", "ProjectorId": pid, "ProjectionDataId": sin_in,
                                     "ReconstructionDataId": bid})
        try:
            for op, alg, out_id in (("forward", fp, sid), ("back", bp, bid)):
                def call(alg=alg, out_id=out_id):
                    astra.data2d.store(out_id, 0)
                    astra.algorithm.run(alg)
                stats, _ = best_of(call, repeats)
                out = astra.data2d.get(out_id)
                if op == "back":
                    out = out[::-1]
                emit(workload=workload, op=op, impl=impl, threads=1, dtype="float32", **timing_fields(stats),
                     **throughput(stats, samples, 4, op, bandwidth),
                     **rel_diff(out, ct_results[op][1].numpy(), op == "back"),
                     model={"linear": "Joseph (linear interpolation)", "line": "line length (Siddon-like)",
                            "line_fanflat": "line length (Siddon-like)"}[ptype])
                results[(impl, op)] = stats
        finally:
            astra.algorithm.delete([fp, bp])
            astra.data2d.delete([vid, sid, bid, sin_in])
            astra.projector.delete(pid)
    return results


# ------------------------------------------------------------------ ratios
def emit_ratio(emit, workload: str, op: str, peer: str, s_peer: dict | None, s_ct: dict | None):
    """Peer time over ctbench time (> 1: ctbench faster), by wall clock and by process CPU seconds.

    The CPU-seconds ratio compares work per core; on a shared, loaded machine
    it is steadier than the wall-clock one.
    """
    if s_peer is None or s_ct is None:
        return
    name = f"{peer}/ctbench"
    value = s_peer["seconds"] / s_ct["seconds"]
    line = {"workload": workload, "op": op, "ratio": name, "value": _round(value),
            "value_cpu_s": _round(s_peer["cpu_s"] / s_ct["cpu_s"]) if s_ct["cpu_s"] > 0 else None}
    median = None
    if "median_s" in s_peer and "median_s" in s_ct:
        median = s_peer["median_s"] / s_ct["median_s"]
        line["value_median"] = _round(median)
    target = TARGETS.get((op, name), TARGETS.get(name))
    if target is not None:
        # judged on the median ratio where there is one (the rule), else on the best times; RTK's targets
        # are CPU-second ratios, so the CPU-seconds ratio must reach them too
        judged = median if median is not None else value
        if name in CPU_S_TARGETS and line["value_cpu_s"] is not None:
            judged = min(judged, line["value_cpu_s"])
        line.update(target=target, meets_target=bool(judged >= target))
    emit(**line)


# ------------------------------------------------------------------ kernel paths
AVX2_LABEL = "forced AVX2 on an AVX-512 CPU: not the speed of an AVX2-only core"
FLAT_SIZES = (64, 128, 192, 256, 320)
FLAT_GOAL = 0.8  # rate min/max over the sizes


def kernel_paths() -> dict:
    """The Joseph library's paths (offered, measured fastest on this CPU, active now)."""
    from ctbench.engine.cpu import library as cpu_library, joseph_paths
    return joseph_paths.describe(cpu_library.load_cpu_library("joseph"))


def path_note(name: str, simd: list[str]) -> dict:
    return {"note": AVX2_LABEL} if name.startswith("avx2") and "avx512f" in simd else {}


def forced(op: str, name: str, fn):
    """``fn`` run with ``CTBENCH_CPU_PATH`` forcing path ``name`` for ``op`` (restored afterwards)."""
    from ctbench.engine.cpu.path_choice import PATH_ENV

    def call():
        old = os.environ.get(PATH_ENV)
        os.environ[PATH_ENV] = f"{op}={name}"
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop(PATH_ENV, None)
            else:
                os.environ[PATH_ENV] = old
    return call


def run_paths(emit, projector: Projector, volume, workload: str, repeats: int, samples: dict, bandwidth: dict,
              names: dict[str, list[str]], rtk_stats: dict | None):
    """Each named path of each op on ``workload``, forced, interleaved call by call; with the RTK ratio of the
    same run (CPU seconds) where RTK ran."""
    simd = cpu_flags()
    sino = projector.project(volume)
    ops = {"forward": lambda: projector.project(volume), "back": lambda: projector.backproject(sino)}
    for op, wanted in names.items():
        if not wanted:
            continue
        stats, _ = interleaved({n: forced(op, n, ops[op]) for n in wanted}, repeats)
        for n in wanted:
            extra = {}
            peer = (rtk_stats or {}).get(op)
            if peer is not None:
                extra = {"rtk_ratio_cpu_s": _round(peer["cpu_s"] / stats[n]["cpu_s"]),
                         "rtk_ratio_median": _round(peer["median_s"] / stats[n]["median_s"])}
            emit(workload=workload, op=op, impl=f"ctbench-cpu path={n}", path=n, threads=torch.get_num_threads(),
                 dtype=str(volume.dtype).replace("torch.", ""), simd=simd, **timing_fields(stats[n]),
                 **throughput(stats[n], samples, volume.element_size(), op, bandwidth), **extra,
                 **path_note(n, simd), timing="paths interleaved call by call (CTBENCH_CPU_PATH)")


FLAT_OPS = ("forward", "back")


def parse_list(text: str, name: str, cast, allowed=None) -> list:
    """A comma-separated option (``--flat-sizes`` ...) as a list; a clear error names the option."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise SystemExit(f"{name}: expected a comma-separated list, got {text!r}")
    out = []
    for x in items:
        try:
            v = cast(x)
        except ValueError:
            raise SystemExit(f"{name}: {x!r} is not a valid entry (expected {cast.__name__})") from None
        if allowed is not None and v not in allowed:
            raise SystemExit(f"{name}: {x!r} is not one of {', '.join(map(str, allowed))}")
        if isinstance(v, int) and v < 1:
            raise SystemExit(f"{name}: {x!r} must be >= 1")
        if v not in out:
            out.append(v)
    return out


def _threaded(t: int, fn):
    def call():
        torch.set_num_threads(t)
        return fn()
    return call


def run_flat_cost(emit, sizes, thread_counts, repeats: int, bandwidth: dict, ops=FLAT_OPS):
    """Rate (ray samples/s) of ``ops`` over N^3 volumes (W1's geometry: 180 views, N x N detector) at each
    thread count, every (N, op, threads) interleaved call by call; a summary line per (op, threads) with the
    rate's min/max over N from the median wall times and from the median CPU seconds."""
    machine = {"cpu": cpu_model(), "simd": cpu_flags()}
    cases, calls = {}, {}
    for n in sizes:
        projector = w1_projector("cpu", scale=n / W1["volume_shape"][0])
        volume = smooth_volume(projector.volume_shape, W1["dtype"])
        sino = projector.project(volume) if "back" in ops else None
        cases[n] = (projector, volume, ray_plane_samples(projector))
        fns = {"forward": lambda p=projector, v=volume: p.project(v),
               "back": lambda p=projector, s=sino: p.backproject(s)}
        for op in ops:
            for t in thread_counts:
                calls[(n, op, t)] = _threaded(t, fns[op])
    # every (N, op, threads) in turn, one warm-up call each (a busy spell then slows every size alike)
    stats, _ = interleaved(calls, repeats)
    paths = kernel_paths()["active"]
    rates: dict[tuple, list] = {}
    for (n, op, t), st in stats.items():
        projector, volume, samples = cases[n]
        times, cpus = st["times"], st["cpu_times"]
        med, cpu_med = st["median_s"], st["cpu_median_s"]
        rate_med = samples["samples"] / med
        rate_cpu = samples["samples"] / cpu_med * t if cpu_med > 0 else math.nan  # all threads' work, per wall-s
        rates.setdefault((op, t), []).append((n, rate_med, rate_cpu))
        timing = {"seconds": st["seconds"], "median_s": med, "cpu_s": st["cpu_s"]}
        emit(kind="flat_cost", workload=f"flat N={n} {t}-thread", op=op, impl="ctbench-cpu", N=n,
             threads=t, n_views=W1["n_views"], seconds=st["seconds"],
             volume_shape=list(projector.volume_shape), detector_shape=list(projector.detector_shape),
             dtype="float32", **machine, paths=paths,
             min_s=_round(st["seconds"]), median_s=_round(med), cpu_s=_round(st["cpu_s"]), cpu_median_s=_round(cpu_med),
             n_calls=len(times), times=times, cpu_times=cpus,
             samples_per_s_median=_round(rate_med),
             # per thread, from the median call's CPU seconds (a crowded machine inflates wall time, not CPU-s)
             samples_per_cpu_s=_round(rate_cpu / t),
             **throughput(timing, samples, volume.element_size(), op, bandwidth), loadavg=os.getloadavg(),
             timing="sizes, ops and threads interleaved call by call")
    summaries = []
    for (op, t), rs in rates.items():
        vals = [r for _, r, _ in rs]
        cpu_vals = [c for _, _, c in rs]
        ratio = min(vals) / max(vals)
        cpu_ratio = min(cpu_vals) / max(cpu_vals)
        summaries.append(emit(
            kind="flat_cost_summary", workload=f"flat-cost {t}-thread", op=op, impl="ctbench-cpu",
            ratio="rate min/max over N", value=_round(ratio), threads=t, sizes=[n for n, _, _ in rs],
            # the same from CPU seconds: steadier on a shared machine, where wall time counts waiting
            cpu_min_over_max=_round(cpu_ratio), value_cpu_s=_round(cpu_ratio),
            samples_per_s_median=[_round(v) for v in vals], samples_per_cpu_s=[_round(c / t) for c in cpu_vals],
            min_over_max=_round(ratio), goal=FLAT_GOAL, meets_goal=ratio >= FLAT_GOAL,
            meets_goal_cpu_s=cpu_ratio >= FLAT_GOAL, paths=paths, **machine, loadavg=os.getloadavg()))
    return summaries


# ------------------------------------------------------------------ main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines file to append to (default: %(default)s)")
    p.add_argument("--no-out", action="store_true", help="print only, write no file")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per op and implementation, interleaved "
                   "call by call after a warm-up (min and median are reported)")
    p.add_argument("--skip-1thread", action="store_true", help="skip the 1-thread rows")
    p.add_argument("--diffct-repeats", type=int, default=1, help="timed diffct calls per op (no warm-up)")
    p.add_argument("--threads", type=int, default=None, help="threads for ctbench, RTK and torch (default: torch's)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink W1 (volume and detector) for quick runs")
    p.add_argument("--skip-rtk", action="store_true")
    p.add_argument("--skip-diffct", action="store_true")
    p.add_argument("--skip-2d", action="store_true", help="skip the 2D section (ctbench 2D and ASTRA)")
    p.add_argument("--skip-astra", action="store_true")
    p.add_argument("--size-2d", type=int, default=512)
    p.add_argument("--views-2d", type=int, default=720)
    p.add_argument("--det-2d", type=int, default=768)
    p.add_argument("--bandwidth-mib", type=int, default=512, help="array size of the DRAM streaming loop")
    p.add_argument("--flat-cost", action="store_true", help="only the flat-cost sweep: forward and back rates "
                   "over N^3 volumes (--flat-sizes), sizes, ops and threads interleaved call by call, then exit")
    p.add_argument("--flat-sizes", type=str, default=",".join(map(str, FLAT_SIZES)),
                   help="comma-separated N of the flat-cost sweep (default: %(default)s)")
    p.add_argument("--flat-ops", type=str, default=",".join(FLAT_OPS),
                   help="comma-separated ops of the flat-cost sweep: forward, back (default: %(default)s)")
    p.add_argument("--flat-threads", type=str, default=None,
                   help="comma-separated thread counts of the flat-cost sweep (default: all threads and 1, "
                        "or all threads only with --skip-1thread)")
    p.add_argument("--all-paths", action="store_true", help="time every forward and back path on W1 (forced "
                   "by CTBENCH_CPU_PATH); by default only the AVX2 forward paths on an AVX-512 CPU")
    p.add_argument("--skip-paths", action="store_true", help="skip the forced-path rows")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    # the sweep is a bench of its own (own file and README table), so it never replaces the latest W1 run
    bench = "projector_flat_cost" if args.flat_cost else BENCH
    out = FLAT_OUT if args.flat_cost and args.out == DEFAULT_OUT else args.out
    emit = Emitter(None if args.no_out else out, run_id, bench)
    emit(kind="header", time=run_id, machine=machine_info(), args={k: str(v) for k, v in vars(args).items()},
         counting="samples = ray/plane samples whose bilinear stencil touches the volume (dominant-axis planes, "
                  "float64 from the geometry); forward touches 4 voxels/sample, back reads+writes 4",
         kernel_paths=kernel_paths())
    if args.flat_cost:
        sizes = parse_list(args.flat_sizes, "--flat-sizes", int)
        ops = parse_list(args.flat_ops, "--flat-ops", str, FLAT_OPS)
        counts = (parse_list(args.flat_threads, "--flat-threads", int) if args.flat_threads else
                  [threads] + ([1] if threads > 1 and not args.skip_1thread else []))
        bandwidth = {"dram": stream_bandwidth(args.bandwidth_mib << 20)}
        run_flat_cost(emit, sizes, counts, args.repeats, bandwidth, ops)
        torch.set_num_threads(threads)
        return 0

    torch.manual_seed(0)
    projector = w1_projector("cpu", scale=args.scale)
    workload = "W1" if args.scale == 1.0 else f"W1@{args.scale:g}"
    volume = smooth_volume(projector.volume_shape, W1["dtype"])
    vol_bytes = volume.numel() * volume.element_size()
    bandwidth = {"dram": stream_bandwidth(args.bandwidth_mib << 20), "volume_sized": stream_bandwidth(vol_bytes)}
    for name, bw in bandwidth.items():
        emit(op="memory_bandwidth", impl=f"torch-copy-{name}", threads=threads, array_bytes=bw["array_bytes"],
             seconds=_round(bw["seconds"]), gb_per_s=_round(bw["gb_per_s"]),
             note="dst.copy_(src), float32, counted as read+write")

    samples = ray_plane_samples(projector)
    thread_counts = [threads] + ([1] if threads > 1 and not args.skip_1thread else [])
    ct = None
    known = kernel_paths()["known"]
    if args.all_paths:
        path_names = known
    else:  # the AVX2 lanes of an AVX-512 build (the AVX-512 and measured paths run in the main rows)
        path_names = {"forward": [n for n in known["forward"] if n.startswith("avx2") and "avx512f" in cpu_flags()]}
    for t in thread_counts:
        wl = workload if t == threads else f"{workload} 1-thread"
        stats, outs = run_w1(emit, projector, volume, wl, args.repeats, t, samples, bandwidth, not args.skip_rtk)
        if ct is None:
            ct = {op: (stats[op]["ctbench-cpu"], outs[op]) for op in outs}
        if not args.skip_paths:
            run_paths(emit, projector, volume, wl, args.repeats, samples, bandwidth, path_names,
                      {op: st.get("rtk") for op, st in stats.items()})
    torch.set_num_threads(threads)
    s_ct = {op: v[0] for op, v in ct.items()}

    if not args.skip_diffct:
        try:
            times = run_diffct(emit, projector, volume, ct, workload, args.diffct_repeats, samples, bandwidth)
            for op in ("forward", "back"):
                emit_ratio(emit, workload, op, "diffct", times.get(op), s_ct.get(op))
        except Exception as e:
            traceback.print_exc()
            emit(workload=workload, impl="diffct-torch", skipped="error", error=repr(e))

    if not args.skip_2d:
        for kind in ("parallel", "fan"):
            p2 = projector_2d(kind, args.size_2d, args.views_2d, args.det_2d)
            wl = f"2D-{kind}-{args.size_2d}"
            vol2 = smooth_volume(p2.volume_shape)
            s2 = ray_plane_samples(p2)
            ct2 = run_ctbench(emit, p2, vol2, wl, args.repeats, bandwidth, s2)
            if args.skip_astra:
                continue
            try:
                astra_t = run_astra(emit, p2, kind, vol2, ct2, wl, args.repeats, s2, bandwidth)
            except Exception as e:
                traceback.print_exc()
                emit(workload=wl, impl="astra", skipped="error", error=repr(e))
                continue
            for (impl, op), st in astra_t.items():
                emit_ratio(emit, wl, op, impl, st, ct2[op][0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
