"""Bundled real data: the HTC2022 "ta" fan-beam scan (sample_data/, CC BY 4.0).

Meaney, Silva de Moura & Siltanen (2022), "Helsinki Tomography Challenge
2022 open tomographic dataset (HTC 2022)", Zenodo, doi:10.5281/zenodo.6984868.
The licence and the geometry notes travel with the file
(sample_data/NOTICE.md).

The organisers' geometry is a flat-detector fan beam: source-origin
distance 410.66 mm, source-detector distance 553.74 mm, 560 pixels of
0.2 mm, and, at angle ``theta``, the source at ``(DSO sin theta, -DSO cos
theta)`` with the detector u axis ``(cos theta, sin theta)`` (ASTRA's
fan-flat frame).  That is ctbench's (diffct's) frame at ``theta + pi`` with
u reversed (docs/GEOMETRY.md), so the loader adds pi to the angles and
reverses every sinogram row: the same physical scan, in ctbench's
convention (a reconstruction with u reversed smears the disc; see
tests/test_real_data.py).  Their reconstructions use a 512 x 512 grid of
the effective pixel 0.1483223 mm (pixel pitch / magnification).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import torch

from .geometry import Trajectory, circular_trajectory_2d_fan

HTC2022_FILE = "htc2022_ta_full.mat"
HTC2022_SID = 410.66
HTC2022_SDD = 553.74
HTC2022_PIXEL = 0.2
HTC2022_VOXEL = 0.1483223173330444
HTC2022_GRID = 512
HTC2022_ATTENUATION = 0.0281  # acrylic, per mm (organisers' reconstructions)
_KINDS = {"full": "CtDataFull", "limited": "CtDataLimited"}


class ScanData(NamedTuple):
    """A measured scan: ``(sinogram, trajectory, projector_kwargs)``.

    ``projector_kwargs`` are the suggested :class:`~ctbench.Projector`
    arguments besides the trajectory (``volume_shape``, ``detector_shape``,
    ``detector_spacing``, ``voxel_spacing``); :meth:`projector` builds it.
    """

    sinogram: torch.Tensor
    trajectory: Trajectory
    projector_kwargs: dict

    def projector(self, **overrides):
        """The Projector for this scan; keyword arguments override the suggested ones."""
        from .projector import Projector

        kw = {**self.projector_kwargs, **overrides}
        return Projector(self.trajectory, kw.pop("volume_shape"), kw.pop("detector_shape"), **kw)


def sample_data_dir() -> Path:
    """The bundled data folder: the installed ``ctbench.sample_data`` package, or the checkout's sample_data/."""
    try:
        from importlib.resources import files
        p = Path(str(files("ctbench.sample_data")))
        if (p / HTC2022_FILE).exists():
            return p
    except (ModuleNotFoundError, TypeError):
        pass
    p = Path(__file__).resolve().parents[1] / "sample_data"
    if (p / HTC2022_FILE).exists():
        return p
    raise FileNotFoundError(f"{HTC2022_FILE} not found in ctbench.sample_data nor in the checkout's sample_data/")


def load_htc2022(kind: str = "full", *, dtype: torch.dtype = torch.float32, device=None,
                 path: str | Path | None = None) -> ScanData:
    """Load the HTC2022 "ta" scan: ``kind="full"`` (721 views over 360 degrees, the first and
    last at the same angle) or ``"limited"`` (the organisers' 61-view, 30-degree subset).

    Returns :class:`ScanData` ``(sinogram (n_views, 560) line integrals, fan-beam trajectory,
    projector_kwargs)``; the volume it suggests is 512 x 512 voxels of 0.1483 mm, in which the
    acrylic disc reconstructs to about 0.0281 per mm.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {tuple(_KINDS)}, got {kind!r}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    import numpy as np
    import scipy.io

    file = Path(path) if path is not None else sample_data_dir() / HTC2022_FILE
    if not file.exists():
        raise FileNotFoundError(f"HTC2022 data file not found: {file}")
    mat = scipy.io.loadmat(str(file), struct_as_record=False, squeeze_me=True)
    rec = mat[_KINDS[kind]]
    sino = np.asarray(rec.sinogram, dtype=np.float64)
    angles_deg = np.atleast_1d(np.asarray(rec.parameters.angles, dtype=np.float64))
    params = rec.parameters
    sid = float(params.distanceSourceOrigin)
    sdd = float(params.distanceSourceDetector)
    pixel = float(params.pixelSizePost)
    n_det = int(params.numDetectorsPost)
    if sino.shape != (angles_deg.size, n_det):
        raise ValueError(f"{file.name}: sinogram {sino.shape} does not match {angles_deg.size} angles x {n_det} pixels")
    # ASTRA's frame at theta is ours at theta + pi with u reversed (module docstring)
    angles = torch.tensor(np.deg2rad(angles_deg), dtype=torch.float64) + math.pi
    sino = np.ascontiguousarray(sino[:, ::-1])
    traj = circular_trajectory_2d_fan(angles=angles, sid=sid, sdd=sdd, dtype=torch.float64).to(device=device,
                                                                                               dtype=dtype)
    traj = traj.replace(meta={**traj.meta, "dataset": f"htc2022-ta-{kind}",
                              "licence": "CC BY 4.0, doi:10.5281/zenodo.6984868"})
    kwargs = {"volume_shape": (HTC2022_GRID, HTC2022_GRID), "detector_shape": n_det, "detector_spacing": pixel,
              "voxel_spacing": float(params.effectivePixelSizePost)}
    return ScanData(torch.tensor(sino, dtype=dtype, device=device), traj, kwargs)


def htc2022_disc_mask(shape=(HTC2022_GRID, HTC2022_GRID), voxel_spacing: float = HTC2022_VOXEL, *,
                      radius_mm: float = 34.0, centre_mm=(0.0, 0.0)) -> torch.Tensor:
    """Boolean (H, W) mask of a disc (default: inside the ~70 mm acrylic phantom's rim)."""
    H, W = shape
    y = (torch.arange(H, dtype=torch.float64) - (H - 1) / 2) * voxel_spacing - centre_mm[1]
    x = (torch.arange(W, dtype=torch.float64) - (W - 1) / 2) * voxel_spacing - centre_mm[0]
    return (y[:, None] ** 2 + x[None, :] ** 2) <= radius_mm ** 2


__all__ = ["ScanData", "load_htc2022", "sample_data_dir", "htc2022_disc_mask", "HTC2022_ATTENUATION"]
