"""Lab 10 exercises: a rank's coordinates in the grid and its pipeline neighbours; the bugs they
catch; and the bug clinic's swapped decision of the composed step, as a patch set.

The lab and tests/test_compose_runs.py run the clinic's bug by passing `replica_setup()` to
`launch.run(..., patches=...)`.
"""

from __future__ import annotations

import random

import torch

from paralab.compose.grid import AXES, DOC_ORDER, TORCHTITAN_ORDER, Grid
from paralab.exercises import Exercise
from paralab.patches import Patches

LAB = "10_four_d_composition"


def one_flat_group(grid: Grid) -> tuple[str, str | None]:
    """The FSDP group taken as every data-parallel rank (with cp), the replicas forgotten."""
    return "dp_cp", None


def replica_setup() -> Patches:
    """The clinic's patch set (named so as not to give the bug away before the clinic asks)."""
    return {"paralab.compose.runs": {"fsdp_groups": one_flat_group}}


def local_tokens_times_ranks(local: int, group) -> int:
    """Known-wrong: each rank divides its summed loss by its own token count times the number of
    data-parallel ranks, the mean of per-rank means (right only when every rank counts alike)."""
    return local * torch.distributed.get_world_size(group)


def per_rank_means() -> Patches:
    """The loss normalised per rank, as `local_tokens_times_ranks` does it, as a patch set."""
    return {"paralab.compose.runs": {"global_token_count": local_tokens_times_ranks}}


# --------------------------------------------------------------------------- the cases
SIXTEEN = {"dp_replicate": 2, "dp_shard": 1, "cp": 2, "tp": 2, "pp": 2}
"""The lab's 16-rank grid."""
UNEVEN = {"dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 4, "pp": 3}
"""24 ranks, no two inner axes of one size: a swapped axis shows."""
VISIBLE = [
    (SIXTEEN, DOC_ORDER, (5, 10, 12)),
    (SIXTEEN, TORCHTITAN_ORDER, (5, 10)),
    (UNEVEN, DOC_ORDER, (6, 17, 23)),
    (UNEVEN, TORCHTITAN_ORDER, (9, 17)),
]
ORDER_NAMES = {DOC_ORDER: "the doc group's order", TORCHTITAN_ORDER: "torchtitan's order"}


def _visible_cases(rank: int, world: int) -> list[tuple]:
    return [(r, dict(sizes), order) for sizes, order, ranks in VISIBLE for r in ranks]


def _visible_kinds(world: int) -> list[str]:
    return [
        f"rank {r} of {' × '.join(f'{a} {n}' for a, n in sizes.items() if n > 1)}, "
        f"{ORDER_NAMES[order]}"
        for sizes, order, ranks in VISIBLE
        for r in ranks
    ]


def _hidden_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Other sizes in the doc group's order and in an order drawn from the seed: rank 0 (a first
    stage) and three more ranks of each grid."""
    draw = random.Random(seed)
    cases = []
    for order in (DOC_ORDER, tuple(draw.sample(AXES, len(AXES)))):
        sizes = {
            "dp_replicate": draw.randint(1, 2),
            "dp_shard": draw.randint(1, 3),
            "cp": draw.randint(1, 2),
            "tp": draw.randint(2, 4),
            "pp": draw.randint(2, 4),
        }
        world_size = 1
        for n in sizes.values():
            world_size *= n
        cases += [(r, dict(sizes), order) for r in (0, *draw.sample(range(1, world_size), 3))]
    return cases


def _hidden_kinds(world: int) -> list[str]:
    return [
        f"another grid, {where}"
        for where in ("the doc group's order", "another order")
        for _ in range(4)
    ]


def _as_tensors(coords: dict[str, int]) -> dict[str, torch.Tensor]:
    return {axis: torch.tensor(value) for axis, value in sorted(coords.items())}


def _neighbours_as_tensors(neighbours: tuple[int | None, int | None]) -> dict[str, torch.Tensor]:
    """None (no stage there) as -1, so it compares like a rank."""
    previous, following = neighbours
    return {
        "previous": torch.tensor(-1 if previous is None else previous),
        "next": torch.tensor(-1 if following is None else following),
    }


# --------------------------------------------------------------------------- rank_coordinates
def coordinates_inner_first(
    rank: int, sizes: dict[str, int], order: tuple[str, ...]
) -> dict[str, int]:
    """Bug: `order` read inner -> outer, so its first axis varies fastest (tp outermost in the doc order)."""
    coords = {}
    for name in order:
        rank, coords[name] = divmod(rank, sizes[name])
    return coords


def coordinates_without_place_values(
    rank: int, sizes: dict[str, int], order: tuple[str, ...]
) -> dict[str, int]:
    """Bug: every axis read as if it were the innermost, `rank % size`."""
    return {name: rank % sizes[name] for name in order}


# --------------------------------------------------------------------------- pipeline_neighbours
def neighbours_one_apart(
    rank: int, sizes: dict[str, int], order: tuple[str, ...]
) -> tuple[int | None, int | None]:
    """Bug: the next stage taken as the next rank, +1, not + the ranks of every axis inside pp."""
    stage = rank % sizes["pp"]
    return (rank - 1 if stage > 0 else None), (rank + 1 if stage < sizes["pp"] - 1 else None)


def neighbours_round_a_ring(
    rank: int, sizes: dict[str, int], order: tuple[str, ...]
) -> tuple[int | None, int | None]:
    """Bug: the stages closed into a ring, the first stage's previous the last stage."""
    stride = 1
    for name in order[order.index("pp") + 1 :]:
        stride *= sizes[name]
    stage, pp = rank // stride % sizes["pp"], sizes["pp"]
    first = rank - stage * stride
    return first + (stage - 1) % pp * stride, first + (stage + 1) % pp * stride


# --------------------------------------------------------------------------- stage_blocks
STAGE_CUTS = [(2, 2), (4, 2), (3, 4), (4, 6)]
"""(n_stages, blocks): even cuts, and cuts that count the embedding and the head as layers."""


def _stage_cases(rank: int, world: int) -> list[tuple]:
    return [(s, n, b) for n, b in STAGE_CUTS for s in range(n)]


def _stage_kinds(world: int) -> list[str]:
    return [f"stage {s} of {n}, {b} blocks" for n, b in STAGE_CUTS for s in range(n)]


def _stage_hidden(rank: int, world: int, seed: int) -> list[tuple]:
    """Other cuts drawn from the seed: an even one and one with the ends counted."""
    draw = random.Random(seed)
    n = draw.randint(3, 6)
    even, ends = n * draw.randint(1, 3), n * draw.randint(2, 3) - 2
    return [(s, n, b) for b in (even, ends) for s in range(n)]


def _stage_hidden_kinds(world: int) -> list[str]:
    return [f"another cut, {what}" for what in ("even", "the ends counted") for _ in range(6)]


def _blocks_as_tensor(blocks: range) -> dict[str, torch.Tensor]:
    return {"blocks": torch.tensor(list(blocks), dtype=torch.int64)}


def ends_get_a_full_share(stage: int, n_stages: int, blocks: int) -> range:
    """Bug: the embedding and the head counted, but the last stage still given a full share."""
    if blocks % n_stages == 0:
        per = blocks // n_stages
        return range(stage * per, (stage + 1) * per)
    per = (blocks + 2) // n_stages
    return range(max(stage * per - 1, 0), min((stage + 1) * per, blocks))


def only_the_embedding_counted(stage: int, n_stages: int, blocks: int) -> range:
    """Bug: only the embedding counted as a layer: every stage's run shifted by one, none shorter
    at the end."""
    if blocks % n_stages == 0:
        per = blocks // n_stages
        return range(stage * per, (stage + 1) * per)
    per = (blocks + 2) // n_stages
    return range(max(stage * per - 1, 0), max((stage + 1) * per - 1, 0))


EXERCISES = [
    Exercise(
        name="rank_coordinates",
        lab=LAB,
        target="paralab.compose.grid.rank_coordinates",
        prompt=(
            "Return `rank`'s coordinate on every axis, `{axis: coordinate}`, for the axes of `order` "
            "(outer -> inner) of sizes `sizes[axis]`: the global rank read in mixed radix, the "
            "innermost axis varying fastest. In the doc group's order, `(dp_replicate, dp_shard, pp, "
            "cp, tp)`, tp partners are neighbouring ranks."
        ),
        hint="peel the innermost axis off first: divmod(rank, its size) gives its coordinate and "
        "what is left for the axes outside it",
        cases=_visible_cases,
        kinds=_visible_kinds,
        hidden=_hidden_cases,
        hidden_kinds=_hidden_kinds,
        points=1,
        minutes=10,
        normalize=_as_tensors,
        bugs=[
            (
                "order read inner -> outer (tp outermost)",
                coordinates_inner_first,
                "case 0, dp_replicate:",
            ),
            ("every axis read as the innermost", coordinates_without_place_values, "case 2, pp:"),
        ],
    ),
    Exercise(
        name="pipeline_neighbours",
        lab=LAB,
        target="paralab.compose.grid.pipeline_neighbours",
        prompt=(
            "Return `(previous, next)`: the global ranks of `rank`'s previous and next pipeline stage, "
            "the ranks that agree with it on every other axis (the same tp column, cp shard and "
            "sample); `None` where there is no stage (before the first, after the last). The axes are "
            "`order` (outer -> inner), of sizes `sizes[axis]`."
        ),
        hint="one step on pp is as many ranks as all the axes inside pp (after it in `order`) "
        "hold together; the stage is rank // that step % pp",
        cases=_visible_cases,
        kinds=_visible_kinds,
        hidden=_hidden_cases,
        hidden_kinds=_hidden_kinds,
        points=1,
        minutes=10,
        normalize=_neighbours_as_tensors,
        bugs=[
            (
                "the next stage taken as the next rank, +1",
                neighbours_one_apart,
                "case 0, previous:",
            ),
            ("the stages closed into a ring", neighbours_round_a_ring, "case 1, previous:"),
        ],
    ),
    Exercise(
        name="stage_blocks",
        lab=LAB,
        target="paralab.compose.model.stage_blocks",
        prompt=(
            "Return the `range` of blocks pipeline stage `stage` of `n_stages` runs, of a model of "
            "`blocks` blocks: an even cut when `n_stages` divides `blocks`; otherwise (it divides "
            "`blocks + 2`) the embedding and the head each count as one layer, so the first and the "
            "last stage run one block fewer (Megatron's `account_for_embedding_in_pipeline_split` "
            "and `account_for_loss_in_pipeline_split`)."
        ),
        hint="with the ends counted, per = (blocks + 2) // n_stages layers a stage; layer i is "
        "block i - 1; clip the run to [0, blocks)",
        cases=_stage_cases,
        kinds=_stage_kinds,
        hidden=_stage_hidden,
        hidden_kinds=_stage_hidden_kinds,
        points=1,
        minutes=10,
        normalize=_blocks_as_tensor,
        bugs=[
            ("the last stage given a full share", ends_get_a_full_share, "stage 0 of 4, 2 blocks"),
            ("only the embedding counted", only_the_embedding_counted, "stage 3 of 4, 2 blocks"),
        ],
    ),
]
