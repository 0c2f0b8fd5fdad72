"""A scan as it comes off a scanner: raw projections, flats, darks and what the file says about them.

Image axes: every stack is ``(view, row, column)`` as detectors and TIFF
files store it, row 0 at the top.  ctbench's sinogram is ``(view, U, V)``
with +v up (docs/ARCHITECTURE.md), so columns are u and rows run along -v:
:func:`images_to_sinogram` and :func:`sinogram_to_images` convert without
copying more than once.  This is also the napari plugin's display order of
sinograms, so a projection stack shown in napari needs no reordering.

Stacks are lazy (dask arrays): nothing is read until a view is indexed or
the stack is computed, so opening a stack larger than memory costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .orientation import Orientation


@dataclass
class RawScan:
    """Projections with their flat and dark fields and the scanner's parameters.

    ``projections``: ``(n_views, rows, cols)`` array (usually dask, lazy).
    ``flats`` / ``darks``: ``(n, rows, cols)`` arrays or None.
    ``angles``: rotation angle of each projection in radians, or None when the file has none.
    ``pixel_size``: detector pitch ``(du, dv)`` in mm (column, row), or None.
    ``values``: "counts" (raw intensities), "transmission" or "line_integrals".
    ``scanner``: other parameters the file carries (SID/SDD in mm when known), JSON-able.
    ``orientation``: how the images and angles map onto ctbench's frame (:mod:`ctbench.io.orientation`);
    "auto" where the file does not say.  ``angles`` are ctbench's angles of the views for
    ``orientation.rotation`` (as "ccw" when "auto").
    ``provenance``: where each value came from, ``{quantity: {"value", "from", "field", "file", "note"}}``
    (:class:`ctbench.io.fields.Provenance`; ``ctbench inspect`` shows it).
    """

    projections: Any
    flats: Any = None
    darks: Any = None
    angles: np.ndarray | None = None
    pixel_size: tuple[float, float] | None = None
    values: str = "counts"
    scanner: dict = field(default_factory=dict)
    source: str = ""
    format: str = ""
    orientation: Orientation = field(default_factory=Orientation)
    provenance: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.orientation, Orientation):
            raise ValueError(f"{self.source or 'scan'}: orientation must be an Orientation, "
                             f"got {type(self.orientation).__name__}")
        shape = tuple(self.projections.shape)
        if len(shape) != 3:
            raise ValueError(f"{self.source or 'scan'}: projections must be a (view, row, column) stack, "
                             f"got shape {shape}")
        for name in ("flats", "darks"):
            a = getattr(self, name)
            if a is not None:
                if len(a.shape) == 2:
                    a = a[None]
                    setattr(self, name, a)
                if tuple(a.shape[1:]) != shape[1:]:
                    raise ValueError(f"{self.source or 'scan'}: {name} are {tuple(a.shape[1:])} pixels but the "
                                     f"projections are {shape[1:]}")
        if self.angles is not None:
            a = np.asarray(self.angles, dtype=np.float64).reshape(-1)
            if a.size != shape[0]:
                raise ValueError(f"{self.source or 'scan'}: {a.size} angles for {shape[0]} projections")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"{self.source or 'scan'}: the rotation angles contain NaN or infinite values")
            self.angles = a
        if self.pixel_size is not None:
            ps = self.pixel_size
            ps = (float(ps), float(ps)) if isinstance(ps, (int, float)) else tuple(float(p) for p in ps)
            if len(ps) != 2 or not all(math.isfinite(p) and p > 0 for p in ps):
                raise ValueError(f"{self.source or 'scan'}: pixel_size must be two positive lengths in mm, "
                                 f"got {self.pixel_size!r}")
            self.pixel_size = ps
        if self.values not in ("counts", "transmission", "line_integrals"):
            raise ValueError(f"values must be 'counts', 'transmission' or 'line_integrals', got {self.values!r}")

    @property
    def n_views(self) -> int:
        return int(self.projections.shape[0])

    @property
    def detector_shape(self) -> tuple[int, int]:
        """(U, V) = (columns, rows)."""
        return int(self.projections.shape[2]), int(self.projections.shape[1])

    def replace(self, **changes) -> "RawScan":
        return replace(self, **changes)

    def describe(self) -> dict:
        """JSON-able summary for layer metadata and reports."""
        return {"source": self.source, "format": self.format, "shape": list(self.projections.shape),
                "dtype": str(self.projections.dtype), "values": self.values,
                "n_flats": 0 if self.flats is None else int(self.flats.shape[0]),
                "n_darks": 0 if self.darks is None else int(self.darks.shape[0]),
                "angles_deg": None if self.angles is None else np.degrees(self.angles).round(6).tolist(),
                "pixel_size": None if self.pixel_size is None else list(self.pixel_size),
                "orientation": self.orientation.to_dict(),
                "scanner": dict(self.scanner), "provenance": dict(self.provenance)}


def images_to_sinogram(images) -> np.ndarray:
    """``(view, row, col)`` images -> ctbench ``(view, U, V)`` sinogram (a view of the data when possible)."""
    return np.asarray(images)[:, ::-1, :].transpose(0, 2, 1)


def sinogram_to_images(sino) -> np.ndarray:
    """ctbench ``(view, U, V)`` -> ``(view, row, col)`` images, row 0 at the top (+v)."""
    return np.asarray(sino).transpose(0, 2, 1)[:, ::-1, :]


class ArraySource:
    """Wraps a memory map (or any sliceable) so that dask reads it chunk by chunk.

    ``dask.array.from_array`` treats numpy arrays, memory maps included, as
    data already in memory and touches all of it; this object has only the
    array interface dask needs (shape, dtype, ndim, slicing).  ``source``: the
    file the frames come from; a frame its library cannot read (a damaged or
    truncated HDF5 chunk) is then a :class:`ScanFileError` naming it.
    """

    def __init__(self, array, source=None):
        self._array = array
        self._source = source
        self.shape = tuple(array.shape)
        self.dtype = array.dtype
        self.ndim = len(self.shape)

    def __getitem__(self, index):
        if self._source is None:
            return np.asarray(self._array[index])
        try:
            return np.asarray(self._array[index])
        except (OSError, RuntimeError) as e:       # h5py's errors for damaged chunks and filters
            from .errors import ScanFileError
            raise ScanFileError(self._source, f"a frame cannot be read ({e}); the file is damaged or "
                                              "truncated") from None


def lazy_stack(array, name_hint: str = "", *, source=None):
    """A dask array reading ``array`` (a memory map, h5py dataset, ...) one frame per chunk (``source``: see
    :class:`ArraySource`)."""
    import dask.array as da

    chunks = (1, *array.shape[1:]) if len(array.shape) == 3 else tuple(array.shape)
    return da.from_array(ArraySource(array, source), chunks=chunks, name=False, meta=np.empty((0,) * len(array.shape),
                                                                                       dtype=array.dtype))
