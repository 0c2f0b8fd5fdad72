"""The drivers of ``ctbench recon`` and ``ctbench calibrate``: from a scan's files to a volume or a geometry.

- :mod:`.config`: the recon config (JSON) and its validation;
- :mod:`.corrections`: the correction keys of its ``preprocess`` section and the steps that apply them;
- :mod:`.steps`: open, preprocess, orient and centre a scan, build its geometry (shared by both drivers);
- :mod:`.recon`: ``ctbench recon``; :mod:`.calibrate`: ``ctbench calibrate``; :mod:`.cli`: their commands.

The package sits above the readers (:mod:`ctbench.io`), the corrections, the calibration and the
workbench's workflows, and below the jobs and the command line (docs/ARCHITECTURE.md).
"""

from .config import (AlgorithmConfig, GeometryConfig, InputConfig, OutputConfig, PreprocessConfig, RawOptions,
                     ReconConfig, load_config, parse_config, save_config)
from .recon import run_recon
from .steps import Prepared, build_geometry, distances, find_offset, open_scan, oriented_scan, prepare

__all__ = ["AlgorithmConfig", "GeometryConfig", "InputConfig", "OutputConfig", "PreprocessConfig", "RawOptions",
           "ReconConfig", "load_config", "parse_config", "save_config", "run_recon", "Prepared", "build_geometry",
           "distances", "find_offset", "open_scan", "oriented_scan", "prepare"]
