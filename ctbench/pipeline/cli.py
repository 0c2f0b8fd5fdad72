"""``ctbench recon`` and ``ctbench calibrate`` on the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .calibrate import run_calibrate
from .calibrate_config import CalibrateConfig
from .config import OutputConfig, load_config
from .recon import run_recon


def register_recon(subparsers) -> None:
    """Add ``ctbench recon CONFIG.json`` to the ``ctbench`` command's subparsers."""
    p = subparsers.add_parser("recon", help="reconstruct a measured scan as described by a JSON config "
                                            "(docs/SCANS.md)")
    p.add_argument("config", help="recon config (JSON)")
    p.add_argument("--out", help="output path (overrides output.path; .tif, .h5 or .zarr)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output that ctbench wrote")
    p.add_argument("--force", action="store_true", help="replace an existing output even if ctbench did not "
                                                        "write it (never an input)")
    p.set_defaults(func=_cli)


def _cli(args) -> int:

    try:
        cfg = load_config(args.config)
        force = getattr(args, "force", False)
        if args.out:
            cfg.output = OutputConfig(path=args.out, overwrite=args.overwrite or force, force=force)
        elif cfg.output is not None:
            cfg.output.overwrite = cfg.output.overwrite or args.overwrite or force
            cfg.output.force = cfg.output.force or force
        report = run_recon(cfg, log=lambda m: print(m, file=sys.stderr))
    except (ValueError, OSError, RecursionError, MemoryError) as e:
        # Every refused input (ScanFileError, bounds, bad config, a file that cannot be read) is rc 2 with one
        # line, never a traceback (docs/SCANS.md).
        print(f"ctbench recon: {e}", file=sys.stderr)
        return 2
    for w in report.get("warnings", []):
        print(f"ctbench recon: warning: {w}", file=sys.stderr)
    for k in ("volume", "geometry_object"):
        report.pop(k)
    print(json.dumps(report))
    return 0


def register_calibrate(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="calibrate a scan's geometry from its own data "
                                                "(the recon config's calibrate section; docs/CALIBRATION.md)")
    p.add_argument("config", help="recon config (JSON) with an optional calibrate section")
    p.add_argument("--overwrite", action="store_true", help="replace existing trajectory and report files")
    p.set_defaults(func=_calibrate_cli)


def _calibrate_cli(args) -> int:
    try:
        cfg = load_config(args.config)
        if cfg.calibrate is None:
            cfg.calibrate = CalibrateConfig()
        if args.overwrite:
            cfg.calibrate.overwrite = True
        report = run_calibrate(cfg, config_path=Path(args.config), log=lambda m: print(m, file=sys.stderr))
    except (ValueError, TypeError, FileExistsError, FileNotFoundError) as e:
        print(f"ctbench calibrate: {e}", file=sys.stderr)
        return 2
    # the scan's orientation/centre doubts, as ctbench recon gives them: a calibration of a mirrored or
    # mis-centred reading is a calibration of the wrong scan
    for w in report.get("warnings", []):
        print(f"ctbench calibrate: warning: {w}", file=sys.stderr)
    print(json.dumps({k: report[k] for k in ("trajectory", "report", "final_loss", "elapsed_s")}
                     | {"parameters": {p["name"]: p["value"] for p in report["parameters"]}}))
    return 0
