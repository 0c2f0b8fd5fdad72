"""The ranks of a streamed recon under ``torchrun``: who does which windows, and where they meet.

``ctbench recon --ranks N`` (or ``torchrun ... -m ctbench recon``) runs one process per rank on the same run
folder.  Every window a stage has (views to read, row bands to ring-filter, z-slabs to backproject) goes to one
rank, round robin over the windows not yet marked done, and each rank writes its windows into the one shared
store or OME-Zarr (windows are whole chunks, so two ranks never write one chunk).  Rank 0 (the leader) holds
the run folder's lock, plans, finds the centre and delivers the output; the ranks meet at a barrier between
stages, so every rank sees the same done markers when it works out the next stage's share.

A single process is the one-rank case of the same code: every method here is then a no-op.
"""

from __future__ import annotations

import datetime
import os

# A stage may run for hours at scanner sizes (a 2048^3 backprojection on a few cores) while the other ranks
# wait at its closing barrier: Gloo's default 30 minutes would end a healthy job.
DEFAULT_TIMEOUT_S = 7 * 24 * 3600


class RankError(RuntimeError):
    """The leader stopped before the other ranks could go on (its own error names why)."""


class Ranks:
    """This process's place among the job's ranks."""

    def __init__(self, rank: int = 0, world: int = 1, local_world: int = 1):
        if not (0 <= rank < world):
            raise ValueError(f"rank must be in [0, {world}), got {rank}")
        self.rank, self.world, self.local_world = int(rank), int(world), max(1, int(local_world))
        self._group = False

    @classmethod
    def from_environment(cls) -> "Ranks":
        """The ranks torchrun describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``), joined over Gloo; one
        rank when not under torchrun."""
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world <= 1:
            return cls()
        me = cls(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        import torch.distributed as dist
        if not dist.is_initialized():
            timeout = float(os.environ.get("CTBENCH_RANK_TIMEOUT_S", DEFAULT_TIMEOUT_S))
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
            me._group = True
        return me

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def share(self, windows: list) -> list:
        """This rank's windows of a stage: every ``world``-th, starting at its rank."""
        return list(windows[self.rank::self.world])

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()

    def broadcast(self, obj):
        """The leader's ``obj`` on every rank (any picklable value)."""
        if self.world == 1:
            return obj
        import torch.distributed as dist
        box = [obj if self.leader else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def from_leader(self, compute):
        """``compute()`` run on the leader and its value on every rank.  An error on the leader reaches the
        other ranks as :class:`RankError` (and is raised on the leader), so no rank waits for a value that
        will not come."""
        value, error = None, None
        if self.leader:
            try:
                value = compute()
            except BaseException as e:        # the others must hear of it before the leader unwinds
                error = e
        value, message = self.broadcast((value, None if error is None else f"{type(error).__name__}: {error}"))
        if error is not None:
            raise error
        if message is not None:
            raise RankError(f"rank 0 stopped: {message}")
        return value

    def close(self) -> None:
        if self._group:
            import torch.distributed as dist
            dist.destroy_process_group()
            self._group = False

    def __repr__(self) -> str:
        return f"Ranks(rank={self.rank}, world={self.world})"
