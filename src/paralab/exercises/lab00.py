"""Lab 00 exercises: every rank's groups, checked against the real DeviceMesh, and its mesh coordinates."""

from __future__ import annotations

import math
import random

import torch

from paralab.exercises import Exercise
from paralab.parallel_dims import ParallelDims, mesh_coordinates, predict_groups
from paralab.patches import Patches, patched

CONFIGS = {
    8: [
        dict(dp_replicate=2, dp_shard=4, cfgp=2, cp=2, lb=2, enable_inference_mode=True),
        dict(dp_shard=2, cp=4, lb=4),
        dict(dp_shard=4, cfgp=2, cp=4, enable_inference_mode=True),
    ],
    4: [dict(dp_shard=2, cp=2, lb=2), dict(cfgp=2, cp=2, enable_inference_mode=True)],
}


HIDDEN_CONFIGS = {
    6: [
        dict(dp_shard=3, cp=2),
        dict(dp_replicate=3, dp_shard=2, lb=3),
        dict(dp_shard=2, cfgp=2, cp=3, enable_inference_mode=True),
    ],
    8: [
        dict(dp_replicate=2, dp_shard=4, cp=2, lb=2),
        dict(dp_shard=8, lb=4),
        dict(dp_replicate=4, dp_shard=2, cfgp=2, cp=2, lb=8, enable_inference_mode=True),
    ],
}


def _cases(rank: int, world: int) -> list[tuple]:
    return [(ParallelDims(world, **config), rank) for config in CONFIGS[world]]


def _kinds(world: int) -> list[str]:
    return [
        f"ParallelDims({world}, {', '.join(f'{k}={v}' for k, v in config.items())})"
        for config in CONFIGS[world]
    ]


def _hidden_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """A layout of the world drawn from the seed, and always the one with the overlay mesh
    (cfgp and cp together, the layout a wrong overlay order gets wrong)."""
    *others, overlay = HIDDEN_CONFIGS[world]
    return [
        (ParallelDims(world, **config), rank)
        for config in (random.Random(seed).choice(others), overlay)
    ]


_BUILT: dict[tuple, dict[str, list[int]]] = {}
"""This rank process's groups per layout. Grading seeds draw the same few layouts again and
again, and each build is a collective that creates new process groups: build each once."""


def mesh_groups(parallel_dims: ParallelDims, rank: int) -> dict[str, list[int]]:
    """The truth: build the meshes for real and read this rank's groups off them."""
    pd = parallel_dims
    layout = (pd.world_size, pd.dp_replicate, pd.dp_shard, pd.cp, pd.cfgp, pd.lb)
    key = (*layout, pd.enable_inference_mode)
    if key not in _BUILT:
        parallel_dims.build_meshes("cpu")
        _BUILT[key] = parallel_dims.group_ranks()
    return {axis: list(ranks) for axis, ranks in _BUILT[key].items()}


def _as_tensors(groups: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    return {axis: torch.tensor(members) for axis, members in sorted(groups.items())}


_MESH_LAYOUTS = ParallelDims.mesh_layouts


def overlay_cp_before_cfgp(
    parallel_dims: ParallelDims,
) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Bug: the overlay mesh in the other order, (rest, cp, cfgp): cfgp becomes the last, fastest dim."""
    layouts = _MESH_LAYOUTS(parallel_dims)
    (rest, cfgp, cp), _ = layouts["overlay"]
    layouts["overlay"] = ((rest, cp, cfgp), ("rest", "cp", "cfgp"))
    return layouts


def one_decision_swapped() -> Patches:
    """The bug clinic's patch set: one layout decision swapped (`overlay_cp_before_cfgp`).

    Named so the clinic can plant it, `with patched(one_decision_swapped()):`,
    before the reader is asked what it is.
    """
    return {"paralab.parallel_dims.ParallelDims": {"mesh_layouts": overlay_cp_before_cfgp}}


def predict_groups_cfgp_last(parallel_dims: ParallelDims, rank: int) -> dict[str, list[int]]:
    """`predict_groups` with the clinic's patch set planted: the grader's proof its check can fail."""
    with patched(one_decision_swapped()):
        return predict_groups(parallel_dims, rank)


def _describe(world: int, config: dict) -> str:
    return f"ParallelDims({world}, {', '.join(f'{k}={v}' for k, v in config.items())})"


def _every_rank(world: int, configs: list[dict]) -> list[tuple]:
    return [(ParallelDims(world, **config), rank) for config in configs for rank in range(world)]


def _coordinate_cases(rank: int, world: int) -> list[tuple]:
    """Every rank of every layout of 4 and 8 ranks, in this process: arithmetic needs no ranks."""
    return [
        case for size, configs in sorted(CONFIGS.items()) for case in _every_rank(size, configs)
    ]


def _coordinate_kinds(world: int) -> list[str]:
    return [
        f"{_describe(size, config)}, rank {rank}"
        for size, configs in sorted(CONFIGS.items())
        for config in configs
        for rank in range(size)
    ]


def _hidden_coordinate_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Every rank of a layout of 6 ranks and one of 8 drawn from the seed, then every rank of
    both overlay layouts (cfgp and cp together, where a wrong overlay order shows)."""
    draw = random.Random(seed)
    drawn = [(size, draw.choice(configs[:-1])) for size, configs in sorted(HIDDEN_CONFIGS.items())]
    overlays = [(size, configs[-1]) for size, configs in sorted(HIDDEN_CONFIGS.items())]
    return [case for size, config in drawn + overlays for case in _every_rank(size, [config])]


def _hidden_coordinate_kinds(world: int) -> list[str]:
    kinds = [f"a layout of {size} ranks drawn from the seed" for size in sorted(HIDDEN_CONFIGS)]
    kinds += [f"a layout of {size} ranks with cfgp and cp" for size in sorted(HIDDEN_CONFIGS)]
    return [
        f"{kind}, rank {rank}"
        for kind, size in zip(kinds, sorted(HIDDEN_CONFIGS) * 2)
        for rank in range(size)
    ]


def _coordinates_as_tensors(coordinates: dict[str, int]) -> dict[str, torch.Tensor]:
    return {name: torch.tensor(value) for name, value in sorted(coordinates.items())}


def coordinates_column_major(parallel_dims: ParallelDims, rank: int) -> dict[str, int]:
    """Bug: each mesh unravelled column-major, its first dim varying fastest."""
    coordinates = {}
    for dims, names in parallel_dims.mesh_layouts().values():
        for dim, name in enumerate(names):
            coordinates[name] = rank // math.prod(dims[:dim]) % dims[dim]
    return coordinates


def coordinates_sample_by_cp_only(parallel_dims: ParallelDims, rank: int) -> dict[str, int]:
    """Bug: the sample group taken as rank // cp, as if cfgp partners worked on other samples."""
    return {**mesh_coordinates(parallel_dims, rank), "rest": rank // parallel_dims.cp}


def coordinates_cfgp_last(parallel_dims: ParallelDims, rank: int) -> dict[str, int]:
    """`mesh_coordinates` with the clinic's patch set planted: the overlay read as (rest, cp, cfgp)."""
    with patched(one_decision_swapped()):
        return mesh_coordinates(parallel_dims, rank)


EXERCISES = [
    Exercise(
        name="predict_groups",
        lab="00_parallel_dims",
        target="paralab.parallel_dims.predict_groups",
        prompt=(
            "Predict, with arithmetic only, the ranks in `rank`'s group on every enabled axis "
            "(`dp_shard`, `dp_replicate`, `cfgp`, `cp`, `lb`). `parallel_dims.mesh_layouts()` gives "
            "each mesh's dims and their names, row-major (the overlay mesh is `(world // (cfgp·cp), "
            "cfgp, cp)`, the dp mesh `(dp_replicate, dp_shard)`, the lb mesh `(world // lb, lb)`), and "
            "`parallel_dims.axes_enabled()` the axes that get a group (leave the others out). The "
            "check builds the real meshes on 4 and 8 ranks."
        ),
        hint="return {axis: sorted global ranks of rank's group} for every enabled axis of size > 1, "
        "computed by arithmetic, the groups the row-major device meshes would build",
        cases=_cases,
        kinds=_kinds,
        hidden=_hidden_cases,
        hidden_kinds=lambda world: [
            f"another layout of {world} ranks",
            f"another layout of {world} ranks, with the overlay mesh (cfgp and cp)",
        ],
        hidden_world_sizes=(6, 8),
        world_sizes=(4, 8),
        points=2,
        minutes=15,
        solution=mesh_groups,
        normalize=_as_tensors,
        bugs=[
            (
                "overlay mesh built as (rest, cp, cfgp): cfgp pairs neighbours",
                predict_groups_cfgp_last,
                "cfgp: ",
            )
        ],
    ),
    Exercise(
        name="mesh_coordinates",
        lab="00_parallel_dims",
        target="paralab.parallel_dims.mesh_coordinates",
        prompt=(
            "Say what `rank` works on: its coordinate on every dim of every mesh of "
            "`parallel_dims.mesh_layouts()` (`rest`, `cfgp`, `cp`, `dp_replicate`, `dp_shard`, "
            "`lb_rest`, `lb`), keyed by the dim's name, each mesh row-major. `rest` is the rank's "
            "sample group, `cfgp` its guidance branch, `cp` its token slice, `dp_replicate` its "
            "model copy, `dp_shard` its weight shard. The check tries every rank of the layouts "
            "of 4 and 8 ranks this lab builds."
        ),
        hint="return {dim name: rank's index along that dim} for all seven dims of the three "
        "meshes, unravelling rank row-major (the last dim varies fastest)",
        cases=_coordinate_cases,
        kinds=_coordinate_kinds,
        hidden=_hidden_coordinate_cases,
        hidden_kinds=_hidden_coordinate_kinds,
        points=2,
        minutes=10,
        normalize=_coordinates_as_tensors,
        bugs=[
            ("meshes unravelled column-major", coordinates_column_major, "case 1, cp:"),
            (
                "sample group taken as rank // cp: cfgp partners on other samples",
                coordinates_sample_by_cp_only,
                "case 6, rest:",
            ),
            ("overlay read as (rest, cp, cfgp)", coordinates_cfgp_last, "case 5, cfgp:"),
        ],
    ),
]
