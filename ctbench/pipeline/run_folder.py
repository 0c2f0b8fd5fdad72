"""The folder a streamed recon works in, beside its output: work stores, the unfinished volume, what is done.

``<output folder>/.<output name>.ctbench-run/`` holds

- ``run.json``: the job's fingerprint (config and input files' sizes and times), its plan and the values it
  found (orientation, centre), written atomically;
- ``lock``: held (``flock``) by the process working in the folder, so two runs never write one output;
- the work stores and the volume under construction;
- ``done/<step>/<a>-<b>``: an empty marker per finished window, created after the window's data is written
  (chunk writes are atomic), so a run killed at any moment knows exactly what it finished.

Run again with the same command, a job finds its folder, checks the fingerprint and goes on where it
stopped (windows with a marker are skipped; the plan is the one recorded, so the result is the same bit for
bit).  A folder of another job (other config or changed input files) is replaced.  The output itself appears
only when the whole volume is written (:func:`ctbench.output_policy.replace_into_place`); the folder is
removed after that.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..atomic_files import atomic_write_bytes

RUN_SUFFIX = ".ctbench-run"
MAX_INPUT_ENTRIES = 200_000     # files of an input folder fingerprinted (a folder listing is bounded)


class RunBusyError(RuntimeError):
    """Another process is working on the same output."""


def run_folder_for(output: Path) -> Path:
    output = Path(output)
    return output.parent / f".{output.name}{RUN_SUFFIX}"


def input_identity(paths) -> list:
    """Size and modification time of each input path and (for folders) of its entries, bounded."""
    out = []
    for p in paths:
        if p is None:
            continue
        p = Path(p)
        try:
            st = os.stat(p)
        except OSError:
            out.append([str(p), None])
            continue
        entry = [str(p), st.st_size, st.st_mtime_ns]
        if p.is_dir():
            names = []
            with os.scandir(p) as it:
                for i, e in enumerate(it):
                    if i >= MAX_INPUT_ENTRIES:
                        break
                    try:
                        s = e.stat(follow_symlinks=True)
                        names.append([e.name, s.st_size, s.st_mtime_ns])
                    except OSError:
                        names.append([e.name, None, None])
            entry.append(sorted(names))
        out.append(entry)
    return out


def fingerprint(doc) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class RunFolder:
    """A job's run folder (module doc).  Use as a context manager: the lock is held inside."""

    def __init__(self, path: Path, key: str, *, say=None, follower: bool = False):
        self.path = Path(path)
        self.key = key
        self.say = say or (lambda m: None)
        self.follower = follower
        self._lock_fd: int | None = None
        self.state: dict = {}
        self.resumed = False

    # ------------------------------------------------------------ opening
    def __enter__(self) -> "RunFolder":
        if self.follower:
            # Another rank of the same job (ctbench.pipeline.ranks): the leader holds the lock and owns the
            # state; a follower only reads it and adds done markers for its own windows.
            doc = self._read_state()
            if doc is None or doc.get("key") != self.key:
                raise RunBusyError(f"the run folder {self.path} is not this job's (rank 0 opened another job)")
            self.state, self.resumed = doc, True
            return self
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        doc = self._read_state()
        if doc is not None and doc.get("key") == self.key:
            self.state, self.resumed = doc, True
        else:
            if doc is not None or any(p.name != "lock" for p in self.path.iterdir()):
                self.say(f"discarding {self.path.name}: it holds another job's unfinished work")
                for p in self.path.iterdir():
                    if p.name != "lock":
                        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            self.state = {"key": self.key}
            self.save()
        return self

    def __exit__(self, *exc) -> None:
        self._unlock()

    def _lock(self) -> None:
        import fcntl

        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunBusyError(f"another ctbench recon is working on this output (its run folder {self.path} is "
                               "locked); wait for it to finish or stop it") from None
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _read_state(self) -> dict | None:
        from .. import guarded_open
        p = self.path / "run.json"
        if not p.exists():
            return None
        try:
            doc = json.loads(guarded_open.read_bytes(p, limit=64 << 20))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    # ------------------------------------------------------------ state
    def save(self) -> None:
        if self.follower:
            raise RuntimeError("only the leading rank writes a run folder's state")
        atomic_write_bytes(self.path / "run.json", json.dumps(self.state, indent=1).encode())

    def remember(self, **entries) -> None:
        self.state.update(entries)
        self.save()

    def item(self, name: str) -> Path:
        return self.path / name

    # ------------------------------------------------------------ markers
    def _marker(self, step: str, a: int, b: int) -> Path:
        return self.path / "done" / step / f"{int(a)}-{int(b)}"

    def is_done(self, step: str, a: int, b: int) -> bool:
        return self._marker(step, a, b).exists()

    def mark_done(self, step: str, a: int, b: int, data: str = "") -> None:
        """Mark a window finished (after its data is written), with a short note (``data``) kept beside it."""
        m = self._marker(step, a, b)
        m.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(m, data.encode())

    def done_data(self, step: str, a: int, b: int) -> str | None:
        """The note kept with a finished window, or None."""
        from .. import guarded_open
        m = self._marker(step, a, b)
        if not m.exists():
            return None
        return guarded_open.read_bytes(m, limit=16 << 20).decode()

    def n_done(self, step: str, windows) -> int:
        return sum(1 for a, b in windows if self.is_done(step, a, b))

    def forget(self, step: str) -> None:
        shutil.rmtree(self.path / "done" / step, ignore_errors=True)

    # ------------------------------------------------------------ cleaning up
    def remove(self) -> None:
        self._unlock()
        shutil.rmtree(self.path, ignore_errors=True)
