"""The streamed recon (ctbench/pipeline/streamed.py): same volume as in memory, within its budget, resumable.

The in-memory reference is the chain the pipeline replaced, run here step by step: ``prepare`` (all views
corrected at once), the orientation and centre on the whole stack, the roll resampled away from the whole
images, and one ``fdk`` call on the whole sinogram.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from ctbench.io.ome_zarr import OmeZarrVolume, pool2
from ctbench.io.orientation import unroll_images
from ctbench.io.sample_scan import LabScanSpec, write_lab_scan
from ctbench.io.scan import images_to_sinogram
from ctbench.pipeline import parse_config, run_recon
from ctbench.pipeline.budget import BudgetError, planning_baseline
from ctbench.pipeline.progress import Cancelled, Progress
from ctbench.pipeline.steps import build_geometry, find_offset, oriented_scan
from ctbench.workbench.workflow import ReconRequest, run

# A camera-convention, clockwise scan of the chiral phantom: the orientation is decided from the data.
SPEC = LabScanSpec(n_views=160, detector_u=160, detector_v=128, pitch=1.0, volume=96, phantom_name="chiral",
                   seen_from="source", rotation="cw")
ROLL = 1.5


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    return write_lab_scan(tmp_path_factory.mktemp("scan") / "scan", SPEC)


def _doc(scan, **extra):
    doc = {"input": {"path": str(scan)}, "algorithm": {"name": "fdk"}, "preprocess": {"ring_filter": 5},
           "geometry": {"detector_roll_deg": ROLL, "image_seen_from": "auto", "rotation_direction": "auto"}}
    doc.update(extra)
    return doc


def _in_memory(doc):
    """The whole-stack chain, step by step (module doc)."""
    cfg = parse_config(doc)
    scan, prep, sid, sdd, angles, resolved, cfg = oriented_scan(cfg, lambda m: None)
    prep = replace(prep, images=unroll_images(prep.images, ROLL, prep.pitch))
    centre = find_offset(prep, angles, sid, sdd, cfg.geometry.detector_offset_v_mm)
    geo = build_geometry(prep, cfg.geometry.model_copy(update={"detector_roll_deg": 0.0}), sid, sdd, angles,
                         centre.offset_mm)
    sino = torch.from_numpy(np.ascontiguousarray(images_to_sinogram(prep.images)))
    return run(geo, sino, ReconRequest("fbp").validated()).volume, centre, resolved


@pytest.mark.slow
def test_streamed_volume_equals_the_in_memory_one_for_every_budget(scan):
    doc = _doc(scan)
    ref, centre, resolved = _in_memory(doc)
    plans = set()
    for extra_mib in (2000, 40, 12):        # one window each; several slabs; many chunks, bands and batches
        budget = int(planning_baseline() + (170 + extra_mib) * 2 ** 20)
        rep = run_recon(parse_config(doc | {"resources": {"memory": budget}}))
        p = rep["plan"]
        plans.add((p["slab"], p["view_batch"], p["view_chunk"], p["row_band"]))
        # The order of the sums over view batches differs: float32 round-off (the values are ~0.06 per mm).
        assert float((rep["volume"] - ref).abs().max()) <= 1e-6 * float(ref.abs().max()), p
        assert rep["centre"]["offset_px"] == pytest.approx(centre.offset_px, abs=1e-9)
        assert rep["orientation"]["image_seen_from"] == resolved.orientation.seen_from == "source"
        assert rep["algorithm"]["method"] == "fdk" and rep["detector_roll"].startswith("images resampled")
    assert len(plans) == 3                  # the budgets did give three different plans
    assert min(p[0] for p in plans) < ref.shape[0]          # at least one plan ran several slabs


def test_a_budget_too_small_is_refused_before_any_work_naming_the_budget_that_would_do(scan, tmp_path):
    out = tmp_path / "v.ome.zarr"
    cfg = parse_config(_doc(scan, output={"path": str(out)}, resources={"memory": "100MB"}))
    with pytest.raises(BudgetError, match=r"give at least [0-9.]+ [KMG]iB") as err:
        run_recon(cfg)
    # the budget it names is above the one given (its unit follows the size: a long test process holds GiB)
    value, unit = re.search(r"give at least ([0-9.]+) ([KMG])iB", str(err.value)).groups()
    assert float(value) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit] > 100e6
    assert not out.exists() and not list(tmp_path.iterdir())      # no run folder either


@pytest.mark.slow
def test_fdk_and_fbp_name_the_same_method_and_the_report_says_which_ran(scan):
    doc = _doc(scan, preprocess={}, geometry={})
    a = run_recon(parse_config(doc | {"algorithm": {"name": "fdk"}}))
    b = run_recon(parse_config(doc | {"algorithm": {"name": "fbp"}}))
    assert torch.equal(a["volume"], b["volume"])
    assert a["algorithm"]["method"] == b["algorithm"]["method"] == "fdk"
    assert a["kernel_s"]["backproject"] > 0 and a["kernel_s"]["filter"] > 0      # the kernels' own time


# ------------------------------------------------------------------ OME-Zarr out
@pytest.mark.slow
def test_the_ome_zarr_output_opens_in_ome_zarr_py_and_napari_with_its_scale_in_mm(scan, tmp_path):
    ome_io = pytest.importorskip("ome_zarr.io")
    ome_reader = pytest.importorskip("ome_zarr.reader")
    out = tmp_path / "v.ome.zarr"
    rep = run_recon(parse_config(_doc(scan, output={"path": str(out)})))
    assert rep["output"] == str(out) and not (tmp_path / ".v.ome.zarr.ctbench-run").exists()
    vox = rep["geometry"]["voxel_spacing"]
    nodes = list(ome_reader.Reader(ome_io.parse_url(str(out)))())
    levels = nodes[0].data
    full = np.asarray(levels[0])
    assert full.shape == tuple(rep["geometry"]["volume_shape"])
    assert np.array_equal(full, rep["volume"].numpy())
    transforms = nodes[0].metadata["coordinateTransformations"]
    assert transforms[0][0]["scale"] == pytest.approx(vox)
    # voxel 0's centre in ctbench's frame (the volume is centred on the origin)
    assert transforms[0][1]["translation"] == pytest.approx([-(n - 1) / 2 * d for n, d in zip(full.shape, vox)])
    expect = full
    for k, lvl in enumerate(levels[1:], 1):
        expect = pool2(expect)
        assert np.allclose(np.asarray(lvl), expect, atol=1e-7), k
        assert transforms[k][0]["scale"] == pytest.approx([d * 2 ** k for d in vox])
    napari_reader = pytest.importorskip("napari_ome_zarr").napari_get_reader(str(out))
    layers = napari_reader(str(out))
    data, meta = layers[0][0], layers[0][1]
    assert np.array_equal(np.asarray(data[0] if isinstance(data, list) else data), full)
    assert list(meta["scale"])[-3:] == pytest.approx(vox)
    assert OmeZarrVolume.open(out).group.attrs["ctbench"]["recon"]["algorithm"]["method"] == "fdk"


@pytest.mark.slow
def test_tiff_export_of_a_streamed_volume_is_the_volume(scan, tmp_path):
    from ctbench.io.export import read_volume
    rep = run_recon(parse_config(_doc(scan, output={"path": str(tmp_path / "v.tif")}, resources={"memory": int(
        planning_baseline() + 200 * 2 ** 20)})))
    vol, sp = read_volume(tmp_path / "v.tif")
    assert np.array_equal(vol, rep["volume"].numpy()) and sp == pytest.approx(rep["geometry"]["voxel_spacing"])


# ------------------------------------------------------------------ cancel, kill, resume
@pytest.mark.slow
def test_cancel_leaves_no_output_and_a_rerun_resumes_to_the_same_volume(scan, tmp_path):
    out = tmp_path / "v.ome.zarr"
    whole = run_recon(parse_config(_doc(scan)))["volume"]
    doc = _doc(scan, output={"path": str(out)}, resources={"memory": int(planning_baseline() + 190 * 2 ** 20)})
    slabs_done = tmp_path / ".v.ome.zarr.ctbench-run" / "done" / "backproject"
    prog = Progress(throttle_s=0.0, cancel=lambda: slabs_done.is_dir() and any(slabs_done.iterdir()))
    with pytest.raises(Cancelled):
        run_recon(parse_config(doc), progress=prog)
    assert not out.exists() and (tmp_path / ".v.ome.zarr.ctbench-run").is_dir()
    seen2 = []
    rep = run_recon(parse_config(doc), progress=Progress(seen2.append, throttle_s=0.0))
    first = {e.stage: e for e in reversed(seen2)}
    assert first["read"].done == first["read"].total          # nothing read again
    starts = [e for e in seen2 if e.stage == "backproject"]
    assert starts[0].done > 0                                 # finished slabs skipped
    assert float((rep["volume"] - whole).abs().max()) <= 1e-6 * float(whole.abs().max())


def _cli(cfg_path, *extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "ctbench.cli", "recon", str(cfg_path), "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _kill_at(cfg_path, stage: str, after_done: bool, run_folder: Path):
    """Start ctbench recon, kill -9 it at the first event of ``stage`` (once a window of it is finished, if
    ``after_done``: its marker is in the run folder)."""
    p = _cli(cfg_path)
    done = run_folder / "done" / stage
    try:
        for line in p.stdout:
            e = json.loads(line)
            if e.get("event") == "progress" and e["stage"] == stage and not e["finished"] and \
                    (not after_done or (done.is_dir() and any(done.iterdir()))):
                p.send_signal(signal.SIGKILL)
                break
            if e.get("event") == "report":
                raise AssertionError(f"the run finished before reaching {stage}")
    finally:
        p.wait(60)
    return p.returncode


KILL_BUDGET = "600MB"            # a fresh process: many windows in every stage


@pytest.fixture(scope="module")
def uninterrupted(scan, tmp_path_factory):
    """The volume of a run nothing interrupted, under the kill tests' budget (one run for all of them)."""
    where = tmp_path_factory.mktemp("uninterrupted")
    ref_cfg = where / "ref.json"
    ref_cfg.write_text(json.dumps(_doc(scan, output={"path": str(where / "ref.ome.zarr")},
                                       resources={"memory": KILL_BUDGET})))
    r = _cli(ref_cfg)
    out, err = r.communicate(timeout=300)
    assert r.returncode == 0, err
    return where / "ref.ome.zarr"


@pytest.mark.slow
@pytest.mark.parametrize("stage,after_done", [("read", True), ("rings", True), ("centre", False),
                                              ("backproject", True), ("backproject", False), ("write", False)])
def test_kill_9_in_each_stage_then_the_same_command_resumes_to_the_same_volume_bit_for_bit(
        scan, uninterrupted, tmp_path, stage, after_done):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(_doc(scan, output={"path": str(tmp_path / "v.ome.zarr")},
                                   resources={"memory": KILL_BUDGET})))
    assert _kill_at(cfg, stage, after_done, tmp_path / ".v.ome.zarr.ctbench-run") == -signal.SIGKILL
    if stage != "write":
        assert not (tmp_path / "v.ome.zarr").exists()      # nothing that looks finished
    p = _cli(cfg)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    events = [json.loads(x) for x in out.splitlines()]
    if after_done:          # the resumed run started with what the killed one had finished
        assert [e for e in events if e.get("stage") == stage][0]["done"] > 0
    a, b = OmeZarrVolume.open(uninterrupted), OmeZarrVolume.open(tmp_path / "v.ome.zarr")
    for k in range(a.n_levels):
        assert np.array_equal(a.read(level=k), b.read(level=k)), k
    assert not (tmp_path / ".v.ome.zarr.ctbench-run").exists()


def test_a_second_run_on_the_same_output_is_refused_while_the_first_works(scan, tmp_path):
    from ctbench.pipeline.run_folder import RunBusyError, RunFolder, run_folder_for
    from ctbench.pipeline.streamed import job_key
    out = tmp_path / "v.ome.zarr"
    cfg = parse_config(_doc(scan, output={"path": str(out)}))
    with RunFolder(run_folder_for(out), job_key(cfg)):
        with pytest.raises(RunBusyError, match="another ctbench recon is working on this output"):
            run_recon(cfg)


@pytest.mark.slow
def test_an_unfinished_run_of_another_config_is_discarded_not_resumed(scan, tmp_path):
    out = tmp_path / "v.ome.zarr"
    doc = _doc(scan, output={"path": str(out)})
    prog = Progress(lambda e: None, cancel=lambda: True)
    with pytest.raises(Cancelled):
        run_recon(parse_config(doc), progress=prog)
    said = []
    other = doc | {"algorithm": {"name": "fdk", "params": {"filter": "hann"}}}
    rep = run_recon(parse_config(other), log=said.append)
    assert any("discarding" in s for s in said)
    assert rep["algorithm"]["params"]["filter"] == "hann"


# ------------------------------------------------------------------ the user's world
def test_an_output_inside_the_scan_is_refused_before_anything_is_written(scan):
    cfg = parse_config(_doc(scan, output={"path": str(Path(scan) / "v.ome.zarr")}))
    with pytest.raises(ValueError, match="lies inside the input"):
        run_recon(cfg)
    assert not list(Path(scan).glob(".v.ome.zarr*")) and not (Path(scan) / "v.ome.zarr").exists()


@pytest.mark.slow
def test_a_full_disk_is_a_clear_error_and_a_rerun_with_space_resumes(scan, tmp_path):
    from test_disk_full import _fill, _mount, _umount
    mnt = tmp_path / "small"
    _mount(mnt, "6m")
    try:
        cfg = tmp_path / "cfg.json"
        cfg.write_text(json.dumps(_doc(scan, output={"path": str(mnt / "v.ome.zarr")})))
        filler = _fill(mnt)
        filler.unlink()
        big = mnt / "big.bin"
        big.write_bytes(b"\0" * (5 << 20))         # 1 MiB left: the work store (13 MB) cannot fit
        p = _cli(cfg)
        out, err = p.communicate(timeout=300)
        assert p.returncode == 2 and "No space left on device" in err and "Traceback" not in err
        assert not (mnt / "v.ome.zarr").exists()
        big.unlink()
        _umount(mnt)
        _mount(mnt, "64m")                          # a bigger disk at the same place: run again
        p = _cli(cfg)
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert OmeZarrVolume.open(mnt / "v.ome.zarr").read().shape[0] > 0
    finally:
        _umount(mnt)


# ------------------------------------------------------------------ iterative methods
@pytest.mark.slow
def test_iterative_methods_run_from_the_work_store_and_cgls_from_disk_when_it_does_not_fit(scan, tmp_path):
    doc = _doc(scan, preprocess={}, geometry={"detector_roll_deg": 0.0},
               algorithm={"name": "cgls", "params": {"n_iter": 4}})
    mem = run_recon(parse_config(doc))
    assert mem["algorithm"].get("from_disk") is None and mem["algorithm"]["n_iter"] == 4
    cfg = tmp_path / "cfg.json"          # a fresh process: its budget is measured against its own baseline
    cfg.write_text(json.dumps(doc | {"output": {"path": str(tmp_path / "v.ome.zarr")}}))
    p = _cli(cfg, "--memory", "620MB")    # above the smallest windows, below CGLS in memory
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["algorithm"]["from_disk"] is True and "runs from disk stores" in out
    disk = OmeZarrVolume.open(tmp_path / "v.ome.zarr").read()
    ref = mem["volume"].numpy()
    rel = float(np.linalg.norm(disk - ref) / np.linalg.norm(ref))
    assert rel < 1e-4, rel          # the same iterates, summed in other windows


# ------------------------------------------------------------------ memory, measured
def _peak_of(cmd) -> int:
    """Peak resident memory (bytes) of a child process, measured by the kernel (ru_maxrss of a wrapper's child)."""
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "sys.stderr.write(r.stderr); print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True, timeout=600)
    rc, kib = out.stdout.split()
    assert rc == "0", out.stderr
    return int(kib) * 1024


IN_MEMORY = """
import sys, numpy as np, torch
from ctbench.pipeline import parse_config
from ctbench.pipeline.steps import build_geometry, oriented_scan
from ctbench.io.scan import images_to_sinogram
from ctbench.workbench.workflow import ReconRequest, run
cfg = parse_config({"input": {"path": sys.argv[1]}, "preprocess": {"ring_filter": 5},
                    "geometry": {"volume_shape": [96, 128, 128], "voxel_size_mm": 1.0}})
scan, prep, sid, sdd, angles, res, cfg = oriented_scan(cfg, lambda m: None)
geo = build_geometry(prep, cfg.geometry, sid, sdd, angles, res.centre.offset_mm)
run(geo, torch.from_numpy(np.ascontiguousarray(images_to_sinogram(prep.images))), ReconRequest("fbp").validated())
"""


@pytest.mark.slow
def test_a_budget_below_the_in_memory_peak_holds_measured_in_a_subprocess(tmp_path):
    spec = LabScanSpec(n_views=720, detector_u=256, detector_v=192, pitch=1.0, volume=64, phantom_name="chiral")
    big = write_lab_scan(tmp_path / "big", spec)
    # the whole scan in memory, as the pipeline before streaming held it: every view, the sinogram, the volume
    whole = _peak_of([sys.executable, "-c", IN_MEMORY, str(big)])
    budget = 600 * 2 ** 20
    assert whole > budget * 1.25, whole                         # the budget is well below what memory would take
    cfg = tmp_path / "small.json"
    cfg.write_text(json.dumps({"input": {"path": str(big)}, "algorithm": {"name": "fdk"},
                               "preprocess": {"ring_filter": 5}, "output": {"path": str(tmp_path / "small.ome.zarr")},
                               "geometry": {"volume_shape": [96, 128, 128], "voxel_size_mm": 1.0},
                               "resources": {"memory": budget}}))
    small = _peak_of([sys.executable, "-m", "ctbench.cli", "recon", "--quiet", str(cfg)])
    assert small <= budget, (small, budget)
    assert OmeZarrVolume.open(tmp_path / "small.ome.zarr").read().shape == (96, 128, 128)
