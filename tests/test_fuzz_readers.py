"""Hypothesis fuzz of scanner files (Nikon, SkyScan, Zeiss, DXchange, ctbench's TIFF folder) in a child process.

The fuzz lives in tests/fuzz_readers_main.py (a script: a crash, a hang or a runaway allocation fails this
test with the child's output instead of taking pytest down), under a 4 GiB address-space limit, every example
under its own alarm: a hostile field value, a deleted line, a truncation or random bytes anywhere in any file
of a scan must give arrays of the declared shapes or a ScanFileError / InputError naming the file.  Its first
run found h5py's own RuntimeError and OSError escaping from damaged DXchange files (a group's symbol table, a
chunk index); both are ScanFileErrors now.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent / "fuzz_readers_main.py"
ADDRESS_SPACE = 4 << 30
N_FILES = 300


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.mark.slow
def test_hostile_scanner_files_get_a_clear_error_or_a_correct_read(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SCRIPT.parents[1]))
    env.pop("FUZZ_COLLECT", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "world"), str(N_FILES)],
                          capture_output=True, text=True, timeout=600, env=env, preexec_fn=_limit)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
    assert f"FUZZ OK {N_FILES} files" in proc.stdout
    print(proc.stdout.strip().splitlines()[-1])


def test_a_dxchange_file_with_a_damaged_group_is_a_scan_file_error(tmp_path):
    """The fuzz's first finding, kept as a plain case: h5py's RuntimeError ('bad symbol table node signature')."""
    from ctbench.io import ScanFileError, read_scan
    from vendor_files import write_dxchange

    counts = np.full((4, 6, 8), 30000, np.uint16)
    path = write_dxchange(tmp_path / "d.h5", counts, counts[:2], counts[:2] // 100, np.arange(4) * 45.0,
                          resolution_um=20.0)
    data = bytearray(path.read_bytes())
    at = data.index(b"SNOD")
    data[at:at + 4] = b"XXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(ScanFileError, match="d.h5") as e:
        read_scan(path)
    assert "RuntimeError" not in type(e.value).__name__
