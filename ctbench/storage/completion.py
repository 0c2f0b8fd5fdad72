"""Completion records: which windows of an output store are written, and from which inputs.

A streaming call (``project_into``, ``backproject_into``, ``fdk_into``) writes
a record into its output store before the first window (every planned window
pending), marks each window done *after* that window's chunks are written, and
marks the record complete last.  A run killed at any point therefore leaves a
record that names exactly the windows that may hold zeros or an earlier run's
data; reading such a window raises :class:`IncompleteStoreError` (an
incomplete store, or one that mixes two runs), and the call can be resumed
(``resume=True``: the same inputs, only the pending windows) or redone.

Stores keep the record as they can: :class:`~ctbench.storage.zarr_store.ZarrStore`
in its zarr attributes (rewritten atomically), :class:`~ctbench.storage.memory.TensorStore`
in memory.  Stores without ``completion_record``/``set_completion_record`` are
written without one.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field

from .base import IncompleteStoreError

RECORD_KEY = "ctbench_completion"


@dataclass
class CompletionRecord:
    """The windows (axis-0 ranges of the output store) a run planned and those it finished."""

    operation: str
    inputs: dict
    windows: list[list[int]]
    done: list[list[int]] = field(default_factory=list)
    complete: bool = False
    run: str = field(default_factory=lambda: secrets.token_hex(8))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d) -> "CompletionRecord | None":
        if not isinstance(d, dict):
            return None
        try:
            return cls(str(d["operation"]), dict(d["inputs"]), [list(map(int, w)) for w in d["windows"]],
                       [list(map(int, w)) for w in d.get("done", [])], bool(d.get("complete")), str(d["run"]))
        except (KeyError, TypeError, ValueError):
            return None

    def pending(self) -> list[list[int]]:
        done = {tuple(w) for w in self.done}
        return [w for w in self.windows if tuple(w) not in done]

    def pending_in(self, start: int, stop: int) -> list[list[int]]:
        """Pending windows that overlap the axis-0 range [start, stop)."""
        if self.complete:
            return []
        return [w for w in self.pending() if w[0] < stop and start < w[1]]


def record_of(store) -> CompletionRecord | None:
    fn = getattr(store, "completion_record", None)
    return fn() if callable(fn) else None


def check_window_complete(store, record: CompletionRecord | None, start: int, stop: int, where: str) -> None:
    """Raise :class:`IncompleteStoreError` if the axis-0 range [start, stop) overlaps an unwritten window."""
    if record is None or record.complete:
        return
    pending = record.pending_in(start, stop)
    if pending:
        total = len(record.windows)
        raise IncompleteStoreError(
            f"{where} is incomplete: its {record.operation} run stopped after {total - len(record.pending())} of "
            f"{total} windows, and the windows {pending[:6]}{' ...' if len(pending) > 6 else ''} (axis 0) that "
            "this read covers were never written by it (they hold zeros or an earlier run's data). Resume the "
            f"run with {record.operation}_into(..., resume=True), redo it, or open the store with "
            "allow_incomplete=True to read it anyway")


def store_identity(store) -> dict:
    """Where a store's data lives and which completed run wrote it (so a resume sees changed inputs)."""
    loc = store_location(store)
    rec = record_of(store)
    return {"location": None if loc is None else str(loc), "run": None if rec is None else rec.run}


def store_location(store):
    """A key equal for two store objects over the same data: resolved path for zarr, storage for tensors."""
    fn = getattr(store, "location", None)
    return fn() if callable(fn) else None


def same_location(a, b) -> bool:
    la, lb = store_location(a), store_location(b)
    return la is not None and la == lb


class OutputRun:
    """The completion record of one streaming call into ``store`` (no-op for stores without records)."""

    def __init__(self, store, operation: str, inputs: dict, windows, *, resume: bool = False):
        self.store = store
        self.enabled = callable(getattr(store, "set_completion_record", None))
        windows = [[int(a), int(b)] for a, b in windows]
        old = record_of(store) if self.enabled else None
        if resume:
            if old is None:
                raise ValueError(f"resume=True, but the output store {store!r} has no completion record of an "
                                 "earlier run to resume; run without resume")
            if old.operation != operation or old.inputs != inputs or old.windows != windows:
                now = {"operation": operation, "inputs": inputs, "windows": windows}
                what = [k for k, v in now.items() if getattr(old, k) != v]
                raise ValueError(f"resume=True, but the output store holds a {old.operation} run with other "
                                 f"{' and '.join(what)} than this call (different geometry, input store, "
                                 "options or memory plan); run without resume to redo it")
            self.record = old
        else:
            self.record = CompletionRecord(operation, inputs, windows)
        if self.enabled:
            remove_partial = getattr(store, "remove_partial_files", None)
            if callable(remove_partial):
                remove_partial()
            if not self.record.complete:
                store.set_completion_record(self.record)

    def is_done(self, start: int, stop: int) -> bool:
        return self.record.complete or [start, stop] in self.record.done

    def mark_done(self, start: int, stop: int) -> None:
        """After the window's data is written: the record says so (atomically, for zarr stores)."""
        self.record.done.append([int(start), int(stop)])
        if self.enabled:
            self.store.set_completion_record(self.record)

    def finish(self) -> None:
        self.record.complete = True
        if self.enabled:
            self.store.set_completion_record(self.record)
