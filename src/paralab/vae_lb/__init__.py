"""VAE load balancing (the `lb` axis): plan, exchange, encode, return.

Before the VAE encode, each rank holds raw uint8 videos of very different
sizes, so some ranks would encode for much longer than others while the rest
wait. The ranks of each lb group agree on a plan of moves and lend each other
their encoders.

- `planner`: the greedy closest-fit plan and the baselines it is compared with;
- `protocol`: the costs shared, videos sent in two phases, latents sent home;
- `runs`: lab 04's per-rank job and the checks of a run;
- `costs`: the predicted encode cost and the closed-form bytes per rank.

The algorithm's names are re-exported here. A bug is planted in the module
whose globals the loop reads: `patches={"paralab.vae_lb.planner": {"closest_fit": bug}}`.
"""

from paralab.vae_lb.costs import encode_cost
from paralab.vae_lb.planner import (
    Assignment,
    Move,
    assign_lpt,
    assign_round_robin_by_size,
    assignment_from_moves,
    closest_fit,
    loads_of,
    most_and_least_loaded,
    plan_rebalance,
    shrinks_gap,
)
from paralab.vae_lb.protocol import (
    META_BYTES,
    META_LEN,
    batched_p2p,
    empty_from_metadata,
    exchange,
    global_rank,
    metadata,
    offload_encode,
    return_latents,
    share_costs,
)

__all__ = [
    "META_BYTES",
    "META_LEN",
    "Assignment",
    "Move",
    "assign_lpt",
    "assign_round_robin_by_size",
    "assignment_from_moves",
    "batched_p2p",
    "closest_fit",
    "empty_from_metadata",
    "encode_cost",
    "exchange",
    "global_rank",
    "loads_of",
    "metadata",
    "most_and_least_loaded",
    "offload_encode",
    "plan_rebalance",
    "return_latents",
    "share_costs",
    "shrinks_gap",
]
