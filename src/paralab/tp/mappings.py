"""The four region crossings of tensor and sequence parallelism, as autograd Functions.

Megatron names them by what they do to a tensor entering or leaving a
tensor-parallel region. Each backward is written by hand, and each is its
forward's mirror:

| function | forward | backward | where it sits |
|---|---|---|---|
| `copy_to_tp` (f) | identity | all-reduce | in front of a column-parallel linear |
| `reduce_from_tp` (g) | all-reduce | identity | behind a row-parallel linear |
| SP's all-gather | all-gather (sequence) | reduce-scatter | inside a column linear, under SP |
| `reduce_scatter_to_sp` | reduce-scatter (sequence) | all-gather | behind a row linear, under SP |

f's backward sums: every rank's column shard of the next linear took the same
input, and each contributes a partial gradient of it. g's backward is the
identity: every rank needs the same full gradient of a sum it holds in full.
The SP pair is the same pair with the sum cut in two: an all-reduce is a
reduce-scatter followed by an all-gather, and SP keeps the tensor scattered in
between, across the norms and residuals. SP's all-gather is not a Function of its own:
it lives inside `layers.SequenceParallelColumnLinear`, which must save the shard it
gathered, not the gathered tensor, and so gathers it again in the backward.

A region that every rank computes alike on the whole sequence (lab 10's MoE layer, whose
router must see every token) is entered and left by the other SP pair: `gather_to_duplicated`
(all-gather / keep this rank's shard) and `scatter_to_sp` (keep this rank's shard /
all-gather). The gradient that reaches the gather is then the whole one on every rank, so its
mirror is a split, not a reduce-scatter.

The collectives go through `torch.distributed` by name at call time, so the
ledger counts them and a patch set can replace them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

SEQ_DIM = 1
"""Activations are (batch, seq, hidden): sequence parallelism cuts dim 1."""


def all_reduce_sum(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """The sum over the group's ranks, on every rank (a new tensor; `x` is left as it is)."""
    out = x.contiguous().clone()
    dist.all_reduce(out, group=group)
    return out


def all_gather_seq(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Every rank's sequence shard, concatenated in rank order along the sequence."""
    n = dist.get_world_size(group)
    shard = x.movedim(SEQ_DIM, 0).contiguous()
    out = shard.new_empty((n * shard.shape[0], *shard.shape[1:]))
    dist.all_gather_single(out, shard, group=group)
    return out.movedim(0, SEQ_DIM)


def reduce_scatter_seq(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """The sum over the group of this rank's sequence shard (shard r of `seq / n` tokens)."""
    n = dist.get_world_size(group)
    full = x.movedim(SEQ_DIM, 0).contiguous()
    if full.shape[0] % n:
        raise ValueError(f"reduce_scatter_seq: sequence of {full.shape[0]} does not divide by {n}")
    out = full.new_empty((full.shape[0] // n, *full.shape[1:]))
    dist.reduce_scatter_single(out, full, group=group)
    return out.movedim(0, SEQ_DIM)


def split_seq(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """This rank's sequence shard (shard r of `seq / n` tokens), no communication."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if x.shape[SEQ_DIM] % n:
        raise ValueError(
            f"split_seq: sequence of {x.shape[SEQ_DIM]} does not divide by tp = {n} (rank {rank})"
        )
    return x.chunk(n, dim=SEQ_DIM)[rank].contiguous()


def f_backward(grad: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """f's backward: every rank's partial gradient of f's input, summed, on every rank."""
    ### BEGIN SOLUTION
    return all_reduce_sum(grad, group)
    ### END SOLUTION


def g_backward(grad: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """g's backward: the gradient of g's input, which every rank holds in full and alike."""
    ### BEGIN SOLUTION
    return grad
    ### END SOLUTION


class CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return f_backward(grad, ctx.group), None


class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g_backward(grad, ctx.group), None


class ReduceScatterToSP(torch.autograd.Function):
    """Reduce-scatter of the sequence forward, all-gather backward (SP's g)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_gather_seq(grad, ctx.group), None


def duplicated_gather_backward(grad: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """The backward of a gather in front of a duplicated region: this rank's shard of the
    gradient, which every rank holds whole and alike."""
    return split_seq(grad, group)


class GatherToDuplicated(torch.autograd.Function):
    """All-gather of the sequence forward, this rank's shard of the gradient backward.

    In front of a region every rank computes alike on the whole sequence, the gradient that
    comes back is the whole one, the same on every rank: a reduce-scatter would add up tp equal
    copies. Megatron's `_GatherFromSequenceParallelRegion` with
    `tensor_parallel_output_grad=False`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return all_gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return duplicated_gather_backward(grad, ctx.group), None


class ScatterToSP(torch.autograd.Function):
    """This rank's sequence shard forward, all-gather backward: leaving a region every rank
    computed alike (Megatron's `_ScatterToSequenceParallelRegion`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return split_seq(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_gather_seq(grad, ctx.group), None


def copy_to_tp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return ReduceFromTP.apply(x, group)


def reduce_scatter_to_sp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return ReduceScatterToSP.apply(x, group)


def gather_to_duplicated(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return GatherToDuplicated.apply(x, group)


def scatter_to_sp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return ScatterToSP.apply(x, group)
