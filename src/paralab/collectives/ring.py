"""The ring algorithms, written with point-to-point sends so the ledger sees every chunk move.

Rank r sends to r+1 and receives from r-1 (mod n). A tensor is n chunks; chunk
c is the one rank c ends up owning after the reduce-scatter.

`ring_shift` is send/recv as an autograd function: its backward sends the
gradient back the way the value came (send's backward is a recv), the pattern
ring attention's hand-written backward follows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _exchange(
    outgoing: torch.Tensor, group: dist.ProcessGroup | None, step: int = 1
) -> torch.Tensor:
    """Send `outgoing` to rank+step, return what rank-step sent (one batched isend/irecv pair)."""
    group = group or dist.group.WORLD
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    incoming = torch.empty_like(outgoing)
    works = dist.batch_isend_irecv(
        [
            dist.P2POp(
                dist.isend,
                outgoing.contiguous(),
                dist.get_global_rank(group, (rank + step) % n),
                group,
            ),
            dist.P2POp(dist.irecv, incoming, dist.get_global_rank(group, (rank - step) % n), group),
        ]
    )
    for work in works:
        work.wait()
    return incoming


def ring_reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Chunk `rank` of the sum of every rank's `x` (n chunks along dim 0), by hand on a ring:
    n-1 steps, each sending one chunk of S/n to the next rank of `group` (`None`: the world)."""
    ### BEGIN SOLUTION
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = x.chunk(n)
    partial = chunks[(rank - 1) % n].clone()
    for step in range(1, n):
        # What arrives is the partial sum of chunk (rank - step - 1); add our share and pass it on.
        partial = _exchange(partial, group) + chunks[(rank - step - 1) % n]
    return partial
    ### END SOLUTION


def ring_all_gather(shard: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Every rank's shard, in rank order: n-1 steps, passing on the shard that just arrived."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    pieces = [None] * n
    pieces[rank] = travelling = shard
    for step in range(1, n):
        travelling = _exchange(travelling, group)
        pieces[(rank - step) % n] = travelling
    return torch.cat(pieces)


def ring_all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The sum of every rank's `x` on every rank: a ring reduce-scatter, then a ring all-gather."""
    return ring_all_gather(ring_reduce_scatter(x, group), group)


class _RingShift(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return _exchange(x, group, step=1)  # send to rank+1, receive from rank-1

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _exchange(grad_out, ctx.group, step=-1), None  # the gradient goes back: to rank-1


def ring_shift(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Send `x` to the next rank and return the previous rank's; gradients flow the other way."""
    return _RingShift.apply(x, group)
