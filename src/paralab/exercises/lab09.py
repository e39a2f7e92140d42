"""Lab 09 exercises: top-k routing with capacity, the permutation and its inverse, the split
exchange, the tokens a DeepEP dispatch sends to each node; and the bugs they must catch.

The bug clinic's patch set lives here too, beside the exercise that catches it, so the
lab and tests/test_ep_dist.py run the same bug.
"""

from __future__ import annotations

import random

import torch
import torch.distributed as dist

from paralab.ep.dispatch import exchange_counts
from paralab.exercises import Exercise
from paralab.patches import Patches

LAB = "09_expert_parallel"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- top_k_route
def _probs(seed: int, tokens: int, experts: int, ties: bool) -> torch.Tensor:
    """Softmax rows; with `ties`, some rows repeat a probability so the tie rule matters."""
    logits = torch.randn(tokens, experts, dtype=torch.float64, generator=_generator(seed))
    if ties:
        logits[::2, 1] = logits[::2, 2]  # experts 1 and 2 tie on every other token
        logits[1::3] = 0.0  # a uniform row: every expert ties
    return torch.softmax(logits, dim=-1)


def _route_cases(rank: int, world: int) -> list[tuple]:
    """E = 4 and 8, k = 1 and 2, ties and not, renormalized and not."""
    return [
        (_probs(0, 9, 4, False), 1, False),
        (_probs(1, 9, 4, True), 2, False),
        (_probs(2, 12, 8, True), 2, True),
        (_probs(3, 12, 8, True), 1, True),
    ]


ROUTE_KINDS = [
    "E = 4, top-1",
    "E = 4, top-2, tied probabilities",
    "E = 8, top-2 renormalized, tied probabilities",
    "E = 8, top-1 renormalized, tied probabilities",
]


def _hidden_route_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    return [
        (_probs(seed + i, draw.randint(5, 15), 6, True), k, renormalize)
        for i, (k, renormalize) in enumerate([(1, False), (2, True), (2, False)])
    ]


HIDDEN_ROUTE_KINDS = [
    "E = 6, top-1, ties",
    "E = 6, top-2 renormalized, ties",
    "E = 6, top-2, ties",
]


def _pair(result: tuple) -> dict[str, torch.Tensor]:
    weights, experts = result
    return {"weights": weights, "experts": experts}


def route_ties_to_higher_index(probs, top_k, renormalize=False):
    """Bug: among equal probabilities the higher expert index wins."""
    flipped = probs.flip(-1)
    ranked = torch.sort(flipped, dim=-1, descending=True, stable=True)
    weights, experts = ranked.values[:, :top_k], probs.shape[-1] - 1 - ranked.indices[:, :top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def route_always_renormalized(probs, top_k, renormalize=False):
    """Bug: the k weights are always divided by their sum, even when `renormalize` is False."""
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights = ranked.values[:, :top_k]
    return weights / weights.sum(dim=-1, keepdim=True), ranked.indices[:, :top_k]


# --------------------------------------------------------------------------- capacity_keep
def _choices(seed: int, tokens: int, experts: int, top_k: int, skew: bool) -> torch.Tensor:
    """(tokens, k) distinct experts per token; `skew` sends most first choices to expert 0."""
    g = _generator(seed)
    scores = torch.rand(tokens, experts, generator=g)
    if skew:
        scores[:, 0] += 0.6
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :top_k]


def _capacity_cases(rank: int, world: int) -> list[tuple]:
    """(experts, E, slots): skewed top-2 with tight and loose slots, top-1, and no limit."""
    return [
        (_choices(0, 10, 4, 2, True), 4, 5),
        (_choices(1, 12, 4, 2, True), 4, 3),
        (_choices(2, 12, 8, 1, True), 8, 2),
        (_choices(3, 12, 8, 2, False), 8, None),
    ]


CAPACITY_KINDS = [
    "E = 4, top-2, 5 slots, skewed to expert 0",
    "E = 4, top-2, 3 slots, skewed",
    "E = 8, top-1, 2 slots, skewed",
    "E = 8, top-2, no limit",
]


def _hidden_capacity_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Top-2 cases have at most 2 slots per expert: with looser ones, first and second choices
    rarely compete for a slot and filling in token order could pass."""
    draw = random.Random(seed)
    return [
        (_choices(seed + i, draw.randint(8, 16), 6, k, skew), 6, slots)
        for i, (k, slots, skew) in enumerate(
            [(2, draw.randint(1, 2), True), (1, draw.randint(1, 3), True), (2, 1, False)]
        )
    ]


HIDDEN_CAPACITY_KINDS = [
    "E = 6, top-2, skewed, tight slots",
    "E = 6, top-1, skewed",
    "E = 6, top-2, one slot each",
]


def keep_in_token_order(experts, num_experts, slots):
    """Bug: an expert fills its slots token by token (token 0's second choice before token 1's
    first), not first choices first."""
    if slots is None:
        return torch.ones_like(experts, dtype=torch.bool)
    flat = experts.reshape(-1)
    one_hot = torch.nn.functional.one_hot(flat, num_experts)
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1
    return (position < slots).reshape(experts.shape)


def keep_one_extra(experts, num_experts, slots):
    """Bug: `<=` where `<` belongs: every full expert keeps one assignment too many."""
    if slots is None:
        return torch.ones_like(experts, dtype=torch.bool)
    by_priority = experts.t().reshape(-1)
    one_hot = torch.nn.functional.one_hot(by_priority, num_experts)
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1
    return (position <= slots).reshape(experts.t().shape).t()


# --------------------------------------------------------------------------- expert_permutation
def _keys(seed: int, rows: int, experts: int) -> torch.Tensor:
    return torch.randint(experts, (rows,), generator=_generator(seed))


def _permutation_cases(rank: int, world: int) -> list[tuple]:
    """Destination experts of 12 to 30 rows, E = 4 and 8, some experts absent."""
    return [(_keys(0, 12, 4),), (_keys(1, 30, 8),), (torch.tensor([3, 3, 0, 3, 0, 2, 2, 3]),)]


PERMUTATION_KINDS = ["12 rows, E = 4", "30 rows, E = 8", "8 rows, experts 1 absent"]


def _hidden_permutation_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    return [(_keys(seed + i, draw.randint(10, 40), 6),) for i in range(2)]


HIDDEN_PERMUTATION_KINDS = ["another length, E = 6", "another length, E = 6"]


def _order_and_inverse(result: tuple) -> dict[str, torch.Tensor]:
    order, inverse = result
    return {"order": order, "inverse": inverse}


def permutation_is_its_own_inverse(keys):
    """Bug: the sorting order is used to undo itself (true only for a permutation of swaps)."""
    order = torch.sort(keys, stable=True).indices
    return order, order.clone()


def permutation_descending(keys):
    """Bug: rows grouped by expert from the last expert down (the all-to-all wants rank order)."""
    order = torch.sort(keys, descending=True, stable=True).indices
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return order, inverse


# --------------------------------------------------------------------------- exchange_counts
def _counts_cases(rank: int, world: int) -> list[tuple]:
    """(E,) counts per expert from every rank (E = 2·world and 3·world), on the whole world."""
    return [
        (torch.randint(0, 9, (per * world,), generator=_generator(10 * per + rank)), None)
        for per in (2, 3)
    ]


def _counts_kinds(world: int) -> list[str]:
    return [f"E = {2 * world} over {world} ranks", f"E = {3 * world} over {world} ranks"]


def _hidden_counts_cases(rank: int, world: int, seed: int) -> list[tuple]:
    return [
        (torch.randint(0, 20, (2 * world,), generator=_generator(seed + rank)), None),
    ]


def _hidden_counts_kinds(world: int) -> list[str]:
    return [f"E = {2 * world} over {world} ranks, other counts"]


def counts_as_sent(send_counts: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Bug: no exchange; each rank takes what it sends each rank as what it receives from it."""
    return send_counts.reshape(dist.get_world_size(group), -1).clone()


def counts_transposed(send_counts: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Bug: the received counts reshaped as (E/ep, ep): source rank and local expert swapped."""
    ep = dist.get_world_size(group)
    return exchange_counts(send_counts, group).reshape(-1, ep).t()


def lean_dispatch() -> Patches:
    """The bug clinic's dispatch, for `run(..., patches=...)`: one decision of it swapped."""
    return {"paralab.ep.dispatch": {"exchange_counts": counts_as_sent}}


def misrouted_tokens(experts: list[torch.Tensor], ep: int, num_experts: int) -> list[list[int]]:
    """Under `counts_as_sent`, top-1 routing whose per-rank totals happen to agree: which tokens
    of each rank land in another expert than they chose (their rows arrive where the receiver
    believes a different local expert's block is)."""
    local = num_experts // ep
    sent = [torch.bincount(e.reshape(-1), minlength=num_experts) for e in experts]
    wrong: list[list[int]] = [[] for _ in experts]
    for source, chosen in enumerate(experts):
        order = torch.sort(chosen.reshape(-1), stable=True).indices
        flat = chosen.reshape(-1)[order]
        for dest in range(ep):
            mine = order[(flat // local) == dest]
            believed = sent[dest].reshape(ep, local)[source]  # the receiver's own sends
            block = torch.arange(local).repeat_interleave(believed)
            truth = flat[(flat // local) == dest] % local
            wrong[source] += mine[block != truth].tolist()
    return [sorted(w) for w in wrong]


# --------------------------------------------------------------------------- tokens_per_node
def _routed(seed: int, tokens: int, experts: int, top_k: int, unchosen: float) -> torch.Tensor:
    """(tokens, k) distinct experts per token; a fraction `unchosen` of the entries set to -1,
    and then token 0 chooses expert 0 alone, so a -1 wrongly counted shows on the last node."""
    g = _generator(seed)
    chosen = torch.rand(tokens, experts, generator=g).argsort(dim=-1)[:, :top_k]
    if unchosen:
        chosen = torch.where(torch.rand(tokens, top_k, generator=g) < unchosen, -1, chosen)
        chosen[0] = torch.tensor([0] + [-1] * (top_k - 1))
    return chosen


def _node_cases(rank: int, world: int) -> list[tuple]:
    """(experts, E, ranks, ranks per node): 2 and 4 nodes, top-2 to top-8, some -1."""
    return [
        (_routed(0, 10, 8, 2, 0.0), 8, 4, 2),
        (_routed(1, 12, 8, 3, 0.3), 8, 4, 2),
        (_routed(2, 16, 32, 8, 0.0), 32, 16, 4),
    ]


NODE_KINDS = [
    "E = 8 on 4 ranks, 2 nodes, top-2",
    "E = 8 on 4 ranks, 2 nodes, top-3, some choices -1",
    "E = 32 on 16 ranks, 4 nodes, top-8",
]


def _hidden_node_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    return [
        (_routed(seed, draw.randint(8, 20), 24, 4, 0.25), 24, 6, 3),
        (_routed(seed + 1, draw.randint(8, 20), 16, 6, 0.0), 16, 8, 2),
    ]


HIDDEN_NODE_KINDS = [
    "E = 24 on 6 ranks, 2 nodes of 3, top-4, some -1",
    "E = 16 on 8 ranks, 4 nodes, top-6",
]


def nodes_once_per_assignment(experts, num_experts, ranks, ranks_per_node):
    """Bug: one row per assignment, as this lab's all-to-all sends, not one per node."""
    per_node = num_experts // ranks * ranks_per_node
    chosen = experts[experts >= 0]
    return torch.bincount(chosen // per_node, minlength=ranks // ranks_per_node)


def nodes_once_per_rank(experts, num_experts, ranks, ranks_per_node):
    """Bug: DeepEP's per-rank counts summed per node: a token whose experts sit on two ranks of
    one node is counted twice."""
    from paralab.ep.layout import tokens_per_rank

    return tokens_per_rank(experts, num_experts, ranks).reshape(-1, ranks_per_node).sum(dim=1)


def nodes_unchosen_on_the_last(experts, num_experts, ranks, ranks_per_node):
    """Bug: -1 (no selection) divided like an expert index wraps to the last node."""
    nodes = ranks // ranks_per_node
    node = (experts // (num_experts // ranks * ranks_per_node)) % nodes
    hit = torch.zeros(experts.shape[0], nodes, dtype=torch.bool).scatter_(1, node, True)
    return hit.sum(dim=0)


EXERCISES = [
    Exercise(
        name="top_k_route",
        lab=LAB,
        target="paralab.ep.router.top_k_route",
        prompt=(
            "The router's choice. `probs` is `(tokens, E)`, each row a softmax. Return `(weights, "
            "experts)`, both `(tokens, k)`: each token's `k` most probable experts, best first, and "
            "their probabilities. Equal probabilities go to the lower expert index. With `renormalize`, "
            "divide each token's `k` weights by their sum."
        ),
        hint="a stable descending sort keeps the lower index first among equals; take the first k columns",
        cases=_route_cases,
        kinds=lambda world: ROUTE_KINDS,
        hidden=_hidden_route_cases,
        hidden_kinds=lambda world: HIDDEN_ROUTE_KINDS,
        points=1,
        minutes=10,
        normalize=_pair,
        bugs=[
            ("ties go to the higher expert index", route_ties_to_higher_index, "case 1, experts:"),
            ("always renormalized", route_always_renormalized, "case 0, weights:"),
        ],
    ),
    Exercise(
        name="capacity_keep",
        lab=LAB,
        target="paralab.ep.router.capacity_keep",
        prompt=(
            "Top-k routing with capacity. `experts` is `(tokens, k)`, each token's chosen experts (best "
            "first). Each expert has `slots` places (`None`: unlimited). Return a `(tokens, k)` bool "
            "tensor, True where the assignment fits: an expert takes every token's first choice before "
            "any second choice, and within one choice earlier tokens first."
        ),
        hint="walk the assignments choice-major (transpose), number each one within its expert "
        "(a cumulative count of a one-hot), keep the numbers below slots",
        cases=_capacity_cases,
        kinds=lambda world: CAPACITY_KINDS,
        hidden=_hidden_capacity_cases,
        hidden_kinds=lambda world: HIDDEN_CAPACITY_KINDS,
        points=2,
        minutes=15,
        bugs=[
            (
                "slots filled in token order, not first choices first",
                keep_in_token_order,
                "case 0:",
            ),
            ("one assignment too many per full expert", keep_one_extra, "case 0:"),
        ],
    ),
    Exercise(
        name="expert_permutation",
        lab=LAB,
        target="paralab.ep.dispatch.expert_permutation",
        prompt=(
            "`keys` is `(rows,)`, the expert each row goes to. Return `(order, inverse)`: `rows[order]` "
            "groups the rows by expert in increasing expert order (rows of one expert keep their "
            "order), and `grouped[inverse]` undoes it."
        ),
        hint="a stable sort gives the order; the inverse scatters arange into the positions order names",
        cases=_permutation_cases,
        kinds=lambda world: PERMUTATION_KINDS,
        hidden=_hidden_permutation_cases,
        hidden_kinds=lambda world: HIDDEN_PERMUTATION_KINDS,
        points=1,
        minutes=10,
        normalize=_order_and_inverse,
        bugs=[
            (
                "the order used as its own inverse",
                permutation_is_its_own_inverse,
                "case 0, inverse:",
            ),
            ("experts in decreasing order", permutation_descending, "case 0, order:"),
        ],
    ),
    Exercise(
        name="exchange_counts",
        lab=LAB,
        target="paralab.ep.dispatch.exchange_counts",
        prompt=(
            "The split exchange. `send_counts` is `(E,)`: how many rows this rank sends each expert; rank "
            "`j` holds experts `[j·E/ep, (j+1)·E/ep)` of `group` (`None`: the whole world). Return "
            "`(ep, E/ep)`: entry `[i, j]` is how many rows rank `i` sends to this rank's local expert `j`."
        ),
        hint="one all_to_all_single of the counts: block j of E/ep entries goes to rank j",
        cases=_counts_cases,
        kinds=_counts_kinds,
        hidden=_hidden_counts_cases,
        hidden_kinds=_hidden_counts_kinds,
        world_sizes=(2, 4),
        hidden_world_sizes=(3,),
        points=2,
        minutes=10,
        bugs=[
            (
                "no exchange: the send counts taken as received (the clinic's)",
                counts_as_sent,
                "world 2, rank 0, case 0:",
            ),
            ("source rank and local expert swapped", counts_transposed, "world 2, rank 0, case 1:"),
        ],
    ),
    Exercise(
        name="tokens_per_node",
        lab=LAB,
        target="paralab.ep.layout.tokens_per_node",
        prompt=(
            "DeepEP's `num_tokens_per_rdma_rank`. `experts` is `(tokens, k)`, each token's chosen "
            "experts, `-1` for no selection. Rank `r` holds experts `[r·E/ranks, (r+1)·E/ranks)`, node "
            "`n` holds ranks `[n·ranks_per_node, (n+1)·ranks_per_node)`. Return `(nodes,)` int64: how "
            "many tokens go to each node, a token counted once per node that holds at least one of its "
            "experts."
        ),
        hint="map each expert to its node (E/ranks·ranks_per_node experts a node), mark a "
        "(tokens, nodes) table with scatter, count each column; keep -1 out of every column",
        cases=_node_cases,
        kinds=lambda world: NODE_KINDS,
        hidden=_hidden_node_cases,
        hidden_kinds=lambda world: HIDDEN_NODE_KINDS,
        points=2,
        minutes=15,
        bugs=[
            (
                "one row per assignment, as this lab's all-to-all",
                nodes_once_per_assignment,
                "case 0:",
            ),
            ("per-rank counts summed per node", nodes_once_per_rank, "case 0:"),
            ("-1 counted on the last node", nodes_unchosen_on_the_last, "case 1:"),
        ],
    ),
]
