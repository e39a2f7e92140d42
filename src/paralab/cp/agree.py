"""Ranks agree on their inputs before the first collective, so that they refuse together.

A rank that raises on its own leaves the others waiting in the exchange it skipped
(until the launch timeout), and shards of unequal length abort gloo mid-transfer.
So each rank runs its local checks, then one small all-gather shares every rank's
verdict and shard shape; if any rank failed, or the shapes differ, every rank raises.
The all-gather is a guard, not the algorithm's traffic: the ledger leaves it out, and
torch.compile (which would break its graph there) runs the local checks alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from paralab.ledger import unrecorded


def check_member(group: dist.ProcessGroup | None, who: str) -> None:
    """A rank outside `group` cannot take part in its collectives: say so, by global rank."""
    if dist.is_initialized() and dist.get_rank(group) < 0:
        raise ValueError(
            f"{who}: global rank {dist.get_rank()} is not in the group "
            f"(ranks {dist.get_process_group_ranks(group)}); call it only on the group's ranks"
        )


def refuse_together(
    local_check: Callable[[], None],
    shard: torch.Tensor,
    group: dist.ProcessGroup | None,
    who: str,
) -> None:
    """Run `local_check` on this rank, then raise on every rank if any rank failed or shapes differ.

    Inside torch.compile only the local checks run: a collective here would break the graph.
    """
    if torch.compiler.is_compiling():
        local_check()
        return
    check_member(group, who)
    if not dist.is_initialized():
        local_check()
        return
    try:
        local_check()
        own_error = None
    except ValueError as error:
        own_error = error
    shape = list(shard.shape) if shard.dim() == 4 else [-1] * 4
    mine = torch.tensor([own_error is not None, *shape], dtype=torch.int64, device=shard.device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    with unrecorded():
        dist.all_gather(everyone, mine, group=group)
    if own_error is not None:
        raise own_error
    failed = [rank for rank, row in enumerate(everyone) if row[0]]
    if failed:
        raise ValueError(
            f"{who}: rank(s) {failed} of the group refused their inputs; rank "
            f"{dist.get_rank(group)} refuses too, so that no rank waits in an exchange"
        )
    shapes = [tuple(row[1:].tolist()) for row in everyone]
    if len(set(shapes)) > 1:
        lengths = ", ".join(f"rank {rank}: {s[2]}" for rank, s in enumerate(shapes))
        raise ValueError(
            f"{who}: the ranks' shards differ; sequence lengths (dim 2) {lengths}; "
            f"shapes {shapes}. Every rank must hold an equal shard (cut by shard_sequence)"
        )
