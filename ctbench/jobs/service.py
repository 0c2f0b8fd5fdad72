"""The bridge's HTTP API (FastAPI), served by uvicorn on 127.0.0.1 by default.

Every endpoint but ``/health`` and the OpenAPI schema (``/openapi.json``,
``/docs``) needs ``Authorization: Bearer <token>``: no token is 401, a wrong
one 403.  Paths of uploaded/downloaded data are relative to the data
directory; one that escapes it is 403.  Uploads larger than the limit are 413
and leave nothing behind.
"""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import secrets
import socket
import sqlite3
import sys
import tarfile
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .bridge import Bridge, PathError
from .data_files import DataPathError, delete_entry, discard_part, write_chunk
from .spec import STATES, JobSpec
from .store import OutputReserved

_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` says the disk (or quota) is full: an OSError, or SQLite's "database or disk is full"."""
    if isinstance(e, OSError):
        return e.errno in _FULL
    return isinstance(e, sqlite3.OperationalError) and "full" in str(e).lower()


def _full_error(what: str, e: BaseException) -> HTTPException:
    return HTTPException(507, f"{what}: the bridge's disk is full ({e}); free space on it and try again")

API_VERSION = "1"


def create_app(bridge: Bridge, *, manage: bool = True) -> FastAPI:
    """The FastAPI app over ``bridge``; ``manage``: start/stop its scheduler with the app."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        if manage:
            bridge.start()
        yield
        if manage:
            bridge.stop()

    app = FastAPI(title="ctbench job bridge", version=API_VERSION, lifespan=lifespan,
                  description="Background reconstruction jobs (torchrun) for the ctbench workbench; see docs/JOBS.md")
    bearer = HTTPBearer(auto_error=False)

    def auth(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if cred is None:
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        if not secrets.compare_digest(cred.credentials.encode(), bridge.token.encode()):
            raise HTTPException(403, "wrong bearer token")

    @app.exception_handler(OSError)
    @app.exception_handler(sqlite3.OperationalError)
    async def _storage(request: Request, exc: Exception):
        # A full disk anywhere (state, job table, data) is a clear 507, never a bare 500.
        if disk_full(exc):
            return JSONResponse({"detail": f"the bridge's disk is full ({exc}); free space on it and try again"},
                                status_code=507)
        import traceback
        traceback.print_exception(exc)   # a real fault: keep the traceback in the bridge's log
        return JSONResponse({"detail": f"the bridge could not complete the request: {type(exc).__name__}: {exc}"},
                            status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        # 422 whose text names each bad field (the default JSON buries it in "loc").
        errors = [{"field": ".".join(str(p) for p in e["loc"] if p not in ("body", "query", "path")),
                   "message": e["msg"]} for e in exc.errors()]
        text = "; ".join(f"{e['field'] or 'body'}: {e['message']}" for e in errors)
        return JSONResponse({"detail": text, "errors": errors}, status_code=422)

    def job_or_404(job_id: str):
        rec = bridge.store.find(job_id)
        if rec is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return rec

    def public(rec, progress: bool = False) -> dict:
        d = rec.to_dict()
        if progress:
            d["progress"] = bridge.progress(rec)
        return d

    @app.get("/health")
    def health() -> dict:
        return {"ok": True, "service": "ctbench-bridge", "api": API_VERSION}

    @app.post("/jobs", status_code=201, dependencies=[Depends(auth)])
    def submit(spec: JobSpec) -> dict:
        try:
            rec = bridge.submit(spec)
        except OutputReserved as e:
            raise HTTPException(409, str(e)) from None
        except PathError as e:
            raise HTTPException(403, str(e)) from None
        except (FileNotFoundError, FileExistsError, ValueError) as e:   # ValueError: output overlaps the dataset
            raise HTTPException(422, str(e)) from None
        except (OSError, sqlite3.OperationalError) as e:
            if disk_full(e):
                raise _full_error("submit", e) from None
            raise
        return public(rec)

    @app.get("/jobs", dependencies=[Depends(auth)])
    def list_jobs(state: str | None = Query(None, description=f"one of {STATES}"),
                  limit: int | None = Query(None, ge=1, le=100000)) -> list[dict]:
        if state is not None and state not in STATES:
            raise HTTPException(422, f"state must be one of {list(STATES)}, got {state!r}")
        return [public(r, progress=not r.terminal) for r in bridge.store.list(state, limit)]

    @app.get("/jobs/{job_id}", dependencies=[Depends(auth)])
    def status(job_id: str) -> dict:
        return public(job_or_404(job_id), progress=True)

    @app.get("/jobs/{job_id}/events", dependencies=[Depends(auth)])
    async def events(job_id: str, after: int = Query(-1, ge=-1, description="return events with seq > after"),
                     timeout: float = Query(0.0, ge=0.0, le=60.0, description="long-poll: wait up to this many s"),
                     limit: int | None = Query(None, ge=1, le=100000)) -> dict:
        rec = job_or_404(job_id)
        index = bridge.events(rec)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            evs = index.read(after, limit)
            rec = bridge.store.find(job_id) or rec
            if evs or rec.terminal or loop.time() >= deadline:
                if rec.terminal and not evs:   # the job may have written its last events just before ending
                    evs = index.read(after, limit)
                nxt = evs[-1]["seq"] if evs else after
                return {"events": evs, "next": nxt, "state": rec.state, "terminal": rec.terminal}
            await asyncio.sleep(0.05)

    @app.get("/jobs/{job_id}/events/stream", dependencies=[Depends(auth)])
    async def event_stream(job_id: str, after: int = Query(-1, ge=-1)):
        """Server-sent events: every job event with seq > after, then an ``end`` event with the final state."""
        rec = job_or_404(job_id)
        index = bridge.events(rec)

        async def gen():
            last = after
            while True:
                r = bridge.store.find(job_id)
                for ev in index.read(last):
                    last = ev["seq"]
                    yield f"id: {ev['seq']}\nevent: {ev['type']}\ndata: {json.dumps(ev)}\n\n"
                if r is None or r.terminal:
                    for ev in index.read(last):
                        last = ev["seq"]
                        yield f"id: {ev['seq']}\nevent: {ev['type']}\ndata: {json.dumps(ev)}\n\n"
                    yield f"event: end\ndata: {json.dumps({'state': r.state if r else 'deleted'})}\n\n"
                    return
                await asyncio.sleep(0.1)

        return StreamingResponse(gen(), media_type="text/event-stream")

    @app.get("/jobs/{job_id}/logs", dependencies=[Depends(auth)], response_class=PlainTextResponse)
    def logs(job_id: str, offset: int = Query(0, ge=0, description="byte offset to read from")):
        rec = job_or_404(job_id)
        try:
            with open(Path(rec.job_dir) / "log", "rb") as f:
                f.seek(offset)
                data = f.read(8 << 20)
        except FileNotFoundError:
            data = b""
        return PlainTextResponse(data.decode(errors="replace"), headers={"X-Next-Offset": str(offset + len(data))})

    @app.post("/jobs/{job_id}/cancel", dependencies=[Depends(auth)])
    async def cancel(job_id: str, wait: float = Query(0.0, ge=0.0, le=120.0,
                                                      description="wait up to this many s for the job to end")):
        job_or_404(job_id)
        rec = await asyncio.to_thread(bridge.cancel, job_id, wait)
        return public(rec)

    @app.get("/jobs/{job_id}/result", dependencies=[Depends(auth)])
    def result(job_id: str):
        """The result dataset as an uncompressed tar stream (one folder, ``result.zarr/``)."""
        rec = job_or_404(job_id)
        if rec.state != "succeeded":
            raise HTTPException(409, f"job {job_id} is {rec.state}; only a succeeded job has a result")
        info = json.loads((Path(rec.job_dir) / "result.json").read_text())
        out = Path(info["output"])
        if not out.exists():
            raise HTTPException(410, f"the result {out} is gone")
        owner = _result_owner(out)
        if owner != job_id and not (owner is None and _result_dir(out) == rec.job_dir):
            raise HTTPException(410, f"the result of job {job_id} at {out} is gone: that path now holds "
                                     f"{'the result of job ' + owner if owner else 'something else'}")
        return StreamingResponse(_tar_stream(out, "result.zarr"), media_type="application/x-tar")

    @app.delete("/jobs/{job_id}", status_code=204, dependencies=[Depends(auth)])
    def delete(job_id: str):
        rec = job_or_404(job_id)
        if not rec.terminal:
            raise HTTPException(409, f"job {job_id} is {rec.state}; cancel it before deleting it")
        bridge.delete(job_id)
        return Response(status_code=204)

    # ------------------------------------------------------------------ data
    def data_path(path: str) -> Path:
        try:
            return bridge.data_path(path)
        except PathError as e:
            raise HTTPException(403, str(e)) from None

    @app.put("/data/{path:path}", dependencies=[Depends(auth)])
    async def upload(path: str, request: Request, offset: int = Query(0, ge=0),
                     final: bool = Query(True, description="the last chunk: move the file into place")):
        """Write one chunk of a file at ``offset`` (chunks of one file go to ``PATH.part`` until ``final``)."""
        target = data_path(path)
        if target.is_dir():
            if offset:      # the upload as a whole failed: drop what its earlier chunks left
                discard_part(bridge.data_dir, path)
            raise HTTPException(409, f"{path} is a directory")
        if target == bridge.data_dir.resolve():
            raise HTTPException(409, "give a file path under the data directory")
        declared = request.headers.get("content-length")
        limit = bridge.max_upload_bytes
        if declared is not None and offset + int(declared) > limit:
            if offset:   # the upload as a whole is refused: drop what its earlier chunks left
                discard_part(bridge.data_dir, path)
            raise HTTPException(413, f"upload exceeds the bridge's limit of {limit} bytes")
        # The body is read before anything is created, so a refused upload writes nothing.
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if offset + len(body) > limit:
                    raise HTTPException(413, f"upload exceeds the bridge's limit of {limit} bytes")
        except BaseException:      # too large, or the client went away mid-chunk: the upload as a whole failed
            if offset:
                discard_part(bridge.data_dir, path)
            raise
        try:
            # Descriptor-relative, O_NOFOLLOW|O_EXCL: a planted PATH.part link cannot redirect the write.
            write_chunk(bridge.data_dir, path, offset, bytes(body), final)
        except DataPathError as e:
            if offset:            # a chunk that does not continue the part: the upload failed, drop what it left
                discard_part(bridge.data_dir, path)
            raise HTTPException(409, f"cannot write {path}: {e}") from None
        except OSError as e:   # a file where a folder is needed, a full disk, ...: no PATH.part stays behind
            discard_part(bridge.data_dir, path)
            if disk_full(e):
                raise _full_error(f"upload of {path}", e) from None
            raise HTTPException(409, f"cannot write {path}: {e.strerror or e}") from None
        size = offset + len(body)
        return {"path": path, "size": size, "final": final}

    @app.get("/data/{path:path}", dependencies=[Depends(auth)])
    def download(path: str):
        """A file's bytes, or for a folder the list of its files (relative paths and sizes)."""
        p = data_path(path)
        if p.is_dir():
            files = [{"path": str(f.relative_to(bridge.data_dir.resolve())), "size": f.stat().st_size}
                     for f in sorted(p.rglob("*")) if f.is_file() and not f.name.endswith(".part")]
            return {"folder": path, "files": files}
        if not p.is_file():
            raise HTTPException(404, f"no file {path!r} in the data directory")
        return FileResponse(p)

    @app.delete("/data/{path:path}", status_code=204, dependencies=[Depends(auth)])
    def delete_data(path: str):
        """Remove a file or folder of the data directory (not the directory itself)."""
        p = data_path(path)
        if p == bridge.data_dir.resolve():
            raise HTTPException(409, "the data directory itself cannot be deleted")
        try:
            # The unresolved path, walked without following links: DELETE of a link removes the link only.
            found = delete_entry(bridge.data_dir, path)
        except DataPathError as e:
            raise HTTPException(409, f"cannot delete {path}: {e}") from None
        if not found:
            raise HTTPException(404, f"no file or folder {path!r} in the data directory")
        return Response(status_code=204)

    return app


def _result_meta(out: Path) -> dict:
    from ..workbench.dataset import _group_attrs
    try:
        meta = _group_attrs(out).get("meta")
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _result_owner(out: Path) -> str | None:
    """The job id a result dataset names as its writer (None: not a job result, or written before ids)."""
    owner = _result_meta(out).get("job_id")
    return owner if isinstance(owner, str) else None


def _result_dir(out: Path) -> str | None:
    return _result_meta(out).get("job_dir")


def _tar_stream(folder: Path, arcname: str, chunk: int = 1 << 20):
    """Tar ``folder`` on the fly (no temporary archive on disk)."""
    buf = io.BytesIO()

    class Sink:
        def write(self, b):
            buf.write(b)
            return len(b)

    tf = tarfile.open(fileobj=Sink(), mode="w|")
    for f in sorted(folder.rglob("*")):
        tf.add(f, arcname=f"{arcname}/{f.relative_to(folder)}", recursive=False)
        if buf.tell() >= chunk:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    tf.close()
    yield buf.getvalue()


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def serve(state_dir=None, host: str = "127.0.0.1", port: int = 0, max_jobs: int = 1, *, grace: float = 5.0,
          max_upload_bytes: int = 8 << 30, json_out: bool = False, log_level: str = "warning") -> None:
    """Run the bridge until interrupted; prints its URL and token file."""
    import uvicorn

    bridge = Bridge(state_dir, max_jobs=max_jobs, grace=grace, max_upload_bytes=max_upload_bytes)
    bridge.acquire()
    if host not in LOOPBACK:
        print(f"WARNING: the bridge listens on {host}, beyond this machine's loopback: anyone who can reach "
              f"the port and read the token can run jobs as this user. Prefer 127.0.0.1 and an SSH tunnel "
              f"(docs/JOBS.md).", file=sys.stderr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)   # before the URL is printed: early clients wait in the backlog instead of being refused
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    bridge.write_info(url)
    info = {"url": url, "token_file": str(bridge.state_dir / "token"), "state_dir": str(bridge.state_dir),
            "max_jobs": bridge.max_jobs, "pid": os.getpid()}
    print(json.dumps(info) if json_out else
          f"ctbench bridge at {url}\ntoken file: {info['token_file']}\nstate: {info['state_dir']}  "
          f"max jobs: {bridge.max_jobs}", flush=True)
    app = create_app(bridge)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        (bridge.state_dir / "bridge.json").unlink(missing_ok=True)
