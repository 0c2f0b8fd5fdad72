"""A Python client of the job bridge (httpx), used by the command line and the napari plugin.

Finding the bridge, first match wins: explicit ``url``/``token_file``; the
environment (``CTBENCH_BRIDGE_URL``, ``CTBENCH_BRIDGE_TOKEN_FILE``,
``CTBENCH_BRIDGE_STATE_DIR``); the local bridge's state directory
(``bridge.json`` and ``token`` in :func:`~ctbench.jobs.bridge.default_state_dir`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Iterator

import httpx



class BridgeError(RuntimeError):
    """The bridge answered with an error (``status`` is the HTTP status)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"bridge error {status}: {message}")
        self.status = status
        self.message = message


class BridgeNotFound(RuntimeError):
    """No bridge is known or reachable."""


def state_dir_from_env(state_dir=None) -> Path:
    from .bridge import default_state_dir

    return Path(state_dir or os.environ.get("CTBENCH_BRIDGE_STATE_DIR") or default_state_dir())


def locate(url: str | None = None, token_file: str | None = None, state_dir=None) -> tuple[str, str]:
    """(url, token) of the bridge to talk to; BridgeNotFound with what was tried."""
    sd = state_dir_from_env(state_dir)
    url = url or os.environ.get("CTBENCH_BRIDGE_URL")
    token_file = token_file or os.environ.get("CTBENCH_BRIDGE_TOKEN_FILE")
    if url is None:
        info = sd / "bridge.json"
        try:
            url = json.loads(info.read_text())["url"]
        except (OSError, ValueError, KeyError):
            raise BridgeNotFound(f"no bridge URL: pass --url, set CTBENCH_BRIDGE_URL, or start one with "
                                 f"'ctbench bridge serve' (looked for {info})") from None
    tf = Path(token_file) if token_file else sd / "token"
    try:
        token = tf.read_text().strip()
    except OSError:
        raise BridgeNotFound(f"no token file at {tf}: pass --token-file or set CTBENCH_BRIDGE_TOKEN_FILE") from None
    return url.rstrip("/"), token


class BridgeClient:
    """Calls of the bridge's HTTP API; every method raises :class:`BridgeError` on an error answer."""

    def __init__(self, url: str | None = None, token: str | None = None, *, token_file: str | None = None,
                 state_dir=None, timeout: float = 30.0):
        if url is None or token is None:
            url2, token2 = locate(url, token_file, state_dir)
            url, token = url or url2, token or token2
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                  timeout=timeout, trust_env=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise BridgeNotFound(f"cannot reach the bridge at {self.url}: {e}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise BridgeError(r.status_code, detail if isinstance(detail, str) else json.dumps(detail))
        return r

    # ------------------------------------------------------------------ jobs
    def health(self) -> dict:
        return self._call("GET", "/health").json()

    def submit(self, spec) -> dict:
        body = spec.model_dump(mode="json", exclude_none=True) if hasattr(spec, "model_dump") else dict(spec)
        return self._call("POST", "/jobs", json=body).json()

    def list(self, state: str | None = None) -> list[dict]:
        return self._call("GET", "/jobs", params={"state": state} if state else None).json()

    def status(self, job_id: str) -> dict:
        return self._call("GET", f"/jobs/{job_id}").json()

    def events(self, job_id: str, after: int = -1, timeout: float = 0.0) -> dict:
        """One long-poll: ``{"events": [...], "next": seq, "state", "terminal"}``."""
        return self._call("GET", f"/jobs/{job_id}/events", params={"after": after, "timeout": timeout},
                          timeout=timeout + 30).json()

    def follow(self, job_id: str, after: int = -1, poll: float = 10.0) -> Iterator[dict]:
        """Every event with seq > after, in order, until the job ends (reconnects cost nothing: offsets)."""
        while True:
            page = self.events(job_id, after, poll)
            for ev in page["events"]:
                after = ev["seq"]
                yield ev
            if page["terminal"] and not page["events"]:
                return

    def logs(self, job_id: str, offset: int = 0) -> tuple[str, int]:
        r = self._call("GET", f"/jobs/{job_id}/logs", params={"offset": offset})
        return r.text, int(r.headers.get("X-Next-Offset", offset))

    def cancel(self, job_id: str, wait: float = 0.0) -> dict:
        return self._call("POST", f"/jobs/{job_id}/cancel", params={"wait": wait}, timeout=wait + 30).json()

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 10.0) -> dict:
        """Block until the job ends (long-polling its events); its final status. TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        after = -1
        while True:
            left = poll if deadline is None else min(poll, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"job {job_id} is still running after {timeout} s")
            page = self.events(job_id, after, left)
            after = page["next"]
            if page["terminal"]:
                return self.status(job_id)

    def delete(self, job_id: str) -> None:
        self._call("DELETE", f"/jobs/{job_id}")

    def fetch(self, job_id: str, dest: str | Path) -> Path:
        """Download a succeeded job's result dataset to ``dest`` (a new ``.zarr`` folder)."""
        from ..output_policy import check_output, remove_path, replace_into_place, staging_path

        dest = Path(dest)
        if os.path.lexists(dest):
            raise FileExistsError(f"{dest} exists; choose another destination")
        check_output(dest, what="fetch destination")       # removes what a killed fetch of dest left
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = staging_path(dest)
        os.mkdir(tmp, 0o700)          # a new folder (never through a planted link), removed on every failure
        try:
            with self._http.stream("GET", f"/jobs/{job_id}/result", timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    raise BridgeError(r.status_code, r.text)
                with tarfile.open(fileobj=_Reader(r.iter_bytes()), mode="r|") as tf:
                    tf.extractall(tmp, filter="data")   # refuses absolute paths, '..' and links out
            # never over something that appeared at dest meanwhile: that is swapped back and refused
            replace_into_place(tmp / "result.zarr", dest, may_replace=lambda old: False)
        finally:
            remove_path(tmp)
        return dest

    # ------------------------------------------------------------------ data
    def upload_file(self, local: str | Path, remote: str, chunk: int = 8 << 20) -> dict:
        """Send a file in chunks to ``remote`` (relative to the bridge's data directory)."""
        from ..guarded_open import open_regular

        local = Path(local)
        out = None
        offset = 0
        with open_regular(local) as f:       # a FIFO or device is refused, never read
            size = os.fstat(f.fileno()).st_size
            try:
                while True:
                    data = f.read(chunk)
                    final = offset + len(data) >= size
                    out = self._call("PUT", f"/data/{remote}", params={"offset": offset, "final": final},
                                     content=data).json()
                    offset += len(data)
                    if final:
                        return out
            except BaseException:
                if offset:     # earlier chunks sit in REMOTE.part on the bridge: the failed upload leaves nothing
                    self._discard_part(remote)
                raise

    def _discard_part(self, remote: str) -> None:
        try:
            self._call("DELETE", f"/data/{remote}.part")
        except (BridgeError, httpx.HTTPError):
            pass      # the bridge removes the part itself on the failures it sees

    def upload_dataset(self, local: str | Path, remote: str, chunk: int = 8 << 20) -> str:
        """Send a dataset folder (every file) to ``remote``; returns the path to submit jobs with."""
        local = Path(local)
        if not local.is_dir():
            raise NotADirectoryError(f"{local} is not a dataset folder")
        for f in sorted(local.rglob("*")):
            if f.is_file():
                self.upload_file(f, f"{remote}/{f.relative_to(local).as_posix()}", chunk)
        return remote

    def delete_data(self, remote: str) -> None:
        """Remove a file or folder of the bridge's data directory."""
        self._call("DELETE", f"/data/{remote}")

    def download(self, remote: str, dest: str | Path) -> Path:
        """Copy a file or folder of the bridge's data directory to ``dest``."""
        dest = Path(dest)
        r = self._call("GET", f"/data/{remote}")
        if r.headers.get("content-type", "").startswith("application/json"):
            listing = r.json()
            if "files" in listing:
                base = remote.rstrip("/")
                for f in listing["files"]:
                    rel = Path(f["path"]).relative_to(base)
                    self.download(f["path"], dest / rel)
                return dest
        from ..atomic_files import atomic_write_bytes

        dest.parent.mkdir(parents=True, exist_ok=True)
        # a new temporary sibling created exclusively (no planted link followed), removed on failure
        atomic_write_bytes(dest, r.content, fsync=True, suffix=".part", mode=0o666)
        return dest


class _Reader:
    """A file-like view of an iterator of byte chunks (for streaming tarfile)."""

    def __init__(self, chunks):
        self._it = iter(chunks)
        self._buf = b""

    def read(self, n=-1):
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._it)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out


def ensure_local_bridge(state_dir=None, max_jobs: int = 1, timeout: float = 30.0, popen=None) -> BridgeClient:
    """A client of the local bridge of ``state_dir``, starting one (detached) if none answers.

    ``popen`` (default ``subprocess.Popen``) starts the process: a caller whose thread runs at a lowered
    priority passes one that starts it from a thread at normal priority (a child inherits its thread's)."""
    sd = state_dir_from_env(state_dir)
    try:
        c = BridgeClient(state_dir=sd, timeout=5)
        c.health()
        return c
    except (BridgeNotFound, BridgeError):
        pass
    sd.mkdir(parents=True, exist_ok=True)
    log = open(sd / "bridge.log", "ab")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    (popen or subprocess.Popen)([sys.executable, "-m", "ctbench.cli", "bridge", "serve", "--state-dir", str(sd),
                                 "--max-jobs", str(max_jobs)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    log.close()
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            c = BridgeClient(state_dir=sd, timeout=5)
            c.health()
            return c
        except (BridgeNotFound, BridgeError) as e:
            last = e
            time.sleep(0.1)
    raise BridgeNotFound(f"started a bridge for {sd} but it did not answer within {timeout} s "
                         f"(see {sd / 'bridge.log'}): {last}")
