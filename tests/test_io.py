"""Scan readers (TIFF, NeXus, raw, lab-scanner folder, ctbench zarr), their error messages, and exporters."""

import json
import subprocess
import sys
import textwrap

import dask.array as da
import numpy as np
import pytest
import tifffile

from ctbench.io import ScanFileError, export_volume, read_raw, read_scan, read_tiff, read_volume
from ctbench.io.scan import images_to_sinogram, sinogram_to_images

from io_helpers import write_nxtomo

RNG = np.random.default_rng(0)
STACK = RNG.integers(0, 60000, size=(7, 12, 16), dtype=np.uint16)


def _folder(tmp_path, stack=STACK, name="proj"):
    d = tmp_path / name
    d.mkdir()
    for i, img in enumerate(stack):
        tifffile.imwrite(d / f"p_{i}.tif", img)     # natural order: p_10 after p_9
    return d


def test_tiff_folder_and_multipage_file_read_lazily_in_natural_order(tmp_path):
    stack = RNG.integers(0, 60000, size=(12, 5, 6), dtype=np.uint16)
    folder = _folder(tmp_path, stack)
    a = read_tiff(folder)
    assert isinstance(a, da.Array) and a.shape == stack.shape
    np.testing.assert_array_equal(a.compute(), stack)
    tifffile.imwrite(tmp_path / "multi.tif", stack)
    tifffile.imwrite(tmp_path / "multi_zlib.tif", stack, compression="zlib")
    for name in ("multi.tif", "multi_zlib.tif"):
        b = read_tiff(tmp_path / name)
        assert isinstance(b, da.Array)
        np.testing.assert_array_equal(b[7].compute(), stack[7])
        np.testing.assert_array_equal(b.compute(), stack)


def test_raw_reader_honours_byte_order_and_header(tmp_path):
    p = tmp_path / "scan.raw"
    p.write_bytes(b"H" * 64 + STACK.astype(">u2").tobytes())
    a = read_raw(p, STACK.shape, "uint16", "big", header=64)
    np.testing.assert_array_equal(a.compute(), STACK)
    # the same bytes read as little-endian are different numbers: byte order is really applied
    b = read_raw(p, STACK.shape, "uint16", "little", header=64)
    assert not np.array_equal(b.compute(), STACK)
    scan = read_scan(p, raw={"shape": STACK.shape, "dtype": "uint16", "byte_order": "big", "header": 64})
    assert scan.format == "raw" and scan.projections.shape == STACK.shape


def test_nexus_reader_splits_frames_by_image_key_with_angles_and_pixel_size(tmp_path):
    proj = STACK[:5]
    flats = np.full((4, 12, 16), 50000, np.uint16)
    darks = np.full((2, 12, 16), 100, np.uint16)
    angles = np.linspace(0, 180, 5, endpoint=False)
    path = write_nxtomo(tmp_path / "scan.nxs", proj, flats, darks, angles, 7.5e-6, sample_detector_m=0.05)
    scan = read_scan(path)
    assert scan.format == "nexus"
    np.testing.assert_array_equal(scan.projections.compute(), proj)
    np.testing.assert_array_equal(scan.flats.compute(), flats)
    np.testing.assert_array_equal(scan.darks.compute(), darks)
    np.testing.assert_allclose(scan.angles, np.radians(angles))
    assert scan.pixel_size == pytest.approx((7.5e-3, 7.5e-3))           # metres -> mm
    assert scan.scanner["sample_detector_distance_mm"] == pytest.approx(50.0)


def test_ctbench_dataset_reads_as_line_integral_images(tmp_path):
    from ctbench.geometry import circular_trajectory_3d
    from ctbench.workbench.dataset import save_dataset
    from ctbench.workbench.design import ScanGeometry

    geo = ScanGeometry(circular_trajectory_3d(4, 100.0, 200.0), (16, 12), (1.0, 1.0), (8, 8, 8), (1.0,) * 3)
    sino = RNG.random((4, 16, 12)).astype(np.float32)
    save_dataset(tmp_path / "d.zarr", sinogram=sino, geometry=geo)
    scan = read_scan(tmp_path / "d.zarr")
    assert scan.values == "line_integrals" and scan.format == "zarr"
    np.testing.assert_array_equal(images_to_sinogram(scan.projections.compute()), sino)
    np.testing.assert_array_equal(sinogram_to_images(sino), scan.projections.compute())
    assert scan.scanner["geometry"]["detector_shape"] == [16, 12]


def test_lab_scanner_folder_gives_angles_distances_and_fields():
    from ctbench.io.sample_scan import LabScanSpec, sample_scan_path

    spec = LabScanSpec()
    scan = read_scan(sample_scan_path())
    assert scan.format == "scanner" and scan.values == "counts"
    assert scan.projections.shape == (spec.n_views, spec.detector_v, spec.detector_u)
    assert scan.flats.shape[0] == spec.n_flats and scan.darks.shape[0] == spec.n_darks
    np.testing.assert_allclose(scan.angles, spec.angles)
    assert scan.scanner["source_object_distance_mm"] == spec.sid
    assert scan.pixel_size == (spec.pitch, spec.pitch)


# ------------------------------------------------------------- bad inputs
def _truncated_tiff(tmp_path):
    p = tmp_path / "cut.tif"
    tifffile.imwrite(p, STACK)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return p, "truncated"


def _odd_one_out(tmp_path):
    d = _folder(tmp_path)
    tifffile.imwrite(d / "p_99.tif", np.zeros((12, 15), np.uint16))
    return d, "p_99.tif"


def _not_a_tiff(tmp_path):
    p = tmp_path / "fake.tif"
    p.write_text("hello")
    return p, "not a readable TIFF"


def _bad_nexus(tmp_path):
    p = tmp_path / "fake.h5"
    p.write_text("not hdf5")
    return p, "not a readable HDF5"


def _nexus_bad_key(tmp_path):
    import h5py
    p = write_nxtomo(tmp_path / "k.nxs", STACK[:3], STACK[:2], STACK[:2], np.arange(3.0), 1e-3)
    with h5py.File(p, "a") as f:
        f["entry/instrument/detector/image_key"][0] = 7
    return p, "image_key holds [7]"


def _nexus_truncated(tmp_path):
    p = write_nxtomo(tmp_path / "t.nxs", STACK, STACK[:2], STACK[:2], np.arange(7.0), 1e-3)
    data = p.read_bytes()
    p.write_bytes(data[: int(len(data) * 0.6)])
    return p, tmp_path.name


def _nexus_no_projections(tmp_path):
    import h5py
    p = write_nxtomo(tmp_path / "n.nxs", STACK[:3], STACK[:2], STACK[:2], np.arange(3.0), 1e-3)
    with h5py.File(p, "a") as f:
        k = f["entry/instrument/detector/image_key"]
        k[...] = np.where(k[...] == 0, 3, k[...])
    return p, "no projections"


def _scanner_missing_projections(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    (d / "scan.json").write_text(json.dumps({"geometry": {}, "files": {}}))
    return d, "lacks files.projections"


def _scanner_count(tmp_path):
    from ctbench.io.scanner import scanner_json
    d = tmp_path / "s"
    (d / "projections").mkdir(parents=True)
    for i in range(3):
        tifffile.imwrite(d / "projections" / f"proj_{i}.tif", STACK[i])
    (d / "scan.json").write_text(json.dumps(scanner_json(sid=100, sdd=200, pixel_size=(1, 1), n_projections=5)))
    return d, "announces 5 projections but projections/*.tif matches 3"


def _unknown_suffix(tmp_path):
    p = tmp_path / "scan.xyz"
    p.write_text("x")
    return p, "unknown format"


BAD_FILES = [_truncated_tiff, _odd_one_out, _not_a_tiff, _bad_nexus, _nexus_bad_key, _nexus_truncated,
             _nexus_no_projections, _scanner_missing_projections, _scanner_count, _unknown_suffix]


@pytest.mark.parametrize("make", BAD_FILES, ids=[f.__name__.strip("_") for f in BAD_FILES])
def test_bad_files_get_an_error_naming_the_file_and_the_problem(tmp_path, make):
    path, words = make(tmp_path)
    with pytest.raises(ScanFileError) as e:
        read_scan(path).projections.compute()
    msg = str(e.value)
    assert path.name in msg and words in msg, msg


@pytest.mark.parametrize("kwargs, words", [
    ({"shape": (7, 12, 17)}, "truncated or smaller than described"),
    ({"shape": (7, 12, 15)}, "larger than described"),
    ({"shape": (7, 12, 16), "header": 10}, "truncated or smaller"),
])
def test_raw_size_mismatches_name_the_file_and_both_sizes(tmp_path, kwargs, words):
    p = tmp_path / "s.raw"
    p.write_bytes(STACK.astype("<u2").tobytes()[: 7 * 12 * 16 * 2])
    with pytest.raises(ScanFileError, match=words) as e:
        read_raw(p, dtype="uint16", **kwargs)
    assert "s.raw" in str(e.value) and str(7 * 12 * 16 * 2) in str(e.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"shape": (7, 12, 16), "dtype": "complex64"}, "dtype must be a numeric"),
    ({"shape": (7, 12, 16), "byte_order": "middle"}, "byte_order must be one of"),
    ({"shape": (7, -1, 16)}, "shape must be"),
    ({"shape": (7, 12, 16), "header": -4}, "header must be a byte count"),
])
def test_raw_options_are_checked(tmp_path, kwargs, words):
    p = tmp_path / "s.raw"
    p.write_bytes(STACK.tobytes())
    with pytest.raises(ValueError, match=words):
        read_raw(p, **kwargs)


def test_missing_path_and_raw_without_options(tmp_path):
    with pytest.raises(ScanFileError, match="nothing.tif: does not exist"):
        read_scan(tmp_path / "nothing.tif")
    (tmp_path / "a.raw").write_bytes(b"\0" * 8)
    with pytest.raises(ValueError, match="a raw file needs raw="):
        read_scan(tmp_path / "a.raw")


# ------------------------------------------------------------- exporters
VOL = RNG.random((5, 6, 7)).astype(np.float32)


@pytest.mark.parametrize("name", ["v.tif", "v.h5", "v.zarr"])
def test_export_round_trips_values_and_voxel_size(tmp_path, name):
    path = export_volume(tmp_path / name, VOL, (0.5, 0.25, 0.125), meta={"note": "x"})
    vol, spacing = read_volume(path)
    np.testing.assert_array_equal(vol, VOL)
    assert spacing == pytest.approx((0.5, 0.25, 0.125))
    assert [p.name for p in tmp_path.iterdir()] == [name]           # nothing left aside


def test_tiff_export_voxel_size_is_in_the_tags_imagej_reads(tmp_path):
    path = export_volume(tmp_path / "v.tif", VOL, (2.0, 0.5, 0.5))
    with tifffile.TiffFile(path) as tif:
        assert tif.imagej_metadata["unit"] == "mm" and tif.imagej_metadata["spacing"] == 2.0
        num, den = tif.pages[0].tags["XResolution"].value
        assert num / den == pytest.approx(2.0)                       # pixels per mm


class _Boom(Exception):
    pass


def _failing_volume():
    def part(i):
        if i == 3:
            raise _Boom("disk full (simulated)")
        return np.full((1, 6, 7), i, np.float32)
    import dask
    parts = [da.from_delayed(dask.delayed(part)(i), (1, 6, 7), np.float32) for i in range(40)]
    return da.concatenate(parts)


@pytest.mark.parametrize("name", ["v.tif", "v.h5", "v.zarr"])
def test_export_failing_halfway_writes_nothing_and_keeps_the_old_file(tmp_path, name):
    with pytest.raises(_Boom):
        export_volume(tmp_path / name, _failing_volume(), 1.0)
    assert list(tmp_path.iterdir()) == []
    export_volume(tmp_path / name, VOL, 1.0)
    with pytest.raises(_Boom):
        export_volume(tmp_path / name, _failing_volume(), 1.0, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == [name]
    np.testing.assert_array_equal(read_volume(tmp_path / name)[0], VOL)


def test_export_refuses_to_overwrite_and_checks_arguments(tmp_path):
    export_volume(tmp_path / "v.tif", VOL, 1.0)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_volume(tmp_path / "v.tif", VOL, 1.0)
    with pytest.raises(ValueError, match="cannot tell the export format"):
        export_volume(tmp_path / "v.png", VOL, 1.0)
    with pytest.raises(ValueError, match="voxel_spacing must be 3 positive"):
        export_volume(tmp_path / "w.tif", VOL, (1.0, -1.0, 1.0))
    with pytest.raises(ScanFileError, match="does not exist"):
        export_volume(tmp_path / "no" / "w.tif", VOL, 1.0)


# ------------------------------------------------------------- lazy loading
RSS_SCRIPT = textwrap.dedent("""
    import json, sys, psutil, numpy as np
    import ctbench.io, dask.array, tifffile
    proc = psutil.Process()
    before = proc.memory_info().rss
    scan = ctbench.io.read_scan(sys.argv[1])
    view = np.asarray(scan.projections[sys.argv[2] and int(sys.argv[2])].compute())
    after = proc.memory_info().rss
    print(json.dumps({"before": before, "after": after, "shape": list(scan.projections.shape),
                      "sum": int(view.astype(np.int64).sum()), "first": int(view[0, 0]),
                      "torch_loaded": "torch" in sys.modules}))
""")


@pytest.mark.slow
def test_reading_one_view_of_a_2gb_tiff_stays_far_below_its_size(tmp_path):
    n, rows, cols = 1024, 1024, 1024             # uint16: 2 GiB of pixel data
    path = tmp_path / "big.tif"
    mm = tifffile.memmap(path, shape=(n, rows, cols), dtype=np.uint16, photometric="minisblack")
    for i in (0, 511, n - 1):                    # the other views stay as holes in a sparse file
        mm[i] = i + 1
    mm.flush()
    del mm
    assert path.stat().st_size >= 2 * 1024 ** 3
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(path), "511"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["shape"] == [n, rows, cols] and r["first"] == 512 and r["sum"] == 512 * rows * cols
    grew = (r["after"] - r["before"]) / 2 ** 20
    print(f"RSS before open {r['before'] / 2**20:.0f} MiB, after reading one view {r['after'] / 2**20:.0f} MiB "
          f"(+{grew:.1f} MiB) for a {path.stat().st_size / 2**30:.2f} GiB file")
    assert grew < 300, f"reading one view of a 2 GiB stack grew resident memory by {grew:.0f} MiB"
    assert grew < 64                             # one view is 2 MiB; far below the file either way
    # the whole process, not only the growth: the readers do not load torch or the engine
    assert not r["torch_loaded"]
    assert r["after"] < 300 * 2 ** 20, f"resident memory {r['after'] / 2**20:.0f} MiB after reading one view"


def test_raw_scan_with_raw_flats_and_darks(tmp_path):
    proj = STACK[:4]
    flats = np.full((3, 12, 16), 60000, np.uint16)
    darks = np.full((2, 12, 16), 7, np.uint16)
    for name, a in (("p.raw", proj), ("f.raw", flats), ("d.raw", darks)):
        (tmp_path / name).write_bytes(b"\0" * 32 + a.astype(">u2").tobytes())
    raw = {"shape": proj.shape, "dtype": "uint16", "byte_order": "big", "header": 32}
    scan = read_scan(tmp_path / "p.raw", raw=raw, flats=tmp_path / "f.raw", darks=tmp_path / "d.raw",
                     pixel_size=0.2, angles_deg=[0, 90, 180, 270])
    np.testing.assert_array_equal(scan.flats.compute(), flats)       # frame count from the file size
    np.testing.assert_array_equal(scan.darks.compute(), darks)
    assert scan.pixel_size == (0.2, 0.2) and scan.angles[1] == pytest.approx(np.pi / 2)
