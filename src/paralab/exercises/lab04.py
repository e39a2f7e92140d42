"""Lab 04 exercises: normalize the pixels, the planner, and the latent return path.

The bug variants are real-world mistakes of VAE load balancing. The first,
`raw_pixels_as_float`, is also the lab's bug clinic: the lab imports it from
here, so the bug is written once.
"""

from __future__ import annotations

import random

import torch
import torch.distributed as dist

from paralab.exercises import Exercise
from paralab.parallel_dims import ParallelDims
from paralab.patches import Patches, patched
from paralab.vae_lb import planner
from paralab.vae_lb.planner import Move
from paralab.vae_lb.protocol import exchange
from paralab.vae_lb.protocol import offload_encode as package_offload_encode


# ------------------------------------------------------------------ exercise 1: normalize the pixels
def _pixel_cases(rank: int, world: int) -> list[tuple]:
    generator = torch.Generator().manual_seed(40)
    edges = torch.tensor([0, 1, 127, 128, 254, 255], dtype=torch.uint8).reshape(3, 1, 1, 2)
    return [
        (edges,),
        (torch.randint(0, 256, (3, 4, 8, 8), generator=generator, dtype=torch.uint8),),
    ]


def _hidden_pixel_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """A video of another shape, drawn from the seed."""
    draw = random.Random(seed)
    shape = (3, draw.randint(1, 5), draw.randint(1, 9), draw.randint(1, 9))
    return [
        (
            torch.randint(
                0, 256, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
            ),
        )
    ]


def raw_pixels_as_float(video: torch.Tensor) -> torch.Tensor:
    """Bug (the lab's bug clinic): the raw uint8 pixels are only cast, never normalized."""
    return video.to(torch.float64)


def raw_pixels_clinic() -> Patches:
    """The lab's bug clinic, a patch set for `run(..., patches=)`: the encoder gets raw pixels cast to float."""
    return {"paralab.models": {"normalize_pixels": raw_pixels_as_float}}


def offload_encode_skipping_empty(videos, costs, encode_fn, group=None):
    """Bug (the lab's section 8): a rank with nothing to encode skips the collectives, and its peers hang."""
    if not videos:
        return []
    return package_offload_encode(videos, costs, encode_fn, group)


def skip_when_empty() -> Patches:
    """A patch set: `offload_encode_skipping_empty` in place of the package's `offload_encode`.

    The replacement calls the package's function as imported here, not through the patched name.
    """
    return {"paralab.vae_lb.protocol": {"offload_encode": offload_encode_skipping_empty}}


def pixels_to_unit_interval(video: torch.Tensor) -> torch.Tensor:
    """Bug: scales to [0, 1] (the image-classifier habit) instead of the VAE's [-1, 1]."""
    return video.to(torch.float64) / 255.0


# ------------------------------------------------------------------ exercise 2: the planner
PLANNER_CASES = [
    ({0: [6.0, 6.0], 1: [1.0, 1.0], 2: [4.0]}, None),  # case 0: the lab's small example
    ({3: [5.0, 1.0, 9.0, 2.0], 7: [], 10: [4.0, 4.0]}, None),  # case 1: rank labels 3, 7, 10
    (
        {10: [2.0, 4.0], 3: [2.0, 4.0], 7: []},
        None,
    ),  # case 2: tie 10 vs 3: the first in dict order gives
    ({0: [8.0, 2.0, 2.0, 6.0], 1: [3.0], 2: [], 3: [5.0, 5.0]}, None),  # case 3: ties
    ({0: [8.0, 2.0, 2.0, 6.0], 1: [3.0], 2: [], 3: [5.0, 5.0]}, 2),  # case 4: max_iterations=2
    ({0: [4.0], 1: []}, None),  # case 5: the only move leaves the gap as it is
    ({5: [10.0, 3.0, 3.0], 2: [1.0]}, 0),  # case 6: max_iterations=0
    (
        {0: [], 1: [8.0, 7.0], 2: [6.0], 3: [12.0, 5.0]},
        None,
    ),  # case 7: rank 0's guest must not move on
    ({0: [2.0, 2.0], 1: [4.0]}, None),  # case 8: balanced already
    (
        {0: [30.0, 14.0, 8.0], 1: [36.0]},
        None,
    ),  # case 9: nearest the whole gap is not nearest half of it
    (
        {0: [768.0, 768.0, 384.0], 1: [], 2: []},
        None,
    ),  # case 10: Cosmos's test batch; a tie between samples
]


PLANNER_KINDS = [
    "the lab's small example",
    "rank labels 3, 7, 10",
    "a load tie: the first rank in dict order gives",
    "ties between candidate samples",
    "max_iterations=2",
    "the only move leaves the gap as it is",
    "max_iterations=0",
    "a guest must not move on",
    "balanced already",
    "nearest the whole gap is not nearest half of it",
    "Cosmos's test batch, a tie between samples",
]


def _planner_cases(rank: int, world: int) -> list[tuple]:
    return [({r: list(c) for r, c in costs.items()}, limit) for costs, limit in PLANNER_CASES]


def _hidden_planner_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Batches drawn from the seed: 3 to 6 ranks with scattered labels, small integer costs (so ties
    happen), the first one unbalanced enough to need moves; then, relabeled and scaled, the two
    batches on which a planner that moves without shrinking the gap, or aims at the whole gap
    instead of half of it, goes wrong (random batches alone may never test either)."""
    draw = random.Random(seed)
    cases = []
    for i in range(3):
        labels = draw.sample(range(12), draw.randint(3, 6))
        costs = {r: [float(draw.randint(1, 9)) for _ in range(draw.randint(0, 4))] for r in labels}
        if i == 0:
            costs[labels[0]] += [9.0, 9.0]
            costs[labels[-1]] = []
        cases.append((costs, None))
    for costs, _ in (PLANNER_CASES[5], PLANNER_CASES[9]):
        scale = float(draw.randint(1, 5))
        labels = draw.sample(range(12), len(costs))
        cases.append(
            ({new: [c * scale for c in v] for new, v in zip(labels, costs.values())}, None)
        )
    return cases


def moves_as_rows(moves: list[Move]) -> torch.Tensor:
    """A plan as an int64 tensor of (from_rank, to_rank, local_index) rows, so it compares element by element."""
    return torch.tensor(
        [[m.from_rank, m.to_rank, m.local_index] for m in moves], dtype=torch.int64
    ).reshape(-1, 3)


def _largest(candidates, gap):
    return max(candidates, key=lambda item: item[1])


def _closest_to_whole_gap(candidates, gap):
    return min(candidates, key=lambda item: abs(gap - item[1]))


def _not_wider(cost, gap):
    return abs(gap - 2 * cost) <= gap


def plan_fit_to_whole_gap(costs, max_iterations=None):
    """Bug: moves the sample closest to the whole gap, which overshoots: it swaps heavy and light."""
    with patched({"paralab.vae_lb.planner": {"closest_fit": _closest_to_whole_gap}}):
        return planner.plan_rebalance(costs, max_iterations)


def plan_largest_first(costs, max_iterations=None):
    """Bug: moves the heavy rank's largest sample instead of the one closest to half the gap."""
    with patched({"paralab.vae_lb.planner": {"closest_fit": _largest}}):
        return planner.plan_rebalance(costs, max_iterations)


def plan_gap_not_strict(costs, max_iterations=None):
    """Bug: also takes a move that leaves the gap as large as before (|g - 2c| <= g)."""
    with patched({"paralab.vae_lb.planner": {"shrinks_gap": _not_wider}}):
        return planner.plan_rebalance(costs, max_iterations)


# ------------------------------------------------------------------ exercise 3: the latent return path
RETURN_PLANS = {  # group-rank labels, in plan order
    2: [Move(0, 1, 2), Move(0, 1, 0), Move(1, 0, 1)],
    4: [Move(0, 2, 3), Move(0, 3, 1), Move(1, 2, 0), Move(0, 2, 0), Move(3, 1, 2)],
}


def latent_of(owner: int, index: int, varied_shapes: bool) -> torch.Tensor:
    """A stand-in latent whose values name its owner (global rank) and local index: 100*owner + index + k/1000."""
    shape = (4, 1 + index % 2, 2, 1 + owner % 3) if varied_shapes else (4, 2, 3)
    count = torch.Size(shape).numel()
    return (100.0 * owner + index + torch.arange(count, dtype=torch.float64) / 1000).reshape(shape)


def _return_case(plan: list[Move], group, varied_shapes: bool) -> tuple:
    me = dist.get_rank(group)
    members = (
        dist.get_process_group_ranks(group)
        if group is not None
        else list(range(dist.get_world_size()))
    )
    incoming = [m for m in plan if m.to_rank == me]
    outgoing = [m for m in plan if m.from_rank == me]
    guest_latents = [
        latent_of(members[m.from_rank], m.local_index, varied_shapes) for m in incoming
    ]
    return guest_latents, incoming, outgoing, group


def _return_cases(rank: int, world: int) -> list[tuple]:
    """Case 0: the whole world as one group. Case 1: lb groups of 2 (group ranks are not global ranks)."""
    pd = ParallelDims(world, lb=2)
    pd.build_meshes("cpu")
    return [
        _return_case(RETURN_PLANS[world], None, varied_shapes=False),
        _return_case(RETURN_PLANS[2], pd.lb_mesh.get_group(), varied_shapes=True),
    ]


def _return_kinds(world: int) -> list[str]:
    return [
        f"the whole world of {world} as one group",
        "lb groups of 2 (group ranks are not global ranks)",
    ]


def _hidden_return_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """A plan drawn from the seed over the whole world: each sample moves at most once, in a shuffled order."""
    draw = random.Random(seed)
    moves = [
        Move(owner, draw.choice([r for r in range(world) if r != owner]), index)
        for owner in range(world)
        for index in range(draw.randint(1, 3))
        if draw.random() < 0.6
    ]
    draw.shuffle(moves)
    # and one owner whose returns arrive neither in index order nor in helper order
    owner = draw.randrange(world)
    low, high = sorted(draw.sample([r for r in range(world) if r != owner], 2))
    scrambled = [Move(owner, high, 1), Move(owner, low, 0)]
    return [
        _return_case(moves, None, varied_shapes=True),
        _return_case(scrambled, None, varied_shapes=True),
    ]


def latents_by_index(latents: dict[int, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Name each returned latent by the owner's local index, in index order."""
    return {f"local index {i}": latents[i] for i in sorted(latents)}


def return_in_arrival_order(guest_latents, incoming, outgoing, group):
    """Bug: the owner files the latents in arrival (plan) order under its indices sorted ascending."""
    back = exchange(
        [(m.from_rank, z) for m, z in zip(incoming, guest_latents)],
        [m.to_rank for m in outgoing],
        group,
    )
    return dict(zip(sorted(m.local_index for m in outgoing), back))


def return_grouped_by_helper(guest_latents, incoming, outgoing, group):
    """Bug: the owner posts its receives helper by helper (sorted by rank), then files them in plan order."""
    by_helper = sorted(outgoing, key=lambda m: m.to_rank)
    back = exchange(
        [(m.from_rank, z) for m, z in zip(incoming, guest_latents)],
        [m.to_rank for m in by_helper],
        group,
    )
    return {m.local_index: z for m, z in zip(outgoing, back)}


EXERCISES = [
    Exercise(
        name="normalize_pixels",
        lab="04_vae_lb",
        target="paralab.models.normalize_pixels",
        prompt=(
            "Turn raw uint8 pixels in `[0, 255]` into float64 values in `[-1, 1]`, the range the encoder "
            "body (`TinyVideoEncoder.encode_normalized`) was built for: 0 → −1, 255 → 1, linearly in "
            "between. The check feeds a video holding 0, 1, 127, 128, 254 and 255 and a random one, "
            "and accepts differences up to 1e-12 (any exact formula passes)."
        ),
        hint="return float64 pixels in [-1, 1], 0 -> -1 and 255 -> 1, same shape as the uint8 input",
        cases=_pixel_cases,
        kinds=lambda world: ["the edge values 0, 1, 127, 128, 254, 255", "a random video"],
        hidden=_hidden_pixel_cases,
        hidden_kinds=lambda world: ["a random video of another shape"],
        points=1,
        minutes=5,
        atol=1e-12,
        bugs=[
            (
                "raw uint8 pixels only cast to float, never normalized",
                raw_pixels_as_float,
                "case 0: 6 of 6 elements differ",
            ),
            (
                "scaled to [0, 1] instead of [-1, 1]",
                pixels_to_unit_interval,
                "expected -1.0, got 0.0",
            ),
        ],
    ),
    Exercise(
        name="plan_rebalance",
        lab="04_vae_lb",
        target="paralab.vae_lb.planner.plan_rebalance",
        prompt=(
            "Write the greedy closest-fit planner (Cosmos's rule, move for move). Start from each rank's "
            "load (the sum of its costs). Each round: take the most and the least loaded rank "
            "(`most_and_least_loaded`: a tie goes to the rank that comes first in the dict, which every "
            "rank builds in rank order; labels need not be 0..n-1); among the heavy rank's samples that "
            "have not moved yet, pick the one whose move leaves the smallest gap, |gap - 2 * cost| "
            "(`closest_fit`: a tie goes to the first in the donor's list); take it only if it strictly "
            "shrinks the gap (`shrinks_gap`), else stop. A sample moves at most once, and a received "
            "sample never moves on. Stop after `max_iterations` moves (None: no limit beyond the number "
            "of samples). Return the moves in order. The check compares your plan, as (from, to, index) "
            "rows, on 11 cases (numbered from 0): the lab's small example; labels 3, 7, 10; a tie "
            "between ranks 10 and 3 given in that dict order; ties between samples; the same with "
            "`max_iterations=2`; a move that would leave the gap unchanged; `max_iterations=0`; a guest "
            "that must not move on; a balanced batch; a sample near the whole gap that is not the best "
            "fit; Cosmos's own test batch."
        ),
        hint="return the list of Moves the greedy planner described above makes, in order; it stops as "
        "soon as no move strictly shrinks the gap between the most and least loaded ranks",
        cases=_planner_cases,
        kinds=lambda world: PLANNER_KINDS,
        hidden=_hidden_planner_cases,
        hidden_kinds=lambda world: [
            "a random batch",
            "a second random batch",
            "a third random batch",
            "the only move leaves the gap as it is (relabeled, scaled)",
            "nearest the whole gap is not nearest half of it (relabeled, scaled)",
        ],
        points=3,
        minutes=25,
        normalize=moves_as_rows,
        bugs=[
            (
                "moves the largest sample instead of the closest fit to half the gap",
                plan_largest_first,
                "case 4: 1 of 6 elements differ, max |diff| 2, first at index (1, 2): expected 1, got 3",
            ),
            (
                "takes a move that does not strictly shrink the gap",
                plan_gap_not_strict,
                "case 5: shape (1, 3), expected (0, 3)",
            ),
            (
                "moves the sample closest to the whole gap instead of half the gap",
                plan_fit_to_whole_gap,
                "case 2: shape (1, 3), expected (2, 3)",
            ),
        ],
    ),
    Exercise(
        name="return_latents",
        lab="04_vae_lb",
        target="paralab.vae_lb.protocol.return_latents",
        prompt=(
            "The latent return path, the mirror image of sending the videos out. This rank encoded "
            "`guest_latents[k]` for the move `incoming[k]` and must send it back to that move's owner; "
            "it also waits for the latents of its own videos it sent away (`outgoing`, in plan order). "
            "Use `exchange(sends, recv_from, group)`: `sends` is a list of (peer group rank, tensor), "
            "`recv_from` a list of group ranks, and it returns the received tensors in `recv_from`'s "
            "order (messages between two ranks arrive in the order posted). Return a dict: local index "
            "of the owner's original video -> its latent. The check runs on 2 and 4 ranks, with the "
            "whole world as one group (case 0) and with lb groups of 2 (case 1: group ranks are not "
            "global ranks there). Every test latent starts with the value 100 × owner's global rank + "
            "local index, so a report's expected/actual values tell whose latent landed where."
        ),
        hint="return this rank's own samples' latents in their original local order, each one "
        "computed by whichever rank the plan sent it to",
        cases=_return_cases,
        kinds=_return_kinds,
        hidden=_hidden_return_cases,
        hidden_kinds=lambda world: [
            f"a random plan over {world} ranks",
            f"returns that arrive out of index and helper order over {world} ranks",
        ],
        hidden_world_sizes=(3,),
        world_sizes=(2, 4),
        points=2,
        minutes=15,
        normalize=latents_by_index,
        bugs=[
            (
                "latents filed in arrival order instead of the owner's original order",
                return_in_arrival_order,
                "world 2, rank 0, case 0, local index 0: 24 of 24 elements differ",
            ),
            (
                "receives posted helper by helper, filed in plan order",
                return_grouped_by_helper,
                "world 4, rank 0, case 0, local index 0: 24 of 24 elements differ",
            ),
        ],
    ),
]
