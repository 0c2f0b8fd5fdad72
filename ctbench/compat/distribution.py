"""diffct.distribution: who owns which views and planes, and rank agreement before any I/O.

Thin names over ctbench's rank grid (:mod:`ctbench.distributed.partition`): the same
``(view_ranks, space_ranks)`` grid, parent rank ``view_rank * space_ranks + space_rank``, balanced
contiguous shares of the views and of the first volume axis.  ``preflight`` is diffct's admission
step: every rank states its local error (or None) and its request metadata; if one rank failed,
every rank raises that error, and if the metadata differ, every rank raises ``ValueError``, so a
job never hangs in a collective that only some ranks enter.
"""

from __future__ import annotations

import hashlib
import math
import numbers

import torch
import torch.distributed as dist

from ..distributed.partition import PARTITIONS, balanced_split, make_layout

__all__ = ["Partition", "balanced_slice", "control_status", "preflight"]

# Error classes a rank's failure is re-raised as on every rank (others become RuntimeError).
_ERRORS = {cls.__name__: cls for cls in (TypeError, ValueError, RuntimeError, PermissionError,
                                         FileNotFoundError, FileExistsError, NotImplementedError)}


def balanced_slice(size, rank, world_size):
    """The ``rank``-th of ``world_size`` contiguous shares of ``range(size)`` (first ones longer)."""
    return balanced_split(int(size), int(world_size), int(rank))


def _backend_device(process_group):
    try:
        nccl = dist.get_backend(process_group) == "nccl"
    except Exception:
        nccl = False
    return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def control_status(values, *, process_group=None, world_size=1):
    """Element-wise maximum over ranks of a few integers (one all-reduce, no pickling)."""
    if world_size == 1:
        return values
    with torch._C._DisableFuncTorch():  # a control message, not part of any transform
        status = torch.tensor([int(v) for v in values], dtype=torch.int64, device=_backend_device(process_group))
        dist.all_reduce(status, op=dist.ReduceOp.MAX, group=process_group)
        return status.tolist()


def _stable(value):
    """A representation independent of dict order, keeping container kinds apart."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((_stable(k), _stable(v)) for k, v in value.items()), key=repr)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_stable(v) for v in value))
    return value


def _digest(metadata) -> int:
    raw = hashlib.sha256(repr(_stable(metadata)).encode("utf-8")).digest()[:8]
    return int.from_bytes(raw, "big", signed=True)


def preflight(error=None, metadata=None, *, process_group=None, world_size=1, cache=None, cache_key=None,
              revision=None, mismatch="distributed ranks must agree on request metadata"):
    """Raise on every rank if any rank has ``error`` or the ranks' ``metadata`` differ.

    With one rank the local error is raised as it is.  Otherwise the ranks first compare a
    64-bit digest of the metadata (one small all-reduce: the common case costs no pickling);
    only on a failure or a mismatch do they exchange the errors and metadata themselves.
    ``cache``/``cache_key``/``revision`` let a caller skip recomputing an unchanged digest.
    """
    mine = (None if error is None else (type(error).__name__, str(error)), metadata)
    gathered = [mine]
    if world_size > 1:
        exchange = error is not None
        try:
            hit = cache is not None and cache_key in cache and cache[cache_key][:2] == (revision, metadata)
            digest = cache[cache_key][2] if hit else _digest(metadata)
        except Exception:  # metadata that cannot be digested: compare the objects themselves
            hit, digest, exchange = False, 0, True
        # max(d) == ~max(~d) exactly when every rank has the same d (~ is exact on int64).
        failed, high, inverted_low = control_status((int(exchange), digest, ~digest),
                                                    process_group=process_group, world_size=world_size)
        if failed or high != ~inverted_low:
            gathered = [None] * world_size
            dist.all_gather_object(gathered, mine, group=process_group)
        elif cache is not None and not hit:
            cache[cache_key] = (revision, metadata, digest)
    for failure, _ in gathered:
        if failure is not None:
            raise _ERRORS.get(failure[0], RuntimeError)(failure[1])
    if any(meta != metadata for _, meta in gathered):
        raise ValueError(mismatch)


def _check_grid_value(grid):
    if (not isinstance(grid, (tuple, list)) or len(grid) != 2
            or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0 for v in grid)):
        return False
    return True


class Partition:
    """This rank's share of a scan: views ``view_slice`` and planes ``volume_slice[0]``.

    ``partition`` is ``"views"``, ``"space"`` or ``"hybrid"`` (with ``partition_grid=(view_ranks,
    space_ranks)``; by default the most square grid with at least as many view ranks).  All ranks
    must pass the same shape, views, partition and grid (``ValueError`` on every rank otherwise).
    """

    def __init__(self, volume_shape, n_views, *, distributed=False, process_group=None, partition="views",
                 partition_grid=None):
        if not isinstance(distributed, bool):
            raise TypeError("distributed must be a bool")
        if process_group is not None and not distributed:
            raise ValueError("process_group requires distributed=True")
        self.process_group = process_group
        self._preflight_cache: dict = {}
        self.rank, self.world_size = 0, 1
        if distributed:
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError("distributed=True requires an initialized process group")
            self.rank = dist.get_rank(process_group)
            self.world_size = dist.get_world_size(process_group)
            if self.rank < 0 or self.world_size <= 0:
                raise ValueError("process_group must include the calling rank")
        volume_shape = tuple(volume_shape)
        if self.world_size > 1:
            mine = (volume_shape, n_views, partition, partition_grid)
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, mine, group=process_group)
            if any(other != mine for other in everyone):
                raise ValueError("distributed ranks must agree on shape, views, partition and partition_grid")
        if partition not in PARTITIONS:
            raise ValueError("partition must be 'views', 'space', or 'hybrid'")
        if partition != "hybrid" and partition_grid is not None:
            raise ValueError("partition_grid requires partition='hybrid'")
        if partition == "hybrid" and partition_grid is None:
            partition_grid = _square_grid(self.world_size)
        if partition == "hybrid" and (not _check_grid_value(partition_grid)
                                      or math.prod(partition_grid) != self.world_size):
            raise ValueError("partition_grid must contain positive (view_ranks, space_ranks) with product world_size")
        if distributed:
            # ctbench's grid and subgroups (the collectives' groups of a distributed Projector)
            layout = make_layout(partition, partition_grid if partition == "hybrid" else None, process_group)
            self.partition_grid = tuple(layout.grid)
            self.space_group = layout.space_group or process_group
            self.view_group = layout.view_group or process_group
            self.ranks = list(dist.get_process_group_ranks(process_group or dist.group.WORLD))
        else:
            self.partition_grid = (1, 1)
            self.space_group = self.view_group = process_group
            self.ranks = [0]
        self.partition = partition
        self.view_world_size, self.space_world_size = self.partition_grid
        self.view_rank, self.space_rank = divmod(self.rank, self.space_world_size)
        first = balanced_slice(volume_shape[0], self.space_rank, self.space_world_size)
        self.volume_slice = (first, *(slice(0, size) for size in volume_shape[1:]))
        self.local_volume_shape = (first.stop - first.start, *volume_shape[1:])
        self.view_slice = balanced_slice(n_views, self.view_rank, self.view_world_size)

    def global_rank(self, rank):
        """The job-wide rank of ``rank`` in this partition's process group."""
        return self.ranks[rank]

    def preflight(self, error=None, metadata=None, *, cache_key=None, revision=None,
                  mismatch="distributed ranks must agree on request metadata"):
        """:func:`preflight` over this partition's ranks."""
        return preflight(error, metadata, process_group=self.process_group, world_size=self.world_size,
                         cache=self._preflight_cache if cache_key is not None else None,
                         cache_key=cache_key, revision=revision, mismatch=mismatch)


class OwnedSlices(tuple):
    """diffct's ``volume_slice``: one slice per axis of the caller's volume (what this rank owns).

    ctbench's engine windows volumes into z-slabs and reads the slab's planes as
    ``volume_slice.start``/``.stop``; those attributes give ``planes``, the owned planes of
    ctbench's grid (for 3D the first slice; a 2D volume is one plane of the grid)."""

    def __new__(cls, slices, planes):
        obj = super().__new__(cls, slices)
        obj.planes = planes
        return obj

    def __getnewargs__(self):
        return tuple(self), self.planes

    @property
    def start(self):
        return self.planes.start

    @property
    def stop(self):
        return self.planes.stop

    @property
    def step(self):
        return self.planes.step

    def indices(self, length):
        return self.planes.indices(length)


def owned_slices(planes, grid_shape, is_2d) -> OwnedSlices:
    """The diffct ``volume_slice`` for ctbench's owned ``planes`` of a grid ``(D, H, W)``."""
    rest = tuple(slice(0, n) for n in grid_shape[1:])
    return OwnedSlices(rest if is_2d else (planes, *rest), planes)


def check_ownership(distributed, process_group, partition, partition_grid):
    """diffct's checks of the ownership keywords, before any collective (diffct's messages)."""
    if not isinstance(distributed, bool):
        raise TypeError("distributed must be a bool")
    if process_group is not None and not distributed:
        raise ValueError("process_group requires distributed=True")
    if not isinstance(partition, str) or partition not in PARTITIONS:
        raise ValueError("partition must be 'views', 'space', or 'hybrid'")
    if partition != "hybrid" and partition_grid is not None:
        raise ValueError("partition_grid requires partition='hybrid'")
    if partition_grid is not None and not _check_grid_value(partition_grid):
        raise ValueError("partition_grid must contain positive (view_ranks, space_ranks) with product world_size")
    if partition == "hybrid" and not distributed and partition_grid is not None and tuple(partition_grid) != (1, 1):
        raise ValueError("partition_grid must contain positive (view_ranks, space_ranks) with product world_size")


def default_grid(partition, partition_grid, process_group):
    """diffct's default hybrid grid (the most square one with at least as many view ranks)."""
    if partition != "hybrid" or partition_grid is not None or not (dist.is_available() and dist.is_initialized()):
        return partition_grid  # (without a process group the core names the fix)
    return _square_grid(dist.get_world_size(process_group))


def _square_grid(world: int) -> tuple[int, int]:
    """The most square ``(view_ranks, space_ranks)`` grid of ``world`` ranks, view ranks the larger."""
    space = math.isqrt(world)
    while world % space:
        space -= 1
    return (world // space, space)


def agree_surface_request(trajectory, volume_shape, detector_shape, surface, backend, precision, schedule,
                          process_group, partition, partition_grid, options) -> None:
    """Every rank of a distributed curved-detector request compares what it asked for (shapes,
    views, partition, spacings, beam, backend, precision, schedule, the surface parameters' layout
    and, for a views partition, whether any geometry requires grad): a difference raises
    ``ValueError`` on every rank, before anything else is collective."""
    parts = tuple(trajectory) if isinstance(trajectory, (tuple, list)) else tuple(trajectory.tensors())
    n_views = int(parts[0].shape[0]) if parts and isinstance(parts[0], torch.Tensor) else None
    shape = tuple(volume_shape) if isinstance(volume_shape, (tuple, list, torch.Size)) else (volume_shape,)
    ranks = Partition(shape, n_views, distributed=True, process_group=process_group, partition=partition,
                      partition_grid=partition_grid)
    params = tuple(getattr(surface, "parameters", ()) or ())
    layout = tuple((tuple(p.shape), str(p.dtype)) if isinstance(p, torch.Tensor) else repr(type(p)) for p in params)
    trainable = any(isinstance(t, torch.Tensor) and t.requires_grad for t in (*parts, *params))
    metadata = (repr(tuple(detector_shape) if isinstance(detector_shape, (tuple, list)) else detector_shape),
                options.get("beam"), repr(options.get("detector_spacing")), repr(options.get("voxel_spacing")),
                backend, precision, schedule, layout, trainable if partition == "views" else None)
    ranks.preflight(None, metadata, mismatch="distributed ranks must agree on the request metadata: detector, "
                    "beam, spacing, backend, precision, schedule, surface parameter layout and (views partition) "
                    "whether the geometry requires grad")
