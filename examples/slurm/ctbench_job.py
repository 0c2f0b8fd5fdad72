"""torchrun entry for a ctbench job on a Slurm allocation: ``torchrun ... ctbench_job.py JOB_DIR``.

``ctbench jobs slurm`` renders ``multi_node.sbatch`` with this file as its
SCRIPT; it runs the job worker (:mod:`ctbench.jobs.worker`) on every rank.
"""

import sys

from ctbench.jobs.worker import main

if __name__ == "__main__":
    sys.exit(main())
