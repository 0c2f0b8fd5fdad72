"""One job rank (world size 1) writes its result dataset; SIGKILLed while writing it, or not at all.

Usage: python result_and_die.py MODE JOB_DIR      (MODE: ``writing`` or ``complete``)

The job directory holds a spec.json (dataset, output) as the bridge writes it.
"""

import os
import socket
import sys

sys.path.insert(0, os.path.dirname(__file__))
from kill_points import die  # noqa: E402

import torch  # noqa: E402

import ctbench.workbench.dataset as dataset  # noqa: E402
from ctbench.jobs.worker import Job  # noqa: E402


def main():
    mode, job_dir = sys.argv[1], sys.argv[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    job = Job(__import__("pathlib").Path(job_dir))
    job.setup()
    if mode == "writing":                 # the volume array created, its planes being written
        dataset.open_array_for_writing = lambda path: die()
    elif mode != "complete":
        raise SystemExit(f"unknown mode {mode}")
    volume = torch.ones(tuple(job.geometry.volume_shape))
    out = job.write_result(volume, {"job_id": os.path.basename(job_dir)})
    print(f"wrote {out}", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
