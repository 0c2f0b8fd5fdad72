"""Which inner-loop path each CPU kernel operation runs.

A path is one implementation family of an operation (for example SIMD lanes with gathers, lanes with
scalar loads, scalar beams), each equal to the reference within round-off.  By default the engine
runs the path measured fastest on this CPU; ``CTBENCH_CPU_PATH`` forces one per operation for
benchmarks and tests: ``CTBENCH_CPU_PATH="forward=NAME,back=NAME,fdk=NAME"`` (any subset; an
operation left out keeps the measured choice; ``NAME=default`` is the build's own default path,
the same on every CPU, for bitwise comparisons between builds).  The Joseph projector's measurement and its use
are in ``joseph_paths``; docs/INTERNALS.md ("CPU paths and how one is chosen") lists them.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from pathlib import Path

from ...atomic_files import atomic_write_bytes
from ..library_trust import UntrustedCache, read_trusted_json

PATH_ENV = "CTBENCH_CPU_PATH"
OPERATIONS = ("forward", "back", "fdk")
# a NAME meaning the build's first-listed path, whatever was measured (bitwise comparisons of builds)
DEFAULT_PATH = "default"


def forced_paths() -> dict[str, str]:
    """The paths ``CTBENCH_CPU_PATH`` forces, by operation (empty when it is unset)."""
    text = os.environ.get(PATH_ENV, "").strip()
    if not text:
        return {}
    forced: dict[str, str] = {}
    for item in text.split(","):
        op, sep, name = (part.strip() for part in item.partition("="))
        if not sep or op not in OPERATIONS or not name:
            raise ValueError(f"{PATH_ENV}: expected comma-separated OP=NAME items with OP one of "
                             f"{', '.join(OPERATIONS)}, got {item.strip()!r} in {text!r}")
        if op in forced:
            raise ValueError(f"{PATH_ENV}: operation {op!r} is named twice in {text!r}")
        forced[op] = name
    return forced


def forced_path(op: str) -> str | None:
    """The path ``CTBENCH_CPU_PATH`` forces for ``op`` (``"forward"``, ``"back"`` or ``"fdk"``), or None."""
    if op not in OPERATIONS:
        raise ValueError(f"op: expected one of {', '.join(OPERATIONS)}, got {op!r}")
    return forced_paths().get(op)


# ------------------------------------------------------------ the measured choice
# A kernel library that offers run-time paths exports, per operation index ``op``:
# ``<family>_path_count(op)``, ``<family>_path_name(op, i)`` and ``<family>_set_path(op, i)``.
# The fastest path of each operation is measured once per library and CPU, and the
# result is kept in a small JSON file beside the library (its cache folder), read
# back only after the trust checks of ``library_trust`` and only when it names this
# very library (SHA-256), this CPU (``library.cpu_signature``) and the paths the
# library offers; anything else (damaged, foreign, stale) is ignored and re-measured.

CHOICE_FORMAT = "ctbench.cpu-paths"


def library_paths(lib, family: str, ops: dict[str, int]) -> dict[str, list[str]]:
    """The path names ``lib`` offers for each operation of ``ops`` (name -> op index), in its order."""
    count = getattr(lib, f"{family}_path_count")
    count.argtypes, count.restype = [ctypes.c_int], ctypes.c_int
    name = getattr(lib, f"{family}_path_name")
    name.argtypes, name.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_char_p
    return {op: [name(i, k).decode() for k in range(count(i))] for op, i in ops.items()}


def set_library_path(lib, family: str, op_index: int, path_index: int) -> None:
    f = getattr(lib, f"{family}_set_path")
    f.argtypes, f.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if f(op_index, path_index) != 0:
        raise ValueError(f"{family}: the library has no path {path_index} for operation {op_index}")


def check_forced(forced: dict[str, str], known: dict[str, list[str]]) -> dict[str, str]:
    """The forced paths of the operations in ``known``; an unknown name is a ValueError listing the known ones."""
    out = {}
    for op, names in known.items():
        want = forced.get(op)
        if want is None:
            continue
        if want == DEFAULT_PATH:  # the build's own default: the same on every CPU that runs the build
            want = names[0]
        if want not in names:
            raise ValueError(f"{PATH_ENV}: {op}={want!r} is not a path of this CPU's kernel library; "
                             f"known {op} paths: {', '.join(names)}")
        out[op] = want
    return out


def choice_file(folder: Path, family: str, sha256: str) -> Path:
    return Path(folder) / f"paths-{family}-{sha256[:16]}.json"


def read_choice(path: Path, family: str, sha256: str, cpu: str,
                known: dict[str, list[str]]) -> tuple[dict[str, str] | None, str]:
    """``(choice, "")`` from ``path`` if it is trusted and names this library, CPU and paths, else
    ``(None, why not)``."""
    if not path.exists():
        return None, "no cached choice"
    try:
        doc = read_trusted_json(path, "cpu path choice")
    except (UntrustedCache, ValueError, OSError) as e:
        return None, str(e)
    ok = (isinstance(doc, dict) and doc.get("format") == CHOICE_FORMAT and doc.get("family") == family
          and doc.get("library_sha256") == sha256 and doc.get("cpu") == cpu and doc.get("paths") == known
          and isinstance(doc.get("choice"), dict) and set(doc["choice"]) == set(known)
          and all(doc["choice"][op] in names for op, names in known.items()))
    if not ok:
        return None, f"{path} is not a choice for this library, CPU and paths"
    return dict(doc["choice"]), ""


def write_choice(path: Path, family: str, sha256: str, cpu: str, known: dict[str, list[str]],
                 choice: dict[str, str], timings: dict[str, dict[str, float]], problem: str) -> None:
    """Write the choice atomically (old or new file, never a mix)."""
    doc = {"format": CHOICE_FORMAT, "family": family, "library_sha256": sha256, "cpu": cpu, "paths": known,
           "choice": choice, "timings_s": timings, "problem": problem, "measured": time.time()}
    atomic_write_bytes(path, json.dumps(doc, indent=1).encode(), fsync=True, suffix=".tmp")


# How much faster than the build's default a path must measure to replace it.  The measurement is a
# second of small calls, cached for the library's life; on a loaded 2-core Zen 4 one measurement in six put
# a path 7-8% ahead of the default that W1 at 2 threads ran 13-18% slower (pairs-padded-rs-b4 / -b4 against
# dup-padded-rs-b8, CPU-s medians); with 5% the choice flipped on such noise (docs/INTERNALS.md, "The
# measurement").
# The choices the measurement exists for differ by far more (gathers against scalar loads on slow-gather
# cores, view-by-view against banded paths: 1.3-2x).
CHOICE_MARGIN = 0.10


def fastest(timings: dict[str, dict[str, float]], margin: float = CHOICE_MARGIN) -> dict[str, str]:
    """Per operation, the path with the least time, unless it beats the first listed (the build's
    default) by less than ``margin``: a noisy measurement then keeps the default."""
    out = {}
    for op, t in timings.items():
        default = next(iter(t))
        best = min(t, key=lambda k: t[k])
        out[op] = best if t[best] < (1.0 - margin) * t[default] else default
    return out
