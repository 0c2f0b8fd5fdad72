"""Peak resident-set growth of a call, from Linux /proc (for the memory-model tests; the
subprocess scripts of tests/test_plan.py and tests/test_capacity.py import it from tests/)."""

from __future__ import annotations

import ctypes


def follow_allocations() -> None:
    """glibc keeps freed buffers below its (dynamic) mmap threshold resident; a fixed threshold
    makes resident memory follow what is allocated."""
    ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)


def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, val = line.split(":")
                out[key] = int(val.split()[0]) * 1024
    return out


def peak_growth(fn):
    """(peak resident-set growth of this process while ``fn`` runs, its result); the high-water
    mark is reset first."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status()["VmRSS"]
    result = fn()
    return _status()["VmHWM"] - base, result
