"""What the Jobs panel says about jobs, in plain words (no Qt): a job's log made readable, a result's layer
name, how many ranks this machine can run, and whether the jobs extra is installed."""

from __future__ import annotations

import importlib.util
import os
import re

JOBS_PACKAGES = ("httpx",)      # what the panel and the background-job choice import (the client of the bridge)


def jobs_missing() -> str | None:
    """The first package of the ``jobs`` extra that the widgets need and that is not installed, else None."""
    for name in JOBS_PACKAGES:
        if importlib.util.find_spec(name) is None:
            return name
    return None


def machine_ranks() -> int:
    """The most ranks a local bridge should run here: one per GPU where there are GPUs, else one per core
    this process may use (more ranks than cores only queue for the CPU; the window froze at load 139)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable CUDA: count cores
        gpus = 0
    return max(1, gpus or cores)


_TB_START = re.compile(r"^Traceback \(most recent call last\):")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|KeyboardInterrupt)\b:?\s?(.*)$")
_RANK_PREFIX = re.compile(r"^\[(rank|default)\d+\]:\s?")
_TORCHRUN_NOISE = re.compile(r"^(W\d{4}|E\d{4}|I\d{4}) .*|^\*{5,}.*|^=+$|^-+$")

STATE_WORDS = {"cancelled": "cancelled (by the user, or by a bridge shutdown); no result was kept",
               "failed": "failed", "succeeded": "finished", "running": "running", "queued": "waiting to start"}


def readable_log(text: str, status: dict) -> str:
    """A job's log for a person: a head line (state and reason in words), the errors named once (the last line
    of each Python traceback, ranks' duplicates merged), then the log without tracebacks and torchrun's
    bookkeeping lines (the full text is still in ``ctbench jobs logs``)."""
    state = str(status.get("state", "?"))
    head = f"job {status.get('id', '?')}: {STATE_WORDS.get(state, state)}"
    reason = status.get("reason")
    if reason and state != "cancelled":
        head += f": {_first_line(reason)}"
    errors: list[str] = []
    kept: list[str] = []
    in_tb = False
    for raw in (text or "").splitlines():
        line = _RANK_PREFIX.sub("", raw.rstrip())
        if _TB_START.match(line):
            in_tb = True
            continue
        if in_tb:
            m = _EXC_LINE.match(line)
            if m:
                in_tb = False
                if not _is_cancel_noise(line, state) and line not in errors:
                    errors.append(line)
            continue
        if _TORCHRUN_NOISE.match(line) or not line.strip():
            continue
        kept.append(line)
    out = [head]
    if errors:
        out.append("")
        out.append("errors:" if len(errors) > 1 else "error:")
        out.extend(f"  {e}" for e in errors)
    if kept:
        out.append("")
        out.append("log:")
        out.extend(kept[-200:])
    return "\n".join(out)


def _is_cancel_noise(line: str, state: str) -> bool:
    """The tracebacks a cancel leaves (the ranks' SIGTERM, torchrun's own exit) say nothing a user needs."""
    return state == "cancelled" and any(w in line for w in ("SignalException", "KeyboardInterrupt", "SIGTERM",
                                                            "ChildFailedError", "Signals.SIGTERM"))


def _first_line(text: str) -> str:
    lines = [x for x in str(text).splitlines() if x.strip()]
    return lines[-1].strip() if lines else ""


def result_name(job: dict, loaded_name: str, taken: list[str]) -> str:
    """A loaded job result's layer name: the method and the input the job was given (its name, set by the
    workbench as ``CGLS n_iter=4 | phantom scan``), else the algorithm and the dataset's file name; the job id
    last, in brackets, and unique among ``taken``."""
    spec = job.get("spec") or {}
    name = (job.get("name") or "").strip()
    if not name:
        algo = str((spec.get("request") or {}).get("algorithm", "result")).upper()
        dataset = os.path.basename(str(spec.get("dataset", "")).rstrip("/")).removesuffix(".zarr")
        name = f"{algo} | {dataset}" if dataset else algo
    if loaded_name.endswith(" sinogram"):
        name += " sinogram"
    base = f"{name} [job {str(job.get('id', ''))[:8]}]"
    out, k = base, 2
    while out in taken:
        out, k = f"{base} ({k})", k + 1
    return out
