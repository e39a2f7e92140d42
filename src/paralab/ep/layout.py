"""Where a dispatch's tokens go across nodes: DeepEP's layout counts, from the routing alone.

This lab's all-to-all sends one row per kept assignment. DeepEP's internode dispatch sends a
token's row over the network **once per destination node** (its "RDMA rank"), however many of
its experts sit on that node, and fans it out to that node's ranks over NVLink.
`Buffer.get_dispatch_layout` counts this before any byte moves: `num_tokens_per_rank` and
`num_tokens_per_rdma_rank`, a token counted once for every rank (node) holding at least one of
its experts; an expert index of -1 means no selection (a dropped or masked choice) and counts
nowhere.

Rank r holds experts [r·E/ranks, (r+1)·E/ranks), node n holds ranks
[n·ranks_per_node, (n+1)·ranks_per_node). The rows a rank sends over the network are the
counts of every node but its own.
"""

from __future__ import annotations

import torch


def tokens_per_node(
    experts: torch.Tensor, num_experts: int, ranks: int, ranks_per_node: int
) -> torch.Tensor:
    """(ranks / ranks_per_node,) int64: the tokens of `experts` (tokens, k) sent to each node,
    each token once per node holding one of its experts; -1 entries choose nothing."""
    ### BEGIN SOLUTION
    nodes = ranks // ranks_per_node
    experts_per_node = num_experts // ranks * ranks_per_node
    node = torch.where(experts >= 0, experts // experts_per_node, nodes)  # -1: a spare column
    hit = torch.zeros(experts.shape[0], nodes + 1, dtype=torch.bool)
    hit.scatter_(1, node, True)
    return hit[:, :nodes].sum(dim=0)
    ### END SOLUTION


def tokens_per_rank(experts: torch.Tensor, num_experts: int, ranks: int) -> torch.Tensor:
    """(ranks,): DeepEP's `num_tokens_per_rank`, a token once per rank holding one of its experts."""
    return tokens_per_node(experts, num_experts, ranks, 1)


def network_tokens(
    experts: torch.Tensor, num_experts: int, ranks: int, ranks_per_node: int, node: int
) -> int:
    """Rows a rank on `node` sends over the network in DeepEP's dispatch: every other node's count."""
    counts = tokens_per_node(experts, num_experts, ranks, ranks_per_node)
    return int(counts.sum() - counts[node])


def network_assignments(
    experts: torch.Tensor, num_experts: int, ranks: int, ranks_per_node: int, node: int
) -> int:
    """Rows the same rank sends across nodes in this lab's all-to-all: one per assignment."""
    experts_per_node = num_experts // ranks * ranks_per_node
    chosen = experts[experts >= 0]
    return int((chosen // experts_per_node != node).sum())
