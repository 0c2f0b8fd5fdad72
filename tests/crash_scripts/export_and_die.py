"""Export a volume over an existing export and SIGKILL this process at a chosen point of the replace.

Usage: python export_and_die.py MODE PATH

As in save_and_die.py, the kill points (kill_points.py) are reached by wrapping the real functions the export
calls (the atomic exchange, renames, the file writer), so the process dies exactly there with no cleanup.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from kill_points import die, kill_in_replace  # noqa: E402

from ctbench.io import export  # noqa: E402


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
    elif not kill_in_replace(mode):        # before_exchange, after_exchange, between_renames
        raise SystemExit(f"unknown mode {mode}")
    new = np.full((8, 6, 5), 7.0, np.float32)
    export.export_volume(path, new, 0.5, overwrite=True, meta={"which": "new"})
    print("export finished without being killed", flush=True)


if __name__ == "__main__":
    main()
