"""The bridge's core, without HTTP: state directory, job table, scheduler, cancel, restart recovery.

State directory layout (default ``$XDG_STATE_HOME/ctbench/bridge``, i.e.
``~/.local/state/ctbench/bridge``)::

    token         the bearer token (mode 0600), kept across restarts
    bridge.json   url and pid of the running bridge (clients read it)
    bridge.lock   held (flock) by the running bridge: one bridge per state directory
    jobs.db       the SQLite job table (:mod:`.store`)
    jobs/ID/      spec.json, log, events.jsonl, exit_code, result.json, result.zarr
    data/         uploaded datasets; relative dataset/output paths resolve here

The database is the source of truth: a cancel only marks the job, and the
scheduler thread (one per bridge) starts, watches, signals and finishes
jobs.  A job's final state is decided from what its process group left on
disk (``exit_code``, ``result.json``), so it is right even when the job ended
while no bridge was running.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import subprocess
import threading
import time
from pathlib import Path

from . import launcher
from .events import EVENTS_FILE, EventIndex, read_events
from .spec import JobSpec
from .store import JobRecord, JobStore
from ._files import write_json_atomic


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "ctbench" / "bridge"


def read_or_create_token(state_dir: Path) -> str:
    """The bridge token from ``state_dir/token``, created (mode 0600, user-only) if missing."""
    from ..atomic_files import create_exclusive, write_all
    from ..guarded_open import read_bytes

    path = Path(state_dir) / "token"
    if os.path.lexists(path):
        return read_bytes(path, limit=4096).decode("ascii", "replace").strip()   # never blocks on a FIFO
    token = secrets.token_urlsafe(32)
    fd, tmp = create_exclusive(path.parent, "token.", ".tmp", 0o600)   # no planted link is written through
    try:
        with os.fdopen(fd, "wb") as f:
            write_all(f.fileno(), (token + "\n").encode())
        try:
            os.link(tmp, path)   # fails if another process created the token meanwhile: keep theirs
        except FileExistsError:
            pass
    finally:
        tmp.unlink()
    return read_bytes(path, limit=4096).decode("ascii", "replace").strip()


class PathError(ValueError):
    """A path that escapes the bridge's data directory."""


class Bridge:
    """Jobs of one state directory, run up to ``max_jobs`` at a time."""

    def __init__(self, state_dir: str | Path | None = None, *, max_jobs: int = 1, grace: float = 5.0,
                 poll: float = 0.1, max_upload_bytes: int = 8 << 30):
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {max_jobs}")
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        self.jobs_dir = self.state_dir / "jobs"
        self.data_dir = self.state_dir / "data"
        self.jobs_dir.mkdir(exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        self.max_jobs, self.grace, self.poll = int(max_jobs), float(grace), float(poll)
        self.max_upload_bytes = int(max_upload_bytes)
        self.token = read_or_create_token(self.state_dir)
        self.store = JobStore(self.state_dir / "jobs.db")
        self._procs: dict[str, subprocess.Popen] = {}
        self._killing: set[str] = set()
        self._lock_fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.recovered: list[tuple[str, str]] = []
        self._indexes: dict[str, EventIndex] = {}

    # ----------------------------------------------------------- lifecycle
    def acquire(self) -> None:
        """Take the state directory's lock; RuntimeError if another bridge holds it."""
        fd = os.open(self.state_dir / "bridge.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            info = self.state_dir / "bridge.json"
            where = json.loads(info.read_text()).get("url") if info.exists() else "?"
            raise RuntimeError(f"another bridge already serves {self.state_dir} (at {where})") from None
        self._lock_fd = fd

    def start(self) -> None:
        if self._lock_fd is None:
            self.acquire()
        self.recover()
        self._thread = threading.Thread(target=self._loop, name="ctbench-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop scheduling; running jobs keep running (a restarted bridge re-attaches them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def write_info(self, url: str) -> None:
        write_json_atomic(self.state_dir / "bridge.json", {"url": url, "pid": os.getpid(),
                                                           "token_file": str(self.state_dir / "token")})

    # ---------------------------------------------------------------- paths
    def data_path(self, rel: str) -> Path:
        """``rel`` under the data directory; PathError if it is absolute or escapes it (also via links)."""
        if not rel or rel.startswith("/") or "\x00" in rel:
            raise PathError(f"path must be relative to the bridge's data directory, got {rel!r}")
        if len(rel) > 1024 or any(len(part) > 200 for part in rel.split("/")):
            raise PathError("path too long: at most 1024 characters, 200 per folder or file name")
        root = self.data_dir.resolve()
        try:
            p = (root / rel).resolve()
        except (OSError, RuntimeError) as e:   # symlink loops and the like
            raise PathError(f"path {rel!r} cannot be resolved: {e}") from None
        if p != root and root not in p.parents:
            raise PathError(f"path {rel!r} escapes the bridge's data directory")
        return p

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    # -------------------------------------------------------------- submit
    def submit(self, spec: JobSpec) -> JobRecord:
        """Queue a job. Relative dataset/output paths resolve under the data directory.

        The output is reserved atomically with the job's row (:class:`~.store.OutputReserved` for a second
        job on the same output while the first is queued or running); an existing path, or one inside or
        around the dataset, is refused.  A submit that fails (a full disk) leaves no job directory.
        """
        from ..output_policy import check_overlap
        from ..workbench.dataset import is_dataset

        ds = Path(spec.dataset) if os.path.isabs(spec.dataset) else self.data_path(spec.dataset)
        if not is_dataset(ds):
            raise FileNotFoundError(f"dataset: no ctbench dataset at {ds}")
        changes = {"dataset": str(ds)}
        job_id = self.store.new_id()
        d = self.job_dir(job_id)
        if spec.output is not None:
            out = Path(os.path.realpath(spec.output if os.path.isabs(spec.output) else self.data_path(spec.output)))
            if os.path.lexists(out):
                raise FileExistsError(f"output: {out} exists; choose another output or delete it")
            check_overlap(out, [ds, self.state_dir / "jobs.db", self.jobs_dir])
            changes["output"] = str(out)
        else:
            out = Path(os.path.realpath(d)) / "result.zarr"
        spec = spec.model_copy(update=changes)
        d.mkdir(parents=True)
        try:
            write_json_atomic(d / "spec.json", spec.model_dump(mode="json"))
            return self.store.add(job_id, spec.model_dump(mode="json"), d, spec.name, output=str(out))
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)   # no half-made job directory (full disk, reserved output)
            raise

    def cancel(self, job_id: str, wait: float = 0.0) -> JobRecord | None:
        rec = self.store.request_cancel(job_id)
        deadline = time.monotonic() + wait
        while rec is not None and not rec.terminal and time.monotonic() < deadline:
            time.sleep(0.05)
            rec = self.store.find(job_id)
        return rec

    def delete(self, job_id: str) -> bool:
        rec = self.store.find(job_id)
        if rec is None or not self.store.delete(job_id):
            return False
        self._indexes.pop(job_id, None)
        shutil.rmtree(rec.job_dir, ignore_errors=True)
        return True

    def events(self, rec: JobRecord) -> EventIndex:
        """The (cached) index of a job's events file."""
        idx = self._indexes.get(rec.id)
        if idx is None:
            idx = self._indexes[rec.id] = EventIndex(Path(rec.job_dir) / EVENTS_FILE)
        return idx

    def progress(self, rec: JobRecord) -> dict | None:
        """The latest progress event of a job, without its preview."""
        last = self.events(rec).last_of("progress")
        if last is None:
            return None
        return {k: last.get(k) for k in ("seq", "iteration", "n_iter", "residual", "elapsed", "eta")}

    # ----------------------------------------------------------- scheduling
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the scheduler must survive one bad job
                import traceback
                traceback.print_exc()
            self._stop.wait(self.poll)

    def step(self) -> None:
        """One scheduler pass: finish ended jobs, signal cancelled ones, start queued ones."""
        running = self.store.list("running")
        for rec in running:
            if rec.cancel_requested and rec.id not in self._killing:
                self._killing.add(rec.id)
                threading.Thread(target=self._kill, args=(rec,), daemon=True).start()
            if not self._alive(rec):
                self._finalize(rec)
        n = self.store.count("running")
        while n < self.max_jobs:
            rec = self.store.claim_next()
            if rec is None:
                break
            n += 1
            self._launch(rec)

    def _alive(self, rec: JobRecord) -> bool:
        p = self._procs.get(rec.id)
        if p is not None:
            if p.poll() is None:
                return True
            # The shell ended; wait for stragglers (ranks exiting).
        return launcher.job_alive(rec.id)

    def _launch(self, rec: JobRecord) -> None:
        spec = JobSpec.model_validate(rec.spec)
        try:
            p = launcher.launch(rec.id, Path(rec.job_dir), spec.nproc, spec.threads_per_rank)
        except Exception as e:  # noqa: BLE001
            self.store.finish(rec.id, "failed", reason=f"could not start torchrun: {type(e).__name__}: {e}")
            return
        self._procs[rec.id] = p
        self.store.set_pgid(rec.id, p.pid)

    def _kill(self, rec: JobRecord) -> None:
        try:
            launcher.terminate_job(rec.id, self.grace)
            p = self._procs.get(rec.id)
            if p is not None:
                p.wait(timeout=5)
        finally:
            self._killing.discard(rec.id)

    def _finalize(self, rec: JobRecord) -> None:
        self._procs.pop(rec.id, None)
        state, rc, reason = self.outcome(rec)
        self.store.finish(rec.id, state, returncode=rc, reason=reason, from_states=("running",))

    def outcome(self, rec: JobRecord) -> tuple[str, int | None, str | None]:
        """Final state of a job whose processes are gone, from what they left in the job directory."""
        d = Path(rec.job_dir)
        rc = launcher.read_exit_code(d)
        if rc == 0 and (d / "result.json").exists():
            return "succeeded", 0, None      # it finished before a cancel could stop it (as Slurm would say)
        if rec.cancel_requested:
            return "cancelled", rc, "cancelled by request (every process of the job terminated)"
        errors = [e["message"] for e in read_events(d / EVENTS_FILE) if e["type"] == "error"]
        if rc is None:
            return "failed", None, "the job's processes ended without an exit status (killed?)"
        why = errors[-1] if errors else _last_line(d / "log")
        return "failed", rc, f"torchrun exited with status {rc}: {why}"

    def recover(self) -> None:
        """After a restart: re-attach live jobs, settle the ones that ended meanwhile, requeue unstarted ones.

        A job whose processes are gone without an exit status fails, unless it
        was started with checkpoints: then it is queued again and resumes.
        """
        for rec in self.store.list("running"):
            if rec.pgid is None:
                self.store.requeue(rec.id, "requeued: the bridge stopped before the job was started")
                self.recovered.append((rec.id, "requeued"))
            elif launcher.job_alive(rec.id):
                self.recovered.append((rec.id, "re-attached"))
            else:
                state, rc, reason = self.outcome(rec)
                if state == "failed" and rc is None and rec.spec.get("checkpoint_every") and not rec.cancel_requested:
                    # Started with checkpoints: run it again; the worker resumes from the newest one.
                    self.store.requeue(rec.id, "requeued after a bridge restart: its processes were gone; "
                                               "it resumes from its last checkpoint")
                    self.recovered.append((rec.id, "resumed"))
                    continue
                if state == "failed" and rc is None:
                    reason = ("the bridge restarted and the job's processes were gone, with no exit status "
                              "(killed with the bridge?)")
                self.store.finish(rec.id, state, returncode=rc, reason=reason, from_states=("running",))
                self.recovered.append((rec.id, state))


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][-300:] if lines else "(empty log)"
