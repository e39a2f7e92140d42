"""Lab 05 exercises: the bytes of one training step, which sample and tokens a rank holds; the bugs.

`loader_clinic_bug()` is the bug clinic's patch set that plants its loader bug in the real loop,
`{"paralab.train.runs": {"sample_index": sample_by_global_rank}}`, under a name that does not
give the bug away before the lab's clinic asks about it; the lab passes it to
`run(..., patches=...)`.
"""

from __future__ import annotations

import random

import torch

from paralab.exercises import Exercise
from paralab.parallel_dims import ParallelDims
from paralab.patches import Patches
from paralab.train.costs import (
    GROUPS,
    PHASES,
    shard_bytes_of_unit,
    training_step_bytes,
    unit_shapes,
)
from paralab.train.model import SequenceShard
from paralab.train.runs import sample_index

LAB = "05_training_composition"


def sample_by_global_rank(rank: int, parallel_dims: ParallelDims) -> int:
    """Every rank its own sample: cp partners no longer share one, and samples past the batch are read."""
    return rank


def loader_clinic_bug() -> Patches:
    """The bug clinic's loader bug as a patch set, for `run(..., patches=...)` or `patched`."""
    return {"paralab.train.runs": {"sample_index": sample_by_global_rank}}


# --------------------------------------------------------------------------- training_step_bytes
STEP_CONFIGS = [
    (4, 1, 2, "ring", "none"),
    (4, 1, 2, "ring", "full"),
    (4, 1, 2, "ring", "selective"),
    (2, 2, 2, "ring", "full"),
    (2, 2, 4, "ulysses", "full"),
    (2, 2, 1, "ring", "none"),
    (2, 3, 2, "ulysses", "selective"),
]
"""(dp_shard, dp_replicate, cp, attention, ac): the lab's configurations, and 3 replicas."""


def _step_cases(rank: int, world: int) -> list[tuple]:
    return [(*config, unit_shapes()) for config in STEP_CONFIGS]


def _step_kinds(world: int) -> list[str]:
    return [
        f"dp_shard {n}, dp_replicate {r}, cp {cp} {attention}, AC {ac}, the lab's model"
        for n, r, cp, attention, ac in STEP_CONFIGS
    ]


def _hidden_step_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Another model (3 blocks, first dims that leave FSDP padding), other group sizes, every AC mode.

    Always dp_replicate 3 and a cp > 1: at r = 2 a replica all-reduce counted like an
    all-gather sends the same bytes, and without cp no AC mode changes the traffic."""
    draw = random.Random(seed)
    width = draw.choice((12, 20, 28))
    block = [(width,), (3 * width, width), (width, width), (2 * width, width), (width, 2 * width)]
    units = [[(draw.randint(5, 40), width), (width,), (4, width)]] + [block] * 3
    return [
        (draw.choice((3, 5, 6)), 3, draw.choice((2, 4, 8)), attention, ac, units)
        for attention, ac in (("ring", "full"), ("ulysses", "selective"), ("ring", "none"))
    ]


HIDDEN_STEP_KINDS = [
    "another model (3 blocks, padded shards), 3 replicas, ring, AC full",
    "another model, 3 replicas, Ulysses, AC selective",
    "another model, 3 replicas, ring, AC none",
]


def _cells(out: dict[tuple[str, str], int]) -> dict[str, torch.Tensor]:
    return {f"{g} {p}": torch.tensor(out[g, p]) for g in GROUPS for p in PHASES}


def root_regathered_in_backward(
    dp_shard, dp_replicate, cp, attention="ring", ac="none", units=None
):
    """Bug: the backward all-gathers the root again too (as if the root resharded after forward)."""
    out = training_step_bytes(dp_shard, dp_replicate, cp, attention, ac, units)
    root = shard_bytes_of_unit((units or unit_shapes())[0], dp_shard)
    out["dp_shard", "backward"] += (dp_shard - 1) * root
    return out


def recompute_under_selective_ac(
    dp_shard, dp_replicate, cp, attention="ring", ac="none", units=None
):
    """Bug: selective AC re-runs the attention's collectives too (it saves the attention output)."""
    return training_step_bytes(
        dp_shard, dp_replicate, cp, attention, "full" if ac == "selective" else ac, units
    )


def replica_all_reduce_without_one_over_r(
    dp_shard, dp_replicate, cp, attention="ring", ac="none", units=None
):
    """Bug: the replica all-reduce counted as 2(r-1) B_u, the 1/r of a ring all-reduce forgotten."""
    out = training_step_bytes(dp_shard, dp_replicate, cp, attention, ac, units)
    out["dp_replicate", "backward"] = out["dp_replicate", "backward"] * dp_replicate
    return out


# --------------------------------------------------------------------------- sample_and_positions
LOADER_LAYOUTS = [
    (dict(dp_shard=4, cp=2), False),
    (dict(dp_shard=4, cp=2), True),
    (dict(dp_replicate=2, dp_shard=4, cp=2), True),
    (dict(dp_shard=8, cp=4), False),
    (dict(dp_replicate=2, dp_shard=2), False),
]
"""(dims, zigzag): the lab's 4-rank layouts, its 8-rank picture, a cp 4 and a cp-less layout."""


def _world(dims: dict) -> int:
    return dims.get("dp_replicate", 1) * dims["dp_shard"]


def _loader_cases(rank: int, world: int) -> list[tuple]:
    return [
        (r, ParallelDims(_world(dims), **dims), 32, zigzag)
        for dims, zigzag in LOADER_LAYOUTS
        for r in range(_world(dims))
    ]


def _loader_kinds(world: int) -> list[str]:
    return [
        f"rank {r} of ParallelDims({_world(dims)}, "
        f"{', '.join(f'{k}={v}' for k, v in dims.items())}), 32 tokens"
        + (", zigzag" if zigzag else "")
        for dims, zigzag in LOADER_LAYOUTS
        for r in range(_world(dims))
    ]


def _hidden_loader_layouts(seed: int) -> list[tuple[dict, int, bool]]:
    """cp 3 in 6 ranks, and cp 3 or 4 under 2 replicas; zigzag at least once, never one chunk a rank."""
    draw = random.Random(seed)
    cp = draw.choice((3, 4))
    return [
        (dict(dp_shard=6, cp=3), 6 * draw.randint(2, 4), draw.random() < 0.5),
        (dict(dp_replicate=2, dp_shard=6, cp=cp), 2 * cp * draw.randint(2, 3), True),
    ]


def _hidden_loader_cases(rank: int, world: int, seed: int) -> list[tuple]:
    return [
        (r, ParallelDims(_world(dims), **dims), n, zigzag)
        for dims, n, zigzag in _hidden_loader_layouts(seed)
        for r in range(_world(dims))
    ]


def _hidden_loader_kinds(world: int) -> list[str]:
    return [f"rank {r} of 6 ranks, cp 3" for r in range(6)] + [
        f"rank {r} of 12 ranks, 2 replicas, cp 3 or 4, zigzag" for r in range(12)
    ]


def loaded_by_the_loop(
    rank: int, parallel_dims: ParallelDims, n_tokens: int, zigzag: bool
) -> tuple[int, list[int]]:
    """The truth: the training loop's own `sample_index` and `SequenceShard` for this rank."""
    shard = SequenceShard(rank % parallel_dims.cp, parallel_dims.cp, zigzag)
    return sample_index(rank, parallel_dims), shard.positions(n_tokens).tolist()


def _sample_and_positions(result: tuple[int, list[int]]) -> dict[str, torch.Tensor]:
    sample, positions = result
    return {"sample": torch.tensor(sample), "positions": torch.tensor(list(positions))}


def each_rank_its_own_sample(rank, parallel_dims, n_tokens, zigzag):
    """Bug (the bug clinic's loader): the sample by global rank, so cp partners load different samples."""
    return rank, loaded_by_the_loop(rank, parallel_dims, n_tokens, zigzag)[1]


def contiguous_even_for_zigzag(rank, parallel_dims, n_tokens, zigzag):
    """Bug: zigzag ignored, every rank keeps one contiguous chunk (the causal ring's load unbalanced)."""
    return loaded_by_the_loop(rank, parallel_dims, n_tokens, False)


def cp_partners_strided(rank, parallel_dims, n_tokens, zigzag):
    """Bug: cp read as the outer mesh dim, so a sample's cp partners sit world/cp ranks apart."""
    samples = parallel_dims.world_size // parallel_dims.cp
    outer = ParallelDims(parallel_dims.world_size, dp_shard=parallel_dims.world_size)
    shard = SequenceShard(rank // samples, parallel_dims.cp, zigzag)
    return sample_index(rank % samples, outer), shard.positions(n_tokens).tolist()


EXERCISES = [
    Exercise(
        name="training_step_bytes",
        lab=LAB,
        target="paralab.train.costs.training_step_bytes",
        prompt=(
            "Predict the bytes one rank sends in one training step, per group (`dp_shard`, "
            "`dp_replicate`, `cp`) and phase (`forward`, `backward`, `recompute`): the dict "
            "`{(group, phase): bytes}` with all nine cells. FSDP2 shards every unit (the root, then "
            "each block of `units`) over dp_shard and keeps the root gathered after forward; HSDP "
            "all-reduces each gradient shard over dp_replicate; each block's attention sends lab 02's "
            "bytes over cp, and AC decides what a backward sends again. `shard_bytes_of_unit` and "
            "`attention_bytes` give the sizes of one call."
        ),
        hint="return {(group, phase): bytes} for the 3 groups x 3 phases, one rank, one step",
        cases=_step_cases,
        kinds=_step_kinds,
        hidden=_hidden_step_cases,
        hidden_kinds=lambda world: HIDDEN_STEP_KINDS,
        points=2,
        minutes=20,
        normalize=_cells,
        bugs=[
            (
                "the root re-gathered in the backward too",
                root_regathered_in_backward,
                "case 0, dp_shard backward:",
            ),
            (
                "selective AC sends the attention again in its recompute",
                recompute_under_selective_ac,
                "case 2, cp recompute:",
            ),
            (
                "the replica all-reduce without its 1/r",
                replica_all_reduce_without_one_over_r,
                "case 3, dp_replicate backward:",
            ),
        ],
    ),
    Exercise(
        name="sample_and_positions",
        lab=LAB,
        target="paralab.train.runs.sample_and_positions",
        prompt=(
            "Predict, by arithmetic, which sample of the global batch `rank` loads and the global "
            "positions of the tokens it keeps: `(sample, positions)`, positions in the order the "
            "rank holds them. The overlay mesh is `(rest, cfgp, cp)` with cp innermost (cfgp is 1 "
            "in training); `zigzag` (the causal ring) cuts `2·cp` chunks and gives cp rank `i` "
            "chunks `i` and `2·cp-1-i`. The check compares with what the training loop loads."
        ),
        hint="return (sample index, list of the global token positions this rank keeps, in order)",
        cases=_loader_cases,
        kinds=_loader_kinds,
        hidden=_hidden_loader_cases,
        hidden_kinds=_hidden_loader_kinds,
        points=2,
        minutes=15,
        solution=loaded_by_the_loop,
        normalize=_sample_and_positions,
        bugs=[
            (
                "each rank its own sample (the bug clinic's loader)",
                each_rank_its_own_sample,
                "case 1, sample:",
            ),
            (
                "zigzag ignored for the causal ring",
                contiguous_even_for_zigzag,
                "case 4, positions:",
            ),
            ("cp partners strided, cp the outer dim", cp_partners_strided, "case 1, sample:"),
        ],
    ),
]
