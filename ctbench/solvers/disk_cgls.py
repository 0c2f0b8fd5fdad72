"""CGLS with its vectors on disk: x, s, p and the ray vectors r, q in zarr block stores.

The same iteration as :mod:`ctbench.solvers.cgls`, run window by window so that resident memory
stays within the plan (:func:`ctbench.engine.plan.make_cgls_plan`) while the problem is far larger
than the memory budget.  One iteration is four passes over the stores:

1. project:     q = A p            (view batch by view batch; the slabs of p are summed into a block)
2. residual:    r = r - alpha q    (block by block)
3. backproject: s = A^T r          (slab by slab; the blocks of r are summed into a slab)
4. update:      x = x + alpha p, then p = s + beta p   (slab by slab)

Under torchrun every rank owns and writes only its part: with ``partition="views"`` its ray shard
(r, q) and a replica of the volume vectors (identical on all ranks, since the backprojected slabs
are summed over the ranks before they are written); with ``partition="space"`` its slab of x, s, p
and a replica of the rays.  Inner products are this rank's window sums reduced by the projector's
``inner_volume``/``inner_projection``, so owned parts are summed once and replicas counted once.
Checkpoints: :mod:`ctbench.solvers.checkpoint`; capacity: docs/LARGE_VOLUMES.md.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch

from ..engine.plan import SolverPlan, plan_cgls_for
from ..storage import ZarrStore, check_store
from ._checks import check_projector, check_run
from .checkpoint import CheckpointError, Checkpoints, agree_on_error, all_min, fingerprints
from .state import IterationState, ReconResult, is_cancelled

__all__ = ["disk_cgls", "disk_cgls_iterations", "plan_disk_cgls", "CheckpointError"]

_FLOATS = (torch.float32, torch.float64)


# ------------------------------------------------------------------ checking
def _check_partition(projector) -> None:
    check_projector(projector)
    if projector.is_2d:
        raise ValueError("disk CGLS is for 3D volumes; a 2D scan fits in memory: use ctbench.solvers.cgls")
    if projector.partition == "hybrid" or (projector.view_world_size > 1 and projector.space_world_size > 1):
        raise ValueError("disk CGLS accepts only partition='views' or partition='space' (each rank then owns "
                         "whole ray shards or whole slabs); the hybrid partition is not supported")
    if projector.options.get("devices") is not None:
        raise ValueError("disk CGLS runs one device per process; build the projector without devices= "
                         "(use torchrun for several devices)")


def plan_disk_cgls(projector, sinogram_store=None, *, dtype=None, memory_budget=None,
                   with_x0: bool = True) -> SolverPlan:
    """The windows and capacity (memory and disk, this rank) of :func:`disk_cgls` on these inputs.

    ``dtype`` defaults to the sinogram store's (float32 without a store); ``memory_budget`` to the
    projector's option, else a quarter of the available host memory.
    """
    _check_partition(projector)
    data_chunks = data_dtype = None
    if sinogram_store is not None:
        check_store(sinogram_store, "sinogram_store", _global_projection_shape(projector), _FLOATS)
        data_chunks, data_dtype = sinogram_store.chunks, sinogram_store.dtype
    dtype = dtype or data_dtype or torch.float32
    if dtype not in _FLOATS:
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    return plan_cgls_for(projector, dtype, memory_budget=memory_budget, data_chunks=data_chunks,
                         data_dtype=data_dtype, with_x0=with_x0)


def _global_projection_shape(projector) -> tuple[int, int, int]:
    return (projector.n_views, *projector.detector_shape)


def _rank_dir(work_dir: Path, rank: int) -> Path:
    return work_dir / f"rank-{rank:05d}"


# ------------------------------------------------------------ chunk-wise I/O
# One chunk per store call: zarr then stages one chunk while writing and about two while reading,
# whatever the window, so resident memory follows the plan exactly (engine/plan.py, make_cgls_plan).
def _pieces(store, window):
    c = int(store.chunks[0])
    a0, a1 = window[0].start, window[0].stop
    for a in range(a0, a1, c):
        yield a - a0, (slice(a, min(a1, (a // c + 1) * c)), *window[1:])


def read_by_chunks(store, window) -> torch.Tensor:
    """``store.read(window)`` (a z- or view-range window), one chunk row per call."""
    parts = list(_pieces(store, window))
    if len(parts) == 1:
        return store.read(window)
    shape = [window[0].stop - window[0].start] + [s.stop - s.start if s.stop is not None else n
                                                  for s, n in zip(window[1:], store.shape[1:])]
    out = torch.empty(shape, dtype=store.dtype)
    for off, w in parts:
        t = store.read(w)
        out[off:off + t.shape[0]] = t
        del t
    return out


def write_by_chunks(store, window, value: torch.Tensor) -> None:
    """``store.write(window, value)``, one chunk row per call."""
    for off, w in _pieces(store, window):
        store.write(w, value[off:off + (w[0].stop - w[0].start)])


# ------------------------------------------------------------ the state
class _State:
    """This rank's work stores and windows, and the four passes of an iteration."""

    def __init__(self, projector, plan: SolverPlan, sinogram_store, folder: Path):
        self.P = projector
        self.plan = plan
        self.b = sinogram_store
        self.folder = folder
        self.dtype = plan.dtype
        self.v0 = plan.view_range[0]
        self.z0 = plan.z_range[0]
        self.slabs = plan.slabs()
        self.batches = plan.view_batches()
        self.ex = projector._executor(torch.device("cpu"))
        rays = projector._rays(None, self.dtype, torch.device("cpu")).detach()
        self.rays = rays.views(plan.view_range[0], plan.view_range[1])
        self.space_group = getattr(projector, "space_group", None)
        self.view_group = getattr(projector, "view_group", None)
        self.stores: dict[str, ZarrStore] = {}

    # ------------------------------------------------------------- stores
    def volume_shape(self):
        return (self.plan.z_range[1] - self.z0, *self.plan.grid_shape[1:])

    def ray_shape(self):
        return (self.plan.view_range[1] - self.v0, *self.plan.detector_shape)

    def create(self, folder: Path, names) -> dict:
        out = {}
        for name in names:
            vol = name in ("x", "s", "p")
            out[name] = ZarrStore.create(folder / f"{name}.zarr", self.volume_shape() if vol else self.ray_shape(),
                                         self.dtype, chunks=self.plan.volume_chunks if vol else self.plan.ray_chunks,
                                         overwrite=True)
        return out

    def open_work(self) -> None:
        self.stores = self.create(self.folder, ("x", "s", "p", "r", "q"))

    def vw(self, s0, s1):  # local volume window of global planes [s0, s1)
        return (slice(s0 - self.z0, s1 - self.z0), slice(None), slice(None))

    @staticmethod
    def rw(a, b):  # local ray window of local views [a, b)
        return (slice(a, b), slice(None), slice(None))

    def read(self, name, window) -> torch.Tensor:
        return read_by_chunks(self.stores[name], window)

    def write(self, name, window, value: torch.Tensor) -> None:
        write_by_chunks(self.stores[name], window, value)

    def copy(self, src: dict, dst: dict, names) -> None:
        """Copy stores window by window (checkpoints and restores)."""
        for name in names:
            windows = ([self.vw(s0, s1) for s0, s1 in self.slabs] if name in ("x", "s", "p")
                       else [self.rw(a, b) for a, b in self.batches])
            for w in windows:
                t = read_by_chunks(src[name], w)
                write_by_chunks(dst[name], w, t)
                del t

    # ----------------------------------------------------------- the data
    def data_pass(self) -> tuple[float, str]:
        """This rank's <b, b> and a fingerprint of its share of the data, in one read."""
        h = hashlib.sha256(str((self.b.shape, self.v0, self.ray_shape())).encode())
        bb = 0.0
        for a, b in self.batches:
            blk = self._data(a, b)
            h.update(blk.numpy().data)
            bb += float(torch.dot(blk.reshape(-1), blk.reshape(-1)))
            del blk
        return bb, h.hexdigest()[:32]

    def _data(self, a, b) -> torch.Tensor:
        blk = self.b.read((slice(self.v0 + a, self.v0 + b), slice(None), slice(None)))
        if blk.dtype != self.dtype:
            blk = blk.to(self.dtype)
        if not bool(torch.isfinite(blk).all()):
            raise ValueError(f"sinogram_store contains non-finite values in views [{self.v0 + a}, {self.v0 + b}); "
                             "clean or mask them before reconstructing")
        return blk.contiguous()

    # ------------------------------------------------------------- passes
    def project(self, src: str, out: str, subtract_from_data: bool = False) -> float:
        """out = A src (or b - A src) block by block; returns this rank's <out, out>."""
        acc_sum = 0.0
        U, V = self.plan.detector_shape
        for a, b in self.batches:
            acc = torch.zeros((1, b - a, U, V), dtype=self.dtype)
            rays = self.rays.views(a, b)
            for s0, s1 in self.slabs:
                slab = self.read(src, self.vw(s0, s1))
                self.ex.project_add(slab[None], s0, rays, acc)
                del slab
            if self.space_group is not None:
                from ..distributed.collectives import all_reduce_sum
                acc = all_reduce_sum(acc, self.space_group)
            blk = acc[0]
            if subtract_from_data:
                data = self._data(a, b)
                blk = torch.sub(data, blk, out=data)
            acc_sum += float(torch.dot(blk.reshape(-1), blk.reshape(-1)))
            self.write(out, self.rw(a, b), blk)
            del acc, blk
        return acc_sum

    def copy_data(self, out: str) -> float:
        """out = b (the residual of x0 = 0); returns this rank's <b, b>."""
        total = 0.0
        for a, b in self.batches:
            blk = self._data(a, b)
            total += float(torch.dot(blk.reshape(-1), blk.reshape(-1)))
            self.write(out, self.rw(a, b), blk)
            del blk
        return total

    def residual(self, alpha: float) -> float:
        """r = r - alpha q; returns this rank's <r, r>."""
        total = 0.0
        for a, b in self.batches:
            r = self.read("r", self.rw(a, b))
            q = self.read("q", self.rw(a, b))
            r.sub_(q.mul_(alpha))  # the same roundings as r - alpha * q in memory
            del q
            total += float(torch.dot(r.reshape(-1), r.reshape(-1)))
            self.write("r", self.rw(a, b), r)
            del r
        return total

    def backproject(self, also=()) -> float:
        """s = A^T r slab by slab (also written to the stores in ``also``); returns this rank's <s, s>."""
        total = 0.0
        H, W = self.plan.grid_shape[1:]
        for s0, s1 in self.slabs:
            acc = torch.zeros((1, s1 - s0, H, W), dtype=self.dtype)
            for a, b in self.batches:
                blk = self.read("r", self.rw(a, b))
                self.ex.backproject_add(blk[None], s0, s1, self.rays.views(a, b), acc)
                del blk
            if self.view_group is not None:
                from ..distributed.collectives import all_reduce_sum
                acc = all_reduce_sum(acc, self.view_group)
            s = acc[0]
            total += float(torch.dot(s.reshape(-1), s.reshape(-1)))
            for name in ("s", *also):
                self.write(name, self.vw(s0, s1), s)
            del acc, s
        return total

    def update(self, alpha: float, beta: float) -> None:
        """x = x + alpha p, then p = s + beta p, slab by slab (two slabs resident)."""
        for s0, s1 in self.slabs:
            w = self.vw(s0, s1)
            p = self.read("p", w)
            x = self.read("x", w)
            x.add_(p, alpha=alpha)
            self.write("x", w, x)
            del x
            s = self.read("s", w)
            p.mul_(beta).add_(s)  # s + beta * p, the same roundings as in memory
            del s
            self.write("p", w, p)
            del p


# -------------------------------------------------------------- the solver
def disk_cgls_iterations(projector, sinogram_store, work_dir, n_iter: int = 20, *, x0_store=None,
                         checkpoint_every: int = 0, resume: bool = False, tol=None, callback=None, cancel=None,
                         memory_budget=None, dtype=None):
    """Generator of disk-backed CGLS iterations; yields an :class:`IterationState` after each one.

    Parameters
    ----------
    projector : a 3D Projector, single process or ``distributed=True`` with partition "views" or "space".
    sinogram_store : block store of the *global* sinogram (n_views, U, V); each rank reads its views.
    work_dir : folder for the work stores and checkpoints (``rank-NNNNN`` per rank; may be rank-local).
    n_iter : iterations in total, counting those before a resumed checkpoint.
    x0_store : optional block store of the global starting volume (each rank reads its slab).
    checkpoint_every : write a checkpoint every this many iterations (0: never).
    resume : continue from the newest checkpoint complete on every rank (none: start afresh).  A
        checkpoint that does not match the run is refused with :class:`CheckpointError`.  Without
        ``resume``, a work_dir that holds checkpoints is refused (FileExistsError).
    tol, callback, cancel : as in :func:`ctbench.solvers.cgls_iterations`.
    memory_budget : bytes (or "256 MiB") for the windows; default the projector's option, else a
        quarter of the available host memory.
    dtype : of the work stores and arithmetic; default the sinogram store's.

    ``state.volume`` is the x store (:class:`~ctbench.storage.ZarrStore` of this rank's slab in the
    work_dir), valid until the next iteration; ``extra`` has ``relative_residual``, ``gradient_norm``
    and ``checkpoint`` (the folder written after this iteration, or None).  The generator returns
    the stop reason; all arguments are checked when it is called, before anything is written.
    """
    return _prepare(projector, sinogram_store, work_dir, n_iter, x0_store=x0_store,
                    checkpoint_every=checkpoint_every, resume=resume, tol=tol, callback=callback, cancel=cancel,
                    memory_budget=memory_budget, dtype=dtype)[1]


def _prepare(projector, sinogram_store, work_dir, n_iter, *, x0_store, checkpoint_every, resume, tol, callback,
             cancel, memory_budget, dtype):
    """Check everything and plan; returns (record, generator): the generator fills ``record``."""
    n_iter, tol, callback, cancel = check_run(n_iter, tol, callback, cancel)
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be a non-negative integer (0: no checkpoints), got "
                         f"{checkpoint_every!r}")
    _check_partition(projector)
    check_store(sinogram_store, "sinogram_store", _global_projection_shape(projector), _FLOATS)
    if x0_store is not None:
        check_store(x0_store, "x0_store", projector.global_volume_shape, _FLOATS)
    if work_dir is None:
        raise ValueError("work_dir must be a folder for the work stores and checkpoints, got None")
    work_dir = Path(work_dir)
    if work_dir.exists() and not work_dir.is_dir():
        raise NotADirectoryError(f"work_dir {work_dir} exists and is not a folder")
    plan = plan_disk_cgls(projector, sinogram_store, dtype=dtype, memory_budget=memory_budget,
                          with_x0=x0_store is not None)
    group = projector.process_group
    # Every rank must run the same windows in the collective passes: agree on the smallest.
    if projector.world_size > 1:
        nz, nb = all_min([plan.slab_depth, plan.view_batch], group)
        if (nz, nb) != (plan.slab_depth, plan.view_batch):
            import dataclasses
            plan = dataclasses.replace(plan, slab_depth=nz, view_batch=nb,
                                       volume_chunks=(min(plan.volume_chunks[0], nz), *plan.volume_chunks[1:]),
                                       ray_chunks=(min(plan.ray_chunks[0], nb), *plan.ray_chunks[1:]))
    rank_dir = _rank_dir(work_dir, projector.rank)
    ck = Checkpoints(rank_dir / "checkpoints", group)
    if not resume:
        has = all_min([0 if ck.complete() else 1], group)[0] == 0
        if has:
            raise FileExistsError(f"work_dir {work_dir} holds checkpoints of an earlier run; pass resume=True to "
                                  "continue it, or use an empty work_dir")
    record: dict = {"plan": plan}
    return record, _run(projector, plan, sinogram_store, x0_store, rank_dir, ck, n_iter, checkpoint_every, resume,
                        tol, callback, cancel, record)


# This rank's window sums of an inner product, reduced as the projector reduces inner products:
# over the ranks owning other parts, counting replicas once.
def _reduce_rays(P, value: float) -> float:
    return float(P.inner_projection(torch.tensor(value, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)))


def _reduce_volume(P, value: float) -> float:
    return float(P.inner_volume(torch.tensor(value, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)))


def _run(P, plan, sinogram_store, x0_store, rank_dir, ck, n_iter, checkpoint_every, resume, tol, callback, cancel,
         record):
    st = _State(P, plan, sinogram_store, rank_dir / "state")
    with torch.no_grad():
        bb, digest = st.data_pass()
        b_norm = math.sqrt(_reduce_rays(P, bb)) or 1.0
        expected = fingerprints(P, plan.dtype, digest, (plan.slab_depth, plan.view_batch))
        start, scalars = 0, None
        if resume:
            start, scalars = _restore(P, st, ck, expected)
        if scalars is None:
            st.open_work()
            if x0_store is not None:
                for s0, s1 in st.slabs:
                    st.write("x", st.vw(s0, s1), x0_store.read((slice(s0, s1), slice(None), slice(None))).to(
                        plan.dtype))
                st.project("x", "r", subtract_from_data=True)
            else:
                st.copy_data("r")
            gamma = _reduce_volume(P, st.backproject(also=("p",)))
            scalars = {"gamma": gamma, "residuals": [], "history": []}
        gamma = scalars["gamma"]
        residuals, history = list(scalars["residuals"]), list(scalars["history"])
        record.update(x=st.stores["x"], residuals=residuals, history=history, start=start)

        def save(it):
            manifest = {"solver": "cgls", "fingerprints": expected,
                        "scalars": {"gamma": gamma, "b_norm": b_norm},
                        "residuals": residuals, "history": history}
            return ck.write(it, lambda folder: st.copy(st.stores, st.create(folder, ("x", "r", "p")),
                                                          ("x", "r", "p")), manifest)

        done = False
        for it in range(start + 1, n_iter + 1):
            if is_cancelled(cancel):
                return "cancelled"
            if gamma == 0.0:  # exact solution reached
                res = math.sqrt(_reduce_rays(P, _local_rr(st)))
                extra = {"relative_residual": res / b_norm, "gradient_norm": 0.0}
                done = True
            else:
                qq = _reduce_rays(P, st.project("p", "q"))
                alpha = gamma / qq if qq > 0 else 0.0
                rr = _reduce_rays(P, st.residual(alpha))
                gamma_new = _reduce_volume(P, st.backproject())
                beta = gamma_new / gamma
                st.update(alpha, beta)
                gamma = gamma_new
                res = math.sqrt(rr)
                extra = {"relative_residual": res / b_norm, "gradient_norm": math.sqrt(gamma_new)}
            residuals.append(res)
            history.append(dict(extra))
            written = save(it) if checkpoint_every and it % checkpoint_every == 0 else None
            state = IterationState(it, float(res), st.stores["x"], dict(extra, checkpoint=written))
            stop_requested = callback is not None and callback(state) is True
            yield state
            if stop_requested:
                return "callback"
            if done or gamma == 0.0 or (tol is not None and extra["relative_residual"] <= tol):
                return "tol"
        return "completed"


def _local_rr(st: _State) -> float:
    total = 0.0
    for a, b in st.batches:
        r = st.read("r", st.rw(a, b))
        total += float(torch.dot(r.reshape(-1), r.reshape(-1)))
    return total


def _restore(P, st: _State, ck: Checkpoints, expected: dict):
    """(iteration, scalars) of the newest checkpoint complete on every rank, restored; (0, None) if none."""
    group = ck.group
    mine = ck.complete()
    error = None
    if mine:  # check this rank's newest first: a checkpoint of another run is refused, not skipped
        try:
            ck.check_manifest(ck.read_manifest(mine[0]), expected, "cgls")
        except CheckpointError as e:
            error = str(e)
    agree_on_error(error, group, "checking the checkpoint")
    it = ck.newest_common()
    if it is None:
        if mine:  # a crash between the ranks' manifests: no checkpoint is complete on every rank
            import warnings
            warnings.warn(f"rank {P.rank}: checkpoints {mine} are not complete on every rank; starting afresh",
                          stacklevel=3)
        return 0, None
    error, doc = None, None
    try:
        doc = ck.read_manifest(it)
        ck.check_manifest(doc, expected, "cgls")
        ck.check_files(doc)
        stores = {name: ZarrStore.open(ck.path(it) / f"{name}.zarr", mode="r") for name in ("x", "r", "p")}
        for name, s in stores.items():
            want = st.volume_shape() if name in ("x", "p") else st.ray_shape()
            if s.shape != want or s.dtype != st.dtype:
                raise CheckpointError(f"checkpoint {ck.path(it)}: {name}.zarr has shape {s.shape} {s.dtype}; "
                                      f"this run needs {want} {st.dtype}")
    except (CheckpointError, OSError, ValueError, KeyError, TypeError) as e:
        error = str(e) if isinstance(e, CheckpointError) else f"checkpoint {ck.path(it)} is unreadable: {e}"
    agree_on_error(error, group, "checking the checkpoint")
    st.open_work()
    st.copy(stores, st.stores, ("x", "r", "p"))
    sc = doc["scalars"]
    return it, {"gamma": float(sc["gamma"]), "residuals": [float(v) for v in doc["residuals"]],
                "history": list(doc["history"])}


def write_owned(projector, x_store, volume_store) -> None:
    """Write this rank's part of the result into the global ``volume_store``, one rank after another.

    With ``partition="views"`` the volume is replicated and rank 0 writes it; with ``"space"`` each
    rank writes its slab.  Ranks take turns, so writes into shared chunks never race.
    """
    from .checkpoint import barrier
    vs = projector.volume_slice
    D = vs.stop - vs.start
    step = max(1, x_store.chunks[0])
    for turn in range(projector.world_size):
        if turn == projector.rank and getattr(projector, "view_rank", 0) == 0:
            for a in range(0, D, step):
                b = min(a + step, D)
                volume_store.write((slice(vs.start + a, vs.start + b), slice(None), slice(None)),
                                   x_store.read((slice(a, b), slice(None), slice(None))))
        barrier(projector.process_group)


def disk_cgls(projector, sinogram_store, work_dir, n_iter: int = 20, *, x0_store=None, checkpoint_every: int = 0,
              resume: bool = False, tol=None, callback=None, cancel=None, memory_budget=None, dtype=None,
              volume_store=None) -> ReconResult:
    """Run disk-backed CGLS to the end; see :func:`disk_cgls_iterations`.

    ``volume_store``: a block store of the global volume shape that receives the result (each rank
    writes the part it owns, one rank after another).  The returned ``volume`` is ``volume_store``
    when given, else this rank's x store in work_dir.  ``residuals`` and ``history`` include the
    iterations before a resumed checkpoint.
    """
    if volume_store is not None:
        check_store(volume_store, "volume_store", projector.global_volume_shape, _FLOATS)
    record, gen = _prepare(projector, sinogram_store, work_dir, n_iter, x0_store=x0_store,
                               checkpoint_every=checkpoint_every, resume=resume, tol=tol, callback=callback,
                               cancel=cancel, memory_budget=memory_budget, dtype=dtype)
    last = None
    while True:
        try:
            last = next(gen)
        except StopIteration as stop:
            reason = stop.value if isinstance(stop.value, str) else "completed"
            break
    x = record.get("x")
    if volume_store is not None and x is not None:
        write_owned(projector, x, volume_store)
        x = volume_store
    return ReconResult(volume=x, residuals=list(record.get("residuals", [])),
                       n_iter=last.iteration if last is not None else record.get("start", 0), stopped=reason,
                       history=list(record.get("history", [])))
