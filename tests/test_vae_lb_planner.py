"""The lb planner and its baselines: pure Python, no processes."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paralab.vae_lb import (
    Move,
    assign_lpt,
    assign_round_robin_by_size,
    assignment_from_moves,
    loads_of,
    plan_rebalance,
)


def spread(loads: dict[int, float]) -> float:
    return max(loads.values()) - min(loads.values()) if loads else 0.0


def replay_problems(costs: dict[int, list[float]], moves: list[Move]) -> list[str]:
    """Every rule a plan must obey, replayed move by move; empty when the plan is valid."""
    problems, seen = [], set()
    loads = {r: float(sum(c)) for r, c in costs.items()}
    start_spread = spread(loads)
    for k, m in enumerate(moves):
        if m.from_rank not in costs or m.to_rank not in costs or m.from_rank == m.to_rank:
            problems.append(f"move {k} {m}: bad ranks")
            continue
        if not 0 <= m.local_index < len(costs[m.from_rank]):
            problems.append(f"move {k} {m}: no such sample")
            continue
        if (m.from_rank, m.local_index) in seen:
            problems.append(f"move {k} {m}: sample moves twice")
        seen.add((m.from_rank, m.local_index))
        gap = abs(loads[m.from_rank] - loads[m.to_rank])
        cost = costs[m.from_rank][m.local_index]
        loads[m.from_rank] -= cost
        loads[m.to_rank] += cost
        if not abs(loads[m.from_rank] - loads[m.to_rank]) < gap:
            problems.append(f"move {k} {m}: gap {gap} does not shrink")
    if spread(loads) > start_spread:
        problems.append(f"spread grew from {start_spread} to {spread(loads)}")
    return problems


# ------------------------------------------------------------------ no moves
@pytest.mark.parametrize(
    "costs",
    [
        {},
        {0: [5.0, 1.0, 3.0]},
        {0: [], 1: [], 2: []},
        {0: [1.0, 2.0], 1: [3.0]},
        {0: [4.0], 1: [4.0], 2: [4.0], 3: [4.0]},
    ],
    ids=["empty", "one rank", "no samples", "balanced", "all equal"],
)
def test_no_moves_when_nothing_to_gain(costs):
    assert plan_rebalance(costs) == []


# ------------------------------------------------------------------ the closest-fit choice
def test_closest_fit_picks_the_sample_nearest_half_the_gap():
    # loads 13 and 1: gap 12, half 6 -> the 6 (index 2), which balances them exactly
    assert plan_rebalance({0: [1.0, 4.0, 6.0, 2.0], 1: [1.0]}) == [Move(0, 1, 2)]


def test_closest_fit_ties_go_to_the_first_sample_in_the_donors_list():
    # gap 10, half 5: 6 and 4 are equally close (both leave a gap of 2) -> the first listed, the 6
    assert plan_rebalance({0: [6.0, 4.0], 1: [0.0]})[0] == Move(0, 1, 0)
    # two equal costs: the first one
    assert plan_rebalance({0: [3.0, 3.0, 1.0], 1: []})[0] == Move(0, 1, 0)


def test_cosmos_test_batch_moves_samples_0_and_1():
    # Cosmos's own offload test: after the first 768 moves, gap 1152: the other 768 and the 384 both
    # leave 384; the first listed (the 768, index 1) goes
    assert plan_rebalance({0: [768.0, 768.0, 384.0], 1: [], 2: []}) == [
        Move(0, 1, 0),
        Move(0, 2, 1),
    ]


def test_rank_ties_go_to_the_first_rank_in_dict_order():
    # 5 and 3 tie as heaviest -> 5 (listed first) gives to 9; then 5 and 9 tie as lightest -> 5 would
    # receive from 3, but moving 2 across a gap of 2 does not shrink it, so planning stops
    assert plan_rebalance({5: [2.0, 2.0], 3: [2.0, 2.0], 9: []}) == [Move(5, 9, 0)]
    assert plan_rebalance({3: [2.0, 2.0], 5: [2.0, 2.0], 9: []}) == [Move(3, 9, 0)]


def test_overshooting_move_is_declined():
    # gap 8; moving the 9 would leave a gap of 10
    assert plan_rebalance({0: [9.0], 1: [1.0]}) == []
    # gap 10; moving the 10 would leave a gap of 10 again: not strictly smaller
    assert plan_rebalance({0: [10.0], 1: []}) == []
    # the 3 fits (gap 9 -> 3) and is taken; the 8 would then overshoot
    assert plan_rebalance({0: [3.0, 8.0], 1: [2.0]}) == [Move(0, 1, 0)]


def test_twenty_unit_samples_over_three_ranks_end_within_one():
    for layout in ({0: [1.0] * 20, 1: [], 2: []}, {0: [1.0] * 12, 1: [1.0] * 8, 2: []}):
        moves = plan_rebalance(layout)
        loads = loads_of(layout, assignment_from_moves(layout, moves))
        assert spread(loads) <= 1, loads
        assert replay_problems(layout, moves) == []


def test_non_contiguous_rank_labels():
    costs = {10: [8.0, 8.0, 8.0], 3: [], 7: [2.0]}
    moves = plan_rebalance(costs)
    assert moves and {m.from_rank for m in moves} | {m.to_rank for m in moves} <= {3, 7, 10}
    assert moves[0] == Move(10, 3, 0)
    assert replay_problems(costs, moves) == []


def test_a_rank_can_send_and_receive_in_one_plan():
    moves = plan_rebalance({0: [6.0, 6.0], 1: [1.0, 1.0], 2: [4.0]})
    assert moves == [Move(0, 1, 0), Move(1, 2, 0), Move(1, 2, 1)]


def test_max_iterations_bounds_the_moves():
    costs = {0: [1.0] * 20, 1: [], 2: []}
    full = plan_rebalance(costs)
    assert len(full) > 3
    assert plan_rebalance(costs, max_iterations=0) == []
    assert plan_rebalance(costs, max_iterations=3) == full[:3]
    assert plan_rebalance(costs, max_iterations=1000) == full
    with pytest.raises(ValueError, match="max_iterations"):
        plan_rebalance(costs, max_iterations=-1)


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_bad_costs_are_rejected_naming_rank_and_sample(bad):
    with pytest.raises(ValueError, match="sample 1 on rank 4"):
        plan_rebalance({4: [1.0, bad], 2: []})


def cosmos_plan(costs: dict[int, list[float]], max_iterations: int = 10_000) -> list[Move]:
    """Cosmos's greedy planner, restated here in our own words so the package can be held to it.

    Follows `plan_rebalance` in NVIDIA's cosmos-framework, `cosmos_framework/model/generator/mot/
    vae_load_balance.py` (the module beside `vae_load_balance_test.py` at commit 41056465a3b6).
    Its rule: with fewer than two ranks, no moves. Each round the heavy rank is the first rank
    of the dict with the largest total and the light rank the first with the smallest; stop when
    their difference d is <= 0 or the heavy rank has nothing left to give. Among the heavy rank's
    remaining (index, cost) pairs, in list order, take the first minimizing |d - 2 * cost|; stop
    unless |d - 2 * cost| < d. Drop that pair, move its cost, record the move. At most
    `max_iterations` rounds.
    """
    if len(costs) < 2:
        return []
    totals = {rank: sum(values) for rank, values in costs.items()}
    remaining = {rank: list(enumerate(values)) for rank, values in costs.items()}
    moves = []
    for _ in range(max_iterations):
        heavy = light = None
        for rank, total in totals.items():  # strict comparisons keep the first of equals
            if heavy is None or total > totals[heavy]:
                heavy = rank
            if light is None or total < totals[light]:
                light = rank
        d = totals[heavy] - totals[light]
        if d <= 0 or not remaining[heavy]:
            break
        best = None
        for index, cost in remaining[heavy]:
            if best is None or abs(d - 2 * cost) < abs(d - 2 * best[1]):
                best = (index, cost)
        index, cost = best
        if not abs(d - 2 * cost) < d:
            break
        remaining[heavy] = [pair for pair in remaining[heavy] if pair[0] != index]
        totals[heavy] -= cost
        totals[light] += cost
        moves.append(Move(heavy, light, index))
    return moves


def test_same_moves_as_cosmos_on_random_batches():
    """Small integer costs make ties between ranks and between samples common; labels come in any order."""
    rng = random.Random(10)
    differ = []
    for _trial in range(3000):
        labels = rng.sample(range(12), rng.randint(0, 6))
        costs = {r: [float(rng.randint(0, 12)) for _ in range(rng.randint(0, 7))] for r in labels}
        for limit in (None, 0, 1, 2, 3, rng.randint(4, 40)):
            ours = plan_rebalance(costs, limit)
            theirs = cosmos_plan(costs) if limit is None else cosmos_plan(costs, limit)
            if ours != theirs:
                differ.append((costs, limit, ours, theirs))
    assert not differ, f"{len(differ)} plans differ from Cosmos's, first: {differ[0]}"


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 20), st.lists(st.floats(0, 1e6, allow_nan=False), max_size=8), max_size=6
    ),
    st.one_of(st.none(), st.integers(0, 10)),
)
def test_same_moves_as_cosmos_on_float_costs(costs, limit):
    assert plan_rebalance(costs, limit) == (
        cosmos_plan(costs) if limit is None else cosmos_plan(costs, limit)
    )


# ------------------------------------------------------------------ properties over random inputs
cost_tables = st.dictionaries(
    st.integers(min_value=0, max_value=50),
    st.lists(st.integers(min_value=0, max_value=100).map(float), max_size=8),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(cost_tables)
def test_every_plan_obeys_the_rules(costs):
    moves = plan_rebalance(costs)
    assert replay_problems(costs, moves) == []
    assert len(moves) <= sum(len(v) for v in costs.values())


def test_the_replay_catches_broken_plans():
    costs = {0: [6.0, 6.0], 1: [1.0, 1.0], 2: [4.0]}
    assert replay_problems(costs, plan_rebalance(costs)) == []
    assert "moves twice" in replay_problems(costs, [Move(0, 1, 0), Move(0, 2, 0)])[0]
    assert "does not shrink" in replay_problems({0: [9.0], 1: [1.0]}, [Move(0, 1, 0)])[0]
    assert "no such sample" in replay_problems(costs, [Move(2, 1, 5)])[0]


# ------------------------------------------------------------------ baselines
def test_baselines_place_every_sample_exactly_once():
    costs = {0: [5.0, 3.0], 1: [], 2: [8.0, 1.0, 1.0]}
    samples = {(r, i) for r, c in costs.items() for i in range(len(c))}
    for assign in (assign_round_robin_by_size, assign_lpt):
        where = assign(costs)
        assert set(where) == samples and set(where.values()) <= set(costs)


def test_lpt_and_round_robin_on_a_known_case():
    costs = {0: [7.0, 5.0, 4.0, 3.0], 1: [], 2: []}  # largest first: 7, 5, 4, 3
    assert loads_of(costs, assign_round_robin_by_size(costs)) == {0: 10.0, 1: 5.0, 2: 4.0}
    assert loads_of(costs, assign_lpt(costs)) == {0: 7.0, 1: 5.0, 2: 7.0}


@pytest.mark.parametrize("bad", ["3", None, True])
def test_non_numeric_costs_are_refused_naming_rank_sample_and_value(bad):
    with pytest.raises(
        ValueError, match=rf"cost of sample 1 on rank 2 must be a number, got {bad!r}"
    ):
        plan_rebalance({0: [1.0], 2: [1.0, bad]})
