"""The centre stage of a scanner-sized scan: orientation check, conjugate-ray centre and sharpness sweep.

``ctbench recon`` decides the orientation and the centre from a band of rows around the mid-plane
(``resolve_orientation``); on a 1024-wide detector this stage took as long as a third of the
backprojection.  This times it on a simulated fan-beam mid-plane (a chiral phantom, flat detector,
Poisson counts) at detector widths and view counts of lab scans, the checkout's
``ctbench/preprocessing/centre.py`` against a git revision's (``--baseline REV``), call by call in turn
in one process, and reports each one's answers beside the true offset.

    python benchmarks/bench_centre.py --widths 512,1024 --views 300,720 --repeats 5 --baseline 2715d5e
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, RESULTS, Emitter, interleaved, machine_info, new_run_id, parse_list, timing_fields  # noqa: E402

BENCH = "bench_centre"


def revision_centre(rev: str, workdir: Path):
    """ctbench.preprocessing.centre as it was at ``rev``, loaded as a module beside the checkout's."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:ctbench/preprocessing/centre.py"],
                         check=True, capture_output=True, text=True).stdout
    path = workdir / "centre.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("ctbench.preprocessing._bench_baseline_centre", path)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "ctbench.preprocessing"       # its relative imports resolve in the checkout
    sys.modules[spec.name] = mod                     # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def mid_plane(width: int, views: int, seed: int = 7):
    """A fan-beam sinogram of a chiral disc phantom (analytic line integrals of discs), and its geometry."""
    rng = np.random.default_rng(seed)
    sid, sdd = 400.0, 800.0
    pitch = 0.2 * 1024 / width                     # the same field of view at every width
    offset_px = 3.37 * width / 256                 # the true detector offset (pixels)
    discs = [(0.0, 0.0, 35.0, 0.02), (12.0, 5.0, 6.0, 0.05), (-8.0, -14.0, 4.0, 0.08), (4.0, -9.0, 2.5, 0.1)]
    ang = np.linspace(0, 2 * np.pi, views, endpoint=False)
    u = (np.arange(width) - (width - 1) / 2) * pitch + offset_px * pitch
    sino = np.zeros((views, width))
    for i, t in enumerate(ang):
        src = sid * np.array([np.cos(t), np.sin(t)])
        det_c = -(sdd - sid) * np.array([np.cos(t), np.sin(t)])
        eu = np.array([-np.sin(t), np.cos(t)])
        pts = det_c[None, :] + u[:, None] * eu[None, :]
        d = pts - src
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        for cx, cy, r, mu in discs:
            c = np.array([cx, cy]) - src
            along = d @ c
            dist2 = (c @ c) - along ** 2
            sino[i] += mu * 2 * np.sqrt(np.clip(r * r - dist2, 0, None))
    counts = rng.poisson(20000 * np.exp(-sino))
    sino = -np.log(np.clip(counts, 1, None) / 20000.0)
    return sino.astype(np.float32), ang, pitch, sid, sdd, offset_px


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="512,1024")
    ap.add_argument("--views", default="300")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", default=None, help="a git revision whose centre.py is timed beside the checkout's")
    ap.add_argument("--out", type=Path, default=RESULTS / f"{BENCH}.jsonl")
    args = ap.parse_args(argv)
    widths = parse_list(args.widths, "--widths", int)
    views = parse_list(args.views, "--views", int)
    from ctbench.preprocessing import centre as current

    emit = Emitter(args.out, new_run_id(), bench=BENCH)
    emit(kind="header", machine=machine_info(), baseline=args.baseline, repeats=args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        impls = {"checkout": current}
        if args.baseline:
            impls[f"baseline {args.baseline}"] = revision_centre(args.baseline, Path(tmp))
        for w in widths:
            for n in views:
                sino, ang, pitch, sid, sdd, truth = mid_plane(w, n)
                calls = {name: (lambda m=m: m.find_centre(sino[:, None, :], ang, pitch, sid=sid, sdd=sdd,
                                                          cross_check=True)) for name, m in impls.items()}
                stats, outs = interleaved(calls, args.repeats)
                for name in impls:
                    r = outs[name]
                    emit(op="find_centre", impl=name, width=w, views=n, truth_px=truth,
                         conjugate_px=r.offset_px, sharpness_px=r.cross_check_px, **timing_fields(stats[name]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
