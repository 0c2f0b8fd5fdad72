"""Rank agreement on a solver request before any collective (diffct's admission rule).

Under torchrun every rank of a distributed operator must take the same branches: a rank that
starts from ``x0`` projects it (a collective) while another does not, and the job hangs.  So
each rank checks its request locally, then all ranks exchange (their error, if any, and a token
of the branches they would take); if one rank failed or the tokens differ, every rank raises
the same ValueError, and none has computed or written anything.  One process: the local error
is raised as it is.
"""

from __future__ import annotations


def agree(operator, error, token) -> None:
    world = int(getattr(operator, "world_size", 1) or 1)
    if world <= 1:
        if error is not None:
            raise error
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if error is not None:
            raise error
        return
    mine = (None if error is None else f"{type(error).__name__}: {error}", repr(token))
    gathered = [None] * world
    dist.all_gather_object(gathered, mine, group=getattr(operator, "process_group", None))
    failed = [(rank, msg) for rank, (msg, _) in enumerate(gathered) if msg is not None]
    if failed:
        rank, msg = failed[0]
        raise ValueError(f"distributed solver request refused on every rank: rank {rank} failed ({msg})")
    if any(tok != gathered[0][1] for _, tok in gathered):
        differ = [rank for rank, (_, tok) in enumerate(gathered) if tok != gathered[0][1]]
        raise ValueError("distributed solver request refused on every rank: ranks disagree on the iterations, "
                         "tolerances, settings, x0, resume or checkpoint_directory (ranks "
                         f"{differ} differ from rank 0): every rank must take the same branches")
