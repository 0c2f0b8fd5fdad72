"""The recon config of ``ctbench recon CONFIG.json``: its sections, their validation, loading and saving.

The same config serves the command line, the napari "Scan import" widget
(which saves its current settings as such a config) and scripts::

    cfg = load_config("recon.json")
    report = run_recon(cfg)

``algorithm.name`` "fdk" and "fbp" are the same filtered backprojection: FDK
for circular cone-beam scans, FBP for fan and parallel beams (the report's
``algorithm.method`` says which ran).  ``resources.memory`` caps the whole
job's peak memory (:mod:`ctbench.pipeline.budget`).

A config (JSON; every section but ``input`` optional)::

    {"input":      {"path": "scan/", "format": "auto", "flats": null, "darks": null,
                    "raw": {"shape": [360, 512, 512], "dtype": "uint16", "byte_order": "little", "header": 0}},
     "preprocess": {"rows": null, "cols": null, "bin": 1, "every": 1, "angle_range_deg": null,
                    "ring_filter": 0, "min_transmission": 1e-4, "view_shifts": true,
                    "zingers": null, "rings": null, "phase": null, "beam_hardening": null},
     "geometry":   {"sid_mm": null, "sdd_mm": null, "pixel_size_mm": null, "angle_range_deg": 360,
                    "start_angle_deg": 0, "detector_offset_u_mm": "auto", "detector_offset_v_mm": null,
                    "volume_shape": null, "voxel_size_mm": null},
     "algorithm":  {"name": "fdk", "params": {}},
     "output":     {"path": "recon.ome.zarr", "format": "auto", "overwrite": false, "force": false},
     "resources":  {"memory": "4GB", "threads": null}}

``null`` means "from the file" (SID/SDD, pixel size, angles) or "automatic"
(the volume grid covers the field of view at the detector's resolution
scaled to the isocentre).  The orientation keys (``image_seen_from``,
``image_columns``, ``image_rows``, ``rotation_direction``), ``beam``,
``detector_roll_deg`` and ``detector_offset_v_mm`` (null = the file's)
are described in docs/SCANS.md.  ``detector_offset_u_mm`` is "auto" (centre
finder, on the preprocessed data), "file" (the offset the vendor file states) or the offset of the *uncropped*
detector in mm; crops and binning are accounted for.

The output follows :mod:`ctbench.output_policy`, checked before the scan is
read: it may not be, contain or lie inside the scan, its flats or darks;
``overwrite`` replaces only what ctbench wrote, ``force`` anything else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..io.errors import read_json_object
from ..io.readers import FORMATS
from .calibrate_config import CalibrateConfig
from .corrections import CorrectionKeys


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Sizes and indices are JSON integers: 2.7 or true is refused, never truncated (finding 10 of issue 20).
PosInt = Annotated[int, Field(strict=True, gt=0)]
Index = Annotated[int, Field(strict=True, ge=0)]


class RawOptions(_Model):
    shape: tuple[PosInt, PosInt, PosInt]
    dtype: str = "uint16"
    byte_order: Literal["little", "big", "native"] = "little"
    header: int = Field(0, ge=0)


class InputConfig(_Model):
    path: str
    format: Literal[FORMATS] = "auto"   # type: ignore[valid-type]
    flats: Optional[str] = None
    darks: Optional[str] = None
    raw: Optional[RawOptions] = None


class PreprocessConfig(CorrectionKeys):      # + zingers, rings, phase, beam_hardening (pipeline/corrections.py)
    rows: Optional[tuple[Index, Index]] = None
    cols: Optional[tuple[Index, Index]] = None
    bin: int = Field(1, ge=1, strict=True)
    every: int = Field(1, ge=1, strict=True)
    angle_range_deg: Optional[tuple[float, float]] = None
    ring_filter: int = Field(0, ge=0, strict=True, description="median width in pixels; 0 = off")
    min_transmission: float = Field(1e-4, gt=0, lt=1)
    view_shifts: bool = Field(True, description="apply the per-view shifts the file records (io/view_shifts.py)")

    @field_validator("ring_filter")
    @classmethod
    def _ring(cls, v):
        if v and v < 3:
            raise ValueError("ring_filter must be 0 (off) or a width >= 3 pixels")
        return v


class GeometryConfig(_Model):
    beam: Optional[Literal["cone", "parallel"]] = None     # null: what the file says (cone if it says nothing)
    sid_mm: Optional[float] = Field(None, gt=0)
    sdd_mm: Optional[float] = Field(None, gt=0)
    pixel_size_mm: Optional[tuple[float, float]] = None
    angle_range_deg: float = Field(360.0, gt=0)
    start_angle_deg: float = 0.0
    # "auto": the centre finder; "file": the offset the vendor's file states (Nikon, SkyScan Postalignment)
    detector_offset_u_mm: Union[float, Literal["auto", "file"]] = "auto"
    detector_offset_v_mm: Optional[float] = None    # null: what the file says (Bruker's optical axis), else 0
    volume_shape: Optional[tuple[PosInt, PosInt, PosInt]] = None
    voxel_size_mm: Optional[float] = Field(None, gt=0)
    # a calibrated trajectory JSON (ctbench calibrate) used in place of the circular orbit built here
    trajectory: Optional[str] = None
    # Orientation (ctbench/io/orientation.py); null = what the file says ("auto" where it says nothing).
    image_seen_from: Optional[Literal["source", "detector", "auto"]] = None
    image_columns: Optional[Literal["right", "left"]] = None
    image_rows: Optional[Literal["down", "up"]] = None
    rotation_direction: Optional[Literal["ccw", "cw", "auto"]] = None
    # null: what the file says (SkyScan Image Rotation, Nikon ObjectRoll), else 0
    detector_roll_deg: Optional[float] = Field(None, ge=-45.0, le=45.0, description="in-plane rotation of the detector")


class AlgorithmConfig(_Model):
    name: str = "fbp"
    params: dict = Field(default_factory=dict)


class OutputConfig(_Model):
    path: str
    # "auto": OME-Zarr for a path ending in .ome.zarr, else by suffix (.tif, .h5, .zarr: the ctbench dataset)
    format: Literal["auto", "ome-zarr", "tiff", "hdf5", "zarr"] = "auto"
    overwrite: bool = False
    force: bool = Field(False, description="replace an existing output even if ctbench did not write it")


class ResourcesConfig(_Model):
    """What the job may use: ``memory`` caps the whole process's peak ("4GB", "512 MiB", bytes; null: 80% of the
    memory available at start), ``threads`` the kernels' threads (null: torch's default, every core)."""

    memory: Optional[Union[Annotated[int, Field(strict=True, gt=0)], str]] = None
    threads: Optional[Annotated[int, Field(strict=True, gt=0, le=4096)]] = None

    @field_validator("memory")
    @classmethod
    def _memory(cls, v):
        if v is not None:
            from ..engine.plan import parse_bytes
            parse_bytes(v, "resources.memory")
        return v


class ReconConfig(_Model):
    """A whole reconstruction, from file to file."""

    version: Literal[1] = 1
    input: InputConfig
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    geometry: GeometryConfig = Field(default_factory=GeometryConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    output: Optional[OutputConfig] = None
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    calibrate: Optional[CalibrateConfig] = None   # ctbench calibrate (ctbench/pipeline/calibrate.py)


def _explain(e: ValidationError, where) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    return f"{where}: invalid recon config: " + "; ".join(parts)


def parse_config(doc: dict, where: str = "config") -> ReconConfig:
    """A validated :class:`ReconConfig`; ValueError naming every bad field otherwise."""
    try:
        return ReconConfig.model_validate(doc)
    except ValidationError as e:
        raise ValueError(_explain(e, where)) from None


def load_config(path) -> ReconConfig:
    """Read a recon config; relative paths in it are taken relative to the config's folder."""
    path = Path(path)
    # Guarded: a FIFO, device or huge file is refused; JSON nested too deeply is a ScanFileError, not a crash.
    cfg = parse_config(read_json_object(path), str(path))
    base = path.resolve().parent

    def rel(p):
        return None if p is None else str(p if Path(p).is_absolute() else base / p)

    cfg.input.path, cfg.input.flats, cfg.input.darks = rel(cfg.input.path), rel(cfg.input.flats), rel(cfg.input.darks)
    cfg.geometry.trajectory = rel(cfg.geometry.trajectory)
    if cfg.calibrate is not None:
        cfg.calibrate.trajectory, cfg.calibrate.report = rel(cfg.calibrate.trajectory), rel(cfg.calibrate.report)
        cfg.calibrate.known_object = rel(cfg.calibrate.known_object)
    if cfg.output is not None:
        cfg.output.path = rel(cfg.output.path)
    return cfg


def save_config(cfg: ReconConfig, path, *, overwrite: bool = True) -> Path:
    """Write a config as JSON (aside, then renamed into place)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(cfg.model_dump(mode="json"), indent=2))
    tmp.replace(path)
    return path
