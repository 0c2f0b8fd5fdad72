"""The FDK backprojection's cpu path chosen by measurement on this CPU.

The same rule as the Joseph paths (:mod:`ctbench.engine.joseph_paths`): the first time the fdk
library is used, each of its paths is timed on a small problem per dtype, the fastest is kept unless it
beats the build's default by less than 10 % (``path_choice.CHOICE_MARGIN``), and the choice is cached
beside the library under its SHA-256 and the CPU's signature (read only through the trust rules; a damaged
or foreign file is measured again).  ``CTBENCH_CPU_PATH=fdk=NAME`` still overrides it (``fdk_kernels.fdk_path``).
"""

from __future__ import annotations

import threading
from typing import Callable

from . import path_cache

FAMILY = "fdk"
MEASURE_PROBLEM = "circular cone, 48^3 volume, 48 views, 48x48 detector, 1 call per path after a warm-up, best of 3"

_LOCK = threading.Lock()
_STATE: dict[int, dict] = {}  # id(lib) -> {"lib", "choice", "source"}


def measured_paths(lib, known: dict[str, list[str]],
                   measure: Callable[[str], dict[str, float]]) -> tuple[dict[str, str], str]:
    """``(choice by dtype name, where from)`` for the fdk library ``lib``: ``known`` lists each dtype's
    paths with the build's default first; ``measure(dtype_name)`` times them (seconds by path)."""
    with _LOCK:
        st = _STATE.get(id(lib))
        if st is not None and st["lib"] is lib and st["known"] == known:
            return st["choice"], st["source"]
        choice, source = _choose(lib, known, measure)
        _STATE[id(lib)] = {"lib": lib, "known": known, "choice": choice, "source": source}
        return choice, source


def _choose(lib, known, measure):
    def measure_all():
        timings = {}
        for dtype, names in known.items():
            seconds = measure(dtype) if len(names) > 1 else {names[0]: 0.0}
            timings[dtype] = {name: float(seconds[name]) for name in names}  # the default stays first
        return timings

    return path_cache.cached_or_measured(getattr(lib, "_ctbench_origin", {}), FAMILY, known, measure_all,
                                             MEASURE_PROBLEM)
