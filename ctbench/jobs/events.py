"""The job event stream: JSON lines written by rank 0, read from any offset.

Each line is one event with a gap-free ``seq`` (0, 1, 2, ...) and a ``type``:

- ``started``:  ``n_iter``, ``volume_shape``, ``voxel_spacing``, ``origin``, ``note``, ``request``, ``nproc``
- ``progress``: ``iteration``, ``n_iter``, ``residual``, ``elapsed``, ``eta``, optional ``preview``
  (a downsampled central z-slice: ``{"index", "factor", "shape", "data"}``, data base64 float32)
- ``finished``: ``stopped``, ``n_iter``, ``residuals``, ``elapsed``, ``output``, ``metadata``
- ``error``:    ``message`` (rank 0 failed; the log has the traceback)

:func:`to_workflow_event` turns them back into the workbench's
:class:`~ctbench.workbench.workflow.Started` / ``Progress`` / ``Finished``,
so a widget cannot tell a job from a local run.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import numpy as np

from ..json_report import dumps as strict_json

EVENTS_FILE = "events.jsonl"


class EventWriter:
    """Appends events to ``events.jsonl``; continues the numbering of an existing file (resumed jobs)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.seq = len(read_events(self.path))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, type_: str, **fields) -> dict:
        event = {"seq": self.seq, "type": type_, "time": time.time(), **fields}
        # One write() of a whole line on an O_APPEND file: a reader never sees half an event
        # followed by another one, only (at worst) a trailing partial line, which it skips.
        # Strict JSON (a NaN residual is null with a note, ctbench/json_report.py): the bridge's HTTP replies
        # and browsers refuse NaN.
        os.write(self._fd, (strict_json(event, separators=(",", ":")) + "\n").encode())
        self.seq += 1
        return event

    def close(self) -> None:
        os.close(self._fd)


def read_events(path: str | Path, after: int = -1, limit: int | None = None) -> list[dict]:
    """The complete events with ``seq > after`` (a trailing partial line is not an event yet)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n")[:-1]:
        if not line:
            continue
        ev = json.loads(line)
        if ev["seq"] > after:
            out.append(ev)
            if limit and len(out) >= limit:
                break
    return out


class EventIndex:
    """Byte offsets of the complete lines of one events file, extended as it grows.

    A long-poll asks for events after ``seq`` many times a second; the index
    reads only the bytes appended since its last look and seeks straight to
    the first wanted line, so a long job's large file is never parsed again.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offsets: list[int] = []     # start of line seq
        self.end = 0                     # end of the last complete line

    def refresh(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.end)
                data = f.read()
        except FileNotFoundError:
            return len(self.offsets)
        pos = 0
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            if nl > pos:
                self.offsets.append(self.end + pos)
            pos = nl + 1
        self.end += pos
        return len(self.offsets)

    def read(self, after: int = -1, limit: int | None = None) -> list[dict]:
        n = self.refresh()
        first = max(after + 1, 0)
        if first >= n:
            return []
        last = n if not limit else min(n, first + limit)
        with open(self.path, "rb") as f:
            f.seek(self.offsets[first])
            data = f.read((self.offsets[last] if last < n else self.end) - self.offsets[first])
        return [json.loads(line) for line in data.split(b"\n") if line]

    def last_of(self, type_: str, lookback: int = 64) -> dict | None:
        """The newest event of ``type_`` among the last ``lookback`` events (cheap: reads only those)."""
        n = self.refresh()
        for ev in reversed(self.read(n - 1 - lookback) if n else []):
            if ev.get("type") == type_:
                return ev
        return None


def encode_preview(plane: np.ndarray, index: int, factor: int, volume_shape) -> dict:
    a = np.ascontiguousarray(plane, dtype=np.float32)
    return {"index": int(index), "factor": int(factor), "shape": list(a.shape), "volume_shape": list(volume_shape),
            "data": base64.b64encode(a.tobytes()).decode("ascii")}


def decode_preview(p: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(p["data"]), dtype=np.float32).reshape(p["shape"]).copy()


def preview_volume(p: dict) -> np.ndarray:
    """A volume of ``volume_shape`` that shows the preview slice at its plane (zeros elsewhere).

    The preview (with ``volume_shape`` of the result) is downsampled by ``factor``; it is repeated back to full size
    (nearest neighbour), so a viewer layer keeps the result's shape and placement.
    """
    plane = decode_preview(p)
    f = int(p["factor"])
    full = np.repeat(np.repeat(plane, f, axis=-2), f, axis=-1) if plane.ndim == 2 else plane
    shape = tuple(p["volume_shape"])
    vol = np.zeros(shape, dtype=np.float32)
    if len(shape) == 2:
        vol[...] = full[:shape[0], :shape[1]]
    else:
        vol[p["index"]] = full[:shape[1], :shape[2]]
    return vol


def to_workflow_event(ev: dict, *, volume=None):
    """The workbench event for a job event (``volume``: the result, needed for ``finished``); None otherwise."""
    import torch

    from ..workbench.workflow import Finished, Progress, ReconRequest, Started

    t = ev.get("type")
    if t == "started":
        return Started(ReconRequest.from_dict(ev["request"]), int(ev["n_iter"]), tuple(ev["volume_shape"]),
                       tuple(ev["voxel_spacing"]), tuple(ev["origin"]), ev.get("note", ""))
    if t == "progress":
        preview = None
        if ev.get("preview") is not None:
            preview = torch.from_numpy(preview_volume(ev["preview"]))
        return Progress(int(ev["iteration"]), int(ev["n_iter"]), ev.get("residual"), float(ev["elapsed"]), preview)
    if t == "finished":
        m = ev["metadata"]
        vol = volume if volume is not None else torch.zeros(0)
        return Finished(vol, [float("nan") if r is None else r for r in ev["residuals"]], int(ev["n_iter"]), ev["stopped"], float(ev["elapsed"]),
                        ReconRequest.from_dict(ev["request"]), tuple(m["voxel_spacing"]), tuple(m["origin"]),
                        m.get("note", ""))
    return None
