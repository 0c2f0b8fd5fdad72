"""Export a volume over an existing export and SIGKILL this process at a chosen point of the replace.

Usage: python export_and_die.py MODE PATH

As in save_and_die.py, the kill points are reached by wrapping the real functions the export calls
(the atomic exchange, renames, the file writer), so the process dies exactly there with no cleanup.
"""

import os
import signal
import sys

import numpy as np

from ctbench import output_policy
from ctbench.io import export


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def kill_on_call(n, fn, before=True):
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


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "writing":                  # half of the new file written aside
        real = export._slabs

        def slabs(vol, step=16):
            for i, item in enumerate(real(vol, 2)):
                if i == 2:
                    die()
                yield item
        export._slabs = slabs
    elif mode == "before_exchange":        # new file complete and flushed, nothing swapped yet
        output_policy._exchange = lambda a, b: die()
    elif mode == "after_exchange":         # swapped; the old file not yet deleted
        output_policy._exchange = kill_on_call(1, output_policy._exchange, before=False)
    elif mode == "between_renames":        # no atomic exchange: old moved aside, new not yet in place
        output_policy._exchange = lambda a, b: False
        os.rename = kill_on_call(2, os.rename)
    else:
        raise SystemExit(f"unknown mode {mode}")
    new = np.full((8, 6, 5), 7.0, np.float32)
    export.export_volume(path, new, 0.5, overwrite=True, meta={"which": "new"})
    print("export finished without being killed", flush=True)


if __name__ == "__main__":
    main()
