"""First picture of a scanner-sized OME-Zarr volume in napari (issue 42, "viewing at any size").

A 1024^3 float32 volume (4 GiB at full resolution) as ``ctbench recon`` writes it, with the slabs around the
middle plane written (napari's first picture reads real chunks; the other chunks are the store's fill value,
so the file stays small). Each call is a fresh process under Xvfb: a napari viewer at 1366 x 768, then
``viewer.open(path, plugin=P)`` until the first canvas screenshot, then one step of the z slider to another
written plane until its screenshot. Readers, interleaved call by call: ``ctbench`` (the plugin's reader, its
first use importing ctbench and torch), ``ctbench-imported`` (the same with the plugin already imported, as in
a session with a ctbench widget docked) and ``napari-ome-zarr``. Min and median of ``--repeats`` calls; the process's memory growth while opening.
Software OpenGL under Xvfb is slower than a GPU-backed display: the figures are an upper bound.

Output: JSON lines on stdout, appended to ``--out`` (results/bench_ome_zarr_view.jsonl).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Emitter, machine_info  # noqa: E402

BENCH = "ome_zarr_view"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_ome_zarr_view.jsonl"
READERS = ("ctbench", "ctbench-imported", "napari-ome-zarr")

CHILD = r"""
import json, sys, time
import psutil
import napari
from qtpy.QtWidgets import QApplication
path, plugin = sys.argv[1], sys.argv[2]
if plugin == "ctbench-imported":
    import ctbench_napari._io  # noqa: F401
    plugin = "ctbench"
viewer = napari.Viewer(show=True)
viewer.window._qt_window.resize(1366, 768)
for _ in range(3):
    QApplication.processEvents()
rss0 = psutil.Process().memory_info().rss
t0 = time.perf_counter()
viewer.open(path, plugin=plugin)
viewer.screenshot(canvas_only=True, flash=False)
t1 = time.perf_counter()
viewer.dims.set_current_step(0, viewer.dims.current_step[0] + 8)
viewer.screenshot(canvas_only=True, flash=False)
t2 = time.perf_counter()
layer = viewer.layers[-1]
print(json.dumps({"first_picture_s": t1 - t0, "next_plane_s": t2 - t1, "multiscale": bool(layer.multiscale),
                  "scale": [float(s) for s in layer.scale], "rss_growth_bytes": psutil.Process().memory_info().rss - rss0}))
viewer.close()
"""


def write_volume(path: Path, n: int) -> None:
    import numpy as np

    from ctbench.io.ome_zarr import OmeZarrVolume
    vol = OmeZarrVolume.create(path, (n, n, n), (0.05, 0.05, 0.05))
    yy, xx = np.mgrid[:n, :n]
    plane = (((yy - n / 2) ** 2 + (xx - n / 2) ** 2) < (0.4 * n) ** 2).astype(np.float32) * (1 + xx / n)
    for z0 in range(n // 2 - 32, n // 2 + 32, vol.slab_alignment):
        vol.write_slab(z0, np.broadcast_to(plane, (vol.slab_alignment, n, n)).copy())


def one_call(path: Path, plugin: str) -> dict:
    cmd = [sys.executable, "-c", CHILD, str(path), plugin]
    if not os.environ.get("DISPLAY"):
        cmd = ["xvfb-run", "-a", "-s", "-screen 0 1920x1080x24"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, MESA_SHADER_CACHE_DISABLE="true"))
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{plugin}: rc {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(lines[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1024, help="voxels per side (default 1024)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    emit = Emitter(args.out, run_id, bench=BENCH)
    machine = machine_info()
    emit(kind="header", machine=machine, avx512="avx512f" in machine["simd"], size=args.size,
         display="Xvfb, software OpenGL" if not os.environ.get("DISPLAY") else os.environ["DISPLAY"])
    work = Path(tempfile.mkdtemp(prefix="ctbench-view-"))
    try:
        path = work / "volume.ome.zarr"
        write_volume(path, args.size)
        times: dict[str, list[dict]] = {r: [] for r in READERS}
        for i in range(args.repeats):
            for reader in READERS:                 # interleaved call by call
                rec = one_call(path, reader)
                times[reader].append(rec)
                emit(kind="call", call=i, reader=reader, **rec)
        for reader, recs in times.items():
            first = [r["first_picture_s"] for r in recs]
            nxt = [r["next_plane_s"] for r in recs]
            emit(kind="summary", reader=reader, first_picture_min_s=round(min(first), 3),
                 first_picture_median_s=round(statistics.median(first), 3), next_plane_min_s=round(min(nxt), 3),
                 next_plane_median_s=round(statistics.median(nxt), 3),
                 rss_growth_max_bytes=max(r["rss_growth_bytes"] for r in recs), scale=recs[0]["scale"],
                 multiscale=recs[0]["multiscale"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
