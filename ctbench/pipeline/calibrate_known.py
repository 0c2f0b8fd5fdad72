"""``calibrate.known_object``: the scanned object read from a volume file, checked against the recon grid.

A known object fixes the absolute scale of a calibration (docs/CALIBRATION.md),
so its voxel size *is* the scale: it must be the reconstruction grid's, and a
config that leaves the grid unstated takes the file's.
"""

from __future__ import annotations

import math

import numpy as np

from ..io.errors import ScanFileError
from ..io.export import read_volume

KEY = "calibrate.known_object"


def read_known_object(path, geometry):
    """(volume as float32 (z, y, x), ``geometry`` with the file's voxel size and shape) or a ValueError naming
    ``calibrate.known_object`` and what is wrong (missing or unreadable file, a shape or voxel size other than
    the config's grid, anisotropic voxels, non-finite or all-zero values)."""
    try:
        vol, spacing = read_volume(path)      # guarded: regular files only, bounded, damaged spacing refused
    except ScanFileError as e:
        raise ValueError(f"{KEY}: {e}") from None
    vol = np.asarray(vol)
    if vol.ndim != 3 or min(vol.shape) < 1:
        raise ValueError(f"{KEY}: {path} holds an array of shape {vol.shape}; expected a 3D volume (z, y, x)")
    if not (np.issubdtype(vol.dtype, np.floating) or np.issubdtype(vol.dtype, np.integer)):
        raise ValueError(f"{KEY}: {path} holds {vol.dtype} values; expected real numbers")
    vox = spacing[0]
    if not all(math.isclose(s, vox, rel_tol=1e-3) for s in spacing):
        raise ValueError(f"{KEY}: {path} has voxel spacing {spacing} mm (dz, dy, dx); the reconstruction grid has "
                         "cubic voxels")
    stated = geometry.voxel_size_mm
    if stated is not None and not math.isclose(stated, vox, rel_tol=1e-3):
        raise ValueError(f"{KEY}: {path} has {vox:g} mm voxels but geometry.voxel_size_mm is {stated:g}; the known "
                         "object fixes the scale, so it must be on the reconstruction grid")
    if geometry.volume_shape is not None and tuple(geometry.volume_shape) != vol.shape:
        raise ValueError(f"{KEY}: {path} has shape {vol.shape} but geometry.volume_shape is "
                         f"{tuple(geometry.volume_shape)}")
    vol = vol.astype(np.float32, copy=False)
    bad = int(vol.size - np.count_nonzero(np.isfinite(vol)))
    if bad:
        raise ValueError(f"{KEY}: {path} has {bad} non-finite values (NaN or infinity)")
    if not np.any(vol):
        raise ValueError(f"{KEY}: {path} is all zero; a known object needs structure")
    return vol, geometry.model_copy(update={"voxel_size_mm": vox, "volume_shape": tuple(int(n) for n in vol.shape)})
