"""Who owns what: balanced splits and the (view, space) rank grid of a process group.

Every partition is a grid ``(view_ranks, space_ranks)`` of the parent group:
``views`` is ``(world_size, 1)``, ``space`` is ``(1, world_size)``, ``hybrid``
is given by ``partition_grid``.  The rank at grid position
``(view_rank, space_rank)`` has parent-group rank
``view_rank * space_ranks + space_rank``.  It owns

* the views ``balanced_split(n_views, view_ranks, view_rank)``, and
* the volume planes ``balanced_split(D, space_ranks, space_rank)``.

Two families of subgroups serve the collectives:

* the *space group* of a rank: the ``space_ranks`` ranks holding the same
  views and different slabs (projections of slabs are summed over it);
* the *view group*: the ``view_ranks`` ranks holding the same slab and
  different views (backprojections of view shards are summed over it).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

PARTITIONS = ("views", "space", "hybrid")


def balanced_split(n: int, parts: int, index: int) -> slice:
    """The ``index``-th of ``parts`` contiguous half-open ranges of ``range(n)``.

    Sizes differ by at most one (the first ``n % parts`` ranges are one
    longer); ranges may be empty when ``parts > n``.
    """
    if parts <= 0 or not 0 <= index < parts:
        raise ValueError(f"need 0 <= index < parts, got index={index}, parts={parts}")
    q, r = divmod(int(n), parts)
    start = index * q + min(index, r)
    return slice(start, start + q + (1 if index < r else 0))


@dataclass(frozen=True)
class RankLayout:
    """This rank's place in the (view, space) grid and the groups it talks to."""

    partition: str
    group: object            # parent process group
    rank: int                # rank in the parent group
    world_size: int
    grid: tuple[int, int]    # (view_ranks, space_ranks)
    view_rank: int
    space_rank: int
    view_group: object       # same slab, other views; None when of size 1
    space_group: object      # same views, other slabs; None when of size 1

    @property
    def view_world_size(self) -> int:
        return self.grid[0]

    @property
    def space_world_size(self) -> int:
        return self.grid[1]


def _check_grid(partition: str, grid, world_size: int) -> tuple[int, int]:
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")
    natural = {"views": (world_size, 1), "space": (1, world_size)}.get(partition)
    if grid is None:
        if natural is None:
            raise ValueError("partition='hybrid' needs partition_grid=(view_ranks, space_ranks) with "
                             f"view_ranks * space_ranks == world_size ({world_size})")
        return natural
    try:
        g = tuple(int(v) for v in grid)
    except (TypeError, ValueError):
        raise ValueError(f"partition_grid must be a pair of positive integers (view_ranks, space_ranks), "
                         f"got {grid!r}") from None
    if len(g) != 2 or min(g) <= 0:
        raise ValueError(f"partition_grid must be a pair of positive integers (view_ranks, space_ranks), "
                         f"got {grid!r}")
    if g[0] * g[1] != world_size:
        raise ValueError(f"partition_grid {g} has {g[0] * g[1]} ranks but the process group has "
                         f"{world_size}")
    if natural is not None and g != natural:
        raise ValueError(f"partition={partition!r} on {world_size} ranks means partition_grid={natural}; "
                         f"got {g} (use partition='hybrid' for a mixed grid)")
    return g


def group_timeout(group) -> datetime.timedelta | None:
    """The parent group's collective timeout, so that subgroups keep the same bound."""
    for dev in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(dev)).options._timeout
        except Exception:
            continue
    return None


_SUBGROUPS: dict = {}


def _subgroup(ranks: tuple[int, ...], group, timeout):
    """A cached process group over global ``ranks`` (None for a single rank)."""
    if len(ranks) == 1:
        return None
    if len(ranks) == dist.get_world_size(group):
        return group
    key = (id(group), ranks)
    if key not in _SUBGROUPS:
        kw = {"timeout": timeout} if timeout is not None else {}
        # Local synchronisation: only the members create the group, so a
        # parent that is itself a subgroup of the job works as well.
        _SUBGROUPS[key] = dist.new_group(list(ranks), use_local_synchronization=True, **kw)
    return _SUBGROUPS[key]


def _job_group():
    """A group over every rank of the job, standing in for the default group.

    Projectors outlive ``destroy_process_group()`` in ordinary scripts (the
    spec's demo keeps its operator to the end); a Python reference to the
    default group itself that survives it makes gloo abort the process at exit
    ("terminate called without an active exception"), a copy made with
    ``new_group`` does not.  All ranks build projectors, so all call this.
    """
    world = dist.group.WORLD
    key = ("job", id(world), dist.get_world_size())
    group = _SUBGROUPS.get(key)
    if group is not None:
        try:
            dist.get_process_group_ranks(group)
        except (KeyError, ValueError, RuntimeError):  # destroyed with an earlier default group
            group = None
    if group is None:
        timeout = group_timeout(world)
        kw = {"timeout": timeout} if timeout is not None else {}
        group = _SUBGROUPS[key] = dist.new_group(list(range(dist.get_world_size())), **kw)
    return group


def make_layout(partition: str, partition_grid, process_group) -> RankLayout:
    """This rank's layout in ``process_group`` (default: the whole job) for ``partition``."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("distributed=True needs an initialised torch.distributed process group: launch with "
                           "torchrun and call torch.distributed.init_process_group('nccl' for CUDA, 'gloo' for "
                           "CPU) before creating the Projector")
    group = _job_group() if process_group is None else process_group
    try:
        rank, world = dist.get_rank(group), dist.get_world_size(group)
    except Exception as e:
        raise ValueError(f"process_group is not a usable process group: {e}") from None
    if rank < 0:
        raise ValueError("this process is not a member of process_group")
    grid = _check_grid(partition, partition_grid, world)
    view_rank, space_rank = divmod(rank, grid[1])
    members = dist.get_process_group_ranks(group)  # global ranks in group order
    timeout = group_timeout(group)
    view_ranks = tuple(members[v * grid[1] + space_rank] for v in range(grid[0]))
    space_ranks = tuple(members[view_rank * grid[1] + s] for s in range(grid[1]))
    return RankLayout(partition, group, rank, world, grid, view_rank, space_rank,
                      _subgroup(view_ranks, group, timeout), _subgroup(space_ranks, group, timeout))
