"""``ctbench bridge serve`` and ``ctbench jobs ...``: the job bridge from the command line.

Registered by :func:`ctbench.cli.main` through :func:`add_commands`.
``--json`` prints machine-readable output (one JSON document; ``events``
prints JSON lines).
"""

from __future__ import annotations

import json
import sys

from ..json_report import dumps as strict_json


def add_commands(sub) -> None:
    """Add the ``bridge`` and ``jobs`` subcommands to the ``ctbench`` parser's subparsers."""
    p = sub.add_parser("bridge", help="the job bridge (an HTTP service that runs torchrun jobs)")
    bsub = p.add_subparsers(dest="bridge_command", required=True)
    s = bsub.add_parser("serve", help="run the bridge in the foreground")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine "
                                                       "only; anything else prints a warning)")
    s.add_argument("--port", type=int, default=0, help="port (default: a free one, printed)")
    s.add_argument("--state-dir", default=None, help="jobs, token and data (default ~/.local/state/ctbench/bridge "
                                                     "or CTBENCH_BRIDGE_STATE_DIR)")
    s.add_argument("--max-jobs", type=int, default=1, help="jobs run at once (default 1)")
    s.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL on cancel")
    s.add_argument("--max-upload", default="8 GiB", help="largest uploaded file (default 8 GiB)")
    s.add_argument("--json", action="store_true", help="print the URL and token file as JSON")
    s.set_defaults(func=_serve)

    p = sub.add_parser("jobs", help="submit and manage background reconstruction jobs")
    p.add_argument("--url", default=None, help="bridge URL (or CTBENCH_BRIDGE_URL; default: the local bridge)")
    p.add_argument("--token-file", default=None, help="bridge token file (or CTBENCH_BRIDGE_TOKEN_FILE)")
    p.add_argument("--state-dir", default=None, help="local bridge state directory to find URL and token in")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    jsub = p.add_subparsers(dest="jobs_command", required=True)
    s = jsub.add_parser("submit", help="queue a reconstruction; prints the job id")
    _spec_args(s)
    s.add_argument("--upload", action="store_true", help="upload the local --dataset to the bridge first")
    s.add_argument("--wait", action="store_true", help="wait for the job to end")
    s.set_defaults(func=_submit)
    s = jsub.add_parser("slurm", help="run a job on a Slurm allocation: render examples/slurm/multi_node.sbatch "
                                      "into a job directory and submit it with sbatch (where sbatch exists)")
    _spec_args(s)
    s.add_argument("--job-dir", required=True, help="new job directory on a file system all nodes see")
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("--gpus-per-node", type=int, default=1, help="ranks (GPUs) per node")
    s.add_argument("--account", default=None)
    s.add_argument("--slurm-partition", default=None)
    s.add_argument("--time", default="01:00:00")
    s.add_argument("--cpus-per-node", type=int, default=None)
    s.add_argument("--dry-run", action="store_true", help="render only; do not call sbatch")
    s.set_defaults(func=_slurm)
    s = jsub.add_parser("list", help="jobs and their states")
    s.add_argument("--state", default=None)
    s.set_defaults(func=_list)
    for name, func, help_ in (("status", _status, "a job's state and progress"),
                              ("events", _events, "a job's events (JSON lines)"),
                              ("logs", _logs, "a job's log (torchrun and ranks)"),
                              ("wait", _wait, "wait for a job to end; exit status 0 if it succeeded"),
                              ("cancel", _cancel, "cancel a job (SIGTERM, SIGKILL after the grace period)"),
                              ("delete", _delete, "delete a finished job and its directory")):
        s = jsub.add_parser(name, help=help_)
        s.add_argument("job_id")
        if name == "events":
            s.add_argument("--after", type=int, default=-1, help="only events with seq > AFTER")
            s.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
            s.add_argument("--previews", action="store_true", help="keep the preview images (base64)")
        if name == "logs":
            s.add_argument("--follow", "-f", action="store_true")
        if name in ("wait", "cancel"):
            s.add_argument("--timeout", type=float, default=None if name == "wait" else 30.0)
        s.set_defaults(func=func)
    s = jsub.add_parser("fetch", help="download a succeeded job's result dataset")
    s.add_argument("job_id")
    s.add_argument("dest")
    s.set_defaults(func=_fetch)


def _serve(args) -> int:
    from ..engine.plan import parse_bytes
    from .service import serve

    if args.max_jobs < 1:
        print("--max-jobs must be at least 1", file=sys.stderr)
        return 2
    try:
        serve(args.state_dir, args.host, args.port, args.max_jobs, grace=args.grace,
              max_upload_bytes=parse_bytes(args.max_upload, "--max-upload"), json_out=args.json)
    except RuntimeError as e:
        print(f"ctbench bridge: {e}", file=sys.stderr)
        return 1
    return 0


def _client(args):
    from .client import BridgeClient

    return BridgeClient(args.url, token_file=args.token_file, state_dir=args.state_dir)


def _print(args, obj, text: str) -> None:
    print(strict_json(obj) if args.json else text)


def _value(v: str):
    try:
        return json.loads(v)
    except ValueError:
        return v


def _spec_args(s) -> None:
    s.add_argument("--dataset", required=True, help="ctbench dataset on the bridge host (relative: its data dir)")
    s.add_argument("--algorithm", required=True, help="fbp, sirt, cgls or tv")
    s.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="algorithm parameter")
    s.add_argument("--nproc", type=int, default=1)
    s.add_argument("--partition", default="views", help="views, space or hybrid")
    s.add_argument("--partition-grid", default=None, metavar="VxS", help="hybrid grid, e.g. 2x2")
    s.add_argument("--devices", default=None, help="comma-separated, one per rank: cuda:0,cuda:1")
    s.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    s.add_argument("--memory-budget", default=None, help="bytes per projector window, e.g. '2 GiB'")
    s.add_argument("--threads", type=int, default=None, help="OMP threads per rank")
    s.add_argument("--checkpoint-every", type=int, default=0, help="iterations between checkpoints (cgls)")
    s.add_argument("--output", default=None, help="result dataset path on the bridge host")
    s.add_argument("--name", default=None)


def _spec(args, dataset: str):
    from pydantic import ValidationError

    from .spec import JobSpec

    params = {}
    for kv in args.param:
        if "=" not in kv:
            raise ValueError(f"--param expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        params[k] = _value(v)
    grid = None
    if args.partition_grid:
        try:
            a, b = args.partition_grid.lower().split("x")
            grid = (int(a), int(b))
        except ValueError:
            raise ValueError(f"--partition-grid expects VxS (e.g. 2x2), got {args.partition_grid!r}") from None
    try:
        return JobSpec(request={"algorithm": args.algorithm, "params": params}, dataset=dataset,
                       output=args.output, name=args.name, nproc=args.nproc, partition=args.partition,
                       partition_grid=grid, backend=args.backend, memory_budget=args.memory_budget,
                       devices=args.devices.split(",") if args.devices else None,
                       threads_per_rank=args.threads, checkpoint_every=args.checkpoint_every)
    except ValidationError as e:
        raise ValueError("; ".join(f"{'.'.join(map(str, x['loc'])) or 'spec'}: {x['msg']}"
                                   for x in e.errors())) from None


def _submit(args) -> int:
    with _client(args) as c:
        dataset = args.dataset
        if args.upload:
            from pathlib import Path
            dataset = c.upload_dataset(dataset, f"uploads/{Path(dataset).name}")
        job = c.submit(_spec(args, dataset))
        if args.wait:
            job = c.wait(job["id"])
    _print(args, job, job["id"] if not args.wait else f"{job['id']} {job['state']}")
    return 0 if not args.wait or job["state"] == "succeeded" else 1


def _slurm(args) -> int:
    from pathlib import Path

    from . import slurm

    spec = _spec(args, args.dataset).model_copy(update={"nproc": args.gpus_per_node})
    script = slurm.prepare_job(spec, Path(args.job_dir), nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                               account=args.account, slurm_partition=args.slurm_partition, time_limit=args.time,
                               cpus_per_node=args.cpus_per_node)
    out = {"job_dir": str(Path(args.job_dir).resolve()), "script": str(script), "slurm_job_id": None}
    if not args.dry_run:
        if slurm.sbatch_available():
            out["slurm_job_id"] = slurm.submit(script)
        else:
            out["note"] = "sbatch not found: rendered only; submit the script on the cluster"
    _print(args, out, "\n".join(f"{k}: {v}" for k, v in out.items() if v is not None))
    return 0


def _list(args) -> int:
    with _client(args) as c:
        jobs = c.list(args.state)
    lines = [f"{'ID':12}  {'STATE':9}  {'ALGORITHM':9}  {'NPROC':5}  NAME"]
    for j in jobs:
        lines.append(f"{j['id']:12}  {j['state']:9}  {j['spec']['request']['algorithm']:9}  "
                     f"{j['spec']['nproc']:5}  {j['name'] or ''}")
    _print(args, jobs, "\n".join(lines))
    return 0


def _status(args) -> int:
    with _client(args) as c:
        st = c.status(args.job_id)
    p = st.get("progress") or {}
    text = f"{st['id']} {st['state']}"
    if p:
        text += f"  iteration {p['iteration']}/{p['n_iter']}"
        if p.get("eta") is not None and st["state"] == "running":
            text += f"  eta {p['eta']:.1f} s"
    if st.get("reason"):
        text += f"  ({st['reason']})"
    _print(args, st, text)
    return 0


def _events(args) -> int:
    with _client(args) as c:
        evs = c.follow(args.job_id, args.after) if args.follow else c.events(args.job_id, args.after)["events"]
        for ev in evs:
            if not args.previews and ev.get("preview"):
                ev = {**ev, "preview": {k: v for k, v in ev["preview"].items() if k != "data"}}
            if args.json:
                print(strict_json(ev), flush=True)
            else:
                keys = ("iteration", "n_iter", "residual", "elapsed", "stopped", "message")
                print(ev["seq"], ev["type"], " ".join(f"{k}={ev[k]}" for k in keys if ev.get(k) is not None),
                      flush=True)
    return 0


def _logs(args) -> int:
    import time
    with _client(args) as c:
        offset = 0
        while True:
            text, offset = c.logs(args.job_id, offset)
            sys.stdout.write(text)
            sys.stdout.flush()
            if not args.follow or c.status(args.job_id)["state"] in ("succeeded", "failed", "cancelled") \
                    and not text:
                return 0
            time.sleep(0.5)


def _wait(args) -> int:
    with _client(args) as c:
        st = c.wait(args.job_id, args.timeout)
    _print(args, st, f"{st['id']} {st['state']}" + (f" ({st['reason']})" if st.get("reason") else ""))
    return 0 if st["state"] == "succeeded" else 1


def _cancel(args) -> int:
    with _client(args) as c:
        st = c.cancel(args.job_id, wait=args.timeout or 0.0)
    _print(args, st, f"{st['id']} {st['state']}")
    return 0


def _fetch(args) -> int:
    with _client(args) as c:
        out = c.fetch(args.job_id, args.dest)
    _print(args, {"id": args.job_id, "path": str(out)}, str(out))
    return 0


def _delete(args) -> int:
    with _client(args) as c:
        c.delete(args.job_id)
    _print(args, {"id": args.job_id, "deleted": True}, f"{args.job_id} deleted")
    return 0


def run(args) -> int:
    """Run a parsed ``bridge``/``jobs`` command; errors become one line on stderr and status 1/2."""
    from .client import BridgeError, BridgeNotFound

    try:
        return args.func(args)
    except (BridgeError, BridgeNotFound, ValueError, FileExistsError, FileNotFoundError, TimeoutError) as e:
        print(f"ctbench {args.command}: {e}", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, BridgeNotFound)) else 1
