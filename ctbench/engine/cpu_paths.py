"""Which inner-loop path each CPU kernel operation runs.

A path is one implementation family of an operation (for example SIMD lanes with gathers, lanes with
scalar loads, scalar beams), each equal to the reference within round-off.  By default the engine
runs the path measured fastest on this CPU; ``CTBENCH_CPU_PATH`` forces one per operation for
benchmarks and tests: ``CTBENCH_CPU_PATH="forward=NAME,back=NAME,fdk=NAME"`` (any subset; an
operation left out keeps the measured choice).
"""

from __future__ import annotations

import os

PATH_ENV = "CTBENCH_CPU_PATH"
OPERATIONS = ("forward", "back", "fdk")


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
