"""Differentiable collectives: each forward and its backward are defined here once.

Every distributed projector call, inner product and halo exchange is built
from these five operations, applied over a process group:

===================  ==========================  ===========================
operation            forward                     backward
===================  ==========================  ===========================
``all_reduce_sum``   sum over ranks              sum over ranks
``copy_to_ranks``    identity                    sum over ranks
``global_sum``       sum over ranks              identity
``all_gather``       concatenate (new dim 0)     sum over ranks, own slice
``scale_grad``       identity                    gradient times a constant
===================  ==========================  ===========================

``all_reduce_sum`` returns a replicated value built from per-rank partial
sums; its backward sums the per-rank cotangents, so a loss that every rank
computes on its identical copy must be divided by the number of copies (the
loss-scaling rules of docs/DISTRIBUTED.md).  ``copy_to_ranks`` marks a
replicated input (volume, geometry) whose per-rank gradients are partial: the
backward sums them so that every rank holds the full gradient.
``global_sum`` returns a global scalar (inner products, total variation)
whose gradient on each rank is that of the rank's own share.

Collectives run with group size 1 as no-ops.  A failing collective (a peer
rank raised or exited, or the process group timed out) raises
:class:`DistributedError` naming the rank and the operation.  Payload bytes
are counted in :data:`COMM_STATS` for benchmarks.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.distributed as dist


class DistributedError(RuntimeError):
    """A collective failed: a peer rank raised, exited or timed out."""


class CommStats:
    """Payload bytes and call counts per collective on this rank (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.bytes = defaultdict(int)
            self.calls = defaultdict(int)

    def add(self, op: str, nbytes: int) -> None:
        with self._lock:
            self.bytes[op] += int(nbytes)
            self.calls[op] += 1

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def snapshot(self) -> dict:
        with self._lock:
            return {"bytes": dict(self.bytes), "calls": dict(self.calls), "total_bytes": sum(self.bytes.values())}


COMM_STATS = CommStats()


@contextmanager
def count_communication():
    """Reset :data:`COMM_STATS`, run the block, and leave the counts of the block in it."""
    COMM_STATS.reset()
    yield COMM_STATS


def group_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _describe(group) -> str:
    try:
        return f"rank {dist.get_rank()} of {dist.get_world_size()}"
    except Exception:  # the default group may already be gone
        return "this rank"


def _run(op: str, group, fn, nbytes: int):
    """Run one collective, counting bytes and turning backend failures into a clear error."""
    COMM_STATS.add(op, nbytes)
    try:
        fn()
    except Exception as e:  # gloo/NCCL raise RuntimeError subclasses (DistBackendError, timeouts)
        raise DistributedError(
            f"ctbench distributed {op} failed on {_describe(group)} (group of {group_size(group)} ranks): "
            f"another rank probably raised, exited or stopped joining collectives; look for the first "
            f"failing rank's traceback. Backend error: {type(e).__name__}: {e}") from e


def _all_reduce_(t: torch.Tensor, group, op: str) -> torch.Tensor:
    t = t.contiguous()
    _run(op, group, lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group), t.numel() * t.element_size())
    return t


def barrier(group, op: str = "barrier") -> None:
    """A barrier with the same clear error as the other collectives."""
    if group_size(group) > 1:
        _run(op, group, lambda: dist.barrier(group=group), 0)


# --------------------------------------------------------------- autograd ops
class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_reduce_(x.detach().clone(), group, "all_reduce")

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_sum(grad, ctx.group), None


class _CopyToRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return global_sum(grad, ctx.group), None


class _GlobalSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_reduce_(x.detach().clone(), group, "all_reduce")

    @staticmethod
    def backward(ctx, grad):
        return copy_to_ranks(grad, ctx.group), None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        flat = x.detach().reshape(-1).contiguous()
        out = flat.new_empty(group_size(group) * flat.numel())
        _run("all_gather", group, lambda: dist.all_gather_into_tensor(out, flat, group=group),
             flat.numel() * flat.element_size())
        return out.view(group_size(group), *x.shape)

    @staticmethod
    def backward(ctx, grad):
        # Each rank's cotangent of the gathered copy is partial: the owner's
        # gradient is the sum over ranks of its slice.
        return all_reduce_sum(grad, ctx.group)[ctx.rank], None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


# ------------------------------------------------------------ public helpers
def all_reduce_sum(x: torch.Tensor, group) -> torch.Tensor:
    """Sum of ``x`` over the ranks of ``group`` on every rank; backward sums the cotangents too."""
    if group_size(group) == 1:
        return x
    return _AllReduceSum.apply(x, group)


def copy_to_ranks(x: torch.Tensor, group) -> torch.Tensor:
    """Identity on a replicated input; backward sums the per-rank gradients over ``group``."""
    if group_size(group) == 1:
        return x
    return _CopyToRanks.apply(x, group)


def global_sum(x: torch.Tensor, group) -> torch.Tensor:
    """Sum over ``group`` whose gradient on each rank is that of the rank's own share (identity)."""
    if group_size(group) == 1:
        return x
    return _GlobalSum.apply(x, group)


def all_gather(x: torch.Tensor, group) -> torch.Tensor:
    """Stack ``x`` (same shape on every rank) from all ranks of ``group`` along a new first axis."""
    if group_size(group) == 1:
        return x.unsqueeze(0)
    return _AllGather.apply(x, group)


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Identity whose backward multiplies the gradient by ``factor``.

    Use it on a replicated backprojection (views mode) that feeds the volume
    again, e.g. unrolled iterations; see docs/DISTRIBUTED.md.
    """
    if factor == 1:
        return x
    return _ScaleGrad.apply(x, float(factor))
