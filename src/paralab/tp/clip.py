"""Gradient-norm clipping across tensor-parallel ranks, as Megatron's optimizer does it.

The norm is that of the whole model's gradient, one vector. A rank holds 1/tp of every
sharded parameter and all of every replicated one (norms, row biases, the position
table). The squared norm is a sum over elements, so each rank adds the squares it owns
and one all-reduce over tp sums them; a replicated gradient, the same on every rank,
must enter once, or it counts tp times. Megatron counts a parameter if it is
`tensor_model_parallel` or this is tp rank 0 (`param_is_not_tensor_parallel_duplicate`, which
`MegatronOptimizer._filter_grads_for_norm` applies), sums the kept gradients' squares and
all-reduces them (`get_grad_norm_fp32`, `clip_grads.py`), then scales every gradient
by `max_norm / (norm + 1e-6)` when that is below 1 (`clip_grad_by_total_norm_fp32`), as
`torch.nn.utils.clip_grad_norm_` does in one process. Under SP the replicated gradients
are partial until `model.sync_replicated_grads` has summed them: clip after it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from paralab.tp.model import param_splits

EPS = 1e-6
"""Added to the norm before dividing, as torch's and Megatron's clipping do."""


def tp_grad_norm(
    grads: list[torch.Tensor], replicated: list[bool], group: dist.ProcessGroup | None
) -> torch.Tensor:
    """The L2 norm of the whole model's gradient, the same on every rank of the tp group.

    `grads[i]` is this rank's piece of gradient i: a shard, or the whole gradient when
    `replicated[i]` (every rank holds the same one)."""
    ### BEGIN SOLUTION
    first = dist.get_rank(group) == 0
    square = torch.zeros((), dtype=torch.float64)
    for grad, whole in zip(grads, replicated):
        if first or not whole:
            square += grad.double().pow(2).sum()
    dist.all_reduce(square, group=group)
    return square.sqrt()
    ### END SOLUTION


def clip_tp_grads_(model: nn.Module, max_norm: float, group: dist.ProcessGroup) -> torch.Tensor:
    """Scale every gradient in place so that the whole model's norm is at most `max_norm`;
    returns the norm before clipping."""
    splits = param_splits(model)
    params = [model.get_parameter(name) for name in splits]
    norm = tp_grad_norm([p.grad for p in params], [s is None for s in splits.values()], group)
    scale = (max_norm / (norm + EPS)).clamp(max=1.0)
    for p in params:
        p.grad.mul_(scale)
    return norm
