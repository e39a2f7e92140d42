"""Aux-loss-free balancing: a per-expert bias that steers the choice and never the weights.

DeepSeek-V3 balances its experts without (mostly) an auxiliary loss: each expert has a bias
added to its score **for the top-k choice only**; the gate weight a chosen expert gets is
still its unbiased probability, so the bias changes which experts run and nothing else. The
bias is not trained by the loss. After each step it moves by a fixed rate against the load:

    delta_e = rate * sign(mean load - load_e);  delta -= mean(delta);  bias += delta

(torchtitan's `_update_expert_bias`, run before the optimizer step over the loads summed
across the data-parallel ranks; Megatron's `get_updated_expert_bias` is the same without
removing the mean). An overloaded expert's bias falls, so fewer tokens choose it next step.
"""

from __future__ import annotations

import torch

from paralab.ep.router import top_k_route


def biased_top_k(
    probs: torch.Tensor, bias: torch.Tensor, top_k: int, renormalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts): the experts chosen by `probs + bias` (ties to the lower index),
    weighted by their unbiased `probs`."""
    _, experts = top_k_route(probs + bias, top_k)
    weights = probs.gather(1, experts)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def updated_bias(bias: torch.Tensor, load: torch.Tensor, rate: float) -> torch.Tensor:
    """The bias after one step whose assignments per expert (summed over every rank) were
    `load`: each expert moves `rate` towards the mean load, the moves centred on zero."""
    delta = rate * torch.sign(load.to(bias.dtype).mean() - load.to(bias.dtype))
    return bias + (delta - delta.mean())
