"""The ``calibrate`` section of a recon config (docs/CALIBRATION.md)::

    "calibrate": {"free": ["offset_u", "roll", "shift"],
                  "bounds": {"roll": [-2, 2]},
                  "levels": [2, 1], "n_outer": [8, 3], "n_inner": 3, "smoothness": 0.05,
                  "trajectory": "calibrated.json", "report": "calibration.json", "overwrite": false}

``trajectory`` and ``report`` are where ``ctbench calibrate`` writes the
calibrated trajectory JSON and the report (relative to the config's folder).
``geometry.trajectory`` in the same config makes ``ctbench recon`` use a
calibrated trajectory in place of the circular one it would build.

``known_object`` (optional): a volume file (TIFF, HDF5 or zarr, as ``ctbench
recon`` writes them) of the scanned object on the reconstruction grid, with
its voxel size.  The calibration then reprojects it instead of reconstructing,
which fixes the absolute scale: ``pitch`` and ``sdd`` become identifiable.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class CalibrateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    free: list[str] = Field(default_factory=lambda: ["offset_u", "roll", "shift"])
    bounds: dict[str, tuple[float, float]] = Field(default_factory=dict)
    levels: list[int] = Field(default_factory=lambda: [2, 1])
    n_outer: list[int] = Field(default_factory=lambda: [8, 3])
    n_inner: int = Field(3, ge=1)
    smoothness: float = Field(0.05, ge=0)
    trajectory: str = "calibrated_trajectory.json"
    report: str = "calibration_report.json"
    overwrite: bool = False
    known_object: Optional[str] = None
    backend: str = "auto"
    # The detector offset the recon geometry starts from: "auto" there runs the centre finder first.
    start: Optional[dict] = None
