"""``ctbench recon`` as a stream: a scan from its files to a volume within a memory budget, resumable.

The stages (docs/LARGE_VOLUMES.md, "Scans larger than memory"):

1. **read**: the kept views, a chunk at a time (the next chunk read in a thread
   while this one is corrected), corrected (:meth:`Corrections.views`) and
   written to the work store ``lines.zarr``: ``(view, row, col)`` float32
   line integrals in the file's frame, chunked by views and bands of 8 rows;
2. **rings** (only with ring filters): bands of rows of every view through
   :meth:`Corrections.rows` into ``rings.zarr``;
3. **centre**: a thin band of rows around the mid-plane, read in ctbench's
   frame (:class:`~ctbench.pipeline.bands.BandReader`), decides the
   orientation where the file leaves it open and the detector offset
   (:func:`ctbench.io.handedness.resolve_orientation`);
4. **backproject**: for FDK/FBP of a circular 3D scan, z-slab by z-slab, the
   detector rows each slab's rays cross (:class:`ctbench.solvers.slab_fdk.SlabFDK`),
   view batch by view batch (the next batch read in a thread), into a
   multiscale OME-Zarr; **solve**: iterative methods in memory when they fit
   (the workbench's workflows), CGLS from disk stores otherwise;
5. **write**: the finished volume put in place (OME-Zarr), or exported slab by
   slab (TIFF, HDF5, the ctbench dataset).

Every window a stage finishes is marked in the run folder
(:mod:`ctbench.pipeline.run_folder`); a run killed anywhere and started again
with the same command skips what is marked and gives the same volume bit for
bit (the plan it records is reused).  The memory budget (``--memory``,
``resources.memory``; default :func:`ctbench.pipeline.budget.default_budget`)
sets every window (:func:`ctbench.pipeline.budget.plan_pipeline`).

Under ``torchrun`` (``ctbench recon --ranks N``) every rank runs this job on the same run folder and takes its
share of each stage's windows (:mod:`ctbench.pipeline.ranks`); the volume is the single process's, bit for bit.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..io.errors import ScanFileError
from ..json_report import strict
from .bands import BandReader, ViewFrame, centre_rows
from .budget import (BudgetError, PipelinePlan, ScanShape, default_budget, parse_budget, plan_pipeline,
                     planning_baseline)
from .config import ReconConfig
from .correct import Corrections, diff_counts, merge_counts
from .progress import Progress
from .ranks import Ranks
from .run_folder import RunFolder, fingerprint, input_identity, run_folder_for
from .steps import distances, open_scan, recon_inputs, scan_geometry, scan_orientation, with_file_values

OME_SUFFIX = ".ome.zarr"
STAGES = ("read", "rings", "centre", "backproject", "solve", "write")


def output_format(path, fmt: str = "auto") -> str:
    """"ome-zarr", "tiff", "hdf5" or "zarr" (the ctbench dataset) for an output path."""
    from ..io.export import export_format

    if fmt == "ome-zarr" or (fmt == "auto" and str(path).lower().rstrip("/").endswith(OME_SUFFIX)):
        return "ome-zarr"
    return export_format(path, fmt)


def job_key(cfg: ReconConfig) -> str:
    """What makes two runs the same job: the config (not its output flags or resources) and the input files."""
    doc = cfg.model_dump(mode="json")
    if doc.get("output"):
        doc["output"] = {k: v for k, v in doc["output"].items() if k not in ("overwrite", "force")}
    doc.pop("resources", None)
    doc.pop("calibrate", None)
    inputs = [cfg.input.path, cfg.input.flats, cfg.input.darks, cfg.geometry.trajectory]
    return fingerprint({"config": doc, "inputs": input_identity(inputs), "version": 1})


@contextmanager
def _reading_ahead():
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctbench-read") as pool:
        yield pool


class StreamedRecon:
    """One ``ctbench recon`` job (module doc); :meth:`run` returns the report."""

    def __init__(self, cfg: ReconConfig, *, say=None, progress: Progress | None = None, return_volume=True,
                 ranks: Ranks | None = None):
        self.cfg = cfg
        self.ranks = ranks or Ranks()
        leader = self.ranks.leader          # the other ranks work silently: one voice, one set of bars
        self.say = (say if leader else None) or (lambda m: None)
        self.progress = (progress if leader else None) or Progress(cancel=progress.cancel if progress else None)
        self.return_volume = return_volume
        self.t0 = time.perf_counter()
        self.kernel_s = {"filter": 0.0, "backproject": 0.0}    # time inside FDK's kernels in this process
        self.windows_done: dict[str, int] = {}                  # windows of each stage this process did

    # ================================================================ set-up
    def _setup(self):
        from ..workbench.workflow import ReconRequest

        cfg = self.cfg
        self.request = ReconRequest(cfg.algorithm.name, cfg.algorithm.params).validated()
        self.out_format = None if cfg.output is None else output_format(cfg.output.path, cfg.output.format)
        res = cfg.resources
        # The budget caps the whole job on each machine: the ranks of one node share it.
        self.budget = (parse_budget(res.memory, "resources.memory") or default_budget()) // self.ranks.local_world
        if res.threads or self.ranks.world > 1:
            import os

            import torch
            # torchrun sets one OpenMP thread per rank; without resources.threads the ranks of a node share
            # its cores
            torch.set_num_threads(int(res.threads) if res.threads else
                                  max(1, (os.cpu_count() or 1) // self.ranks.local_world))
        self.scan = scan = open_scan(cfg.input)
        self.say(f"read {scan.format} scan {scan.source}: {scan.n_views} views of {scan.detector_shape} pixels")
        self.corr = Corrections(scan, cfg.preprocess, cfg.geometry.pixel_size_mm)
        self.sid, self.sdd = distances(scan, cfg.geometry)
        self.cfg = cfg = with_file_values(cfg, scan)
        geo = cfg.geometry
        n = self.corr.n_views
        rows, cols = self.corr.frame
        self.shape = (n, rows, cols)
        if scan.angles is not None:
            self.file_angles = scan.angles[self.corr.idx]
        else:
            all_a = np.radians(geo.start_angle_deg + geo.angle_range_deg * np.arange(scan.n_views) / scan.n_views)
            self.file_angles = all_a[self.corr.idx]
        self.orientation = scan_orientation(scan, geo)
        self.shift_v = -self.corr.change.shift_v if self.orientation.flip_rows else self.corr.change.shift_v
        self.analytic = not self.request.spec.iterative

    def _geometry(self, angles, offset_u: float, roll_in_trajectory: bool):
        geo = self.cfg.geometry
        if not roll_in_trajectory and geo.detector_roll_deg:
            geo = geo.model_copy(update={"detector_roll_deg": 0.0})
        return scan_geometry(self.shape, self.corr.pitch, self.shift_v, geo, self.sid, self.sdd, angles, offset_u)

    def _slab_fdk(self, geometry):
        """The slab-by-slab FDK of this geometry, or None when it is not a circular 3D scan FDK can take."""
        if not self.analytic or geometry.is_2d:
            return None
        from ..solvers.slab_fdk import SlabFDK
        try:
            return SlabFDK(geometry.projector("auto"), filter=self.request.params["filter"])
        except ValueError:           # helical or general trajectories: the in-memory workflow decides
            return None

    def _plan(self) -> PipelinePlan:
        import warnings

        from ..io.ome_zarr import level_shapes
        n, rows, cols = self.shape
        provisional = self._geometry(self.file_angles, 0.0, roll_in_trajectory=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # short-scan warnings come again, once, when the slabs run
            fdk = self._slab_fdk(provisional)
        D, H, W = provisional.volume_shape if not provisional.is_2d else (1, *provisional.volume_shape)
        pre = self.cfg.preprocess
        phase_pad = (0, 0)
        if pre.phase is not None:
            pr = pre.phase.pad if pre.phase.pad is not None else max(8, rows // 2)
            pc = pre.phase.pad if pre.phase.pad is not None else max(8, cols // 2)
            phase_pad = (rows + 2 * pr, cols + 2 * pc)
        raw_r, raw_c = self.corr._cropped_shape()
        shape = ScanShape(n, (raw_r, raw_c), int(np.dtype(self.scan.projections.dtype).itemsize), (rows, cols),
                          (D, H, W), ring_pass=self.corr.has_row_pass, phase_pad=phase_pad)
        iterative = 0 if fdk is not None else self._in_memory_bytes(D * H * W)
        align = max(16, 2 ** (len(level_shapes((D, H, W))) - 1))
        band = fdk.band_height if fdk is not None else (lambda z0, z1: rows)
        baseline = planning_baseline()      # measured once: both plans below assume the same fixed cost
        try:
            plan = plan_pipeline(shape, self.budget, baseline, band_rows=band, alignment=align,
                                 iterative_bytes=iterative)
        except BudgetError:
            if iterative and self.request.algorithm == "cgls":
                plan = plan_pipeline(shape, self.budget, baseline, band_rows=band, alignment=align)
                plan.solver_from_disk = True      # disk-backed CGLS plans its own windows
                self.say("CGLS does not fit in memory: it runs from disk stores (disk-backed CGLS)")
            else:
                raise
        return plan

    def _in_memory_bytes(self, n_voxels: int) -> int:
        n, rows, cols = self.shape
        copies = {"sirt": 4, "cgls": 5, "tv": 8, "os_sirt": 4, "os_tv": 6, "fbp": 3}.get(self.request.algorithm, 6)
        return int(n * rows * cols * 4 * 3 + n_voxels * 4 * copies)

    # ================================================================ the run
    def run(self) -> dict:
        self.ranks.from_leader(self._check_output)
        self._setup()
        cfg = self.cfg
        if cfg.output is not None:
            folder = run_folder_for(Path(cfg.output.path))
            temp = None
        else:
            temp = Path(tempfile.mkdtemp(prefix="ctbench-recon-"))
            folder = temp / "run"
        try:
            with self._open_run(folder) as (run, plan):
                self.plan, self.run_folder = plan, run
                world = self.ranks.world
                self.say(plan.summary() + (f"; {world} ranks share its windows" if world > 1 else ""))
                try:
                    report = self._stages(run)
                except BaseException:
                    from ..storage.zarr_store import settle_pending_io
                    settle_pending_io()       # chunk writes still in flight after one failed (a full disk)
                    raise
                if cfg.output is not None and self.ranks.leader:
                    run.remove()
        finally:
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
        report["elapsed_s"] = round(time.perf_counter() - self.t0, 3)
        return report

    @contextmanager
    def _open_run(self, folder: Path):
        """The run folder (the leader's, locked; the other ranks follow it) and the job's plan."""
        key, fresh, opened = job_key(self.cfg), not folder.exists(), []

        def open_and_plan():
            run = RunFolder(folder, key, say=self.say).__enter__()
            opened.append(run)
            return self._plan_of(run, fresh, folder)

        try:
            plan_json = self.ranks.from_leader(open_and_plan)
            if not self.ranks.leader:
                opened.append(RunFolder(folder, key, follower=True).__enter__())
            yield opened[0], PipelinePlan.from_json(plan_json)
        finally:
            for run in opened:
                run.__exit__(None, None, None)

    def _check_output(self) -> None:
        """Refused before any work (on the leader): an output over the scan, a foreign file, a missing folder."""
        cfg = self.cfg
        if cfg.output is None:
            if self.ranks.world > 1:
                raise ValueError("output.path is required with several ranks: they share the run folder beside it")
            return
        from ..output_policy import check_output
        output_format(cfg.output.path, cfg.output.format)
        check_output(cfg.output.path, recon_inputs(cfg), overwrite=cfg.output.overwrite,
                     force=cfg.output.force, what="output.path")
        if not Path(cfg.output.path).parent.is_dir():
            raise ScanFileError(cfg.output.path, f"cannot be written: the folder {Path(cfg.output.path).parent} "
                                                 "does not exist")

    def _plan_of(self, run: RunFolder, fresh: bool, folder: Path) -> dict:
        """The recorded plan of a resumed run (the same windows: the same bits), else a new one, recorded."""
        if run.resumed and "plan" in run.state:
            self.say(f"resuming the unfinished run in {folder}")
            return run.state["plan"]
        try:
            plan = self._plan()
        except BudgetError:
            if fresh:
                run.remove()
            raise
        run.remember(plan=plan.to_json())
        return plan.to_json()

    def _share(self, run: RunFolder, step: str, windows: list, chunk: int | None = None) -> list:
        """This rank's windows of a stage not yet done; every rank looks at the markers at the same moment.
        ``chunk``: the store's chunk length along the windows' axis; windows within one chunk go to one rank,
        so no two ranks ever write the same chunk."""
        self.ranks.barrier()
        todo = [w for w in windows if not run.is_done(step, *w)]
        chunk = chunk or 1                   # (without a chunk, each window is a group of its own)
        ours = set(self.ranks.share(sorted({a // chunk for a, _ in todo})))
        mine = [w for w in todo if w[0] // chunk in ours]
        self.windows_done[step] = self.windows_done.get(step, 0) + len(mine)
        return mine

    def _advance(self, stage, run: RunFolder, step: str, windows: list, width: int) -> None:
        """The stage's bar after this rank finished a window of ``width``: alone, by that; among ranks, at what
        every rank has marked done."""
        if self.ranks.world == 1:
            if width:
                stage.advance(width)
            return
        done = sum(b - a for a, b in windows if run.is_done(step, a, b))
        if done > stage.done:
            stage.advance(done - stage.done)

    def _stages(self, run: RunFolder) -> dict:
        store = self._read_pass(run)
        if self.corr.has_row_pass:
            store = self._ring_pass(run, store)
        self._say_corrections()
        frame, found = self._centre(run, store)
        reader = BandReader(store.array, frame)
        geometry = self._geometry(found["angles"], found["offset_u_mm"], roll_in_trajectory=not frame.roll_deg)
        volume_path = run.item("volume.ome.zarr")
        fdk = self._slab_fdk(geometry)
        if fdk is not None:
            self._backproject(run, reader, fdk, geometry, volume_path)
            algo = {"algorithm": self.request.algorithm, "method": fdk.who, "params": dict(self.request.params),
                    "n_iter": 1, "stopped": "completed", "slabs": self.plan.slab, "view_batch": self.plan.view_batch}
        else:
            # iterative methods run on the leader (disk CGLS plans its own windows); the other ranks wait
            algo = self.ranks.from_leader(lambda: self._solve(run, reader, geometry, volume_path))
        report = self._report(found, geometry, algo)
        report["ranks"] = {"world": self.ranks.world, "windows": self.ranks.gather(self.windows_done)}
        report["volume"] = None
        if self.return_volume and self.ranks.leader:
            import torch
            from ..io.ome_zarr import OmeZarrVolume
            report["volume"] = torch.from_numpy(OmeZarrVolume.open(volume_path).read())
            if geometry.is_2d:
                report["volume"] = report["volume"][0]
        report["geometry_object"] = geometry
        if self.cfg.output is not None:
            report["output"] = self.ranks.from_leader(lambda: str(self._deliver(volume_path, geometry, report)))
            self.say(f"wrote {report['output']}")
        return report

    # ================================================================ stage 1: read and correct
    def _store(self, run, name: str):
        from ..storage import ZarrStore
        path = run.item(name)
        n, rows, cols = self.shape

        def create():        # the leader makes the store; the other ranks open it
            if run.is_done("created", 0, 0) and path.exists() and (path / "zarr.json").exists() and \
                    run.state.get("stores", {}).get(name):
                return
            if path.exists():
                shutil.rmtree(path)
            ZarrStore.create(path, (n, rows, cols), chunks=self.plan.store_chunks)
            run.remember(stores={**run.state.get("stores", {}), name: True})
            run.mark_done("created", 0, 0)

        self.ranks.from_leader(create)
        return ZarrStore.open(path, "r+", allow_incomplete=True)

    def _read_pass(self, run: RunFolder):
        store = self._store(run, "lines.zarr")
        n = self.shape[0]
        k = self.plan.view_chunk
        windows = [(a, min(n, a + k)) for a in range(0, n, k)]
        todo = self._share(run, "read", windows, chunk=self.plan.store_chunks[0])
        stage = self.progress.stage("read", n, "views", done=sum(b - a for a, b in windows if run.is_done("read", a, b)))
        corr = self.corr
        with _reading_ahead() as pool:
            ahead = pool.submit(corr.read_raw, *todo[0]) if todo else None
            for j, (a, b) in enumerate(todo):
                raw = ahead.result()
                ahead = pool.submit(corr.read_raw, *todo[j + 1]) if j + 1 < len(todo) else None
                before = corr.summary()
                lines = corr.views(a, b, raw=raw)
                del raw
                store.array[a:b] = lines
                run.mark_done("read", a, b, json.dumps(diff_counts(corr.summary(), before)))
                self._advance(stage, run, "read", windows, b - a)
        self.ranks.barrier()
        self._advance(stage, run, "read", windows, 0)
        stage.close()
        self.counts = merge_counts([corr.summary_fields()] + [json.loads(run.done_data("read", a, b) or "{}")
                                                              for a, b in windows])
        return store

    def _say_corrections(self) -> None:
        c = self.counts
        self.say(f"preprocessed: {list(self.shape)} line integrals; clipped {c.get('n_clipped', 0)} values")
        n_nonfinite = sum(c.get(k, 0) for k in ("n_nonfinite_counts", "n_nonfinite_flat_values",
                                                "n_nonfinite_dark_values"))
        if n_nonfinite:
            self.say(f"non-finite input values: {n_nonfinite} ({c['nonfinite_rule']})")
        if "zingers" in c:
            self.say(f"zingers: replaced {c['zingers']['n_replaced']} outlier values")
        shifted = self.corr.shifts()
        if shifted is not None:     # applied as the views are read (pipeline/bands.py)
            c["view_shifts"] = s = shifted[2]
            self.say(f"per-view shifts applied ({s['source']}; up to {s['max_abs_x_px']:.2f} px across, "
                     f"{s['max_abs_y_px']:.2f} px down)")

    # ================================================================ stage 2: ring filters
    def _ring_pass(self, run: RunFolder, src):
        dst = self._store(run, "rings.zarr")
        n, rows, cols = self.shape
        rb = self.plan.row_band
        windows = [(r, min(rows, r + rb)) for r in range(0, rows, rb)]
        todo = self._share(run, "rings", windows, chunk=self.plan.store_chunks[1])
        stage = self.progress.stage("rings", rows, "rows", done=sum(b - a for a, b in windows if run.is_done("rings", a, b)))
        with _reading_ahead() as pool:
            ahead = pool.submit(lambda w: np.asarray(src.array[:, w[0]:w[1]]), todo[0]) if todo else None
            for j, (r0, r1) in enumerate(todo):
                band = ahead.result()
                ahead = pool.submit(lambda w: np.asarray(src.array[:, w[0]:w[1]]), todo[j + 1]) \
                    if j + 1 < len(todo) else None
                dst.array[:, r0:r1] = self.corr.rows(band)
                run.mark_done("rings", r0, r1)
                self._advance(stage, run, "rings", windows, r1 - r0)
        self.ranks.barrier()
        self._advance(stage, run, "rings", windows, 0)
        stage.close()
        return dst

    # ================================================================ stage 3: orientation and centre
    def _centre(self, run: RunFolder, store):
        from ..io.handedness import ctbench_angles, fixed_fields, resolve_orientation

        cfg, geo = self.cfg, self.cfg.geometry
        n, rows, cols = self.shape
        du, dv = self.corr.pitch
        shifted = self.corr.shifts()
        frame = ViewFrame(flip_rows=self.orientation.flip_rows, pitch=(du, dv),
                          shift_x=None if shifted is None else shifted[0],
                          shift_y=None if shifted is None else shifted[1])
        roll = float(geo.detector_roll_deg or 0.0)
        unroll = bool(roll) and self.analytic

        def find() -> dict:       # on the leader; the other ranks get what it found
            found = run.state.get("found")
            if found is not None:
                return found
            stage = self.progress.stage("centre", 1, "steps")
            offset_v = (geo.detector_offset_v_mm or 0.0) + self.shift_v
            r0, r1, band_offset = centre_rows(rows, dv, offset_v)
            band = BandReader(store.array, frame).images(0, n, r0, r1, orient_columns=False, unroll=False)
            res = resolve_orientation(band, self.file_angles, self.orientation, self.scan.orientation.rotation,
                                      pitch=du, pitch_v=dv, sid=self.sid, sdd=self.sdd, offset_v_mm=band_offset,
                                      search_centre=geo.detector_offset_u_mm == "auto", fixed=fixed_fields(geo))
            res.warnings[:0] = list(self.scan.scanner.get("warnings", []))   # what the reader found amiss
            angles = ctbench_angles(self.file_angles, self.scan.orientation.rotation, res.orientation.rotation)
            shift_u = -self.corr.change.shift_u if res.orientation.flip_columns else self.corr.change.shift_u
            centre = res.centre
            roll_how = None
            if roll:
                if unroll:      # FBP/FDK filters rows: the images are resampled onto an unrolled detector
                    roll_how = f"images resampled onto an unrolled detector ({roll} deg)"
                    if geo.detector_offset_u_mm == "auto":
                        from ..preprocessing import find_centre
                        uband = BandReader(store.array, frame.with_(flip_columns=res.orientation.flip_columns,
                                                                    roll_deg=roll)).images(0, n, r0, r1)
                        centre = find_centre(uband, angles, du, sid=self.sid, sdd=self.sdd, pitch_v=dv,
                                             offset_v=band_offset)
                else:
                    roll_how = f"detector turned in the trajectory ({roll} deg)"
            if geo.detector_offset_u_mm == "auto":
                offset_u = centre.offset_mm
            else:
                offset_u = float(geo.detector_offset_u_mm) + shift_u
            found = {"flip_columns": res.orientation.flip_columns, "angles": [float(a) for a in angles],
                     "offset_u_mm": float(offset_u), "centre": None if centre is None else centre.to_dict(),
                     "centre_text": None if centre is None or geo.detector_offset_u_mm != "auto" else centre.text(),
                     "orientation": res.to_dict(), "warnings": list(res.warnings), "notes": list(res.notes),
                     "detector_roll": roll_how}
            run.remember(found=found)
            stage.advance(1)
            stage.close()
            return found

        found = self.ranks.from_leader(find)
        for note in found["notes"]:
            self.say(note)
        if found["detector_roll"]:
            self.say(f"detector roll: {found['detector_roll']}")
        if found["centre_text"]:
            self.say(found["centre_text"])
        found = dict(found, angles=np.asarray(found["angles"]))
        return frame.with_(flip_columns=found["flip_columns"], roll_deg=roll if unroll else 0.0), found

    # ================================================================ stage 4: reconstruct
    def _volume(self, path: Path, geometry, attrs: dict):
        from ..io.ome_zarr import OmeZarrVolume
        vshape = geometry.volume_shape if not geometry.is_2d else (1, *geometry.volume_shape)
        spacing = geometry.voxel_spacing if not geometry.is_2d else (1.0, *geometry.voxel_spacing)
        if path.exists():
            vol = OmeZarrVolume.open(path, "r+")
            if vol.shape == tuple(vshape):
                return vol
            shutil.rmtree(path)
        return OmeZarrVolume.create(path, vshape, spacing, attrs=attrs)

    def _provenance(self, geometry) -> dict:
        return {"config": self.cfg.model_dump(mode="json"), "geometry": geometry.to_dict(),
                "algorithm": self.request.to_dict()}

    def _backproject(self, run: RunFolder, reader: BandReader, fdk, geometry, path: Path) -> None:
        from ..io.ome_zarr import OmeZarrVolume
        self.ranks.from_leader(lambda: self._volume(path, geometry, self._provenance(geometry)).shape)
        vol = OmeZarrVolume.open(path, "r+")
        D = geometry.volume_shape[0]
        n = self.shape[0]
        slab, nb = self.plan.slab, self.plan.view_batch
        slabs = [(z, min(D, z + slab)) for z in range(0, D, slab)]
        todo = self._share(run, "backproject", slabs)
        done = sum(b - a for a, b in slabs if run.is_done("backproject", a, b))
        stage = self.progress.stage("backproject", D, "planes", done=done)
        shared = self.ranks.world > 1        # the bar follows the markers of every rank
        batches = [(a, min(n, a + nb)) for a in range(0, n, nb)]
        with _reading_ahead() as pool:
            for z0, z1 in todo:
                lo, hi = fdk.rows(z0, z1)
                jobs = [(a, b) for a, b in batches] if hi > lo else []
                ahead = pool.submit(reader.sinogram, *jobs[0], lo, hi) if jobs else None
                import torch
                acc = torch.zeros((z1 - z0, *geometry.volume_shape[1:]), dtype=torch.float32)
                done_planes = 0.0
                for j, (a, b) in enumerate(jobs):
                    block = ahead.result()
                    ahead = pool.submit(reader.sinogram, *jobs[j + 1], lo, hi) if j + 1 < len(jobs) else None
                    with torch.no_grad():
                        t = time.perf_counter()
                        filtered = fdk.filter_band(block, a, b, lo, hi)
                        t1 = time.perf_counter()
                        fdk.backproject(filtered, a, b, lo, hi, z0, z1, acc)
                        self.kernel_s["filter"] += t1 - t
                        self.kernel_s["backproject"] += time.perf_counter() - t1
                        del filtered
                    del block
                    step = (z1 - z0) * (j + 1) / len(jobs) - done_planes
                    if int(step) >= 1 and not shared:
                        stage.advance(int(step))
                        done_planes += int(step)
                vol.write_slab(z0, acc.numpy())
                del acc
                run.mark_done("backproject", z0, z1)
                self._advance(stage, run, "backproject", slabs, int(round((z1 - z0) - done_planes)))
        self.ranks.barrier()
        self._advance(stage, run, "backproject", slabs, 0)
        stage.close()

    def _solve(self, run: RunFolder, reader: BandReader, geometry, path: Path) -> dict:
        import torch

        from ..workbench.workflow import Progress as SolverProgress, reconstruct
        n, rows, cols = self.shape
        if self.plan.solver_from_disk:
            return self._disk_cgls(run, reader, geometry, path)
        sino = reader.sinogram(0, n, 0, rows)
        if geometry.is_2d:
            sino = sino[..., 0]
        total = int(self.request.params.get("n_iter", 1)) if self.request.spec.iterative else 1
        stage = self.progress.stage("solve", total, "iterations")
        finished = None
        for event in reconstruct(geometry, sino, self.request, preview_every=0, cancel=self.progress.cancel):
            if isinstance(event, SolverProgress) and event.iteration > stage.done:
                stage.advance(event.iteration - stage.done)
            elif hasattr(event, "volume") and hasattr(event, "residuals"):
                finished = event
        stage.close()
        del sino
        if finished.stopped == "cancelled":
            from .progress import Cancelled
            raise Cancelled("cancelled while solving")
        vol = self._volume(path, geometry, self._provenance(geometry))
        v = finished.volume.detach().cpu().numpy().astype(np.float32)
        vol.write_slab(0, v[None] if geometry.is_2d else v)
        meta = finished.metadata()
        return meta

    def _disk_cgls(self, run: RunFolder, reader: BandReader, geometry, path: Path) -> dict:
        from ..solvers import disk_cgls
        from ..storage import ZarrStore
        n, rows, cols = self.shape
        sino_path = run.item("sinogram.zarr")
        nb = self.plan.view_chunk
        if not run.is_done("sinogram", 0, n):
            if sino_path.exists():
                shutil.rmtree(sino_path)
            store = ZarrStore.create(sino_path, (n, cols, rows), chunks=(min(n, 16), cols, min(rows, 64)))
            stage = self.progress.stage("sinogram", n, "views")
            for a in range(0, n, nb):
                b = min(n, a + nb)
                store.array[a:b] = reader.sinogram(a, b, 0, rows).numpy()
                stage.advance(b - a)
            stage.close()
            run.mark_done("sinogram", 0, n)
        store = ZarrStore.open(sino_path, "r")
        n_iter = int(self.request.params["n_iter"])
        stage = self.progress.stage("solve", n_iter, "iterations")
        avail = self.plan.budget - self.plan.baseline
        res = disk_cgls(geometry.projector("auto"), store, run.item("cgls-work"), n_iter, checkpoint_every=1,
                        resume=(run.item("cgls-work").exists()), memory_budget=max(avail // 2, 64 << 20),
                        callback=lambda s: stage.advance(1), cancel=self.progress.cancel)
        stage.close()
        vol = self._volume(path, geometry, self._provenance(geometry))
        x = res.volume
        D = geometry.volume_shape[0]
        step = vol.slab_alignment
        for z0 in range(0, D, step):
            vol.write_slab(z0, x.read((slice(z0, min(D, z0 + step)), slice(None), slice(None))).numpy())
        return {"algorithm": "cgls", "params": dict(self.request.params), "n_iter": res.n_iter,
                "stopped": res.stopped, "residuals": [float(r) for r in res.residuals], "from_disk": True}

    # ================================================================ stage 5: output
    def _deliver(self, volume_path: Path, geometry, report: dict) -> Path:
        from ..output_policy import replace_into_place, written_by_ctbench
        from ..io.ome_zarr import OmeZarrVolume

        out = self.cfg.output
        target = Path(out.path)
        vol = OmeZarrVolume.open(volume_path, "r+")
        # written as strict JSON (a NaN residual or sharpness is null with a note: ctbench/json_report.py)
        vol.set_attrs(recon=strict({k: v for k, v in report.items() if k not in ("volume", "geometry_object")}))
        if self.out_format == "ome-zarr":
            stage = self.progress.stage("write", 1, "steps")
            replace_into_place(volume_path, target, may_replace=None if out.force else written_by_ctbench)
            stage.advance(1)
            stage.close()
            return target
        from ..io.export import export_volume
        stage = self.progress.stage("write", 1, "volumes")
        level0 = vol.level(0)
        path = export_volume(target, level0[0] if geometry.is_2d else level0, geometry.voxel_spacing,
                             format=self.out_format, overwrite=out.overwrite, force=out.force,
                             inputs=recon_inputs(self.cfg), geometry=geometry,
                             meta={"config": self.cfg.model_dump(mode="json"), "recon": strict(report["algorithm"])})
        stage.advance(1)
        stage.close()
        return path

    def _report(self, found: dict, geometry, algo: dict) -> dict:
        cfg = self.cfg
        geo = cfg.geometry
        report = {"input": self.scan.describe() | {"angles_deg": None}, "preprocessed_shape": list(self.shape),
                  "correction": self.counts, "centre": found["centre"],
                  "detector_offset_mm": [found["offset_u_mm"], (geo.detector_offset_v_mm or 0.0) + self.shift_v],
                  "geometry": {"sid_mm": self.sid, "sdd_mm": self.sdd, "volume_shape": list(geometry.volume_shape),
                               "voxel_spacing": list(geometry.voxel_spacing), "trajectory": geo.trajectory},
                  "orientation": found["orientation"], "warnings": list(found["warnings"]),
                  "detector_roll": found["detector_roll"], "algorithm": algo, "output": None,
                  "plan": self.plan.to_json(),
                  "kernel_s": {k: round(v, 3) for k, v in self.kernel_s.items()}}
        return report


def run_streamed(cfg: ReconConfig, *, log=None, progress: Progress | None = None, return_volume: bool = True,
                 ranks: Ranks | None = None) -> dict:
    """Run a recon config as a stream (module doc); returns the report (``"volume"``: the volume as a tensor when
    ``return_volume``, on the leading rank, else None).  ``ranks``: this process's place under torchrun
    (default: read from the environment, one rank outside torchrun)."""
    own = ranks is None
    ranks = Ranks.from_environment() if own else ranks
    try:
        return StreamedRecon(cfg, say=log, progress=progress, return_volume=return_volume, ranks=ranks).run()
    finally:
        if own:
            ranks.close()
