"""The kill points shared by the crash scripts: SIGKILL this process (no handler, no finally runs) at a chosen
call of a real function, or at a chosen point of output_policy's replace of an existing output."""

import os
import signal

from ctbench import output_policy


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def kill_on_call(n, fn, before=True):
    """``fn`` that kills the process at its n-th call (before or after running it)."""
    count = [0]

    def wrapped(*args, **kwargs):
        count[0] += 1
        if count[0] == n and before:
            die()
        out = fn(*args, **kwargs)
        if count[0] == n:
            die()
        return out
    return wrapped


def kill_in_replace(point: str) -> bool:
    """Arrange the kill at ``point`` of the replace; False if ``point`` is not one of these:

    ``before_exchange``: the new output complete and flushed, nothing swapped yet;
    ``after_exchange``: swapped, the old output not yet deleted;
    ``between_renames``: no atomic exchange, the old output moved aside, the new one not yet in place.
    """
    if point == "before_exchange":
        output_policy._exchange = lambda a, b: die()
    elif point == "after_exchange":
        output_policy._exchange = kill_on_call(1, output_policy._exchange, before=False)
    elif point == "between_renames":
        output_policy._exchange = lambda a, b: False
        os.rename = kill_on_call(2, os.rename)
    else:
        return False
    return True
