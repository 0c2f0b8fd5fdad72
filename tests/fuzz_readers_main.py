"""Property-based fuzz of scanner files: hostile variants of each format ``read_scan`` reads.

Run as a script in a child process (tests/test_fuzz_readers.py) under an address-space limit, so that an
allocation nobody bounded fails the run instead of the machine.  Usage::

    python tests/fuzz_readers_main.py WORKDIR N_EXAMPLES [SEED]

Tiny valid scans are written the way each scanner writes them (tests/vendor_files.py: Nikon ``.xtekct``,
Bruker SkyScan ``.log`` with its ``_TS.csv``, Zeiss ``.txrm``, DXchange and NeXus NXtomo HDF5, and ctbench's own TIFF scan
folder); hypothesis then changes one thing of one of them: a field of a text file given a hostile value
(huge, tiny, negative, non-finite, empty, not a number, glob characters, a Windows path), a line deleted, a
text or binary file truncated at any byte or overwritten with random bytes over any range.  The property,
for every example, within ``EXAMPLE_S`` seconds: ``read_scan`` and a read of its first projection, flats and
darks either return arrays of the declared shapes or raise a :class:`ctbench.io.ScanFileError` /
:class:`ctbench.guarded_open.InputError` (a ValueError) that names a file; any other exception (an
IndexError, a KeyError, h5py's or olefile's own errors, "Unable to allocate") fails the run.

Prints ``FUZZ OK <n> files (<r> read, <e> refused) by format: ...`` at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from io_helpers import write_nxtomo  # noqa: E402
from vendor_files import write_bruker, write_dxchange, write_nikon, write_txrm  # noqa: E402

EXAMPLE_S = 20
COLLECT = bool(os.environ.get("FUZZ_COLLECT"))      # list every distinct failure instead of stopping at the first
HOSTILE_VALUES = ["", "-", "-1", "0", "1e999", "-1e999", "nan", "inf", "1e30", "16.9", "4294967297",
                  "9" * 400, "abc", "s[1]", "*", "C:\\Scans\\x\\", "0x10", " ", "1,5", "YES", "ON (1e9)"]


class Mutation:
    """One hostile change of one base file; its repr (what hypothesis prints for a failing example) is short."""

    def __init__(self, fmt: str, target: Path, data: bytes, what: str):
        self.fmt, self.target, self.data, self.what = fmt, target, data, what

    def __repr__(self) -> str:
        return f"{self.fmt}: {self.what}"


class ExampleTimeout(BaseException):
    """An example ran past EXAMPLE_S (a BaseException: no handler of the code under test swallows it)."""


def _alarm(signum, frame):
    raise ExampleTimeout(f"the example ran longer than {EXAMPLE_S} s")


def write_bases(root: Path) -> dict[str, Path]:
    """One tiny valid scan per format, as the scanner writes it: {format: the path read_scan is given}."""
    from ctbench.io.sample_scan import LabScanSpec, write_lab_scan

    n, rows, cols = 6, 8, 10
    rng = np.random.default_rng(5)
    counts = rng.integers(20000, 60000, (n, rows, cols)).astype(np.uint16)
    ang = np.arange(n) * 60.0
    bases = {
        "nikon": write_nikon(root / "nikon", "s", counts, pitch=0.2, sid=200, sdd=400, angles_deg=ang,
                             white_level=60000, ctdata_deg=ang),
        "skyscan": write_bruker(root / "skyscan", "k_", counts, sid=50, sdd=200, pitch=0.01, step_deg=60,
                                shifts=(np.linspace(-1, 1, n), np.linspace(0.5, -0.5, n)), optical_axis=3.5),
        "zeiss": write_txrm(root / "z.txrm", counts, np.full((rows, cols), 60000.0), angles_deg=ang - 150, sid=40,
                            sdd=120, pixel_um=50.0, x_shifts=np.zeros(n)),
        "dxchange": write_dxchange(root / "d.h5", counts, np.full((2, rows, cols), 60000, np.uint16),
                                   np.full((2, rows, cols), 100, np.uint16), ang, resolution_um=20.0),
        "nexus": write_nxtomo(root / "n.nxs", counts, np.full((2, rows, cols), 60000, np.uint16),
                              np.full((2, rows, cols), 100, np.uint16), ang, 20e-6, sample_detector_m=0.1),
        "tiff": write_lab_scan(root / "tiff", LabScanSpec(n_views=n, detector_u=cols, detector_v=rows, volume=8)),
    }
    return {k: Path(v) for k, v in bases.items()}


TEXT_SUFFIXES = {".xtekct", ".log", ".csv", ".txt", ".json"}


@st.composite
def mutation(draw, bases):
    fmt = draw(st.sampled_from(sorted(bases)))
    base = bases[fmt]
    folder = base if base.is_dir() else base.parent if base.suffix in (".xtekct", ".log") else None
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder is not None else [base]
    target = draw(st.sampled_from(files))
    data = target.read_bytes()
    if target.suffix.lower() in TEXT_SUFFIXES and draw(st.booleans()):
        lines = data.decode("latin-1").splitlines(keepends=True)
        fields = [i for i, ln in enumerate(lines) if "=" in ln or "," in ln]
        if fields:
            i = draw(st.sampled_from(fields))
            sep = "=" if "=" in lines[i] else ","
            if draw(st.integers(0, 4)) == 0:
                lines[i] = ""                                        # the line deleted
            else:
                key = lines[i].split(sep, 1)[0]
                value = draw(st.one_of(st.sampled_from(HOSTILE_VALUES), st.floats(allow_nan=True).map(repr),
                                       st.integers(-2 ** 70, 2 ** 70).map(str)))
                lines[i] = f"{key}{sep}{value}\r\n"
            return Mutation(fmt, target, "".join(lines).encode("latin-1", "replace"),
                            f"{target.name}: line {i} -> {lines[i]!r}")
    kind = draw(st.sampled_from(["truncate", "overwrite"]))
    if kind == "truncate":
        cut = draw(st.integers(0, max(0, len(data) - 1)))
        return Mutation(fmt, target, data[:cut], f"{target.name} truncated at {cut} of {len(data)} bytes")
    start = draw(st.integers(0, max(0, len(data) - 1)))
    junk = draw(st.binary(min_size=1, max_size=64))
    return Mutation(fmt, target, data[:start] + junk + data[start + len(junk):],
                    f"{target.name}: {len(junk)} random bytes at {start}")


def check_read(path: Path) -> str:
    """'read' or 'refused'; raises AssertionError on anything else."""
    from ctbench import guarded_open
    from ctbench.io import ScanFileError, read_scan

    try:
        scan = read_scan(path)
        first = np.asarray(scan.projections[0])
        assert first.shape == tuple(scan.projections.shape[1:]), (first.shape, scan.projections.shape)
        for extra in (scan.flats, scan.darks):
            if extra is not None:
                np.asarray(extra[:1])
        if scan.angles is not None:
            assert len(scan.angles) == scan.projections.shape[0]
        return "read"
    except (ScanFileError, guarded_open.InputError) as e:
        assert str(e).strip(), "an empty error message"
        return "refused"


def main(argv) -> int:
    root, n = Path(argv[1]), int(argv[2])
    seed = int(argv[3]) if len(argv) > 3 else 0
    signal.signal(signal.SIGALRM, _alarm)
    pristine = root / "pristine"
    bases = write_bases(pristine)
    for fmt, path in bases.items():             # every base reads: the fuzz starts from valid files
        assert check_read(path) == "read", fmt
    work = root / "work"
    counts: dict[str, dict[str, int]] = {f: {"read": 0, "refused": 0} for f in bases}

    @settings(max_examples=n, deadline=None, derandomize=seed == 0, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutation(bases))
    def hostile(m):
        fmt, target, data, what = m.fmt, m.target, m.data, m.what
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(pristine, work)
        rel = target.relative_to(pristine)
        (work / rel).write_bytes(data)
        path = work / bases[fmt].relative_to(pristine)
        signal.alarm(EXAMPLE_S)
        try:
            outcome = check_read(path)
        except ExampleTimeout:
            raise AssertionError(f"{fmt}: {what}: read_scan ran past {EXAMPLE_S} s") from None
        except AssertionError:
            raise
        except BaseException as e:  # noqa: BLE001 - any other exception is the finding
            if COLLECT:
                found.setdefault((fmt, type(e).__name__, str(e)[:120]), what)
                return
            raise AssertionError(f"{fmt}: {what}: {type(e).__name__}: {e}") from e
        finally:
            signal.alarm(0)
        counts[fmt][outcome] += 1

    found: dict = {}
    hostile()
    for (fmt, kind, msg), what in sorted(found.items()):
        print(f"FINDING {fmt} | {what} | {kind}: {msg}")
    total = {k: sum(c[k] for c in counts.values()) for k in ("read", "refused")}
    by = ", ".join(f"{f} {c['read'] + c['refused']}" for f, c in counts.items())
    print(f"FUZZ OK {total['read'] + total['refused']} files ({total['read']} read, {total['refused']} refused) "
          f"by format: {by}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
