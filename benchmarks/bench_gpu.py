"""GPU benchmark (``make gpu-check``): ctbench's Joseph pair on ``backend="cuda"``.

Cases: W1 (benchmarks/workloads.py: 128^3, 180 views, 128^2 detector) and a
larger L256 (256^3 of 1 mm voxels, 360 views over 360 degrees, 256^2 detector
of 2 mm pixels, SID 600, SDD 1200), float32.  Each op gets a warm-up call
(which also compiles the kernels with NVRTC; reported as ``warmup_s``), then
the best of ``--repeats`` calls, each bracketed by ``torch.cuda.synchronize()``.
Sample counting and the bandwidth fraction follow bench_projector.py; the
streaming reference here is a device-to-device ``copy_`` of large arrays.  For
W1 the CPU backend runs the same calls on the same inputs, giving the
cuda/cpu agreement (``rel_diff_vs_cpu``) and a ``ctbench-cpu/ctbench-cuda``
speed ratio.

Exits with status 2 and a message when no CUDA device or no CuPy is present.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_projector import (  # noqa: E402
    Emitter,
    _round,
    machine_info,
    ray_plane_samples,
    smooth_volume,
    throughput,
)
from workloads import W1, w1_projector  # noqa: E402

from ctbench import Projector, circular_trajectory_3d  # noqa: E402

BENCH = "gpu"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_gpu.jsonl"


def require_gpu() -> str | None:
    """None when a CUDA device and CuPy are usable, else the reason they are not."""
    if not torch.cuda.is_available():
        return ("no CUDA device visible to torch (torch.cuda.is_available() is False): run bench_gpu.py on a "
                "machine with an NVIDIA GPU and a CUDA build of torch")
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
        info["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
    except Exception:  # informational only
        pass
    return info


def cuda_best_of(fn, repeats: int, device: torch.device):
    """Warm-up call, then the best of ``repeats`` synchronised calls."""
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize(device)
    warm = time.perf_counter() - t0
    times = []
    for _ in range(max(1, repeats)):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return {"seconds": min(times), "times": [_round(t) for t in times], "warmup_s": _round(warm)}, out


def device_bandwidth(device: torch.device, n_bytes: int = 1 << 30, repeats: int = 10) -> dict:
    """Device-memory streaming rate of ``dst.copy_(src)`` (read + write counted)."""
    src = torch.rand(n_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    stats, _ = cuda_best_of(lambda: dst.copy_(src), repeats, device)
    del src, dst
    torch.cuda.empty_cache()
    return {"array_bytes": n_bytes, "seconds": stats["seconds"], "gb_per_s": 2 * n_bytes / stats["seconds"] / 1e9}


def l256_projector(backend: str) -> Projector:
    traj = circular_trajectory_3d(360, 600.0, 1200.0, dtype=torch.float32)
    return Projector(traj, (256, 256, 256), (256, 256), voxel_spacing=1.0, detector_spacing=2.0, backend=backend)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def run_case(emit, name: str, projector: Projector, device: torch.device, repeats: int, bandwidth: dict,
             cpu_projector: Projector | None):
    volume_cpu = smooth_volume(projector.volume_shape, W1["dtype"])
    volume = volume_cpu.to(device)
    samples = ray_plane_samples(projector)
    stats_f, sino = cuda_best_of(lambda: projector.project(volume), repeats, device)
    stats_b, back = cuda_best_of(lambda: projector.backproject(sino), repeats, device)
    extra = {}
    if cpu_projector is not None:
        sino_cpu = cpu_projector.project(volume_cpu)
        back_cpu = cpu_projector.backproject(sino.cpu())
        t_cpu = {}
        for op, fn in (("forward", lambda: cpu_projector.project(volume_cpu)),
                       ("back", lambda: cpu_projector.backproject(sino_cpu))):
            best = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            t_cpu[op] = best
        extra = {"forward": {"rel_diff_vs_cpu": _round(rel(sino, sino_cpu))},
                 "back": {"rel_diff_vs_cpu": _round(rel(back, back_cpu))}}
        for op in ("forward", "back"):
            emit(workload=name, op=op, impl="ctbench-cpu", threads=torch.get_num_threads(),
                 seconds=_round(t_cpu[op]), **throughput({"seconds": t_cpu[op]}, samples, 4, op, {}))
    for op, stats in (("forward", stats_f), ("back", stats_b)):
        emit(workload=name, op=op, impl="ctbench-cuda", dtype="float32", seconds=_round(stats["seconds"]),
             times=stats["times"], warmup_s=stats["warmup_s"],
             **throughput(stats, samples, volume.element_size(), op, bandwidth), **extra.get(op, {}))
    if cpu_projector is not None:
        for op, stats in (("forward", stats_f), ("back", stats_b)):
            emit(workload=name, op=op, ratio="ctbench-cpu/ctbench-cuda", value=_round(t_cpu[op] / stats["seconds"]))
    del volume, sino, back
    torch.cuda.empty_cache()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="ctbench CUDA projector benchmark (JSON lines)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines file to append to (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-large", action="store_true", help="skip the 256^3 case")
    p.add_argument("--device", default="cuda:0")
    args = p.parse_args(argv)

    reason = require_gpu()
    if reason is not None:
        print(f"bench_gpu.py: {reason}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    torch.cuda.set_device(device)
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    emit = Emitter(args.out, run_id, bench=BENCH)
    emit(kind="header", time=run_id, machine={**machine_info(), **gpu_info(device)},
         args={k: str(v) for k, v in vars(args).items()})
    bw = device_bandwidth(device)
    emit(op="memory_bandwidth", impl="torch-cuda-copy", array_bytes=bw["array_bytes"], seconds=_round(bw["seconds"]),
         gb_per_s=_round(bw["gb_per_s"]), note="dst.copy_(src) on the device, float32, counted as read+write")
    bandwidth = {"device": bw}

    run_case(emit, "W1", w1_projector("cuda"), device, args.repeats, bandwidth, cpu_projector=w1_projector("cpu"))
    if not args.skip_large:
        run_case(emit, "L256", l256_projector("cuda"), device, args.repeats, bandwidth, cpu_projector=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
