"""Issue 20, the input side: one guarded way to open inputs, bounds before allocation, no silent coercions.

Hanging cases (FIFOs) run in a subprocess with a timeout, so that a regression fails instead of hanging the
suite; files are real FIFOs (os.mkfifo), real symlinks and /dev/zero.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import tifffile

from ctbench import guarded_open
from ctbench.io import read_scan, read_volume
from ctbench.io.errors import ScanFileError, read_json_object
from ctbench.io.raw import read_raw
from ctbench.io.readers import detect_format
from ctbench.io.scanner import scanner_json
from ctbench.preprocessing import crop

from io_helpers import write_nxtomo

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
needs_dev_zero = pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")


def _memory_limit() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))


def _run(code: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with 2 GiB of data memory: a hang becomes a TimeoutExpired and a read
    without end a MemoryError (failures), not a stuck suite or a machine out of memory."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_memory_limit)


def _scanner_folder(d: Path, n: int = 3) -> Path:
    (d / "projections").mkdir(parents=True)
    for i in range(n):
        tifffile.imwrite(d / "projections" / f"proj_{i}.tif", np.full((6, 8), 100 + i, np.uint16))
    return d


# ------------------------------------------------------------------ the guarded open itself
def test_a_fifo_is_refused_at_once_not_read(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    r = _run(f"from ctbench import guarded_open\n"
             f"try:\n    guarded_open.read_json({str(fifo)!r})\n"
             f"except guarded_open.InputError as e:\n    print('REFUSED', e)\n", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "REFUSED" in r.stdout and "FIFO" in r.stdout and str(fifo) in r.stdout


@needs_dev_zero
def test_a_link_to_dev_zero_is_refused_not_read(tmp_path):
    link = tmp_path / "meta.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(guarded_open.InputError, match="character device"):
        guarded_open.read_bytes(link)
    with pytest.raises(guarded_open.InputError, match="character device"):
        guarded_open.check_regular(link)


def test_folders_are_refused_and_missing_files_named(tmp_path):
    with pytest.raises(guarded_open.InputError, match="folder"):
        guarded_open.read_bytes(tmp_path)
    with pytest.raises(guarded_open.InputError, match=f"{tmp_path / 'nope.json'}: does not exist"):
        guarded_open.read_bytes(tmp_path / "nope.json")


def test_a_link_leaving_the_root_is_refused_and_one_inside_is_followed(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    root = tmp_path / "root"
    root.mkdir()
    (root / "inside.json").write_text('{"a": 1}')
    (root / "out.json").symlink_to(outside)
    (root / "alias.json").symlink_to(root / "inside.json")
    with pytest.raises(guarded_open.InputError, match="outside"):
        guarded_open.read_json(root / "out.json", root=root)
    assert guarded_open.read_json(root / "alias.json", root=root) == {"a": 1}
    assert guarded_open.read_json(root / "out.json") == {}          # without a root, links are followed


def test_whole_reads_are_bounded_with_the_documented_override(tmp_path, monkeypatch):
    p = tmp_path / "big.json"
    p.write_text(json.dumps({"x": "a" * 5000}))
    monkeypatch.setenv("CTBENCH_READER_MAX_BYTES", "1000")
    with pytest.raises(guarded_open.InputError, match="more than the bound of 1000 bytes for a file read whole; raise CTBENCH_READER_MAX"):
        guarded_open.read_json(p)
    monkeypatch.setenv("CTBENCH_READER_MAX_BYTES", "100000")
    assert len(guarded_open.read_json(p)["x"]) == 5000
    monkeypatch.setenv("CTBENCH_READER_MAX_BYTES", "-3")
    with pytest.raises(ValueError, match="CTBENCH_READER_MAX_BYTES must be a positive number"):
        guarded_open.read_json(p)


def test_json_nested_too_deeply_is_an_input_error_not_a_recursion_error(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100000)
    with pytest.raises(ScanFileError, match="nested too deeply"):
        read_json_object(p)


# ------------------------------------------------------------------ finding 1: scan folders with FIFOs
def test_a_fifo_named_scan_json_does_not_block_read_scan_or_detect_format(tmp_path):
    d = _scanner_folder(tmp_path / "scan")
    os.mkfifo(d / "scan.json")
    r = _run("from ctbench.io import read_scan, detect_format, ScanFileError\n"
             f"for f in (read_scan, detect_format):\n"
             f"    try:\n        f({str(d)!r})\n        print('ACCEPTED')\n"
             f"    except ScanFileError as e:\n        print('REFUSED', e)\n", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("REFUSED") == 2 and "FIFO" in r.stdout, r.stdout


def test_a_fifo_among_the_json_files_is_skipped_without_blocking(tmp_path):
    d = _scanner_folder(tmp_path / "scan")
    (d / "params.json").write_text(json.dumps(scanner_json(sid=100, sdd=200, pixel_size=(1, 1), n_projections=3)))
    os.mkfifo(d / "other.json")
    r = _run(f"from ctbench.io.scanner import find_scanner_json\nprint(find_scanner_json({str(d)!r}))", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(d / "params.json")


@needs_dev_zero
def test_scan_json_linked_to_dev_zero_is_refused(tmp_path):
    d = _scanner_folder(tmp_path / "scan")
    (d / "scan.json").symlink_to("/dev/zero")
    r = _run("from ctbench.io import read_scan, ScanFileError\n"
             "from ctbench.io.scanner import find_scanner_json\n"
             "for f in (read_scan, find_scanner_json):\n"
             f"    try:\n        f({str(d)!r})\n        print('ACCEPTED')\n"
             "    except ScanFileError as e:\n        print('REFUSED', e)\n", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("REFUSED") == 2 and r.stdout.count("character device") == 2, r.stdout


def test_scanner_images_may_not_leave_the_scan_folder(tmp_path):
    d = _scanner_folder(tmp_path / "scan")
    elsewhere = _scanner_folder(tmp_path / "elsewhere")
    doc = scanner_json(sid=100, sdd=200, pixel_size=(1, 1), n_projections=3)
    doc["files"] = {"projections": "projections/*.tif"}        # this scan has no flats or darks
    (d / "scan.json").write_text(json.dumps(doc))
    assert read_scan(d).n_views == 3
    doc["files"]["projections"] = "../elsewhere/projections/*.tif"
    (d / "scan.json").write_text(json.dumps(doc))
    with pytest.raises(ScanFileError, match="outside"):
        read_scan(d)
    doc["files"]["projections"] = "projections/*.tif"
    (d / "scan.json").write_text(json.dumps(doc))
    (d / "projections" / "proj_1.tif").unlink()
    (d / "projections" / "proj_1.tif").symlink_to(elsewhere / "projections" / "proj_1.tif")
    with pytest.raises(ScanFileError, match="outside"):
        read_scan(d)


@pytest.mark.slow
def test_fifo_tiffs_and_raw_files_are_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "scan.tif")
    os.mkfifo(tmp_path / "scan.raw")
    folder = _scanner_folder(tmp_path / "folder")
    os.mkfifo(folder / "projections" / "proj_9.tif")
    r = _run("from ctbench.io import read_scan, ScanFileError\n"
             f"for args in (({str(tmp_path / 'scan.tif')!r}, {{}}), "
             f"({str(tmp_path / 'scan.raw')!r}, {{'raw': {{'shape': (2, 3, 4)}}}}), "
             f"({str(folder / 'projections')!r}, {{}})):\n"
             f"    try:\n        read_scan(args[0], **args[1])\n        print('ACCEPTED')\n"
             f"    except ScanFileError as e:\n        print('REFUSED', e)\n", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("REFUSED") == 3 and r.stdout.count("FIFO") == 3, r.stdout


def test_the_napari_scan_reader_declines_a_fifo_tif(tmp_path):
    os.mkfifo(tmp_path / "scan.tif")
    r = _run("import sys; sys.path.insert(0, 'plugins')\n"
             "from ctbench_napari._scan_io import get_scan_reader\n"
             f"print('READER', get_scan_reader({str(tmp_path / 'scan.tif')!r}))", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "READER None" in r.stdout


def test_a_fifo_recon_config_is_rc_2_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "recon.json")
    r = subprocess.run([sys.executable, "-m", "ctbench.cli", "recon", str(tmp_path / "recon.json")], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "FIFO" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ finding 7: declared sizes bounded first
def _deflate_bomb(path: Path, width: int = 60000, height: int = 60000) -> Path:
    """A tiny deflate TIFF whose tags declare ``width x height`` 8-bit pixels (written by hand, as an attacker
    or a damaged writer would)."""
    data = zlib.compress(b"")
    n_tags = 9
    data_offset = 8 + 2 + 12 * n_tags + 4
    tags = [(256, 4, width), (257, 4, height), (258, 3, 8), (259, 3, 8), (262, 3, 1), (273, 4, data_offset),
            (277, 3, 1), (278, 4, height), (279, 4, len(data))]
    ifd = struct.pack("<H", n_tags)
    for tag, typ, value in tags:
        ifd += struct.pack("<HHI", tag, typ, 1) + (struct.pack("<HH", value, 0) if typ == 3
                                                   else struct.pack("<I", value))
    path.write_bytes(b"II" + struct.pack("<HI", 42, 8) + ifd + struct.pack("<I", 0) + data)
    return path


def test_a_tiny_deflate_tiff_declaring_60000_squared_is_refused_before_decompression(tmp_path, monkeypatch):
    bomb = _deflate_bomb(tmp_path / "bomb.tif")
    assert bomb.stat().st_size < 200
    with tifffile.TiffFile(bomb) as tif:           # the file is a valid TIFF that declares what the test says
        assert tif.pages[0].shape == (60000, 60000) and tif.pages[0].compression == 8
    with pytest.raises(ScanFileError, match=r"declares a page of 60000 x 60000 values .* raise CTBENCH_READER_MAX"):
        read_scan(bomb)
    r = _run("from ctbench.io import read_volume, ScanFileError\n"          # a regression would allocate 3.35 GiB
             f"try:\n    read_volume({str(bomb)!r})\n    print('ACCEPTED')\n"
             "except ScanFileError as e:\n    print('REFUSED', e)\n")
    assert r.returncode == 0 and "REFUSED" in r.stdout and "60000 x 60000" in r.stdout, (r.stdout, r.stderr[-2000:])
    folder = tmp_path / "f"
    folder.mkdir()
    os.replace(bomb, folder / "p_0.tif")
    with pytest.raises(ScanFileError, match="60000 x 60000"):
        read_scan(folder)
    # The documented override lets a user open it (opening is lazy: nothing is decompressed here).
    monkeypatch.setenv("CTBENCH_READER_MAX_BYTES", str(4 << 30))
    assert read_scan(folder).projections.shape == (1, 60000, 60000)


def _nexus_with_frames(path: Path, shape, keys=None, chunks=None) -> Path:
    import h5py

    with h5py.File(path, "w") as f:
        ent = f.create_group("entry")
        ent.attrs["NX_class"] = "NXentry"
        ent["definition"] = "NXtomo"
        det = ent.create_group("instrument/detector")
        det.create_dataset("data", shape=shape, dtype=np.uint16, chunks=chunks)   # declared, never written
        det["image_key"] = np.zeros(shape[0], np.int64) if keys is None else keys
    return path


def test_an_nxtomo_file_declaring_huge_frames_or_counts_is_refused_before_h5py_reads(tmp_path):
    big = _nexus_with_frames(tmp_path / "big.nxs", (4, 100000, 100000))
    assert big.stat().st_size < 1 << 20
    with pytest.raises(ScanFileError, match=r"declares /entry/instrument/detector/data frames of 100000 x 100000"):
        read_scan(big)
    many = _nexus_with_frames(tmp_path / "many.nxs", (2_000_000, 2, 2))
    with pytest.raises(ScanFileError, match="declares 2000000 frames, more than the reader's bound"):
        read_scan(many)



def test_an_nxtomo_chunk_spanning_many_frames_is_bounded(tmp_path, monkeypatch):
    # Reading one pixel decompresses its whole chunk: 100 frames of 2 MB in one chunk is 200 MB at once.
    p = _nexus_with_frames(tmp_path / "chunky.nxs", (100, 1000, 1000), chunks=(100, 1000, 1000))
    monkeypatch.setenv("CTBENCH_READER_MAX_BYTES", str(10 ** 7))
    with pytest.raises(ScanFileError, match="declares /entry/instrument/detector/data chunks of 100 x 1000 x 1000"):
        read_scan(p)


def test_raw_frames_are_bounded(tmp_path, monkeypatch):
    p = tmp_path / "scan.raw"
    p.write_bytes(b"\0" * (2 * 30 * 40 * 2))
    monkeypatch.setenv("CTBENCH_READER_MAX_BYTES", "1000")
    with pytest.raises(ScanFileError, match="declares a frame of 30 x 40 values"):
        read_raw(p, (2, 30, 40))
    monkeypatch.delenv("CTBENCH_READER_MAX_BYTES")
    assert read_raw(p, (2, 30, 40)).shape == (2, 30, 40)


# ------------------------------------------------------------------ finding 10: silent coercions refused
def test_image_key_must_be_whole_numbers(tmp_path):
    stack = np.ones((4, 3, 5), np.uint16)
    p = write_nxtomo(tmp_path / "k.nxs", stack, stack[:1], stack[:1], np.arange(4.0), 1e-3)
    import h5py
    with h5py.File(p, "a") as f:
        k = f["entry/instrument/detector/image_key"][...]
        del f["entry/instrument/detector/image_key"]
        f["entry/instrument/detector/image_key"] = np.where(np.arange(k.size) == 0, 0.7, k).astype(np.float64)
    with pytest.raises(ScanFileError, match=r"image_key must hold whole numbers 0-3, got \[0.7\]"):
        read_scan(p)


@pytest.mark.parametrize("shape", [(2.7, 3.2, 4.9), (True, True, True), (2, 3, 0), ("2", 3, 4), (2, 3, 4, 5)])
def test_read_raw_shape_must_be_positive_whole_numbers(tmp_path, shape):
    p = tmp_path / "s.raw"
    p.write_bytes(b"\0" * 200)
    with pytest.raises(ValueError, match="shape must be"):
        read_raw(p, shape)


def test_read_raw_accepts_whole_floats_as_before(tmp_path):
    p = tmp_path / "s.raw"
    p.write_bytes(b"\0" * (2 * 3 * 4 * 2))
    assert read_raw(p, (2.0, 3, np.int64(4))).shape == (2, 3, 4)


def test_crop_rows_must_be_whole_indices():
    stack = np.zeros((2, 6, 8), np.float32)
    with pytest.raises(ValueError, match="rows must be .* whole pixel indices"):
        crop(stack, rows=(0.5, 3.9))
    with pytest.raises(ValueError, match="cols must be .* whole pixel indices"):
        crop(stack, cols=(False, 3))
    assert crop(stack, rows=(1.0, 4)).shape == (2, 3, 8)


def test_voxel_spacing_true_is_refused_everywhere(tmp_path):
    import torch

    from ctbench import Projector, circular_trajectory_3d
    from ctbench.io import export_volume
    from ctbench.workbench.dataset import save_dataset

    traj = circular_trajectory_3d(4, 50.0, 100.0)
    with pytest.raises(ValueError, match="voxel_spacing must be lengths"):
        Projector(traj, (4, 4, 4), (6, 6), voxel_spacing=True)
    with pytest.raises(ValueError, match="voxel_spacing must be lengths"):
        export_volume(tmp_path / "v.h5", np.zeros((2, 3, 4), np.float32), True)
    with pytest.raises(ValueError, match="voxel_spacing must be lengths"):
        save_dataset(tmp_path / "d.zarr", volume=torch.zeros(2, 3, 4), voxel_spacing=(1.0, True, 1.0))


def test_read_volume_refuses_damaged_spacings(tmp_path):
    import h5py

    from ctbench.io import export_volume

    vol = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for bad in ([np.nan, 1, 1], [-1, np.nan, 0]):
        p = export_volume(tmp_path / f"v{len(list(tmp_path.iterdir()))}.h5", vol, 1.0)
        with h5py.File(p, "a") as f:
            f["volume"].attrs["voxel_spacing"] = np.asarray(bad, np.float64)
        with pytest.raises(ScanFileError, match="damaged voxel spacing"):
            read_volume(p)


# ------------------------------------------------------------------ finding 13: errors that name the file/field
def test_tiff_resolution_of_zero_is_named(tmp_path):
    p = tmp_path / "v.tif"
    tifffile.imwrite(p, np.zeros((2, 3, 4), np.float32), resolution=(0, 1), photometric="minisblack")
    with pytest.raises(ScanFileError, match=r"v.tif: TIFF tag XResolution is 0/1"):
        read_volume(p)


def test_hdf5_without_volume_is_named(tmp_path):
    import h5py
    p = tmp_path / "other.h5"
    with h5py.File(p, "w") as f:
        f["something"] = np.zeros(3)
    with pytest.raises(ScanFileError, match="other.h5: has no /volume dataset"):
        read_volume(p)


def test_nexus_angle_count_names_the_dataset(tmp_path):
    import h5py
    stack = np.ones((5, 3, 4), np.uint16)
    p = write_nxtomo(tmp_path / "a.nxs", stack, stack[:1], stack[:1], np.arange(5.0), 1e-3)
    with h5py.File(p, "a") as f:
        ang = f["entry/sample/rotation_angle"][...]
        del f["entry/sample/rotation_angle"]
        f["entry/sample/rotation_angle"] = ang[:5]
    with pytest.raises(ScanFileError, match=r"/entry/sample/rotation_angle has 5 angles for 7 frames"):
        read_scan(p)


def test_non_numeric_n_projections_is_named(tmp_path):
    d = _scanner_folder(tmp_path / "scan")
    doc = scanner_json(sid=100, sdd=200, pixel_size=(1, 1), n_projections=3)
    doc["acquisition"]["n_projections"] = "many"
    (d / "scan.json").write_text(json.dumps(doc))
    with pytest.raises(ScanFileError, match=r"scan.json: acquisition.n_projections must be a whole number, "
                                            r"got 'many'"):
        read_scan(d)


def test_detect_format_of_a_missing_path_still_names_it(tmp_path):
    with pytest.raises(ScanFileError, match="does not exist"):
        detect_format(tmp_path / "nothing.tif")


def test_a_dataset_whose_metadata_nests_too_deeply_is_refused_not_a_recursion_error(tmp_path):
    import torch

    from ctbench.workbench.dataset import load_dataset, save_dataset

    d = tmp_path / "d.zarr"
    save_dataset(d, volume=torch.zeros(2, 3, 4), sinogram=torch.zeros(3, 4, 5), voxel_spacing=1.0)
    (d / "zarr.json").write_text("[" * 100000)
    with pytest.raises(ValueError, match="not a ctbench dataset|nested too deeply"):
        load_dataset(d)
    with pytest.raises(ScanFileError):
        read_scan(d, format="zarr")
