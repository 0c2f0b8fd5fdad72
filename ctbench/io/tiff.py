"""TIFF readers: a folder of single-image files or one multi-page file, read lazily.

Headers are parsed when the stack is opened (so a wrong shape or a
truncated file is reported at once, naming the file); pixel data is read
only when a view is indexed or the stack is computed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from .. import guarded_open
from .errors import ScanFileError, as_scan_error, check_frame, check_input, require
from .scan import lazy_stack

TIFF_SUFFIXES = (".tif", ".tiff")


def _natural_key(p: Path):
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", p.name)]


def _open(path: Path):
    """The file opened for reading if it is a regular file (a FIFO or device is refused, never read)."""
    try:
        return guarded_open.open_regular(path)
    except guarded_open.InputError as e:
        raise as_scan_error(e) from None


def tiff_files(folder, pattern: str | None = None, *, root=None) -> list[Path]:
    """The TIFF files of ``folder`` in natural order (proj_2 before proj_10); ``pattern`` is a glob.

    With ``root``, the folder and every file must resolve inside ``root`` (links out are refused).  Names with
    a TIFF suffix that are not regular files (FIFOs, devices) are errors, not skipped silently."""
    folder = Path(folder)
    if root is not None:
        try:
            guarded_open.check_inside(folder, root)
        except guarded_open.InputError as e:
            raise as_scan_error(e) from None
    if not folder.is_dir():
        raise ScanFileError(folder, "is not a folder of TIFF files")
    files = [p for p in folder.glob(pattern or "*") if p.suffix.lower() in TIFF_SUFFIXES and not p.is_dir()]
    for p in files:
        check_input(p, root=root)
    if not files:
        raise ScanFileError(folder, f"contains no TIFF files{f' matching {pattern!r}' if pattern else ''}")
    return sorted(files, key=_natural_key)


def tifffile_module(path=None):
    """tifffile, or one line naming the extra that installs it."""
    return require("tifffile", "TIFF images", path if path is not None else "TIFF reader")


def _page_info(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and page count of a TIFF file; ScanFileError if unreadable or truncated."""
    tifffile = tifffile_module(path)

    fh = _open(path)
    try:
        size = os.fstat(fh.fileno()).st_size
        with tifffile.TiffFile(fh) as tif:
            series = tif.series[0]
            shape, dtype = tuple(series.shape), np.dtype(series.dtype)
            # Bounds before allocation: a tiny compressed file may declare a huge page (a decompression bomb).
            check_frame(path, shape[-2:] if len(shape) >= 3 else shape, dtype.itemsize, "a page")
            check_frame(path, tif.pages[0].shape, dtype.itemsize, "a page")
            # Truncation: the last strip or tile must end inside the file.
            end = 0
            if series.dataoffset is not None:       # contiguous series: pages may not all be parsed
                end = series.dataoffset + series.nbytes
            for page in tif.pages:
                offs, counts = page.dataoffsets, page.databytecounts
                if offs:
                    end = max(end, max(o + c for o, c in zip(offs, counts)))
    except ScanFileError:
        raise
    except Exception as e:  # tifffile raises several types for damaged files
        raise ScanFileError(path, f"is not a readable TIFF file ({e})") from None
    finally:
        fh.close()
    if end > size:
        raise ScanFileError(path, f"is truncated: its image data needs {end} bytes but the file has {size}")
    return shape, dtype, len(shape) == 3 and shape[0] or 1


def _read_file(path: Path, shape: tuple[int, int], dtype) -> np.ndarray:
    import tifffile

    with _open(path) as fh:
        try:
            with tifffile.TiffFile(fh) as tif:      # the page is bounded again: the file may have changed
                check_frame(path, tif.pages[0].shape, np.dtype(tif.pages[0].dtype).itemsize, "a page")
                img = tif.asarray()
        except ScanFileError:
            raise
        except Exception as e:
            raise ScanFileError(path, f"could not be read ({e})") from None
    if img.shape != tuple(shape):
        raise ScanFileError(path, f"holds a {img.shape} image but the stack's images are {tuple(shape)}")
    return img.astype(dtype, copy=False)


def read_tiff_folder(folder, pattern: str | None = None, *, root=None):
    """A folder of 2D TIFF images -> lazy ``(n, rows, cols)`` dask array, one chunk per file."""
    return read_tiff_files(tiff_files(folder, pattern, root=root))


def read_tiff_files(files) -> "object":
    """2D TIFF images ``files`` (in this order) -> lazy ``(n, rows, cols)`` dask array, one chunk per file.

    The vendor readers list their projections by the vendor's exact naming rule and pass the list, so a stray
    file that a glob would catch (``scan_0001 (copy).tif``) never becomes a view."""
    import dask
    import dask.array as da

    tifffile_module()
    files = [Path(f) for f in files]
    if not files:
        raise ScanFileError(None, "no TIFF files to read")
    for f in files:
        check_input(f)
    shape, dtype, _ = _page_info(files[0])
    if len(shape) != 2:
        raise ScanFileError(files[0], f"holds a {shape} array; a folder stack needs one 2D image per file")
    for f in files[1:]:
        s, d, _ = _page_info(f)
        if s != shape:
            raise ScanFileError(f, f"holds a {s} image but {files[0].name} is {shape}; all images of a stack "
                                   "must have the same size")
    read = dask.delayed(_read_file, pure=True)
    views = [da.from_delayed(read(f, shape, dtype), shape=shape, dtype=dtype) for f in files]
    return da.stack(views)


def read_tiff_file(path):
    """A multi-page TIFF (or a single image) -> lazy ``(n, rows, cols)`` dask array.

    Uncompressed files are memory-mapped; compressed ones are read page by
    page through tifffile's zarr interface.
    """
    import dask.array as da

    path = Path(path)
    check_input(path)
    tifffile = tifffile_module(path)
    shape, dtype, _ = _page_info(path)
    if len(shape) not in (2, 3):
        raise ScanFileError(path, f"holds a {len(shape)}-dimensional {shape} array; expected 2D images or a "
                                  "(views, rows, cols) stack")
    try:
        arr = tifffile.memmap(path, mode="r")
    except Exception:   # compressed or not contiguous: page-wise reads
        import dask
        n = shape[0] if len(shape) == 3 else 1
        read = dask.delayed(_read_page, pure=True)
        return da.stack([da.from_delayed(read(path, i, shape[-2:]), shape=shape[-2:], dtype=dtype)
                         for i in range(n)])
    stack = lazy_stack(arr)
    return stack[None] if stack.ndim == 2 else stack


def _read_page(path: Path, index: int, shape) -> np.ndarray:
    import tifffile

    with _open(path) as fh:
        try:
            with tifffile.TiffFile(fh) as tif:
                page = tif.pages[index]
                check_frame(path, page.shape, np.dtype(page.dtype).itemsize, f"page {index}")
                img = page.asarray()
        except ScanFileError:
            raise
        except Exception as e:
            raise ScanFileError(path, f"page {index} could not be read ({e})") from None
    if img.shape != tuple(shape):
        raise ScanFileError(path, f"page {index} is {img.shape}, expected {tuple(shape)}")
    return img


def read_tiff(path, pattern: str | None = None):
    """A folder of TIFF files or one (multi-page) TIFF file -> lazy ``(n, rows, cols)`` stack."""
    path = Path(path)
    if path.is_dir():
        return read_tiff_folder(path, pattern)
    if not os.path.lexists(path):
        raise ScanFileError(path, "does not exist")
    if path.suffix.lower() not in TIFF_SUFFIXES:
        raise ScanFileError(path, "is not a TIFF file (expected .tif or .tiff)")
    return read_tiff_file(path)
