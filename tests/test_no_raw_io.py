"""No file is read or written outside the guarded ways in and out (docs/RELIABILITY.md).

The package (ctbench/ and the napari plugin) is parsed, and every call that opens a file by itself is found:
``open(...)``, ``Path.read_text/read_bytes/write_text/write_bytes``, ``h5py.File``, ``olefile.*``,
``np.load/np.memmap/np.fromfile`` and tifffile's readers and writers.  Each must sit in one of the modules that
*are* the ways in and out, or be in ALLOWED with the reason it needs no guard.  A new raw call fails this test
until it goes through ``ctbench.guarded_open`` / ``ctbench.io.errors`` (reads) or ``ctbench.output_policy`` /
``ctbench.atomic_files`` (writes), or is added here with its reason; an entry that no longer matches fails too.
"""

import ast
import os
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "ctbench", ROOT / "plugins" / "ctbench_napari"]
WAYS_IN_AND_OUT = {"ctbench/guarded_open.py", "ctbench/io/errors.py", "ctbench/atomic_files.py"}

RAW_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes"}
RAW_FUNCTIONS = {("h5py", "File"), ("np", "load"), ("np", "memmap"), ("np", "fromfile"), ("tifffile", "imread"),
                 ("tifffile", "imwrite"), ("tifffile", "TiffFile")}

GUARDED_HANDLE = "a file object from the guarded opener (regular, non-blocking, bounded) is handed to the library"
CHECKED_FIRST = "the path passed guarded_open.check_regular / io.errors.check_input just before (the library opens by name)"
OWN_STAGING = "writes an exclusive staging file of an output reserved under the output policy"
SYSTEM_FILE = "a kernel-provided /proc file, not a user's"
PACKAGE_FILE = "a file shipped inside the installed package (kernel sources, the sbatch template)"
BRIDGE_STATE = "the job bridge's own state folder (created 0700 by the bridge; never a user-named path)"
KERNEL_CACHE = "ctbench's kernel build cache (keyed by content; its records are checked by library_trust)"

ALLOWED = {
    ("ctbench/compat/storage.py", "NpyStore.__init__", "np.load"): CHECKED_FIRST,
    ("ctbench/engine/cpu/library.py", "cpu_signature", ".read_text"): SYSTEM_FILE,
    ("ctbench/engine/cpu/library.py", "_arch_flags", ".write_text"): KERNEL_CACHE + ": a compiler probe source",
    ("ctbench/engine/cpu/library.py", "cache_key", ".read_bytes"): PACKAGE_FILE,
    ("ctbench/engine/cpu/library.py", "_build", "open"): KERNEL_CACHE + ": hashing the library just built",
    ("ctbench/engine/cpu/prebuilt.py", "_file_sha", ".read_bytes"): "a prebuilt library shipped in the wheel",
    ("ctbench/engine/cuda.py", "entry_source", ".read_text"): PACKAGE_FILE,
    ("ctbench/engine/cuda_emulation.py", "emulation_library", ".read_text"): PACKAGE_FILE,
    ("ctbench/engine/cuda_emulation.py", "emulation_library", ".write_text"): KERNEL_CACHE,
    ("ctbench/engine/plan.py", "available_host_memory", "open"): SYSTEM_FILE,
    ("ctbench/pipeline/budget.py", "baseline_bytes", "open"): SYSTEM_FILE,
    ("ctbench/io/export.py", "_write_tiff", "tifffile.imwrite"): OWN_STAGING,
    ("ctbench/io/export.py", "_write_hdf5", "h5py.File"): OWN_STAGING,
    ("ctbench/io/export.py", "_read_tiff_volume", "tifffile.TiffFile"): GUARDED_HANDLE,
    ("ctbench/io/export.py", "_read_hdf5_volume", "h5py.File"): CHECKED_FIRST,
    ("ctbench/io/nexus.py", "open_hdf5", "h5py.File"): GUARDED_HANDLE,
    ("ctbench/io/raw.py", "read_raw", "np.memmap"): CHECKED_FIRST + "; its size equals the declared shape",
    ("ctbench/io/sample_scan.py", "write_scan_folder", "tifffile.imwrite"): "the sample scan written into a fresh "
                                                                            "temporary folder, then moved in place",
    ("ctbench/io/sample_scan.py", "write_scan_folder", ".write_text"): "the sample scan's fresh temporary folder",
    ("ctbench/io/tiff.py", "_page_info", "tifffile.TiffFile"): GUARDED_HANDLE,
    ("ctbench/io/tiff.py", "_read_file", "tifffile.TiffFile"): GUARDED_HANDLE,
    ("ctbench/io/tiff.py", "_read_page", "tifffile.TiffFile"): GUARDED_HANDLE,
    ("ctbench/io/zeiss.py", "_open", "olefile.OleFileIO"): GUARDED_HANDLE,
    ("ctbench/output_policy.py", "_tiff_marked", "tifffile.TiffFile"): "an existing output's marker, after "
                                                                        "written_by_ctbench's S_ISREG check",
    ("ctbench/output_policy.py", "_hdf5_marked", "h5py.File"): "an existing output's marker, after "
                                                               "written_by_ctbench's S_ISREG check",
    ("ctbench/storage/zarr_store.py", "write_chunk_positions", ".read_bytes"): "the writer's own store, just written",
    ("ctbench/storage/zarr_store.py", "write_chunk_positions", "open"): "the writer's own store, just written",
    ("ctbench/storage/zarr_store.py", "AtomicLocalStore._read_checked", "open"): "after safe_file_size (regular, "
                                                                                 "inside the store, bounded)",
    ("ctbench/storage/zarr_store.py", "AtomicLocalStore._recorded_crc", "open"): "after safe_file_size (regular, "
                                                                                 "inside the store, exact size)",
    ("ctbench/workbench/dataset.py", "_read_small_json", "open"): "after safe_file_size (regular, inside the "
                                                                  "dataset, bounded)",
    ("ctbench/jobs/bridge.py", "Bridge.acquire", ".read_text"): BRIDGE_STATE,
    ("ctbench/jobs/bridge.py", "_last_line", ".read_text"): BRIDGE_STATE,
    ("ctbench/jobs/client.py", "locate", ".read_text"): BRIDGE_STATE,
    ("ctbench/jobs/client.py", "ensure_local_bridge", "open"): BRIDGE_STATE + ": the bridge's log",
    ("ctbench/jobs/events.py", "read_events", ".read_bytes"): BRIDGE_STATE + ": a job's event log",
    ("ctbench/jobs/events.py", "EventIndex.refresh", "open"): BRIDGE_STATE + ": a job's event log",
    ("ctbench/jobs/events.py", "EventIndex.read", "open"): BRIDGE_STATE + ": a job's event log",
    ("ctbench/jobs/launcher.py", "launch", "open"): BRIDGE_STATE + ": a job's log",
    ("ctbench/jobs/launcher.py", "_proc_state", "open"): SYSTEM_FILE,
    ("ctbench/jobs/launcher.py", "job_processes", "open"): SYSTEM_FILE,
    ("ctbench/jobs/launcher.py", "read_exit_code", ".read_text"): BRIDGE_STATE,
    ("ctbench/jobs/service.py", "create_app.logs", "open"): BRIDGE_STATE + ": a job's log",
    ("ctbench/jobs/service.py", "create_app.result", ".read_text"): BRIDGE_STATE,
    ("ctbench/jobs/slurm.py", "render_sbatch", ".read_text"): PACKAGE_FILE,
    ("ctbench/jobs/worker.py", "Job.__init__", ".read_text"): BRIDGE_STATE + ": the spec the bridge wrote",
}


def _raw_calls(path: Path):
    """(enclosing function's dotted name, call) for each raw file call in one module."""
    found = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name])
                continue
            if isinstance(child, ast.Call):
                f, name = child.func, None
                if isinstance(f, ast.Name) and f.id == "open":
                    name = "open"
                elif isinstance(f, ast.Attribute):
                    base = f.value.id if isinstance(f.value, ast.Name) else None
                    if f.attr in RAW_METHODS and base != "guarded_open":
                        name = "." + f.attr
                    elif (base, f.attr) in RAW_FUNCTIONS or base == "olefile":
                        name = f"{base}.{f.attr}"
                if name:
                    found.append((".".join(scope) or "<module>", name))
            visit(child, scope)

    visit(ast.parse(path.read_text(encoding="utf-8")), [])
    return found


def _all_raw_calls():
    calls = set()
    for pkg in PACKAGES:
        for p in sorted(pkg.rglob("*.py")):
            rel = p.relative_to(ROOT).as_posix()
            if rel not in WAYS_IN_AND_OUT:
                calls.update((rel, *c) for c in _raw_calls(p))
    return calls


def test_every_raw_file_call_is_a_way_in_or_out_or_allowed_with_a_reason():
    calls = _all_raw_calls()
    unguarded = sorted(calls - ALLOWED.keys())
    assert not unguarded, ("file calls outside the guarded opener and the output policy (route them through "
                           "ctbench.guarded_open / ctbench.output_policy, or add them to ALLOWED with the reason): "
                           f"{unguarded}")
    stale = sorted(ALLOWED.keys() - calls)
    assert not stale, f"ALLOWED entries that match no call any more (remove them): {stale}"


def test_the_scanner_finds_each_kind_of_raw_call(tmp_path):
    """The scanner itself: each pattern it claims to find is found, in its function; guarded calls are not."""
    src = tmp_path / "m.py"
    src.write_text(
        "import h5py, olefile, tifffile\nimport numpy as np\nfrom ctbench import guarded_open\n"
        "def a(p):\n    open(p)\n    p.read_text()\n    p.write_bytes(b'')\n"
        "class K:\n    def b(self, p):\n        h5py.File(p)\n        olefile.OleFileIO(p)\n"
        "        np.memmap(p)\n        tifffile.imread(p)\n"
        "def c(p):\n    guarded_open.read_bytes(p)\n")
    assert sorted(_raw_calls(src)) == sorted([
        ("a", "open"), ("a", ".read_text"), ("a", ".write_bytes"), ("K.b", "h5py.File"),
        ("K.b", "olefile.OleFileIO"), ("K.b", "np.memmap"), ("K.b", "tifffile.imread")])


def _fifo_refused_in_time(fifo: Path, call):
    """``call`` on a FIFO with no writer returns or raises within 10 s (a hang would block forever)."""
    outcome = {}

    def run():
        try:
            call()
            outcome["result"] = "returned"
        except Exception as e:  # noqa: BLE001
            outcome["result"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        with open(fifo, "wb"):       # unblock the reader so the thread can end
            pass
        pytest.fail(f"{call} blocked on the FIFO {fifo}")
    return outcome["result"]


def test_checkpoint_files_that_are_fifos_are_refused_not_read(tmp_path):
    """The two readers this scan routed through the guard: a disk solver's checkpoint and a compat NpyStore."""
    from ctbench import guarded_open
    from ctbench.compat.storage import NpyStore

    fifo = tmp_path / "state.npy"
    os.mkfifo(fifo)
    err = _fifo_refused_in_time(fifo, lambda: NpyStore(fifo, mode="r"))
    assert isinstance(err, guarded_open.InputError) and "FIFO" in str(err)

    np.save(tmp_path / "ok.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert NpyStore(tmp_path / "ok.npy", mode="r").shape == (2, 3)

    from ctbench.solvers.checkpoint import CheckpointError, Checkpoints

    ck = Checkpoints(tmp_path / "ck")
    ck.path(3).mkdir(parents=True)
    os.mkfifo(ck.path(3) / "manifest.json")
    err = _fifo_refused_in_time(ck.path(3) / "manifest.json", lambda: ck.read_manifest(3))
    assert isinstance(err, CheckpointError) and "manifest" in str(err)
