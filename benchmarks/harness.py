"""What every benchmark shares: the JSON-lines output, the machine it ran on, interleaved timing.

The rules (docs/ARCHITECTURE.md, "Benchmarks"): peers are timed in the same process, call by call in
turn (A B A B ...), after one warm-up call each, so that a busy spell on a shared machine slows all of
them alike; every figure is reported as min and median, in wall seconds and in the process's CPU
seconds (all threads; on an oversubscribed machine the steadier of the two); every line carries the
bench name and the run id, and the header line the machine (CPU model, caches, SIMD levels with an
``avx512`` flag, load average, package versions).

    emit = Emitter(out_path, new_run_id(), bench="mybench")
    emit(kind="header", machine=machine_info())
    stats, outs = interleaved({"ctbench": f, "peer": g}, repeats=8)
    emit(op="forward", impl="ctbench", **timing_fields(stats["ctbench"]))

Another build of the CPU kernels (a git revision's) runs through the same Python path with
``revision_library`` and ``with_cpu_library``: the old-against-new A/B runs of kernel changes.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
import json
import math
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
PEER_PACKAGES = ("ctbench", "torch", "numpy", "itk-rtk", "itk", "astra-toolbox", "diffct")


# ------------------------------------------------------------------ output
class Emitter:
    """Prints JSON lines and appends them to a file; every line carries the bench name and run id."""

    def __init__(self, out: Path | None, run_id: str, bench: str):
        self.out = out
        self.run_id = run_id
        self.bench = bench
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, **fields) -> dict:
        line = {"bench": self.bench, "run_id": self.run_id, **fields}
        text = json.dumps(line, default=jsonable)
        print(text, flush=True)
        if self.out is not None:
            with open(self.out, "a") as f:
                f.write(text + "\n")
        return line


def new_run_id() -> str:
    """The run id every line of one run carries: its UTC start time, ``YYYYmmddTHHMMSSZ``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, torch.Tensor):
        return x.tolist()
    return str(x)


def rounded(x, digits: int = 4):
    """``x`` to ``digits`` significant digits (None, inf and nan unchanged)."""
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


def has_avx512() -> bool:
    return "avx512f" in cpu_flags()


def physical_cores() -> int | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    cores = {(b.get("physical id"), b.get("core id"))
             for b in ({k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in blk.splitlines())}
                       for blk in text.split("\n\n") if blk.strip())}
    return len(cores) or None


def loadavg():
    try:
        return os.getloadavg()
    except OSError:
        return None


def machine_info(packages=PEER_PACKAGES) -> dict:
    """The header's machine: CPU model, cores, caches, SIMD levels, load, threads, versions."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {"cpu": cpu_model(), "nproc": os.cpu_count(), "cores": physical_cores(), "caches": cpu_caches(),
            "simd": cpu_flags(), "avx512": has_avx512(), "cpus_usable": affinity,
            "torch_threads": torch.get_num_threads(), "loadavg": loadavg(),
            "openmp_env": {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")},
            "python": platform.python_version(), "platform": platform.platform(),
            "versions": package_versions(packages)}


# ------------------------------------------------------------------ timing
def _stats(times: list[float], cpus: list[float], warm: float | None) -> dict:
    i = int(np.argmin(times))
    return {"seconds": times[i], "median_s": float(np.median(times)), "cpu_s": cpus[i],
            "cpu_min_s": min(cpus), "cpu_median_s": float(np.median(cpus)),
            "times": [rounded(x) for x in times], "cpu_times": [rounded(x) for x in cpus],
            "warmup_s": None if warm is None else rounded(warm)}


def interleaved(calls: dict, repeats: int, warmup: bool = True, sync=None) -> tuple[dict, dict]:
    """Time several callables call by call in turn: A B A B ...

    ``calls``: {name: fn}.  One warm-up call each (``warmup``), then ``repeats`` rounds; ``sync`` (e.g.
    ``torch.cuda.synchronize``) runs after each call inside its timing.  Returns ({name: stats}, {name:
    output of its last call}); stats: ``seconds`` (the fastest wall time) and ``median_s``, ``cpu_s``
    (the fastest call's CPU seconds), ``cpu_min_s``, ``cpu_median_s``, every ``times`` and ``cpu_times``,
    and ``warmup_s``.
    """
    sync = sync or (lambda: None)
    outs, warm = {}, {}
    if warmup:
        for name, fn in calls.items():
            t0 = time.perf_counter()
            outs[name] = fn()
            sync()
            warm[name] = time.perf_counter() - t0
    times = {n: [] for n in calls}
    cpus = {n: [] for n in calls}
    for _ in range(max(1, repeats)):
        for name, fn in calls.items():
            c0, t0 = time.process_time(), time.perf_counter()
            outs[name] = fn()
            sync()
            times[name].append(time.perf_counter() - t0)
            cpus[name].append(time.process_time() - c0)
    return {n: _stats(times[n], cpus[n], warm.get(n)) for n in calls}, outs


def interleaved_summary(fns: dict, repeat: int) -> dict:
    """``interleaved`` in short: {name: {"min_s", "median_s", "cpu_min_s", "cpu_median_s", "n"}}, rounded
    to the microsecond."""
    stats, _ = interleaved(fns, repeat)
    return {k: {"min_s": round(s["seconds"], 6), "median_s": round(s["median_s"], 6),
                "cpu_min_s": round(s["cpu_min_s"], 6), "cpu_median_s": round(s["cpu_median_s"], 6),
                "n": len(s["times"])} for k, s in stats.items()}


def best_of(fn, repeats: int, warmup: bool = True):
    """One callable on its own (a peer too slow to interleave): its statistics and last output."""
    stats, outs = interleaved({"fn": fn}, repeats, warmup)
    return stats["fn"], outs["fn"]


def timing_fields(stats: dict) -> dict:
    """The fields of a result line from ``interleaved``'s statistics."""
    extra = {"median_s": rounded(stats["median_s"])} if "median_s" in stats else {}
    cpu_median = {"cpu_median_s": rounded(stats["cpu_median_s"])} if "cpu_median_s" in stats else {}
    return {"seconds": rounded(stats["seconds"]), **extra, "cpu_s": rounded(stats["cpu_s"]), **cpu_median,
            "parallelism": rounded(stats["cpu_s"] / stats["seconds"], 3), "times": stats["times"],
            "warmup_s": stats["warmup_s"]}


def ratio_fields(peer: dict, ours: dict) -> dict:
    """peer / ours (> 1: ours faster) on the fastest wall time, the median wall time and CPU seconds."""
    out = {"value": rounded(peer["seconds"] / ours["seconds"]),
           "value_cpu_s": rounded(peer["cpu_s"] / ours["cpu_s"]) if ours["cpu_s"] > 0 else None}
    if "median_s" in peer and "median_s" in ours:
        out["value_median"] = rounded(peer["median_s"] / ours["median_s"])
    if "cpu_median_s" in peer and "cpu_median_s" in ours and ours["cpu_median_s"] > 0:
        out["value_cpu_median_s"] = rounded(peer["cpu_median_s"] / ours["cpu_median_s"])
    return out


def threaded(t: int, fn):
    """``fn`` run with ``t`` torch (and so kernel) threads."""
    def call():
        torch.set_num_threads(t)
        return fn()
    return call


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


# ------------------------------------------------------------------ CPU kernel builds and paths
def kernel_paths() -> dict:
    """The Joseph library's paths (offered, measured fastest on this CPU, active now)."""
    from ctbench.engine.cpu import joseph_paths, library
    return joseph_paths.describe(library.load_cpu_library("joseph"))


def forced_path(op: str, name: str, fn):
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


def with_cpu_library(lib, fn, family: str = "joseph"):
    """``fn`` wrapped so that, while it runs, ``load_cpu_library(family)`` returns ``lib``.

    The same Python path then calls another build of the kernels (a baseline revision, a prebuilt
    variant); the loader is restored after each call.
    """
    from ctbench.engine.cpu import backend, library

    original = library.load_cpu_library

    def call():
        # the backend holds its own reference (it sets the run-time paths on that library): patch both,
        # else the paths are set on the default build while the substitute runs its default path
        library.load_cpu_library = backend.load_cpu_library = lambda f: lib if f == family else original(f)
        try:
            return fn()
        finally:
            library.load_cpu_library = backend.load_cpu_library = original
    return call


def revision_kernels(rev: str, dest: Path) -> Path:
    """The kernels/ folder of git revision ``rev``, written to ``dest``."""
    git = ["git", "-C", str(REPO)]
    names = subprocess.run([*git, "ls-tree", "--name-only", f"{rev}:kernels"], check=True,
                           capture_output=True, text=True).stdout.split()
    dest.mkdir(parents=True, exist_ok=True)
    for n in names:
        data = subprocess.run([*git, "show", f"{rev}:kernels/{n}"], check=True, capture_output=True).stdout
        (dest / n).write_bytes(data)
    return dest


def revision_library(rev: str, family: str, workdir: Path):
    """Kernel family ``family`` of git revision ``rev``, compiled with today's flags through the same
    cache code as the current build (so the two differ by their sources only)."""
    from ctbench.engine.cpu import library
    src = revision_kernels(rev, workdir / f"kernels-{rev}")
    return library.load_library(family, src, library.cache_dir())


def kernels_revision() -> str:
    """HEAD's short hash, with "+dirty" when kernels/ has uncommitted changes."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "kernels"]).returncode != 0
    return head + ("+dirty" if dirty else "")


def median(xs) -> float:
    return float(statistics.median(xs))
