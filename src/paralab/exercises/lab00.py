"""Lab 00 exercise: predict every rank's groups, checked against the real DeviceMesh."""
from __future__ import annotations

import torch

from paralab.exercises import Exercise
from paralab.parallel_dims import ParallelDims

CONFIGS = {
    8: [dict(dp_replicate=2, dp_shard=4, cfgp=2, cp=2, lb=2, enable_inference_mode=True),
        dict(dp_shard=2, cp=4, lb=4),
        dict(dp_shard=4, cfgp=2, cp=4, enable_inference_mode=True)],
    4: [dict(dp_shard=2, cp=2, lb=2), dict(cfgp=2, cp=2, enable_inference_mode=True)],
}


def _cases(rank: int, world: int) -> list[tuple]:
    return [(ParallelDims(world, **config), rank) for config in CONFIGS[world]]


def mesh_groups(parallel_dims: ParallelDims, rank: int) -> dict[str, list[int]]:
    """The truth: build the meshes for real and read this rank's groups off them."""
    parallel_dims.build_meshes("cpu")
    return parallel_dims.group_ranks()


def _as_tensors(groups: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    return {axis: torch.tensor(members) for axis, members in sorted(groups.items())}


def _cp_fastest_everywhere(parallel_dims: ParallelDims, rank: int) -> dict[str, list[int]]:
    """Bug: treats every overlay axis as the last mesh dim (contiguous groups), so cfgp pairs neighbours."""
    from paralab.parallel_dims import predict_groups

    groups = predict_groups(parallel_dims, rank)
    if "cfgp" in groups:
        size = len(groups["cfgp"])
        groups["cfgp"] = list(range(rank - rank % size, rank - rank % size + size))
    return groups


EXERCISES = [
    Exercise(
        name="predict_groups",
        lab="00_parallel_dims",
        target="paralab.parallel_dims.predict_groups",
        prompt=(
            "Predict, with arithmetic only, the ranks in `rank`'s group on every enabled axis "
            "(`dp_shard`, `dp_replicate`, `cfgp`, `cp`, `lb`). Meshes are row-major: the overlay "
            "mesh is `(world // (cfgp·cp), cfgp, cp)`, the dp mesh `(dp_replicate, dp_shard)`, the "
            "lb mesh `(world // lb, lb)`. Leave out axes of size 1 (and the dp axes when "
            "`parallel_dims.dp_enabled` is false). The check builds the real meshes on 4 and 8 ranks."
        ),
        hint="along a mesh dim of size n with stride s (product of the later dims), the group of r "
             "starts at r - (r // s % n) * s and steps by s",
        cases=_cases,
        world_sizes=(4, 8),
        points=2,
        minutes=15,
        solution=mesh_groups,
        normalize=_as_tensors,
        bugs=[("cfgp groups taken as contiguous, like cp", _cp_fastest_everywhere, "cfgp: ")],
    ),
]
