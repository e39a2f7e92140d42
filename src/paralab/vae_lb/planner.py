"""The lb planner: which videos move where, decided identically on every rank (pure Python, no torch).

`plan_rebalance` is a greedy closest-fit: move samples from the most to the
least loaded rank of an lb group while that strictly shrinks their gap. The
assignments and the two baselines (round-robin by size, LPT) let the lab
compare plans by makespan.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass


# ------------------------------------------------------------------ the greedy plan
@dataclass(frozen=True)
class Move:
    """Send sample `local_index` of `from_rank`'s original list to `to_rank` to encode."""

    from_rank: int
    to_rank: int
    local_index: int


def _check_costs(costs: dict[int, list[float]]) -> None:
    for rank, values in costs.items():
        for index, cost in enumerate(values):
            if isinstance(cost, bool) or not isinstance(cost, numbers.Real):
                raise ValueError(
                    f"lb planner: cost of sample {index} on rank {rank} must be a number, "
                    f"got {cost!r} ({type(cost).__name__})"
                )
            if not cost >= 0:  # also rejects NaN
                raise ValueError(
                    f"lb planner: cost of sample {index} on rank {rank} must be >= 0, got {cost!r}"
                )


def most_and_least_loaded(loads: dict[int, float]) -> tuple[int, int]:
    """The heaviest and the lightest rank; a tie goes to the rank that comes first in `loads`.

    That is Cosmos's rule (its planner takes `max`/`min` over the costs dict).
    Every rank builds the dict in group-rank order (`share_costs`), so every
    rank breaks the tie the same way. Any rule would do, as long as all agree.
    """
    heavy = max(loads, key=loads.__getitem__)  # max/min keep the first of equal keys
    light = min(loads, key=loads.__getitem__)
    return heavy, light


def closest_fit(candidates: list[tuple[int, float]], gap: float) -> tuple[int, float]:
    """The (local_index, cost) whose move leaves the smallest gap, |gap - 2 * cost|.

    Moving cost c turns the gap g into |g - 2c|, smallest when c is nearest g/2.
    A tie goes to the first candidate, i.e. the donor's earliest sample (Cosmos's rule).
    """
    return min(candidates, key=lambda item: abs(gap - 2 * item[1]))


def shrinks_gap(cost: float, gap: float) -> bool:
    """Does moving `cost` from the heavy to the light rank strictly shrink their gap?"""
    return abs(gap - 2 * cost) < gap


def plan_rebalance(costs: dict[int, list[float]], max_iterations: int | None = None) -> list[Move]:
    """Greedy closest-fit: move samples from the most to the least loaded rank.

    Each round takes the most and the least loaded rank and moves the heavy
    rank's not-yet-moved sample whose cost best fits half their gap, if that
    strictly shrinks the gap; otherwise planning stops. A sample moves at most
    once (a helper never forwards a guest), so the plan needs a single round
    of exchange. Makes the same moves as Cosmos's `plan_rebalance`, ties
    included. Deterministic: same `costs` in, same moves out, on every rank.
    """
    if max_iterations is not None and max_iterations < 0:
        raise ValueError(f"lb planner: max_iterations must be >= 0 or None, got {max_iterations}")
    _check_costs(costs)
    ### BEGIN SOLUTION
    loads = {rank: float(sum(values)) for rank, values in costs.items()}
    movable = {rank: list(enumerate(map(float, values))) for rank, values in costs.items()}
    limit = sum(len(v) for v in costs.values()) if max_iterations is None else max_iterations
    moves: list[Move] = []
    while len(moves) < limit and len(loads) >= 2:
        heavy, light = most_and_least_loaded(loads)
        gap = loads[heavy] - loads[light]
        if gap <= 0 or not movable[heavy]:
            break
        index, cost = closest_fit(movable[heavy], gap)
        if not shrinks_gap(cost, gap):
            break
        movable[heavy].remove((index, cost))
        loads[heavy] -= cost
        loads[light] += cost
        moves.append(Move(heavy, light, index))
    return moves
    ### END SOLUTION


# ------------------------------------------------------------------ plans as assignments (for comparisons)
Assignment = dict[tuple[int, int], int]  # (owner rank, local index) -> rank that encodes it


def assignment_from_moves(costs: dict[int, list[float]], moves: list[Move]) -> Assignment:
    """Where every sample is encoded once `moves` are applied."""
    where = {(rank, i): rank for rank, values in costs.items() for i in range(len(values))}
    for m in moves:
        where[(m.from_rank, m.local_index)] = m.to_rank
    return where


def loads_of(costs: dict[int, list[float]], assignment: Assignment) -> dict[int, float]:
    """Predicted load per rank under an assignment."""
    loads = {rank: 0.0 for rank in costs}
    for (owner, index), rank in sorted(assignment.items()):
        loads[rank] += costs[owner][index]
    return loads


def _largest_first(costs: dict[int, list[float]]) -> list[tuple[int, int]]:
    samples = [(rank, i) for rank in sorted(costs) for i in range(len(costs[rank]))]
    return sorted(samples, key=lambda s: (-costs[s[0]][s[1]], s))


def assign_round_robin_by_size(costs: dict[int, list[float]]) -> Assignment:
    """Baseline: sort every sample by cost, largest first, and deal them out in turn."""
    ranks = sorted(costs)
    return {s: ranks[k % len(ranks)] for k, s in enumerate(_largest_first(costs))}


def assign_lpt(costs: dict[int, list[float]]) -> Assignment:
    """Baseline: longest processing time first, each sample to the currently least loaded rank."""
    loads = {rank: 0.0 for rank in sorted(costs)}
    where: Assignment = {}
    for owner, index in _largest_first(costs):
        _, light = most_and_least_loaded(loads)
        where[(owner, index)] = light
        loads[light] += costs[owner][index]
    return where
