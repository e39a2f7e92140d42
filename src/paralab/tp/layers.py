"""Tensor-parallel layers, each cut from a one-process layer so that results compare element by element.

- `ColumnParallelLinear`: weight cut on the output features; f in front, or under SP
  `SequenceParallelColumnLinear`, which all-gathers the sequence inside the linear's own
  Function so that it can save only this rank's shard. Its output stays split: each rank
  holds out/tp features (for attention, its heads).
- `RowParallelLinear`: weight cut on the input features; g (or SP's reduce-scatter) behind.
  Each rank's product is a partial sum over its input features; the bias is added once,
  after the sum.
- `VocabParallelEmbedding`: rank r holds the rows of tokens [r·V/tp, (r+1)·V/tp); tokens
  it does not own look up zeros, and g (or a reduce-scatter) adds the ranks' rows up.

A column linear followed by a row linear needs no collective in between: the split
output of the first is exactly the split input the second wants. That is why an MLP
(up column, down row) and attention (q, k, v column, output row) each cost one f and
one g.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import ProcessGroup

from paralab.tp.layout import Split, owned_range, shard
from paralab.tp.mappings import (
    all_gather_seq,
    copy_to_tp,
    reduce_from_tp,
    reduce_scatter_seq,
    reduce_scatter_to_sp,
)


def _group_rank_size(group: ProcessGroup) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


class SequenceParallelColumnLinear(torch.autograd.Function):
    """SP's column linear: all-gather the sequence, then x W_rᵀ + b_r; the backward gathers again.

    The forward saves only this rank's `s/tp` tokens, not the gathered input, so SP divides
    this activation by tp too (Korthikanti et al.'s accounting; Megatron's
    `LinearWithGradAccumulationAndAsyncCommunication`). The price is in the backward, which
    runs on every rank in this order: all-gather the saved shard again (Megatron overlaps it
    with the input-gradient matmul), the input gradient, its reduce-scatter to this rank's
    tokens (the forward all-gather's mirror; Megatron overlaps it with the weight-gradient
    matmul), then the weight gradient from the re-gathered input.
    """

    @staticmethod
    def forward(
        ctx,
        x_shard: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group: ProcessGroup,
    ) -> torch.Tensor:
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x_shard, weight)
        return F.linear(all_gather_seq(x_shard, group), weight, bias)

    @staticmethod
    def backward(
        ctx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, None]:
        x_shard, weight = ctx.saved_tensors
        x_full = all_gather_seq(x_shard, ctx.group)
        grad_x = reduce_scatter_seq(grad @ weight, ctx.group)
        grad_rows = grad.flatten(0, -2)
        grad_weight = grad_rows.T @ x_full.flatten(0, -2)
        grad_bias = grad_rows.sum(0) if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None


class ColumnParallelLinear(nn.Module):
    """y_r = x W_rᵀ + b_r with W_r this rank's rows of W: a full input in, a split output out."""

    def __init__(
        self,
        linear: nn.Linear,
        group: ProcessGroup,
        sequence_parallel: bool = False,
        parts: int = 1,
    ) -> None:
        super().__init__()
        rank, tp = _group_rank_size(group)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.splits = {"weight": Split(0, parts), "bias": Split(0, parts)}
        self.weight = nn.Parameter(shard(linear.weight, self.splits["weight"], rank, tp))
        self.bias = (
            None
            if linear.bias is None
            else nn.Parameter(shard(linear.bias, self.splits["bias"], rank, tp))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            return SequenceParallelColumnLinear.apply(x, self.weight, self.bias, self.group)
        return F.linear(copy_to_tp(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = Σ_r x_r W_rᵀ + b with W_r this rank's columns of W: a split input in, a full sum out."""

    def __init__(
        self, linear: nn.Linear, group: ProcessGroup, sequence_parallel: bool = False
    ) -> None:
        super().__init__()
        rank, tp = _group_rank_size(group)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.splits = {"weight": Split(1)}  # the bias is replicated: added once, after the sum
        self.weight = nn.Parameter(shard(linear.weight, self.splits["weight"], rank, tp))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sp(partial, self.group)
        else:
            y = reduce_from_tp(partial, self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token rows [start, end) on this rank; the others look up zeros; the ranks' rows are summed."""

    def __init__(
        self, embedding: nn.Embedding, group: ProcessGroup, sequence_parallel: bool = False
    ) -> None:
        super().__init__()
        rank, tp = _group_rank_size(group)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.splits = {"weight": Split(0)}
        self.start, self.end = owned_range(embedding.num_embeddings, rank, tp)
        self.weight = nn.Parameter(shard(embedding.weight, self.splits["weight"], rank, tp))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        foreign = (ids < self.start) | (ids >= self.end)
        local = torch.where(foreign, torch.zeros_like(ids), ids - self.start)
        rows = F.embedding(local, self.weight).masked_fill(foreign.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_to_sp(rows, self.group)
        return reduce_from_tp(rows, self.group)


def split_of(module: nn.Module, name: str) -> Split | None:
    """How parameter `name` of `module` is split over the tp ranks (None: replicated).

    Read from the module's own `splits`, not from its class: a notebook that shows these
    classes defines copies of them, and the package must still recognise their layers.
    """
    return getattr(module, "splits", {}).get(name)
