"""The ``calibrate`` section of a recon config (docs/CALIBRATION.md)::

    "calibrate": {"free": ["offset_u", "roll", "shift"],
                  "bounds": {"roll": [-2, 2]},
                  "levels": [2, 1], "n_outer": [8, 3], "n_inner": 3, "smoothness": 0.05,
                  "trajectory": "calibrated.json", "report": "calibration.json", "overwrite": false}

``trajectory`` and ``report`` are where ``ctbench calibrate`` writes the
calibrated trajectory JSON and the report (relative to the config's folder),
under the output policy (:mod:`ctbench.output_policy`): never onto the scan,
its flats or darks, the known object or the config itself, not both on one
path, an existing file replaced only with ``overwrite`` and only if ctbench
wrote it (anything else only with ``force``).
``geometry.trajectory`` in the same config makes ``ctbench recon`` use a
calibrated trajectory in place of the circular one it would build.

``known_object`` (optional): a volume file (TIFF, HDF5 or zarr, as ``ctbench
recon`` writes them) of the scanned object on the reconstruction grid, with
its voxel size.  The calibration then reprojects it instead of reconstructing,
which fixes the absolute scale: ``pitch`` and ``sdd`` become identifiable.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

# Every value bounded where it enters (issue 47): a level bins the detector, an iteration count costs a
# reprojection each; beyond these bounds a config asks for hours or for nothing meaningful.
Level = Annotated[int, Field(strict=True, ge=1, le=64)]
Outer = Annotated[int, Field(strict=True, ge=1, le=1000)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
PathText = Annotated[str, Field(min_length=1, max_length=4096)]


class CalibrateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    free: list[Annotated[str, Field(max_length=32)]] = Field(default_factory=lambda: ["offset_u", "roll", "shift"],
                                                             max_length=16)
    bounds: dict[Annotated[str, Field(max_length=32)], tuple[Finite, Finite]] = Field(default_factory=dict,
                                                                                      max_length=16)
    levels: list[Level] = Field(default_factory=lambda: [2, 1], min_length=1, max_length=8)
    n_outer: list[Outer] = Field(default_factory=lambda: [8, 3], min_length=1, max_length=8)
    n_inner: int = Field(3, ge=1, le=1000, strict=True)
    smoothness: float = Field(0.05, ge=0, le=1e6, allow_inf_nan=False)
    trajectory: PathText = "calibrated_trajectory.json"
    report: PathText = "calibration_report.json"
    overwrite: bool = False
    force: bool = Field(False, description="replace existing files even if ctbench did not write them "
                                           "(never an input)")
    known_object: Optional[PathText] = None
    backend: Literal["auto", "cpu", "cuda", "reference"] = "auto"
    # Starting values {name: value} (per-view parameters: one value per view); checked against the bounds and
    # the scan's number of views by ctbench.calibration.
    start: Optional[dict[Annotated[str, Field(max_length=32)],
                         Union[Finite, Annotated[list[Finite], Field(max_length=10 ** 6)]]]] = Field(None,
                                                                                                   max_length=16)
