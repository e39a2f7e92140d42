"""The router: which experts each token goes to, with what weight, and which assignments fit.

- `top_k_route`: softmax probabilities -> the k best experts per token. Ties go to the
  lower expert index (a stable descending sort), so every process picks the same experts
  from the same numbers.
- `renormalize`: divide the k weights by their sum (Mixtral, GShard's top-2, DeepSeek-V3)
  or keep the raw probabilities (Switch, DeepSeek-V2). Engines differ, so it is an option.
- `capacity`: each expert takes at most ceil(c * tokens * k / E) assignments from one
  rank's tokens; c = None means no limit.
- `capacity_keep`: which assignments fit. Priority: every token's first choice before any
  second choice; within one choice, earlier tokens first. A dropped assignment contributes
  nothing, so a token whose every choice is dropped leaves the MoE layer as the residual.
  Kept weights are not renormalized after drops.
- `switch_aux_loss`: E * sum_e f_e * P_e (f_e: the fraction of assignments routed to e,
  before drops; P_e: the mean router probability of e). It is 1 for a uniform load
  (f_e = 1/E), and larger when load and probability pile onto the same experts.
"""

from __future__ import annotations

import math

import torch


def top_k_route(
    probs: torch.Tensor, top_k: int, renormalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts), both (tokens, k): the k most probable experts of each token, best first.

    Ties go to the lower expert index; `renormalize` makes each token's k weights sum to 1.
    """
    ### BEGIN SOLUTION
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, experts = ranked.values[:, :top_k], ranked.indices[:, :top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts
    ### END SOLUTION


def capacity(tokens: int, num_experts: int, top_k: int, factor: float | None) -> int | None:
    """Assignments one expert takes from one rank: ceil(factor * tokens * k / E); None: no limit."""
    if factor is None:
        return None
    return math.ceil(factor * tokens * top_k / num_experts)


def capacity_keep(experts: torch.Tensor, num_experts: int, slots: int | None) -> torch.Tensor:
    """(tokens, k) bool: True where the assignment fits in its expert's `slots`.

    An expert fills its slots with first choices in token order, then second choices in
    token order; the rest are dropped. `slots=None` keeps everything.
    """
    ### BEGIN SOLUTION
    if slots is None:
        return torch.ones_like(experts, dtype=torch.bool)
    by_priority = experts.t().reshape(-1)  # choice 0 of every token, then choice 1, ...
    one_hot = torch.nn.functional.one_hot(by_priority, num_experts)
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1  # place in its expert's queue
    return (position < slots).reshape(experts.t().shape).t()
    ### END SOLUTION


def switch_aux_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """E * sum_e f_e * P_e over this rank's tokens; f_e counts assignments before drops."""
    num_experts = probs.shape[-1]
    routed = torch.bincount(experts.reshape(-1), minlength=num_experts).to(probs.dtype)
    fraction = routed / experts.numel()
    return num_experts * (fraction * probs.mean(dim=0)).sum()
