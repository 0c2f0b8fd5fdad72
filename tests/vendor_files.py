"""Vendor files written the way the scanners and beamlines write them (for the reader tests).

Each writer follows the vendor's layout as the vendor's documentation and the
open readers (dxchange, CIL's cil.io, TIGRE's dataloaders) describe it; the
readers under test are in ctbench/io/.  Written independently of the readers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctbench.io.orientation import Orientation

_RESOLUTION = "measurement/instrument/detection_system/objective/resolution"
_MAGNIFICATION = "measurement/instrument/detection_system/objective/magnification"
_DETECTOR = "measurement/instrument/detector"


def write_dxchange(path, projections, flats, darks, theta_deg, *, resolution_um: float | None = None,
                   pixel_size_um: float | None = None, magnification: float = 1.0, binning: int = 1,
                   orientation: Orientation | None = None) -> Path:
    """Write a DXchange file the way the beamline software lays it out (for tests and examples).

    Either ``resolution_um`` (effective pixel) or ``pixel_size_um`` (sensor,
    with ``magnification`` and ``binning``).  ``orientation``: ctbench's
    attributes on ``/exchange`` (None writes none, as beamlines do).
    """
    import h5py

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with h5py.File(tmp, "w") as f:
        ex = f.create_group("exchange")
        ex.create_dataset("data", data=np.asarray(projections), chunks=(1, *np.shape(projections)[1:]))
        ex["data"].attrs["units"] = "counts"
        ex.create_dataset("data_white", data=np.asarray(flats))
        ex.create_dataset("data_dark", data=np.asarray(darks))
        ex.create_dataset("theta", data=np.asarray(theta_deg, dtype=np.float64))
        ex["theta"].attrs["units"] = "degrees"
        if orientation is not None:
            for k, v in orientation.to_dict().items():
                ex.attrs[k] = v
        det = f.create_group(_DETECTOR)
        if resolution_um is not None:
            f.create_dataset(_RESOLUTION, data=float(resolution_um))
        if pixel_size_um is not None:
            for axis in ("x", "y"):
                det.create_dataset(f"pixel_size_{axis}", data=float(pixel_size_um))
                det.create_dataset(f"binning_{axis}", data=int(binning))
            f.create_dataset(_MAGNIFICATION, data=float(magnification))
    tmp.replace(path)
    return path
