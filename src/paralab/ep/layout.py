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
counts of every node but its own. `sent_per_node` reads the same counts off what a rank's
dispatch really sent, so the ranks can be checked against the layout of one process's routing.
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


def sent_per_node(
    token_of_row: torch.Tensor, send_counts: torch.Tensor, ranks: int, ranks_per_node: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, tokens), each (nodes,) int64, of one rank's dispatch: the rows it sent to each
    node's ranks and the distinct tokens among them. `token_of_row` is the token of each sent
    row in send order (by expert, so by node) and `send_counts` (E,) the rows per expert."""
    rows = send_counts.reshape(ranks // ranks_per_node, -1).sum(dim=1)
    tokens = [block.unique().numel() for block in token_of_row.split(rows.tolist())]
    return rows, torch.tensor(tokens, dtype=torch.long)
