"""The job table: one SQLite file in the bridge's state directory.

Every state change is one transaction whose ``WHERE`` names the states it
may leave (``queued -> running`` only from ``queued``), so two schedulers, or
a scheduler and a cancel arriving at once, can never both win: a job runs at
most once and a finished job never changes again.  WAL mode lets readers
(``list``, ``status``) run beside the writer; the file survives restarts,
and ``synchronous=FULL`` makes every committed transition survive a power cut.

A job's output path is reserved in the same transaction that adds the job: a
unique index over the outputs of queued and running jobs refuses a second job
naming the same output (:class:`OutputReserved`) until the first has ended.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from .spec import STATES, TERMINAL

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    id        TEXT UNIQUE NOT NULL,
    name      TEXT,
    state     TEXT NOT NULL CHECK (state IN ('queued','running','succeeded','failed','cancelled')),
    spec      TEXT NOT NULL,
    job_dir   TEXT NOT NULL,
    submitted REAL NOT NULL,
    started   REAL,
    ended     REAL,
    pgid      INTEGER,
    returncode INTEGER,
    reason    TEXT,
    attempts  INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
"""
_RESERVE = """
CREATE UNIQUE INDEX IF NOT EXISTS jobs_output_active ON jobs(output) WHERE state IN ('queued','running');
"""


class OutputReserved(FileExistsError):
    """Another queued or running job already writes to this output."""


@dataclass
class JobRecord:
    """One row of the job table."""

    id: str
    name: str | None
    state: str
    spec: dict
    job_dir: str
    submitted: float
    started: float | None
    ended: float | None
    pgid: int | None
    returncode: int | None
    reason: str | None
    attempts: int
    cancel_requested: bool
    seq: int = 0
    output: str | None = None   # the resolved output path, reserved while the job is queued or running

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


class JobStore:
    """Thread-safe access to the job table (one connection per thread)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        c = self._conn()
        c.executescript(_SCHEMA)   # idempotent (IF NOT EXISTS); executescript commits itself
        if "output" not in {r["name"] for r in c.execute("PRAGMA table_info(jobs)")}:
            c.execute("ALTER TABLE jobs ADD COLUMN output TEXT")   # a table of an older bridge
        c.executescript(_RESERVE)

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            c.row_factory = sqlite3.Row
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=FULL")   # a committed transition is on disk (WAL fsync per commit)
            self._local.conn = c
        return c

    class _Tx:
        def __init__(self, conn):
            self.conn = conn

        def __enter__(self):
            self.conn.execute("BEGIN IMMEDIATE")
            return self.conn

        def __exit__(self, exc_type, *_):
            self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
            return False

    def _tx(self):
        return self._Tx(self._conn())

    @staticmethod
    def _record(row) -> JobRecord:
        d = dict(row)
        d["spec"] = json.loads(d["spec"])
        d["cancel_requested"] = bool(d["cancel_requested"])
        return JobRecord(**d)

    # ------------------------------------------------------------- writes
    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex[:12]

    def add(self, job_id: str, spec: dict, job_dir: Path, name: str | None = None,
            output: str | None = None) -> JobRecord:
        """A new queued job (its directory and spec.json are written before, so a claimed job has them),
        reserving ``output``; :class:`OutputReserved` if a queued or running job already holds it."""
        try:
            with self._tx() as db:
                db.execute("INSERT INTO jobs (id, name, state, spec, job_dir, submitted, output) "
                           "VALUES (?,?,?,?,?,?,?)",
                           (job_id, name, "queued", json.dumps(spec), str(job_dir), time.time(), output))
        except sqlite3.IntegrityError:
            row = self._conn().execute("SELECT id, state FROM jobs WHERE output=? AND state IN "
                                       "('queued','running')", (output,)).fetchone()
            other = f"job {row['id']} ({row['state']})" if row else "another job"
            raise OutputReserved(f"output: {output} is reserved by {other}; choose another output or wait "
                                 "until that job has ended") from None
        return self.get(job_id)

    def claim_next(self) -> JobRecord | None:
        """The oldest queued job, moved to ``running`` (attempt counted); None if none is queued."""
        with self._tx() as db:
            row = db.execute("SELECT id FROM jobs WHERE state='queued' AND cancel_requested=0 "
                             "ORDER BY seq LIMIT 1").fetchone()
            if row is None:
                return None
            cur = db.execute("UPDATE jobs SET state='running', started=?, attempts=attempts+1 "
                             "WHERE id=? AND state='queued'", (time.time(), row["id"]))
            if cur.rowcount != 1:
                return None
        return self.get(row["id"])

    def set_pgid(self, job_id: str, pgid: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET pgid=? WHERE id=?", (pgid, job_id))

    def finish(self, job_id: str, state: str, *, returncode: int | None = None, reason: str | None = None,
               from_states=("queued", "running")) -> bool:
        """Move a job to a terminal state; False if it was not in ``from_states`` (nothing changed)."""
        if state not in TERMINAL:
            raise ValueError(f"state must be one of {TERMINAL}, got {state!r}")
        marks = ",".join("?" * len(from_states))
        with self._tx() as db:
            cur = db.execute(f"UPDATE jobs SET state=?, ended=?, returncode=?, reason=? "
                             f"WHERE id=? AND state IN ({marks})",
                             (state, time.time(), returncode, reason, job_id, *from_states))
            return cur.rowcount == 1

    def requeue(self, job_id: str, reason: str) -> bool:
        """A running job whose processes are gone goes back to the queue (to resume from a checkpoint)."""
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET state='queued', pgid=NULL, reason=? WHERE id=? AND state='running'",
                             (reason, job_id))
            return cur.rowcount == 1

    def request_cancel(self, job_id: str) -> JobRecord | None:
        """Mark a job for cancelling; a queued job is cancelled at once. None if there is no such job."""
        with self._tx() as db:
            db.execute("UPDATE jobs SET cancel_requested=1 WHERE id=? AND state IN ('queued','running')", (job_id,))
            db.execute("UPDATE jobs SET state='cancelled', ended=?, reason='cancelled before it started' "
                       "WHERE id=? AND state='queued'", (time.time(), job_id))
        return self.find(job_id)

    def delete(self, job_id: str) -> bool:
        """Remove a finished job's row; False if it is not finished (or does not exist)."""
        marks = ",".join("?" * len(TERMINAL))
        with self._tx() as db:
            cur = db.execute(f"DELETE FROM jobs WHERE id=? AND state IN ({marks})", (job_id, *TERMINAL))
            return cur.rowcount == 1

    # -------------------------------------------------------------- reads
    def find(self, job_id: str) -> JobRecord | None:
        row = self._conn().execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return None if row is None else self._record(row)

    def get(self, job_id: str) -> JobRecord:
        rec = self.find(job_id)
        if rec is None:
            raise KeyError(job_id)
        return rec

    def list(self, state: str | None = None, limit: int | None = None) -> list[JobRecord]:
        if state is not None and state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        q, args = "SELECT * FROM jobs", []
        if state:
            q += " WHERE state=?"
            args.append(state)
        q += " ORDER BY seq"
        if limit:
            q += " LIMIT ?"
            args.append(int(limit))
        return [self._record(r) for r in self._conn().execute(q, args).fetchall()]

    def count(self, state: str) -> int:
        return self._conn().execute("SELECT COUNT(*) FROM jobs WHERE state=?", (state,)).fetchone()[0]
