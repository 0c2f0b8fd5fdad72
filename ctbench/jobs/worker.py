"""The torchrun entry of a job: ``python -m torch.distributed.run ... -m ctbench.jobs.worker JOB_DIR``.

Every rank loads its share of the dataset's sinogram (its views), builds a
distributed :class:`~ctbench.projector.Projector` with the job's partition,
and consumes the same solver generator a local run uses
(:mod:`ctbench.workbench.workflow`).  Rank 0 writes the events
(:mod:`.events`); previews are sent at most every ``preview_interval``
seconds (rank 0 decides and tells the others, since a slab partition needs
every rank to contribute the central plane).  The result is a ctbench dataset
written beside its final name and renamed into place; ``result.json`` in the
job directory (also renamed into place) says where it is.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ._files import write_json_atomic
from .events import EVENTS_FILE, EventWriter, encode_preview
from .spec import JobSpec


def _device(spec: JobSpec, local_rank: int) -> torch.device:
    if spec.devices is not None:
        return torch.device(spec.devices[local_rank])
    if spec.backend != "gloo" and torch.cuda.is_available():
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    return torch.device("cpu")


def _downsample(plane: torch.Tensor, size: int) -> tuple[np.ndarray, int]:
    f = max(1, math.ceil(max(plane.shape) / size))
    if f > 1:
        plane = torch.nn.functional.avg_pool2d(plane[None, None].float(), f, ceil_mode=True)[0, 0]
    return plane.float().cpu().numpy(), f


class Job:
    """One rank's view of the job."""

    def __init__(self, job_dir: Path):
        self.dir = job_dir
        self.spec = JobSpec.model_validate_json((job_dir / "spec.json").read_text())
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.events = EventWriter(job_dir / EVENTS_FILE) if self.rank == 0 else None

    def emit(self, type_: str, **fields) -> None:
        if self.events is not None:
            self.events.write(type_, **fields)

    # ---------------------------------------------------------------- setup
    def setup(self):
        from ..workbench.dataset import load_dataset
        from ..workbench.preview import Problem, grid_origin

        spec = self.spec
        self.device = _device(spec, self.local_rank)
        backend = spec.backend if spec.backend != "auto" else ("nccl" if self.device.type == "cuda" else "gloo")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(backend)
        ds = load_dataset(spec.dataset, lazy=True)
        if ds.sinogram is None or ds.geometry is None:
            raise ValueError(f"dataset {spec.dataset} needs a sinogram and a geometry to be reconstructed")
        geo = ds.geometry
        options = {"distributed": True, "partition": spec.partition}
        if spec.partition_grid is not None:
            options["partition_grid"] = tuple(spec.partition_grid)
        if spec.memory_budget is not None:
            options["memory_budget"] = spec.memory_budget
        P = geo.projector("auto", **options)
        vs = P.view_slice
        sino = torch.from_numpy(np.asarray(ds.sinogram[vs.start:vs.stop]))
        if not sino.is_floating_point():
            sino = sino.float()
        sino = sino.reshape(tuple(P.projection_shape)).to(self.device)
        self.geometry, self.projector = geo, P
        self.problem = Problem(P, sino, geo, tuple(geo.volume_shape), tuple(geo.voxel_spacing),
                               grid_origin(geo.volume_shape, geo.voxel_spacing), "full")

    # ------------------------------------------------------------ previews
    def _preview_due(self, due: bool) -> bool:
        # Rank 0's clock decides; the others learn it (they must join the plane's all-reduce).
        if self.projector.space_world_size == 1:
            return due
        flag = torch.tensor([1 if due else 0], dtype=torch.int32, device=self.device)
        dist.broadcast(flag, 0)
        return bool(flag.item())

    def _central_plane(self, volume: torch.Tensor) -> tuple[torch.Tensor, int]:
        P = self.projector
        c = self.geometry.volume_shape[0] // 2
        if self.geometry.is_2d:
            return volume.reshape(self.geometry.volume_shape), 0
        if P.space_world_size == 1:
            return volume.reshape(-1, *volume.shape[-2:])[c], c
        s = P.volume_slice
        plane = torch.zeros(volume.shape[-2:], dtype=volume.dtype, device=volume.device)
        if P.view_rank == 0 and s.start <= c < s.stop:
            plane += volume[c - s.start]
        dist.all_reduce(plane)
        return plane, c

    # ---------------------------------------------------------------- run
    def run(self) -> None:
        from ..workbench.workflow import Finished, ReconRequest, _direct, _iterations

        spec = self.spec
        request: ReconRequest = spec.request.to_request().validated()
        t0 = time.perf_counter()
        self.setup()
        prob = self.problem
        n_iter = int(request.params.get("n_iter", 1)) if request.spec.iterative else 1
        self.emit("started", request=request.to_dict(), n_iter=n_iter, volume_shape=list(prob.volume_shape),
                  voxel_spacing=list(prob.voxel_spacing), origin=list(prob.origin), note=prob.note,
                  nproc=self.world, partition=spec.partition, setup_s=time.perf_counter() - t0)
        residuals: list[float] = []
        it = 0   # the last iteration (a resumed disk CGLS starts after its checkpoint, not at 1)
        stopped, volume = "completed", None
        if not request.spec.iterative:
            volume = _direct(prob, request.params)
            self._progress(1, 1, None, t0, volume, last=True)
        else:
            last_preview = -math.inf
            gen = self._disk_cgls(n_iter) if spec.checkpoint_every else _iterations(prob, request, None, None)
            try:
                for state in gen:
                    volume, it = state.volume, int(state.iteration)
                    res = None if state.residual is None else float(state.residual)
                    if res is not None:
                        residuals.append(res)
                    last = it >= n_iter
                    due = self._preview_due(last or time.monotonic() - last_preview >= spec.preview_interval)
                    if due or last:
                        # Disk CGLS yields its x store (valid until the next iteration): read it now.
                        volume = _tensor(volume)
                    if due:
                        last_preview = time.monotonic()
                    self._progress(it, n_iter, res, t0, volume if due else None, last)
                    if last:
                        break
                else:
                    stopped = "tol" if (volume is not None and it < n_iter) else "completed"
                    volume = _tensor(volume)
            finally:
                gen.close()
        if volume is None:
            volume = torch.zeros(self.projector.volume_shape, dtype=prob.sinogram.dtype)
        elapsed = time.perf_counter() - t0
        fin = Finished(volume, residuals, it if request.spec.iterative else 1, stopped, elapsed,
                       request, prob.voxel_spacing, prob.origin, prob.note)
        meta = {**fin.metadata(), "nproc": self.world, "partition": spec.partition, "job_dir": str(self.dir),
                "job_id": self.dir.name}   # binds the result to this job (the bridge serves only its own)
        out = self.write_result(volume, meta)
        if self.rank == 0:
            write_json_atomic(self.dir / "result.json", {"output": str(out), "metadata": meta})
            shutil.rmtree(self.dir / "work", ignore_errors=True)   # disk CGLS work stores: done with them
        self.emit("finished", stopped=stopped, n_iter=fin.n_iter, residuals=residuals, elapsed=elapsed,
                  request=request.to_dict(), output=str(out), metadata=meta)

    def _disk_cgls(self, n_iter: int):
        """Disk-backed CGLS with checkpoints in ``JOB_DIR/work``: a relaunched job resumes from the newest one."""
        from ..solvers.disk_cgls import disk_cgls_iterations
        from ..storage import ZarrStore
        from ..workbench.dataset import load_dataset

        sino = ZarrStore(load_dataset(self.spec.dataset, lazy=True).sinogram)
        work = self.dir / "work"
        resumed = work.exists()
        if resumed:
            self.emit("resuming", message="resuming from the newest checkpoint complete on every rank "
                                          "(or from the start if there is none)")
        return disk_cgls_iterations(self.projector, sino, work, n_iter, checkpoint_every=self.spec.checkpoint_every,
                                    resume=True, memory_budget=self.spec.memory_budget)

    def _progress(self, it, n_iter, res, t0, volume, last) -> None:
        preview = None
        if volume is not None:
            plane, index = self._central_plane(volume)
            if self.rank == 0:
                small, f = _downsample(plane, self.spec.preview_size)
                preview = encode_preview(small, index, f, self.problem.volume_shape)
        elapsed = time.perf_counter() - t0
        eta = elapsed / it * (n_iter - it) if it else None
        self.emit("progress", iteration=it, n_iter=n_iter, residual=res, elapsed=elapsed, eta=eta, preview=preview)

    # -------------------------------------------------------------- result
    def output_path(self) -> Path:
        return Path(self.spec.output) if self.spec.output else self.dir / "result.zarr"

    def write_result(self, volume: torch.Tensor, meta: dict) -> Path:
        """The result as a ctbench dataset; every rank that owns a slab writes its planes.

        Written aside into a new hidden sibling ``.NAME.new-PID-RANDOM`` (created by rank 0 with ``mkdir``,
        which never follows a planted link, its name sent to the other ranks) and exchanged into place.  Every
        failure (a full disk, a cancel, an error on any rank) removes the aside copy; one a killed worker left
        is removed by the next write of that output (:func:`ctbench.output_policy.recover_interrupted_replace`).
        A folder found at the output path is replaced only if it is this job's own result (the bridge reserved
        the path at submit; anything else there was put by someone else).
        """
        from ..workbench.dataset import swap_into_place

        out = self.output_path()
        tmp = self._staging_folder(out)
        placed: list[BaseException] = []
        try:
            error = None
            try:
                self._write_aside(tmp, volume, meta)
            except Exception as e:  # noqa: BLE001 - every rank learns of it below
                error = e
            failed = torch.tensor([1 if error is not None else 0], dtype=torch.int32, device=self.device)
            if dist.is_initialized() and self.world > 1:
                dist.all_reduce(failed)
            if failed.item():
                raise error if error is not None else RuntimeError("writing the result failed on another rank")
            if self.rank == 0:
                try:
                    job_id = self.dir.name
                    # An earlier result stays whole until this one is; a foreign folder is swapped back untouched.
                    swap_into_place(tmp, out, may_replace=lambda old: _result_of(old, job_id))
                except Exception as e:  # noqa: BLE001 - every rank learns of it (no rank left at a barrier)
                    placed.append(e)
            self._agree(placed)
            if placed:
                raise placed[0]
        finally:
            if self.rank == 0 and os.path.lexists(tmp):   # not swapped in: nothing half-written stays behind
                shutil.rmtree(tmp, ignore_errors=True)
        return out

    def _staging_folder(self, out: Path) -> Path:
        """The aside folder of this job's result, made by rank 0 and named to every rank."""
        from ..output_policy import recover_interrupted_replace, staging_path

        name = [None]
        error = None
        if self.rank == 0:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                recover_interrupted_replace(out)      # what a killed worker of this output left behind
                for _ in range(16):
                    tmp = staging_path(out)
                    try:
                        os.mkdir(tmp, 0o700)          # exclusive: an existing name or a planted link is not used
                    except FileExistsError:
                        continue
                    name[0] = str(tmp)
                    break
                else:
                    raise FileExistsError(f"could not create a staging folder beside {out}")
            except Exception as e:  # noqa: BLE001 - every rank learns of it below
                error = e
        if dist.is_initialized() and self.world > 1:
            dist.broadcast_object_list(name, src=0)
        if name[0] is None:
            raise error if error is not None else RuntimeError(f"rank 0 could not create the result's staging "
                                                               f"folder beside {out}")
        return Path(name[0])

    def _write_aside(self, tmp: Path, volume: torch.Tensor, meta: dict) -> None:
        """Fill ``tmp`` in three phases (rank 0 creates, the owners write, rank 0 finishes); every rank meets
        every barrier even after a failure of its own (a full disk), so a failing rank never strands the others."""
        import zarr

        from ..workbench.dataset import FORMAT, UNITS, VERSION, _axes, create_array, open_array_for_writing

        geo, P = self.geometry, self.projector
        shape = tuple(geo.volume_shape)
        writes = P.view_rank == 0 if P.space_world_size > 1 else self.rank == 0
        error: list[BaseException] = []

        def phase(fn):
            if not error:
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - raised after the barriers
                    error.append(e)

        manifest = {}

        def create():
            group = zarr.open_group(str(tmp), mode="w", zarr_format=3)   # the fresh folder _staging_folder made
            # One chunk per plane: ranks write disjoint chunks, so slabs never race.
            chunks = shape if len(shape) == 2 else (1, *shape[1:])
            _, manifest["volume"] = create_array(group, "volume", shape, str(volume.dtype).replace("torch.", ""),
                                                 chunks)

        def write():
            arr = open_array_for_writing(tmp / "volume")
            local = volume.detach().cpu().numpy()
            if len(shape) == 2 or P.space_world_size == 1:
                arr[...] = local.reshape(shape)
            else:
                s = P.volume_slice
                if s.stop > s.start:
                    arr[s.start:s.stop] = local.reshape(s.stop - s.start, *shape[1:])

        def finish():
            from ..storage.zarr_store import write_chunk_positions
            write_chunk_positions(tmp / "volume")   # every rank has written: bind each chunk to its position
            group = zarr.open_group(str(tmp), mode="r+")
            group.attrs.update({"format": FORMAT, "version": VERSION, "units": UNITS, "geometry": geo.to_dict(),
                                "meta": meta, "manifest": manifest, "volume": {"axes": _axes("volume", len(shape)),
                                                         "voxel_spacing": list(geo.voxel_spacing)}})

        if self.rank == 0:
            phase(create)
        self._agree(error)   # the others must not open an array rank 0 failed to create
        if writes:
            phase(write)
        dist.barrier()
        if self.rank == 0:
            phase(finish)
        if error:
            raise error[0]

    def _agree(self, error: list) -> None:
        """Barrier that also tells every rank whether any rank has failed (then all skip the next phases)."""
        flag = torch.tensor([1 if error else 0], dtype=torch.int32, device=self.device)
        if dist.is_initialized() and self.world > 1:
            dist.all_reduce(flag)
        if flag.item() and not error:
            error.append(RuntimeError("writing the result failed on another rank"))


def _result_of(folder: Path, job_id: str) -> bool:
    """Whether ``folder`` is a result dataset of job ``job_id`` (or empty): the only thing a job may replace."""
    from ..output_policy import _is_dataset_folder

    try:
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            return True
        if not _is_dataset_folder(folder):
            return False
        from ..workbench.dataset import _group_attrs
        return (_group_attrs(folder).get("meta") or {}).get("job_id") == job_id
    except (OSError, ValueError):
        return False


def _tensor(v):
    """A solver's estimate as a tensor (disk CGLS yields a block store)."""
    return v.read() if v is not None and hasattr(v, "read") else v


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m torch.distributed.run ... -m ctbench.jobs.worker JOB_DIR", file=sys.stderr)
        return 2
    job = Job(Path(argv[0]))
    try:
        job.run()
    except BaseException as e:
        job.emit("error", message=f"{type(e).__name__}: {e}")
        traceback.print_exc()
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
