"""Scans from files and volumes to files: readers (TIFF, NeXus NXtomo, raw, lab-scanner folders,
ctbench zarr), exporters (TIFF, HDF5, zarr) and the ``ctbench recon`` pipeline.

Numpy, dask, tifffile and h5py only (torch is needed by the pipeline's reconstruction step).
"""

from .errors import ScanFileError
from .export import export_volume, read_volume
from .readers import FORMATS, detect_format, read_scan
from .raw import read_raw
from .scan import RawScan, images_to_sinogram, sinogram_to_images
from .tiff import read_tiff

__all__ = ["ScanFileError", "RawScan", "read_scan", "detect_format", "read_tiff", "read_raw", "export_volume",
           "read_volume", "images_to_sinogram", "sinogram_to_images", "FORMATS"]
