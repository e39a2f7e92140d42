"""Loss normalization when the ranks hold different numbers of loss tokens (padding, packing).

The lab's rule (`loss_of`: the plain local mean, then FSDP's average over the world)
is exact only when every cp shard of every sample holds the same number of loss
tokens. With a loss mask (padded samples, or packed ones whose padding carries no
label) the counts differ, and the mean of local means weights a token on a sparse
shard more than one on a full shard.

torchtitan's rule (`torchtitan/train.py` and `disable_fsdp_gradient_division` at
238fa99): sum the squared error over this rank's loss tokens, divide by the loss
tokens of the whole global batch (an all-reduced count), and set FSDP's gradient
divide factor to 1 so the reduction sums instead of averaging. Exact for any counts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from paralab.parallel_dims import ParallelDims
from paralab.train.model import DTYPE, SHAPE, build_model
from paralab.train.parallelism import parallelize
from paralab.train.runs import (
    dims_of,
    full_parameters,
    make_sample,
    optimizer_for,
    sample_index,
)

LOSS_TOKENS = (32, 20)
"""Loss tokens of sample i (i mod 2): the first ones carry a loss, the rest are padding.

At cp 2 the shards of sample 0 hold 16 and 16 of them, those of sample 1 hold 16 and 4.
"""
RULES = ("local mean", "global token count")


def loss_mask(index: int) -> torch.Tensor:
    """(1, N) True where sample `index` has a loss token."""
    return (torch.arange(SHAPE["tokens"]) < LOSS_TOKENS[index % len(LOSS_TOKENS)]).view(1, -1)


def masked_error(
    model: nn.Module,
    noisy: torch.Tensor,
    sigma: torch.Tensor,
    noise: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, int]:
    """(sum of squared errors over this rank's loss tokens, how many loss tokens it holds)."""
    local = model.shard.tokens(mask.unsqueeze(-1)).to(DTYPE)
    error = ((model(noisy, sigma) - model.shard.tokens(noise)) ** 2 * local).sum()
    return error, int(local.sum().item())


def loss_tokens_in_batch(parallel_dims: ParallelDims) -> int:
    """Loss tokens of the whole global batch (what the all-reduce of the counts returns)."""
    samples = parallel_dims.world_size // (parallel_dims.cfgp * parallel_dims.cp)
    return sum(int(loss_mask(i).sum()) for i in range(samples))


def masked_step(dims: dict, rule: str, *, seed: int = 0) -> dict:
    """One SGD step on this rank's share of the padded global batch, normalized by `rule`.

    local mean: the local sum over (local loss tokens x channels), FSDP averages.
    global token count: the local sum over (all-reduced loss tokens x channels),
    FSDP's divide factor set to 1 (it sums).
    """
    if rule not in RULES:
        raise ValueError(f"rule = {rule!r}, expected one of {RULES}")
    pd = dims_of(dims)
    model = parallelize(build_model(), pd)
    index = sample_index(dist.get_rank(), pd)
    error, tokens = masked_error(model, *make_sample(seed, 0, index), loss_mask(index))
    if rule == "local mean":
        loss = error / (tokens * SHAPE["channels"])
    else:
        count = torch.tensor(tokens, dtype=torch.int64)
        dist.all_reduce(count)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
        loss = error / (int(count) * SHAPE["channels"])
    loss.backward()
    optimizer_for(model.parameters(), "sgd").step()
    return {"params": full_parameters(model), "loss tokens": tokens, "sample": index}


def masked_reference(samples: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """One process, one SGD step: the squared error summed over every loss token, over their count."""
    model = build_model()
    error, tokens = torch.zeros((), dtype=DTYPE), 0
    for i in range(samples):
        e, n = masked_error(model, *make_sample(seed, 0, i), loss_mask(i))
        error, tokens = error + e, tokens + n
    (error / (tokens * SHAPE["channels"])).backward()
    optimizer_for(model.parameters(), "sgd").step()
    return full_parameters(model)
