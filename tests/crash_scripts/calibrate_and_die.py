"""``ctbench calibrate CONFIG --overwrite``, SIGKILLed at a chosen point.

Usage: python calibrate_and_die.py MODE CONFIG

``calibrating``: both outputs reserved (staging files beside them), the calibration running;
``between_commits``: the trajectory committed, the report not yet.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from kill_points import die  # noqa: E402

import ctbench.calibration  # noqa: E402
from ctbench import output_policy  # noqa: E402
from ctbench.cli import main as cli  # noqa: E402


def main():
    mode, config = sys.argv[1], sys.argv[2]
    if mode == "calibrating":
        ctbench.calibration.calibrate = lambda *a, **k: die()
    elif mode == "between_commits":
        real = output_policy.FileReservation.commit
        calls = [0]

        def commit(self, data):
            calls[0] += 1
            if calls[0] == 2:
                die()
            return real(self, data)
        output_policy.FileReservation.commit = commit
    else:
        raise SystemExit(f"unknown mode {mode}")
    rc = cli(["calibrate", config, "--overwrite"])
    print(f"calibrate finished without being killed (rc {rc})", flush=True)


if __name__ == "__main__":
    main()
