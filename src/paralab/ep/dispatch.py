"""Dispatch and combine: each token to the rank of its expert and back, with two all-to-alls.

Rank r of an ep group holds experts [r * E/ep, (r+1) * E/ep). One MoE layer on one rank:

    dispatch: 1. order the kept assignments by expert (so by destination rank too: `send_order`),
              2. exchange the counts: how many rows each rank sends each local expert,
              3. all_to_all_single with those splits,
              4. regroup what arrived (by source rank, then expert) by local expert.
    experts : each local expert runs on its contiguous block of rows.
    combine : undo the regroup, the reverse all_to_all_single (the splits swapped),
              then put every row back at its token, times its gate weight, summed.

`AllToAll` is an autograd Function whose backward is the all-to-all with the splits
swapped: the backward of dispatch is combine's exchange and the backward of combine is
dispatch's. The two calls of one layer sit on one chain of the graph (combine consumes
what dispatch produced), so every rank issues their backwards in the same order:
combine's first, then dispatch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


def exchange_rows(
    x: torch.Tensor,
    output_splits: list[int],
    input_splits: list[int],
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """all_to_all_single: rows [sum(input_splits[:j]), ...) go to rank j; rank i's rows arrive in block i."""
    received = x.new_empty((sum(output_splits), *x.shape[1:]))
    dist.all_to_all_single(received, x.contiguous(), output_splits, input_splits, group=group)
    return received


class AllToAll(torch.autograd.Function):
    """`exchange_rows` whose backward is `exchange_rows` with the splits swapped."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):  # type: ignore[override]
        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group
        return exchange_rows(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return exchange_rows(grad, ctx.input_splits, ctx.output_splits, ctx.group), None, None, None


def exchange_counts(send_counts: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """(ep, E/ep) int64: entry [i, j] is how many rows rank i sends to this rank's local expert j.

    `send_counts` (E,) is how many rows this rank sends to each expert; the block of
    E/ep entries for rank j's experts goes to rank j.
    """
    ### BEGIN SOLUTION
    ep = dist.get_world_size(group)
    received = torch.empty_like(send_counts)
    dist.all_to_all_single(received, send_counts.contiguous(), group=group)
    return received.reshape(ep, -1)
    ### END SOLUTION


def expert_permutation(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, inverse): `rows[order]` groups rows by key (ties keep their order), and
    `grouped[inverse]` puts them back: inverse[order[i]] = i."""
    ### BEGIN SOLUTION
    order = torch.sort(keys, stable=True).indices
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return order, inverse
    ### END SOLUTION


@dataclass
class DispatchPlan:
    """What combine needs to bring the rows home, and what the checks and pictures read."""

    token_of_row: torch.Tensor
    """(rows sent,) the token of each sent row, in send order."""
    weight_of_row: torch.Tensor
    """(rows sent,) its gate weight (differentiable)."""
    send_counts: torch.Tensor
    """(E,) rows this rank sends to each expert."""
    recv_counts: torch.Tensor
    """(ep, E/ep) rows rank i sends to local expert j."""
    input_splits: list[int]
    output_splits: list[int]
    regroup_inverse: torch.Tensor
    """Puts the expert-grouped rows back in arrival order (source rank, then expert)."""
    score_before: bool = False
    """The rows were scaled by their gate weights before dispatch, so combine only sums."""

    @property
    def tokens_per_local_expert(self) -> list[int]:
        return self.recv_counts.sum(dim=0).tolist()


def send_order(
    weights: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, weight, counts): the kept assignments ordered by expert, so by destination rank;
    each row's token and gate weight, and (E,) how many rows go to each expert."""
    tokens, k = experts.shape
    token_of_assignment = torch.arange(tokens, device=experts.device).repeat_interleave(k)
    kept = keep.reshape(-1)
    expert_of_row = experts.reshape(-1)[kept]
    order, _ = expert_permutation(expert_of_row)
    send_counts = torch.bincount(expert_of_row, minlength=num_experts)
    return token_of_assignment[kept][order], weights.reshape(-1)[kept][order], send_counts


def dispatch(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    keep: torch.Tensor,
    num_experts: int,
    group: dist.ProcessGroup | None,
    score_before: bool = False,
) -> tuple[torch.Tensor, DispatchPlan]:
    """This rank's (tokens, dim) rows to the ranks of their experts: (rows for my local experts,
    grouped by local expert, and the plan). `weights`, `experts`, `keep` are (tokens, k).
    `score_before`: each row leaves already times its gate weight."""
    ep = dist.get_world_size(group)
    local = num_experts // ep
    token_of_row, weight_of_row, send_counts = send_order(weights, experts, keep, num_experts)
    recv_counts = exchange_counts(send_counts, group)
    input_splits = send_counts.reshape(ep, local).sum(dim=1).tolist()
    output_splits = recv_counts.sum(dim=1).tolist()
    sent = x[token_of_row] * weight_of_row.unsqueeze(1) if score_before else x[token_of_row]
    received = AllToAll.apply(sent, output_splits, input_splits, group)
    local_expert_of_row = torch.arange(local, device=x.device).repeat(ep)
    regroup, regroup_inverse = expert_permutation(
        local_expert_of_row.repeat_interleave(recv_counts.reshape(-1))
    )
    plan = DispatchPlan(
        token_of_row,
        weight_of_row,
        send_counts,
        recv_counts,
        input_splits,
        output_splits,
        regroup_inverse,
        score_before,
    )
    return received[regroup], plan


def run_local_experts(
    experts: list[nn.Module], rows: torch.Tensor, counts: list[int]
) -> torch.Tensor:
    """Each local expert on its block of `counts` rows (rows grouped by local expert)."""
    blocks = rows.split(counts)
    return torch.cat([expert(block) for expert, block in zip(experts, blocks)])


def combine(
    expert_out: torch.Tensor, plan: DispatchPlan, num_tokens: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """The experts' rows home and summed per token, gate-weighted: (num_tokens, dim).
    A token none of whose assignments was kept gets zeros (the residual carries it)."""
    arrival_order = expert_out[plan.regroup_inverse]
    returned = AllToAll.apply(arrival_order, plan.input_splits, plan.output_splits, group)
    out = expert_out.new_zeros((num_tokens, expert_out.shape[1]))
    if not plan.score_before:
        returned = returned * plan.weight_of_row.unsqueeze(1)
    return out.index_add(0, plan.token_of_row, returned)
