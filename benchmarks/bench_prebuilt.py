"""Prebuilt kernels against the -march=native JIT build (issue 21): W1 forward and backprojection.

The prebuilt libraries are what a wheel ships: by default this script builds
them the way the wheel build does (CMakeLists.txt through cmake, into a
temporary folder; or ``--prebuilt DIR``, an installed ``ctbench/_prebuilt``)
and loads the variant this CPU gets (``cpu_prebuilt.load``: archspec's best
level, ``--variant`` to force one).  The JIT build is ``cpu.library`` with
``-march=native`` into the per-user cache.  Both are called through the same
Projector path, alternating call by call (prebuilt, native, prebuilt, ...)
after one warm-up each, ``--repeat`` calls each; min and median wall seconds
and CPU seconds.  Every line records the CPU model, AVX-512 yes/no and the
load average at that moment: the machine may be shared, so read ratios with
the load in mind.

Output: JSON lines on stdout, appended to benchmarks/results/bench_prebuilt.jsonl.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Emitter, cpu_model, interleaved_summary, machine_info, with_cpu_library  # noqa: E402
from workloads import w1_projector  # noqa: E402

from ctbench.engine.cpu import library as cpu_library, prebuilt as cpu_prebuilt  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_prebuilt.jsonl"


def _tool(name: str) -> str | None:
    """A build tool: this environment's (the dev extra installs cmake and ninja from PyPI), else PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def _avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def build_prebuilt(dest: Path) -> Path:
    """CMakeLists.txt built and installed into ``dest`` as the wheel build does; returns the _prebuilt folder."""
    cmake = _tool("cmake")
    if cmake is None:
        raise SystemExit("bench_prebuilt: cmake not found (pip install cmake ninja, or pass --prebuilt DIR)")
    gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"] if _tool("ninja") else []
    for cmd in ([cmake, "-S", str(REPO), "-B", str(dest / "build"), *gen, f"-DCMAKE_INSTALL_PREFIX={dest / 'inst'}"],
                [cmake, "--build", str(dest / "build")], [cmake, "--install", str(dest / "build")]):
        subprocess.run(cmd, check=True, capture_output=True)
    folder = dest / "inst" / "ctbench" / "_prebuilt"
    os.chmod(folder, 0o755)
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="timed calls per build (>= 5)")
    ap.add_argument("--scale", type=float, default=1.0, help="W1 scale (<1 for a quick run)")
    ap.add_argument("--prebuilt", type=Path, default=None, help="an installed ctbench/_prebuilt folder")
    ap.add_argument("--variant", default=None, help="force a prebuilt level (e.g. x86_64_v3)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch/kernel threads (default torch's); 1 gives steadier CPU seconds on a shared machine")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    if args.repeat < 5:
        ap.error("--repeat must be at least 5")
    if args.variant:
        os.environ[cpu_prebuilt.VARIANT_ENV] = args.variant
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    emit_raw = Emitter(args.out, run_id, bench="prebuilt")

    def emit(**fields):  # every line: CPU model, AVX-512, load average now
        return emit_raw(cpu=cpu_model(), avx512=_avx512(), loadavg=_load(), **fields)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = args.prebuilt or build_prebuilt(Path(tmp))
        build_s = None if args.prebuilt else round(time.perf_counter() - t0, 1)
        src = cpu_library.kernel_dir()
        prebuilt, info = cpu_prebuilt.load("joseph", cpu_library._source_files(src, "joseph"), folder)
        os.environ.pop("CTBENCH_MARCH", None)  # the JIT build: -march=native
        native = cpu_library.load_library("joseph", src, cpu_library.cache_dir())
    emit(kind="header", machine=machine_info(), workload="W1", scale=args.scale, repeat=args.repeat,
         threads=torch.get_num_threads(),
         prebuilt_variant=info["variant"], prebuilt_flags=info["flags"], prebuilt_build_s=build_s,
         native_flags=cpu_library.compile_flags(cpu_library.find_compiler()),
         note="calls interleaved prebuilt/native; shared machine: see loadavg on each line")

    P = w1_projector("cpu", scale=args.scale)
    vol = torch.rand(P.volume_shape, dtype=torch.float32)
    sino = P.project(vol)

    impl = {"prebuilt": f"prebuilt {info['variant']}", "native": "JIT -march=native"}
    for op, fn in (("forward", lambda: P.project(vol)), ("backproject", lambda: P.backproject(sino))):
        res = interleaved_summary({"prebuilt": with_cpu_library(prebuilt, fn),
                                   "native": with_cpu_library(native, fn)}, args.repeat)
        p, n = res["prebuilt"], res["native"]
        for k, r in res.items():  # readme_table's timing lines: seconds = min, median_s beside it
            emit(kind="timing", workload="W1", op=op, impl=impl[k], seconds=r["min_s"], **r)
        ratio = round(p["min_s"] / n["min_s"], 4)
        emit(kind="ratio", workload="W1", op=op, ratio="prebuilt / native (time)", value=ratio,
             value_median=round(p["median_s"] / n["median_s"], 4),
             value_cpu_s=round(p["cpu_median_s"] / n["cpu_median_s"], 4), target=1.05,
             meets_target=bool(ratio <= 1.05), variant=info["variant"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
