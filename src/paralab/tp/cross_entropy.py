"""Cross-entropy over vocab-sharded logits, without ever gathering them.

Each rank holds logits for V/tp tokens of the vocabulary. The loss of one
position is `log Σ_v exp(z_v) - z_target`; three all-reduces of one number per
position give it on every rank:
1. the max over the vocabulary (for a stable exp), `ReduceOp.MAX`;
2. the sum of exp(z - max) (each rank sums its own shard);
3. the target's logit (only the rank that owns the target contributes; the rest add 0).

The backward needs no collective at all: d loss / d z = softmax(z) - onehot(target),
and each rank holds its own columns of both (softmax from the log-sum-exp the forward
kept). Compare gathering the logits: an all-gather of b·s·V numbers per step against 3·b·s.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from paralab.tp.layout import owned_range


def all_reduce_in_place(x: torch.Tensor, group: ProcessGroup, op: str = "sum") -> torch.Tensor:
    """All-reduce `x` itself (sum or max): the loss's reductions of one number per position."""
    dist.all_reduce(x, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
    return x


def vocab_parallel_loss(
    logits: torch.Tensor, target: torch.Tensor, group: ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, log-sum-exp), each (N,) and the same on every rank, from this rank's logit columns
    (N, V/tp) (rank r holds vocabulary entries [r·V/tp, (r+1)·V/tp)) and the (N,) global targets."""
    ### BEGIN SOLUTION
    rank, tp = dist.get_rank(group), dist.get_world_size(group)
    start, end = owned_range(logits.shape[-1] * tp, rank, tp)
    logits_max = all_reduce_in_place(logits.max(dim=-1).values, group, "max")
    shifted = logits - logits_max.unsqueeze(-1)
    sum_exp = all_reduce_in_place(shifted.exp().sum(dim=-1), group)
    mine = (target >= start) & (target < end)
    local_target = torch.where(mine, target - start, torch.zeros_like(target))
    picked = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
    target_logit = all_reduce_in_place(torch.where(mine, picked, torch.zeros_like(picked)), group)
    return sum_exp.log() - target_logit, sum_exp.log() + logits_max
    ### END SOLUTION


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-position loss from (N, V/tp) logit shards and (N,) targets; hand-written backward."""

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, target: torch.Tensor, group: ProcessGroup
    ) -> torch.Tensor:
        loss, logsumexp = vocab_parallel_loss(logits, target, group)
        ctx.save_for_backward(logits, target, logsumexp)
        ctx.group = group
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, target, logsumexp = ctx.saved_tensors
        rank, tp = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        start, end = owned_range(logits.shape[-1] * tp, rank, tp)
        grad = (logits - logsumexp.unsqueeze(-1)).exp()  # this rank's columns of the softmax
        mine = (target >= start) & (target < end)
        rows = mine.nonzero().squeeze(-1)
        grad[rows, target[rows] - start] -= 1.0
        return grad * grad_loss.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, group: ProcessGroup
) -> torch.Tensor:
    """Per-position losses (N,) from this rank's logit columns (N, V/tp): equal on every rank."""
    return VocabParallelCrossEntropy.apply(logits, target, group)
