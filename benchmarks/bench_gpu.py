"""GPU benchmark (``make gpu-check``): ctbench's CUDA kernels on workload G1, with diffct's native backend.

G1 (benchmarks/workloads.py): circular cone beam, 512^3 volume, 360 views,
1024x768 detector, float32.  Operations: forward projection, matched
backprojection, one CGLS iteration (a step of ``cgls_iterations``) and FDK with
filtering.  Peers run the same workload in the same process, interleaved call
by call: diffct 2.5 with its native CUDA backend (``backend="numba"``) when it
imports.  Each (implementation, operation) gets a warm-up call (NVRTC compile;
reported as ``warmup_s``), then ``--repeats`` timed calls bracketed by
``torch.cuda.synchronize()``; min and median are reported, and the claim is
the median.

Rates: forward and backprojection count ray/plane samples (as
projector_measures.py); FDK counts voxel updates (voxels x views).  ``gups`` is
giga samples (updates) per second.  ``bound_fraction`` is an estimated
hardware bound over the measured time: the larger of the unique bytes over the
measured device copy bandwidth and an operation count (FLOP_PER_SAMPLE, FLOP_PER_UPDATE
below) over the FP32 peak (SMs x 128 lanes x 2 x clock).  It is an estimate of
where the ceiling is, not a measurement of one.

``--rehearse`` runs the whole script on the CPU through ``backend="cuda-emulated"``
(the CUDA entry files run on the host) at a tiny scale, so a lent GPU is spent
on measuring only.  Without a GPU (and no --rehearse) it exits with status 2.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Emitter, machine_info, rounded as _round  # noqa: E402
from projector_measures import ray_plane_samples, smooth_volume  # noqa: E402
from workloads import G1, g1_geometry, g1_projector  # noqa: E402

BENCH = "gpu"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_gpu.jsonl"
FLOP_PER_SAMPLE = 16   # Joseph: bilinear (4 loads, 3 lerps), step update, weight
FLOP_PER_UPDATE = 20   # FDK: 3 affine numerators, perspective divide and 1/w^2, bilinear
TARGETS_S = {"forward": 0.150, "back": 0.200, "cgls_iteration": 0.400, "fdk": 0.150}  # issue 16, one H200


def require_gpu() -> str | None:
    """None when a CUDA device and CuPy are usable, else the reason they are not."""
    if not torch.cuda.is_available():
        return ("no CUDA device visible to torch (torch.cuda.is_available() is False): run bench_gpu.py on a "
                "machine with an NVIDIA GPU and a CUDA build of torch, or pass --rehearse")
    try:
        import cupy  # noqa: F401
    except ImportError as e:
        return f"backend='cuda' needs CuPy ({e}): pip install 'ctbench[gpu]'"
    return None


def gpu_info(device: torch.device) -> dict:
    import cupy

    props = torch.cuda.get_device_properties(device)
    info = {"gpu": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2 ** 30, 1), "multiprocessors": props.multi_processor_count,
            "torch_cuda": torch.version.cuda, "cupy": cupy.__version__}
    try:
        dev = cupy.cuda.Device(device.index or 0)
        info["clock_khz"] = int(dev.attributes["ClockRate"])
    except Exception:  # informational; the peak estimate then uses the H200's boost clock
        info["clock_khz"] = None
    return info


def fp32_peak(info: dict) -> float | None:
    """FP32 FLOP/s: SMs x 128 lanes x 2 (FMA) x clock (1.98 GHz, the H200 boost clock, when unknown)."""
    sms = info.get("multiprocessors")
    if not sms:
        return None
    clock = (info.get("clock_khz") or 1_980_000) * 1e3
    return sms * 128 * 2 * clock


class Clock:
    """Wall time of a call on the device (synchronised) or on the host (rehearsal)."""

    def __init__(self, device: torch.device):
        self.device = device

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, fn):
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out


def device_bandwidth(clock: Clock, n_bytes: int, repeats: int = 10) -> float:
    """Streaming rate of ``dst.copy_(src)`` on the device, bytes read + written per second."""
    src = torch.rand(n_bytes // 4, dtype=torch.float32, device=clock.device)
    dst = torch.empty_like(src)
    clock.time(lambda: dst.copy_(src))
    best = min(clock.time(lambda: dst.copy_(src))[0] for _ in range(repeats))
    return 2 * n_bytes / best


def ctbench_ops(projector, volume, device):
    """name -> zero-argument callable, for ctbench on ``projector``."""
    from ctbench.solvers import cgls_iterations, fdk

    state = {}

    def forward():
        state["sino"] = projector.project(volume)
        return state["sino"]

    def back():
        return projector.backproject(state["sino"])

    def cgls_iteration():
        if "cgls" not in state:
            state["cgls"] = cgls_iterations(projector, state["sino"], n_iter=10 ** 6)
            next(state["cgls"])  # set-up and the first iteration: the warm-up
        return next(state["cgls"])

    def fdk_call():
        return fdk(projector, state["sino"], filter="hann")

    return {"forward": forward, "back": back, "cgls_iteration": cgls_iteration, "fdk": fdk_call}


def diffct_ops(geom: dict, volume, device, rehearse: bool):
    """diffct 2.5 on the same workload (native CUDA backend; torch backend on CPU when rehearsing), or a reason."""
    try:
        import diffct
    except Exception as e:  # an optional peer
        return None, f"diffct not importable: {type(e).__name__}: {e}"
    try:
        traj = diffct.circular_trajectory_3d(geom["n_views"], geom["sid"], geom["sdd"], device=device,
                                             dtype=geom["dtype"])
        op = diffct.Projector(traj, geom["volume_shape"], geom["detector_shape"],
                              detector_spacing=geom["detector_spacing"], voxel_spacing=geom["voxel_spacing"],
                              backend="torch" if rehearse else "numba")
    except Exception as e:
        return None, f"diffct projector failed: {type(e).__name__}: {e}"
    state = {}

    def forward():
        state["sino"] = op.project(volume)
        return state["sino"]

    def back():
        return op.backproject(state["sino"])

    def cgls_iteration():
        return diffct.cgls(op, state["sino"], iterations=1)

    return {"forward": forward, "back": back, "cgls_iteration": cgls_iteration}, None


def rates(op: str, seconds: float, samples: dict, geom: dict, bw: float | None, peak: float | None) -> dict:
    D, H, W = geom["volume_shape"]
    U, V = geom["detector_shape"]
    n = geom["n_views"]
    vol_bytes, sino_bytes = 4 * D * H * W, 4 * n * U * V
    if op == "fdk":
        work, flops, unique = D * H * W * n, D * H * W * n * FLOP_PER_UPDATE, vol_bytes + sino_bytes
    elif op == "cgls_iteration":
        work = 2 * samples["samples"]
        flops, unique = work * FLOP_PER_SAMPLE, 6 * vol_bytes + 4 * sino_bytes
    else:
        work, flops, unique = samples["samples"], samples["samples"] * FLOP_PER_SAMPLE, vol_bytes + sino_bytes
    out = {"gups": _round(work / seconds / 1e9)}
    bounds = [t for t in ((unique / bw) if bw else None, (flops / peak) if peak else None) if t]
    if bounds:
        out["bound_s"] = _round(max(bounds))
        out["bound_fraction"] = _round(max(bounds) / seconds)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="ctbench CUDA benchmark on G1 with diffct's native backend (JSON lines)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines file to append to (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per (implementation, op), at least 5")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--scale", type=float, default=1.0, help="shrink G1's volume and detector (quick runs)")
    p.add_argument("--no-peers", action="store_true", help="skip diffct")
    p.add_argument("--rehearse", action="store_true",
                   help="run on the CPU through backend='cuda-emulated' at scale 1/32 with 12 views")
    args = p.parse_args(argv)

    if args.rehearse:
        device, backend, scale, n_views = torch.device("cpu"), "cuda-emulated", min(args.scale, 1 / 32), 12
        info = {}
    else:
        reason = require_gpu()
        if reason is not None:
            print(f"bench_gpu.py: {reason}", file=sys.stderr)
            return 2
        device, backend, scale, n_views = torch.device(args.device), "cuda", args.scale, None
        torch.cuda.set_device(device)
        info = gpu_info(device)
    clock = Clock(device)
    geom = g1_geometry(scale, n_views)
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    emit = Emitter(args.out, run_id, bench=BENCH)
    emit(kind="header", time=run_id, machine={**machine_info(), **info}, backend=backend,
         workload={k: (str(v) if k == "dtype" else v) for k, v in geom.items()},
         args={k: str(v) for k, v in vars(args).items()})
    bw = device_bandwidth(clock, (1 << 30) if device.type == "cuda" else (1 << 24))
    peak = fp32_peak(info) if device.type == "cuda" else None
    emit(op="memory_bandwidth", impl=f"torch-copy-{device.type}", gb_per_s=_round(bw / 1e9),
         note="dst.copy_(src), float32, counted as read+write")

    projector = g1_projector(backend, scale, n_views)
    samples = ray_plane_samples(projector)
    volume = smooth_volume(projector.volume_shape, G1["dtype"]).to(device)
    impls = {"ctbench-cuda" if not args.rehearse else "ctbench-cuda-emulated": ctbench_ops(projector, volume, device)}
    if not args.no_peers:
        ops, why = diffct_ops(geom, volume, device, args.rehearse)
        if ops is None:
            emit(impl="diffct", skipped=why)
        else:
            impls["diffct-numba" if not args.rehearse else "diffct-torch"] = ops
    order = ["forward", "back", "cgls_iteration", "fdk"]
    times = {(impl, op): [] for impl, ops in impls.items() for op in order if op in ops}
    failed = {}
    for rep in range(-1, max(5, args.repeats)):  # rep -1: warm-up (compiles kernels, fills caches)
        for op in order:
            for impl, ops in impls.items():
                if op not in ops or (impl, op) in failed:
                    continue
                try:
                    t, _ = clock.time(ops[op])
                except Exception as e:  # a peer that cannot run an op is reported, not fatal
                    failed[(impl, op)] = f"{type(e).__name__}: {e}"
                    continue
                if rep >= 0:
                    times[(impl, op)].append(t)
                else:
                    times[(impl, op)] = []
                    emit(workload="G1", op=op, impl=impl, warmup_s=_round(t))
    medians = {}
    for (impl, op), ts in times.items():
        if (impl, op) in failed:
            emit(workload="G1", op=op, impl=impl, failed=failed[(impl, op)])
            continue
        med = statistics.median(ts)
        medians[(impl, op)] = med
        line = dict(workload="G1", op=op, impl=impl, seconds=_round(med), min_s=_round(min(ts)),
                    median_s=_round(med), times=[_round(t) for t in ts], **rates(op, med, samples, geom, bw, peak))
        if impl.startswith("ctbench") and not args.rehearse and scale == 1.0:
            line["target_s"] = TARGETS_S[op]
            line["target_met"] = med <= TARGETS_S[op]
        emit(**line)
    ours = next(iter(impls))
    for (impl, op), med in medians.items():
        if impl != ours and (ours, op) in medians:
            emit(workload="G1", op=op, ratio=f"{impl}/{ours}", value=_round(med / medians[(ours, op)]),
                 note="median over median; above 1 means ctbench is faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
