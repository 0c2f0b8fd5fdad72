"""Save a dataset over an existing one and SIGKILL this process at a chosen point of the save.

Usage: python save_and_die.py MODE PATH N

The kill points are reached by wrapping the real functions the save calls
(file writes, the atomic exchange, renames, unlinks), so the process dies
exactly there, with no cleanup (SIGKILL runs no handler and no finally).
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from kill_points import kill_in_replace, kill_on_call  # noqa: E402

from ctbench import output_policy  # noqa: E402
from ctbench.storage import zarr_store  # noqa: E402
from ctbench.workbench import dataset  # noqa: E402

# this script's names for kill_points' points of the replace
REPLACE_POINTS = {"before_swap": "before_exchange", "after_swap": "after_exchange",
                  "between_renames": "between_renames"}


def main():
    mode, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "writing_new":              # the n-th file of the new dataset
        zarr_store.atomic_write_bytes = kill_on_call(n, zarr_store.atomic_write_bytes)
    elif mode in REPLACE_POINTS:           # before_swap, after_swap, between_renames
        kill_in_replace(REPLACE_POINTS[mode])
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
