"""Progress of a long job, stage by stage: done / total, rate and ETA, as events any front end can show.

A job opens a :class:`Stage` per step (``stage = progress.stage("read", total=1500, unit="views")``) and
advances it as work finishes (``stage.advance(64)``).  Every advance is a :class:`StageEvent` handed to the
job's sinks, throttled to a few per second (the last one of a stage always goes out):

- :class:`TqdmSink`: a tqdm bar per stage on stderr (the command line);
- :class:`JsonLinesSink`: one JSON object per line (``ctbench recon --json``, the job bridge's event stream);
- any callable taking the event (the napari widgets' progress bars, tests).

``cancel`` (a ``threading.Event`` or a callable) is checked at every advance: when set, :class:`Cancelled`
is raised in the job's own thread, so a job stops between two chunks and leaves only what its completion
records call finished.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import asdict, dataclass

THROTTLE_S = 0.25


class Cancelled(RuntimeError):
    """The job was cancelled; what it finished is kept and recorded, nothing looks finished that is not."""


@dataclass
class StageEvent:
    """The state of one stage after an advance."""

    stage: str
    done: int
    total: int
    unit: str
    elapsed_s: float
    rate: float | None = None      # units per second over the stage so far
    eta_s: float | None = None
    finished: bool = False
    note: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        d["event"] = "progress"
        for k in ("elapsed_s", "rate", "eta_s"):
            if d[k] is not None:
                d[k] = round(d[k], 3)
        return d

    def text(self) -> str:
        s = f"{self.stage}: {self.done}/{self.total} {self.unit}"
        if self.rate:
            s += f", {self.rate:.3g} {self.unit}/s"
        if self.eta_s is not None and not self.finished:
            s += f", {self.eta_s:.0f} s left"
        return s


def _is_set(cancel) -> bool:
    if cancel is None:
        return False
    if isinstance(cancel, threading.Event):
        return cancel.is_set()
    return bool(cancel())


class Stage:
    """One stage of a job (see the module doc)."""

    def __init__(self, progress: "Progress", name: str, total: int, unit: str, done: int = 0):
        self.progress, self.name, self.total, self.unit = progress, name, max(0, int(total)), unit
        self.done = int(done)
        self._start_done = self.done          # work resumed from an earlier run does not count in the rate
        self.t0 = time.perf_counter()
        self._last = 0.0
        self._emit(force=True)

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.total, self.done + int(n))
        self._emit(force=self.done >= self.total, note=note)
        if _is_set(self.progress.cancel):
            raise Cancelled(f"cancelled during {self.name} ({self.done}/{self.total} {self.unit} done)")

    def close(self, note: str = "") -> None:
        self.done = max(self.done, self.total)
        self._emit(force=True, finished=True, note=note)

    def _emit(self, force: bool = False, finished: bool = False, note: str = "") -> None:
        now = time.perf_counter()
        if not force and now - self._last < self.progress.throttle_s:
            return
        self._last = now
        elapsed = now - self.t0
        worked = self.done - self._start_done
        rate = worked / elapsed if elapsed > 0 and worked > 0 else None
        eta = (self.total - self.done) / rate if rate else None
        self.progress.emit(StageEvent(self.name, self.done, self.total, self.unit, elapsed, rate, eta, finished,
                                      note))


class Progress:
    """Hands :class:`StageEvent` objects to ``sinks`` and carries the job's ``cancel``."""

    def __init__(self, *sinks, cancel=None, throttle_s: float = THROTTLE_S):
        self.sinks = [s for s in sinks if s is not None]
        self.cancel = cancel
        self.throttle_s = throttle_s      # 0: an event for every advance (machine-read streams)

    def stage(self, name: str, total: int, unit: str, done: int = 0) -> Stage:
        return Stage(self, name, total, unit, done)

    def emit(self, event: StageEvent) -> None:
        for sink in self.sinks:
            sink(event)

    def close(self) -> None:
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if callable(close):
                close()

    def check_cancel(self, where: str) -> None:
        if _is_set(self.cancel):
            raise Cancelled(f"cancelled {where}")


class TqdmSink:
    """A tqdm bar per stage on ``file`` (stderr)."""

    def __init__(self, file=None):
        self.file = file or sys.stderr
        self.bars: dict[str, object] = {}

    def __call__(self, e: StageEvent) -> None:
        from tqdm import tqdm

        bar = self.bars.get(e.stage)
        if bar is None:
            bar = self.bars[e.stage] = tqdm(total=e.total, desc=e.stage, unit=f" {e.unit}", file=self.file,
                                            dynamic_ncols=True, initial=e.done, leave=True,
                                            mininterval=THROTTLE_S)
        bar.update(e.done - bar.n)
        if e.finished:
            bar.close()
            self.bars.pop(e.stage, None)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()


class JsonLinesSink:
    """One JSON object per event on ``file`` (stdout), flushed at once."""

    def __init__(self, file=None):
        self.file = file or sys.stdout

    def __call__(self, e: StageEvent) -> None:
        self.file.write(json.dumps(e.to_json()) + "\n")
        self.file.flush()


__all__ = ["Progress", "Stage", "StageEvent", "Cancelled", "TqdmSink", "JsonLinesSink"]
