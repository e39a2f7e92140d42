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


def test_closest_fit_ties_go_to_the_smaller_cost_then_the_smaller_index():
    # gap 10, half 5: 4 and 6 are equally close (both leave a gap of 2) -> the 4
    assert plan_rebalance({0: [6.0, 4.0], 1: [0.0]})[0] == Move(0, 1, 1)
    # two equal costs: the first one
    assert plan_rebalance({0: [3.0, 3.0, 1.0], 1: []})[0] == Move(0, 1, 0)


def test_rank_ties_go_to_the_smallest_label():
    # 3 and 5 tie as heaviest -> 3 gives; afterwards 3 and 9 tie as lightest -> 3 would receive,
    # but moving 2 across a gap of 2 does not shrink it, so planning stops
    moves = plan_rebalance({5: [2.0, 2.0], 3: [2.0, 2.0], 9: []})
    assert moves == [Move(3, 9, 0)]


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


def test_the_plan_does_not_depend_on_dict_order():
    rng = random.Random(0)
    costs = {r: [float(rng.randint(1, 50)) for _ in range(rng.randint(0, 6))] for r in range(6)}
    reversed_costs = dict(reversed(list(costs.items())))
    assert plan_rebalance(costs) == plan_rebalance(reversed_costs)


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
