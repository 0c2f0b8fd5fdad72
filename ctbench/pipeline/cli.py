"""``ctbench recon`` and ``ctbench calibrate`` on the command line."""

from __future__ import annotations

import sys
from pathlib import Path

from ..json_report import dumps as strict_json
from .calibrate import run_calibrate
from .calibrate_config import CalibrateConfig
from .config import OutputConfig, load_config
from .recon import run_recon


# why a report's number may be missing (null; ctbench/json_report.py writes the note beside it)
REPORT_NOTES = {
    "sharpness": "not computed: the sharpness sweep runs for the reading taken only",
    "split_px": "not computed: the even and the odd views did not both pair up (or too few views)",
    "conjugate_mismatch": "not computed: no ray met its conjugate within the detector",
}


def register_recon(subparsers) -> None:
    """Add ``ctbench recon CONFIG.json`` to the ``ctbench`` command's subparsers."""
    p = subparsers.add_parser("recon", help="reconstruct a measured scan as described by a JSON config "
                                            "(docs/SCANS.md)")
    p.add_argument("config", help="recon config (JSON)")
    p.add_argument("--out", help="output path (overrides output.path; .ome.zarr, .tif, .h5 or .zarr)")
    p.add_argument("--memory", help="cap on the job's peak memory, e.g. 4GB or 512MiB (overrides "
                                    "resources.memory; default: 80%% of the memory available)")
    p.add_argument("--threads", type=int, help="kernel threads (overrides resources.threads)")
    p.add_argument("--json", action="store_true", help="progress as JSON lines on stdout (the report is the "
                                                       "last line) instead of progress bars on stderr")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output that ctbench wrote")
    p.add_argument("--force", action="store_true", help="replace an existing output even if ctbench did not "
                                                        "write it (never an input)")
    p.add_argument("--ranks", type=int, help="processes on this machine that share the job's windows "
                                             "(torchrun with Gloo; docs/LARGE_VOLUMES.md, \"Several ranks\")")
    p.set_defaults(func=_cli)


def _relaunch_args(args) -> list[str]:
    """The same ``ctbench recon`` command line, without ``--ranks`` (each rank runs it)."""
    out = [str(Path(args.config).resolve())]
    for flag in ("out", "memory", "threads"):
        value = getattr(args, flag)
        if value is not None:
            out += [f"--{flag}", str(Path(value).resolve()) if flag == "out" else str(value)]
    return out + [f"--{flag}" for flag in ("json", "quiet", "overwrite", "force") if getattr(args, flag)]


def _launch_ranks(args) -> int:
    """``--ranks N``: the command again as N ranks under torchrun (one machine, Gloo); rank 0 speaks."""
    import os
    import subprocess

    import tempfile

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
           "-m", "ctbench.cli", "recon", *_relaunch_args(args)]
    with tempfile.TemporaryDirectory(prefix="ctbench-ranks-") as status:
        # A refused input is one line from rank 0 and its exit status comes back through a file, so torchrun
        # sees ranks that ended normally and adds no failure summary of its own; a crash still shows it.
        rc = subprocess.call(cmd, env=dict(os.environ, **{RANK_STATUS_ENV: status}))
        mine = Path(status) / "rank0.rc"
        if rc != 0 or not mine.exists():
            return rc
        from .. import guarded_open
        return int(guarded_open.read_bytes(mine, limit=64))


RANK_STATUS_ENV = "CTBENCH_RANK_STATUS"


def _cli(args) -> int:
    import os

    rc = _recon_cli(args)
    status = os.environ.get(RANK_STATUS_ENV)
    if status and "RANK" in os.environ:
        from ..atomic_files import atomic_write_bytes
        atomic_write_bytes(Path(status) / f"rank{int(os.environ['RANK'])}.rc", str(rc).encode())
        return 0
    return rc


def _close(progress) -> None:
    if progress is not None:      # idempotent: the error paths close it before their message, finally again
        progress.close()


def _recon_cli(args) -> int:
    from .progress import Cancelled, JsonLinesSink, Progress, TqdmSink
    from .ranks import RankError
    from .run_folder import RunBusyError

    import os

    if args.threads is not None and args.threads < 1:
        print("ctbench recon: --threads must be a positive number of threads", file=sys.stderr)
        return 2
    if args.ranks is not None:
        if args.ranks < 1:
            print("ctbench recon: --ranks must be a positive number of processes", file=sys.stderr)
            return 2
        if args.ranks > (os.cpu_count() or 1):
            print(f"ctbench recon: --ranks {args.ranks} is more than this machine's {os.cpu_count()} cores",
                  file=sys.stderr)
            return 2
        if args.ranks > 1 and "WORLD_SIZE" not in os.environ:
            return _launch_ranks(args)
    leader = os.environ.get("RANK", "0") == "0"
    progress = None
    try:
        cfg = load_config(args.config)
        force = getattr(args, "force", False)
        if args.out:
            cfg.output = OutputConfig(path=args.out, overwrite=args.overwrite or force, force=force)
        elif cfg.output is not None:
            cfg.output.overwrite = cfg.output.overwrite or args.overwrite or force
            cfg.output.force = cfg.output.force or force
        updates = {k: v for k, v in (("memory", args.memory), ("threads", args.threads)) if v is not None}
        if updates:
            cfg.resources = cfg.resources.model_validate(cfg.resources.model_dump() | updates)
        sink = None if not leader else JsonLinesSink() if args.json else (None if args.quiet else TqdmSink())
        progress = Progress(sink, throttle_s=0.0 if args.json else 0.25)
        say = (lambda m: print(strict_json({"event": "log", "message": m}), flush=True)) if args.json else \
            (lambda m: print(m, file=sys.stderr))
        report = run_recon(cfg, log=say, progress=progress, return_volume=False)
    except RankError:
        return 2                  # rank 0 stopped and says why; the other ranks stay quiet
    except Cancelled as e:
        _close(progress)     # the bars end their lines first: the message starts a line of its own
        print(f"ctbench recon: {e}; run the same command again to resume", file=sys.stderr)
        return 130
    except (ValueError, OSError, RecursionError, MemoryError, RunBusyError) as e:
        # Every refused input (ScanFileError, bounds, bad config, a file that cannot be read, a busy output, a
        # budget too small) is rc 2 with one line, never a traceback (docs/SCANS.md).
        _close(progress)
        print(f"ctbench recon: {e}", file=sys.stderr)
        return 2
    finally:
        _close(progress)
    if not leader:
        return 0
    for w in report.get("warnings", []):
        print(f"ctbench recon: warning: {w}", file=sys.stderr)
    for k in ("volume", "geometry_object"):
        report.pop(k)
    if args.json:
        report = {"event": "report", **report}
    print(strict_json(report, notes=REPORT_NOTES))
    return 0


def register_calibrate(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="calibrate a scan's geometry from its own data "
                                                "(the recon config's calibrate section; docs/CALIBRATION.md)")
    p.add_argument("config", help="recon config (JSON) with an optional calibrate section")
    p.add_argument("--overwrite", action="store_true", help="replace existing trajectory and report files that "
                                                            "ctbench wrote")
    p.add_argument("--force", action="store_true", help="replace them even if ctbench did not write them (never an "
                                                        "input)")
    p.set_defaults(func=_calibrate_cli)


def _calibrate_cli(args) -> int:
    try:
        cfg = load_config(args.config)
        if cfg.calibrate is None:
            cfg.calibrate = CalibrateConfig()
        cfg.calibrate.overwrite = cfg.calibrate.overwrite or args.overwrite or args.force
        cfg.calibrate.force = cfg.calibrate.force or args.force
        report = run_calibrate(cfg, config_path=Path(args.config), log=lambda m: print(m, file=sys.stderr))
    except (ValueError, TypeError, OSError, RecursionError, MemoryError) as e:   # as ctbench recon: rc 2, one line
        print(f"ctbench calibrate: {e}", file=sys.stderr)
        return 2
    # the scan's orientation/centre doubts, as ctbench recon gives them: a calibration of a mirrored or
    # mis-centred reading is a calibration of the wrong scan
    for w in report.get("warnings", []):
        print(f"ctbench calibrate: warning: {w}", file=sys.stderr)
    print(strict_json({k: report[k] for k in ("trajectory", "report", "final_loss", "elapsed_s")}
                      | {"parameters": {p["name"]: p["value"] for p in report["parameters"]}}, notes=REPORT_NOTES))
    return 0
