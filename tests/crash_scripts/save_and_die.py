"""Save a dataset over an existing one and SIGKILL this process at a chosen point of the save.

Usage: python save_and_die.py MODE PATH N

The kill points are reached by wrapping the real functions the save calls
(file writes, the atomic exchange, renames, unlinks), so the process dies
exactly there, with no cleanup (SIGKILL runs no handler and no finally).
"""

import os
import signal
import sys

import numpy as np

from ctbench.storage import zarr_store
from ctbench import output_policy
from ctbench.workbench import dataset


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


def main():
    mode, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "writing_new":              # the n-th file of the new dataset
        zarr_store.atomic_write_bytes = kill_on_call(n, zarr_store.atomic_write_bytes)
    elif mode == "before_swap":            # the new one complete, nothing swapped yet
        output_policy._exchange = lambda a, b: die()
    elif mode == "after_swap":             # swapped, the old one not yet deleted
        output_policy._exchange = kill_on_call(1, output_policy._exchange, before=False)
    elif mode == "between_renames":        # no atomic exchange: old moved aside, new not yet in place
        output_policy._exchange = lambda a, b: False
        os.rename = kill_on_call(2, os.rename)
    elif mode == "deleting_old":           # the n-th file of the old dataset being deleted
        os.unlink = kill_on_call(n, os.unlink)
    elif mode == "deleting_old_renames":
        output_policy._exchange = lambda a, b: False
        os.unlink = kill_on_call(n, os.unlink)
    else:
        raise SystemExit(f"unknown mode {mode}")
    new = np.arange(12 * 10 * 8, dtype=np.float32).reshape(12, 10, 8) + 1000
    dataset.save_dataset(path, volume=new, sinogram=np.full((5, 6, 4), 3.0, np.float32), voxel_spacing=0.5,
                         chunks=4, overwrite=True, meta={"which": "new"})
    print("save finished without being killed", flush=True)


if __name__ == "__main__":
    main()
