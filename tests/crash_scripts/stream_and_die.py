"""Run a streaming call into a zarr store and SIGKILL this process after the n-th window is written.

Usage: python stream_and_die.py project|fdk VOLUME_STORE SINOGRAM_STORE N [partial]

The window's data is written, then the process dies before its completion
record says so.  With ``partial``, the kill comes in the middle of the next
chunk file instead (its temporary ``.partial`` file half written).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from crash_cases import projector  # noqa: E402
from kill_points import die  # noqa: E402

from ctbench.storage import ZarrStore, project_into, zarr_store  # noqa: E402


def main():
    kind, vol_path, sino_path, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    partial = len(sys.argv) > 5 and sys.argv[5] == "partial"
    torch.set_num_threads(1)
    real_write = ZarrStore.write
    writes = [0]

    def write(self, window, value):
        real_write(self, window, value)
        if os.path.realpath(self.location().rstrip("/")) == os.path.realpath(target):
            writes[0] += 1
            if writes[0] == n:
                if partial:
                    def half_written(path, data, fsync=False):
                        fd = os.open(f"{path.parent}/.{path.name}.x1y2z3.partial", os.O_CREAT | os.O_WRONLY)
                        os.write(fd, bytes(data)[: len(bytes(data)) // 2])
                        die()
                    zarr_store.atomic_write_bytes = half_written
                else:
                    die()
    ZarrStore.write = write
    if kind == "project":
        target = sino_path
        project_into(projector(), ZarrStore.open(vol_path, "r"), ZarrStore.open(sino_path))
    else:
        from ctbench.solvers import fdk_into
        target = vol_path
        fdk_into(projector(fdk=True), ZarrStore.open(sino_path, "r"), ZarrStore.open(vol_path))
    print("finished without being killed", flush=True)


if __name__ == "__main__":
    main()
