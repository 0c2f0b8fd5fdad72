"""Save a trajectory over an existing one and SIGKILL this process at a chosen point of the write.

Usage: python trajectory_and_die.py MODE PATH

``reserved``: the staging file created beside PATH, nothing written yet; ``writing``: half of the new bytes
written into it; ``before_exchange``, ``after_exchange``, ``between_renames``: the points of the replace
(kill_points.py).  The new trajectory has 7 views (the test's old one has 5).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from kill_points import die, kill_in_replace  # noqa: E402

from ctbench import output_policy  # noqa: E402
from ctbench.geometry import circular_trajectory_3d  # noqa: E402


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "reserved":
        output_policy.FileReservation.commit = lambda self, data: die()
    elif mode == "writing":
        real = output_policy.write_all

        def half_then_die(fd, data):
            real(fd, data[:len(data) // 2])
            die()
        output_policy.write_all = half_then_die
    elif not kill_in_replace(mode):
        raise SystemExit(f"unknown mode {mode}")
    circular_trajectory_3d(7, 300.0, 600.0).save(path)
    print("save finished without being killed", flush=True)


if __name__ == "__main__":
    main()
