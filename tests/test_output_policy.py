"""The output policy (ctbench/output_policy.py) through every writer: recon, export_volume, save_dataset,
the napari writer; crash-safe replacement by exchange with real SIGKILLs (issue 20, findings 2 and 5)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ctbench.io import read_volume
from ctbench.io.export import export_volume
from ctbench.pipeline import load_config, run_recon
from ctbench.output_policy import (ForeignOutputError, OutputOverlapError, check_output, replace_into_place,
                                   staging_path, written_by_ctbench)
from ctbench.workbench.dataset import load_dataset, save_dataset

HERE = Path(__file__).resolve().parent
VOL = np.arange(8 * 6 * 5, dtype=np.float32).reshape(8, 6, 5)


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def tree(path: Path) -> dict:
    """Every file under ``path`` with its bytes (to show that nothing was touched)."""
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ recon (finding 2)
@pytest.fixture(scope="module")
def lab_scan(tmp_path_factory):
    from ctbench.io.sample_scan import LabScanSpec, write_lab_scan
    return write_lab_scan(tmp_path_factory.mktemp("scan") / "lab_scan", LabScanSpec())


def _config(tmp_path, scan, out, **output):
    cfg = {"input": {"path": str(scan)}, "preprocess": {"bin": 4, "every": 4},
           "geometry": {"detector_offset_u_mm": 0.0, "volume_shape": [8, 24, 24], "voxel_size_mm": 3.0},
           "algorithm": {"name": "fbp"}, "output": {"path": str(out), **output}}
    p = tmp_path / "recon.json"
    p.write_text(json.dumps(cfg))
    return p


def _recon_cli(cfg, *extra):
    return subprocess.run([sys.executable, "-m", "ctbench.cli", "recon", str(cfg), *extra], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_recon_refuses_to_write_over_its_scan_folder(lab_scan, tmp_path):
    before = tree(lab_scan)
    cfg = _config(tmp_path, lab_scan, lab_scan, format="zarr", overwrite=True, force=True)
    with pytest.raises(OutputOverlapError, match="is the input"):
        run_recon(load_config(cfg))
    inside = _config(tmp_path, lab_scan, lab_scan / "recon.zarr", overwrite=True)
    with pytest.raises(OutputOverlapError, match="inside the input"):
        run_recon(load_config(inside))
    around = _config(tmp_path, lab_scan, lab_scan.parent, format="zarr", overwrite=True, force=True)
    with pytest.raises(OutputOverlapError, match="contains the input"):
        run_recon(load_config(around))
    out = _recon_cli(_config(tmp_path, lab_scan, lab_scan, format="zarr", overwrite=True), "--force")
    assert out.returncode == 2 and "is the input" in out.stderr, out.stderr
    assert tree(lab_scan) == before


def test_recon_refuses_an_output_folder_that_does_not_exist_before_reading_the_scan(tmp_path):
    cfg = _config(tmp_path, tmp_path / "no-scan-here", tmp_path / "missing" / "recon.tif")
    with pytest.raises(ValueError, match="cannot be written"):   # about the output: the scan is never opened
        run_recon(load_config(cfg))


def test_recon_refuses_scan_tif_as_its_own_output_and_a_hard_link_of_it(tmp_path):
    import tifffile

    scan = tmp_path / "scan.tif"
    tifffile.imwrite(scan, np.full((4, 6, 5), 1000, np.uint16), photometric="minisblack")
    raw = scan.read_bytes()
    with pytest.raises(OutputOverlapError, match="is the input"):
        run_recon(load_config(_config(tmp_path, scan, scan, overwrite=True)))
    link = tmp_path / "out.tif"
    os.link(scan, link)
    with pytest.raises(OutputOverlapError, match="hard link"):
        run_recon(load_config(_config(tmp_path, scan, link, overwrite=True, force=True)))
    assert scan.read_bytes() == raw


@pytest.mark.slow
def test_recon_replaces_its_own_output_but_not_a_foreign_file_without_force(lab_scan, tmp_path):
    out = tmp_path / "recon.tif"
    cfg = _config(tmp_path, lab_scan, out)
    assert _recon_cli(cfg).returncode == 0
    first = out.read_bytes()
    assert written_by_ctbench(out)
    again = _recon_cli(cfg, "--overwrite")
    assert again.returncode == 0, again.stderr   # ctbench's own export: replaced
    foreign = tmp_path / "foreign.tif"
    import tifffile
    tifffile.imwrite(foreign, np.ones((3, 4, 4), np.float32), photometric="minisblack")     # a TIFF some other program wrote
    cfg2 = _config(tmp_path, lab_scan, foreign)
    refused = _recon_cli(cfg2, "--overwrite")
    assert refused.returncode == 2 and "not a ctbench dataset or export" in refused.stderr, refused.stderr
    assert tifffile.imread(foreign).shape == (3, 4, 4)
    forced = _recon_cli(cfg2, "--force")
    assert forced.returncode == 0, forced.stderr
    assert read_volume(foreign)[0].shape == read_volume(out)[0].shape
    assert len(first) > 0 and siblings(out) == sorted(["foreign.tif", "recon.json"])


# ------------------------------------------------------------------ export_volume (finding 2)
@pytest.mark.parametrize("name", ["out.tif", "out.h5", "out.zarr"])
def test_export_overwrite_never_deletes_a_foreign_folder(tmp_path, name):
    target = tmp_path / name
    target.mkdir()
    (target / "thesis.txt").write_text("years of work")
    with pytest.raises(ForeignOutputError, match="force"):
        export_volume(target, VOL, 0.5, overwrite=True)
    assert (target / "thesis.txt").read_text() == "years of work" and siblings(target) == []
    export_volume(target, VOL, 0.5, overwrite=True, force=True)    # explicitly forced: replaced
    np.testing.assert_array_equal(read_volume(target)[0], VOL)
    assert siblings(target) == []


def test_export_overwrite_refuses_foreign_files_and_replaces_ctbench_exports(tmp_path):
    import h5py
    import tifffile

    tif, h5 = tmp_path / "a.tif", tmp_path / "a.h5"
    tifffile.imwrite(tif, np.ones((2, 3, 3), np.float32), photometric="minisblack")
    with h5py.File(h5, "w") as f:
        f["volume"] = np.ones((2, 3, 3), np.float32)
    before = {p: p.read_bytes() for p in (tif, h5)}
    for p in (tif, h5):
        with pytest.raises(ForeignOutputError):
            export_volume(p, VOL, 0.5, overwrite=True)
        assert p.read_bytes() == before[p]
    fifo = tmp_path / "pipe.tif"
    os.mkfifo(fifo)
    with pytest.raises(ForeignOutputError):   # judged without opening it (a FIFO would block)
        export_volume(fifo, VOL, 0.5, overwrite=True)
    for name in ("b.tif", "b.h5", "b.zarr"):
        p = export_volume(tmp_path / name, VOL, 0.5)
        assert written_by_ctbench(p)
        export_volume(p, VOL * 2, 0.25, overwrite=True)
        vol, sp = read_volume(p)
        np.testing.assert_array_equal(vol, VOL * 2)
        assert sp == (0.25, 0.25, 0.25)
    with pytest.raises(FileExistsError, match="overwrite"):
        export_volume(tmp_path / "b.tif", VOL, 0.5)


def test_export_refuses_outputs_over_inputs(tmp_path):
    scan = tmp_path / "scan"
    scan.mkdir()
    (scan / "p.tif").write_bytes(b"raw")
    for out, words in ((scan / "x.tif", "inside"), (tmp_path / "scan", "is the input")):
        with pytest.raises(OutputOverlapError, match=words):
            export_volume(out, VOL, 0.5, overwrite=True, force=True, inputs=[scan], format="tiff")
    with pytest.raises(OutputOverlapError, match="contains"):
        check_output(tmp_path, [scan / "p.tif"], overwrite=True, force=True)
    assert (scan / "p.tif").read_bytes() == b"raw"


# ------------------------------------------------------------------ save_dataset and the napari writer
def test_save_dataset_follows_the_policy(tmp_path):
    src = save_dataset(tmp_path / "in.zarr", volume=VOL, voxel_spacing=1.0)
    with pytest.raises(OutputOverlapError):
        save_dataset(src, volume=VOL, voxel_spacing=1.0, overwrite=True, inputs=[src])
    with pytest.raises(OutputOverlapError):
        save_dataset(src / "sub.zarr", volume=VOL, voxel_spacing=1.0, inputs=[src])
    plain = tmp_path / "plain.zarr"
    plain.write_text("not a folder")
    with pytest.raises(ForeignOutputError):
        save_dataset(plain, volume=VOL, voxel_spacing=1.0, overwrite=True)
    save_dataset(plain, volume=VOL, voxel_spacing=1.0, overwrite=True, force=True)
    np.testing.assert_array_equal(load_dataset(plain).volume, VOL)


def test_napari_writer_never_replaces_the_dataset_a_lazy_layer_reads(tmp_path):
    from ctbench_napari._io import DatasetWriteError, read_dataset, write_dataset

    src = save_dataset(tmp_path / "scan.zarr", volume=VOL, voxel_spacing=1.0)
    layers = read_dataset(str(src))
    before = tree(src)
    with pytest.raises(DatasetWriteError, match="is the input"):
        write_dataset(str(src), layers)
    assert tree(src) == before
    [copy] = write_dataset(str(tmp_path / "copy"), layers)
    np.testing.assert_array_equal(load_dataset(copy).volume, VOL)


# ------------------------------------------------------------------ replace by exchange
def test_replace_swaps_back_a_path_that_someone_else_filled(tmp_path):
    path = tmp_path / "res.zarr"
    new = staging_path(path)
    new.mkdir()
    (new / "mine").write_text("new")
    path.mkdir()                           # appeared after the policy check
    (path / "theirs").write_text("keep")
    with pytest.raises(ForeignOutputError):
        replace_into_place(new, path, may_replace=lambda old: False)
    assert (path / "theirs").read_text() == "keep" and (new / "mine").read_text() == "new"


@pytest.mark.parametrize("name", ["v.h5", "v.tif"])
@pytest.mark.parametrize("mode, expect", [
    ("writing", "old"),                # killed while the new file is written aside
    ("before_exchange", "old"),        # complete, not yet swapped
    ("after_exchange", "new"),         # swapped, old not yet deleted
    ("between_renames", "new"),        # finding 5: fallback swap, target missing, data in hidden siblings
])
def test_export_killed_during_replace_leaves_old_or_new_and_is_recovered(tmp_path, name, mode, expect):
    path = tmp_path / name
    old = np.full((8, 6, 5), -1.0, np.float32)
    export_volume(path, old, 0.25, meta={"which": "old"})
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
    proc = subprocess.run([sys.executable, str(HERE / "crash_scripts" / "export_and_die.py"), mode, str(path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    if mode == "between_renames":
        assert not path.exists() and siblings(path), "the kill point was not between the renames"
    vol, sp = read_volume(path)        # the next open recovers an interrupted replace
    np.testing.assert_array_equal(vol, old if expect == "old" else np.full((8, 6, 5), 7.0, np.float32))
    assert sp == ((0.25,) * 3 if expect == "old" else (0.5,) * 3)
    export_volume(path, old, 1.0, overwrite=True)     # the next write removes the dead writer's leftovers
    assert siblings(path) == []


def test_the_leftovers_of_an_export_killed_by_an_older_ctbench_are_recovered(tmp_path):
    """Finding 5 as the old export left it: the target missing, `.v.h5.old-PID` and `.v.h5.tmp-PID`."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "v.h5"
    export_volume(tmp_path / "old.h5", np.full((2, 3, 3), 1.0, np.float32), 1.0)
    export_volume(tmp_path / "new.h5", np.full((2, 3, 3), 2.0, np.float32), 1.0)
    os.rename(tmp_path / "old.h5", tmp_path / f".v.h5.old-{dead.pid}")
    os.rename(tmp_path / "new.h5", tmp_path / f".v.h5.tmp-{dead.pid}")
    vol, _ = read_volume(path)
    np.testing.assert_array_equal(vol, np.full((2, 3, 3), 2.0, np.float32))
    export_volume(path, vol, 1.0, overwrite=True)
    assert siblings(path) == []
