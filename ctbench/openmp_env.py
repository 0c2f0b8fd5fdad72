"""libgomp's idle spin, shortened before torch loads it.

After every parallel region libgomp's idle threads spin (``GOMP_SPINCOUNT``, 300 000 ``pause`` loops by
default: several milliseconds) before they sleep, and that spin is CPU time of the process: after a
2-thread projector call the idle worker billed 10-12% more CPU to a following 25 ms call (docs/INTERNALS.md,
"OpenMP idle spin"), and in the GUI it takes a core from Qt for milliseconds after every kernel call.  10 000
loops (a fraction of a millisecond) keep the spin-wake for regions that follow each other closely (torch's
element-wise operations) and sleep soon after.

libgomp reads its environment once, when torch loads it, so this only acts when ctbench is imported before
torch, and never overrides the user's own ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``.
"""

from __future__ import annotations

import os
import sys

SPIN_COUNT = "10000"
USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def shorten_idle_spin() -> bool:
    """Set ``GOMP_SPINCOUNT`` to ``SPIN_COUNT`` unless torch is already loaded or the user chose a wait
    policy; whether it was set."""
    if "torch" in sys.modules or any(k in os.environ for k in USER_SETTINGS):
        return False
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True
