"""Lab 01 exercises: gather a unit's parameters from its shards, reduce-scatter its gradients; and the bugs.

The bug variants are real-world failures of FSDP / HSDP code. The lab's bug
clinic and tests/test_fsdp_distributed.py import them from here, so each bug is
written once.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from paralab.exercises import Exercise
from paralab.fsdp import zero
from paralab.fsdp.zero import FlatUnit, padded_size, shard_unit, unflatten
from paralab.models import MLPBlock
from paralab.parallel_dims import ParallelDims
from paralab.patches import Patches, patched

LAB = "01_fsdp_hsdp"
WIDTH, HIDDEN = 2, 3  # one MLPBlock of 17 parameters: padded to 18 on 2 ranks, to 20 on 4


@functools.cache
def _meshes(
    world: int, dp_replicate: int
) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """(shard group, replicate group) of a (dp_replicate, world // dp_replicate) dp mesh, built
    once per rank process: every case and grading seed at one layout shares its groups."""
    pd = ParallelDims(world, dp_shard=world // dp_replicate, dp_replicate=dp_replicate)
    pd.build_meshes("cpu")
    replicate = pd.dp_replicate_mesh.get_group() if pd.dp_replicate_mesh is not None else None
    return pd.dp_shard_mesh.get_group(), replicate


def _layouts(world: int) -> list[int]:
    """dp_replicate of each case: the whole world as one shard group, and at world 4 HSDP 2x2."""
    return [1] + ([2] if world == 4 else [])


# --------------------------------------------------------------------------- gather_unit_params
def _unit(seed: int, group: dist.ProcessGroup) -> FlatUnit:
    torch.manual_seed(seed)
    return shard_unit(MLPBlock(WIDTH, HIDDEN).double(), group)


def _gather_cases(rank: int, world: int) -> list[tuple]:
    """Per layout: a unit gathered for the first time, and one whose gathered storage was freed (the refill)."""
    cases = []
    for i, dp_replicate in enumerate(_layouts(world)):
        shard_group, _ = _meshes(world, dp_replicate)
        fresh, refill = _unit(10 * i, shard_group), _unit(10 * i + 1, shard_group)
        refill.full = torch.zeros(
            refill.shard.numel() * dist.get_world_size(shard_group), dtype=torch.float64
        )
        refill.full.untyped_storage().resize_(0)
        cases += [(fresh, shard_group), (refill, shard_group)]
    return cases


def _gather_kinds(world: int) -> list[str]:
    kinds = [
        f"ZeRO-3 over all {world} ranks: first gather",
        f"ZeRO-3 over all {world} ranks: refill of freed storage",
    ]
    return kinds + (
        [
            "HSDP 2 x 2 (shard groups {0,1} {2,3}): first gather",
            "HSDP 2 x 2 (shard groups {0,1} {2,3}): refill of freed storage",
        ]
        if world == 4
        else []
    )


def _hidden_gather_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Other parameters (drawn from the seed), sharded over a world whose size does not divide the unit."""
    shard_group, _ = _meshes(world, 1)
    fresh, refill = _unit(seed, shard_group), _unit(seed + 1, shard_group)
    refill.full = torch.zeros(
        refill.shard.numel() * dist.get_world_size(shard_group), dtype=torch.float64
    )
    refill.full.untyped_storage().resize_(0)
    return [(fresh, shard_group), (refill, shard_group)]


def _layout() -> FlatUnit:
    """The exercise unit's names and shapes only (built on the meta device: no numbers, no RNG)."""
    with torch.device("meta"):
        block = MLPBlock(WIDTH, HIDDEN)
    names, params = zip(*block.named_parameters())
    return FlatUnit(
        block, list(names), [p.shape for p in params], sum(p.numel() for p in params), shard=None
    )


def _by_name(full: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gathered flat buffer as the unit's named parameters, plus the padding after them."""
    layout = _layout()
    return {
        **{name: t.clone() for name, t in unflatten(layout, full).items()},
        "padding": full[layout.numel :].clone(),
    }


def gather_in_reverse_order(unit: FlatUnit, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Bug: gathers into a list and concatenates it last rank first (e.g. a `reversed` left from a backward loop)."""
    pieces = [torch.empty_like(unit.shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, unit.shard.detach(), group=group)
    unit.full = torch.cat(pieces[::-1])
    return unit.full


def gather_own_shard_only(unit: FlatUnit, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Bug: writes this rank's shard into its slot of a zeroed buffer and never gathers the others."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    size = unit.shard.numel()
    unit.full = torch.zeros(size * n, dtype=unit.shard.dtype)
    unit.full[rank * size : (rank + 1) * size] = unit.shard.detach()
    return unit.full


def gather_padding_dropped(unit: FlatUnit, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Bug: strips the padding from the gathered buffer itself; the views look right, but the buffer (and so
    the gradient the reduce-scatter cuts into equal slices) is no longer a multiple of n."""
    pieces = [torch.empty_like(unit.shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, unit.shard.detach(), group=group)
    unit.full = torch.cat(pieces)[: unit.numel]
    return unit.full


# --------------------------------------------------------------------------- reduce_scatter_grads
def _reduce_cases(rank: int, world: int) -> list[tuple]:
    """A different full (padded) gradient on every rank, per layout: ZeRO-3 over the world, and HSDP 2x2."""
    cases = []
    for i, dp_replicate in enumerate(_layouts(world)):
        shard_group, replicate_group = _meshes(world, dp_replicate)
        g = torch.Generator().manual_seed(100 * i + rank)
        full_grad = torch.randn(
            padded_size(_layout().numel, world // dp_replicate), generator=g, dtype=torch.float64
        )
        cases.append((full_grad, shard_group, replicate_group))
    return cases


def _reduce_kinds(world: int) -> list[str]:
    return [f"ZeRO-3 over all {world} ranks"] + (
        ["HSDP 2 x 2: shard groups {0,1} {2,3}, replicas {0,2} {1,3}"] if world == 4 else []
    )


def _hidden_reduce_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Other gradients (drawn from the seed): ZeRO-3 over the world, and HSDP with 2 replicas of world/2 shards."""
    cases = []
    for i, dp_replicate in enumerate([1, 2]):
        shard_group, replicate_group = _meshes(world, dp_replicate)
        g = torch.Generator().manual_seed(seed + 100 * i + rank)
        full_grad = torch.randn(
            padded_size(_layout().numel, world // dp_replicate), generator=g, dtype=torch.float64
        )
        cases.append((full_grad, shard_group, replicate_group))
    return cases


def _as_shard_grad(shard_grad: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"gradient shard": shard_grad}


_REDUCE_SCATTER_GRADS, _DIVIDE_FACTORS = zero.reduce_scatter_grads, zero.gradient_divide_factors


def divide_by_one(
    shard_group: dist.ProcessGroup | None, replicate_group: dist.ProcessGroup | None
) -> tuple[int, int]:
    """Bug: divide factors of 1: both reductions stay sums."""
    return 1, 1


def replicas_divided_by_world(
    shard_group: dist.ProcessGroup | None, replicate_group: dist.ProcessGroup | None
) -> tuple[int, int]:
    """Bug: the replica all-reduce's sum divided by the world size instead of by the number of replicas."""
    return _DIVIDE_FACTORS(shard_group, replicate_group)[0], dist.get_world_size()


def reduce_sum_not_mean(
    full_grad: torch.Tensor,
    shard_group: dist.ProcessGroup | None,
    replicate_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Bug, one decision swapped (`divide_by_one`): the step is dp_replicate x dp_shard times too large."""
    with patched({"paralab.fsdp.zero": {"gradient_divide_factors": divide_by_one}}):
        return _REDUCE_SCATTER_GRADS(full_grad, shard_group, replicate_group)


def hsdp_divides_twice(
    full_grad: torch.Tensor,
    shard_group: dist.ProcessGroup | None,
    replicate_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Bug, one decision swapped (`replicas_divided_by_world`): averages in the shard group (/ dp_shard), then
    divides the replicas' sum by the world size: HSDP gradients come out dp_shard times too small."""
    with patched(one_reduction_decision_swapped()):
        return _REDUCE_SCATTER_GRADS(full_grad, shard_group, replicate_group)


def one_reduction_decision_swapped() -> Patches:
    """The bug clinic's patch set: one decision of the gradient reduction swapped (`replicas_divided_by_world`).

    Named so the clinic can launch it, `run(run_jobs, n, jobs, patches=...)`,
    before the reader is asked what it is.
    """
    return {"paralab.fsdp.zero": {"gradient_divide_factors": replicas_divided_by_world}}


def no_replica_all_reduce(
    full_grad: torch.Tensor,
    shard_group: dist.ProcessGroup | None,
    replicate_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Bug, one decision swapped (the replica group dropped): HSDP without the replica all-reduce, so each
    replica steps on its own half of the batch and the replicas drift apart."""
    return _REDUCE_SCATTER_GRADS(full_grad, shard_group, None)


EXERCISES = [
    Exercise(
        name="gather_unit_params",
        lab=LAB,
        target="paralab.fsdp.zero.gather_unit_params",
        prompt=(
            "Before a unit computes, its full parameters must exist on every rank of the shard `group`. "
            "Each rank holds `unit.shard`, its equal 1/n slice of the unit's flattened parameters, zero-padded "
            "at the end to a multiple of n (`unit.numel` real values). All-gather the shards, in group-rank "
            "order, into `unit.full`, the padded flat buffer, and return it; `unflatten(unit, full)` then "
            "views the real parameters by name and leaves the padding out. The first call allocates "
            "`unit.full`; later calls find it freed (`free_unit_params` resized its storage to 0) and must "
            "refill that same tensor — autograd saved views of it — by resizing its storage back, writing "
            "under `torch.no_grad()` and `torch.autograd._unsafe_preserve_version_counter(unit.full)`. "
            "`group` None means one rank: copy the shard. The check runs on 2 and 4 ranks (and on the "
            "shard groups of 2 of an HSDP 2x2 mesh), on a 17-parameter unit, fresh and refilled."
        ),
        hint="afterwards unit.full holds every rank's shard in rank order (padding included) and the "
        "unit's parameters view it; nothing is returned",
        cases=_gather_cases,
        kinds=_gather_kinds,
        hidden=_hidden_gather_cases,
        hidden_kinds=lambda world: [
            f"other parameters over {world} ranks: first gather",
            f"other parameters over {world} ranks: refill of freed storage",
        ],
        hidden_world_sizes=(3,),
        world_sizes=(2, 4),
        points=2,
        minutes=15,
        normalize=_by_name,
        bugs=[
            (
                "shards concatenated last rank first",
                gather_in_reverse_order,
                "world 2, rank 0, case 0, fc1.weight",
            ),
            (
                "only this rank's own shard, the others left zero",
                gather_own_shard_only,
                "world 2, rank 0, case 0, fc2.weight",
            ),
            (
                "padding stripped from the buffer itself",
                gather_padding_dropped,
                "world 2, rank 0, case 0, padding",
            ),
        ],
    ),
    Exercise(
        name="reduce_scatter_grads",
        lab=LAB,
        target="paralab.fsdp.zero.reduce_scatter_grads",
        prompt=(
            "After a unit's backward every rank holds the full (padded, flat) gradient of its own slice "
            "of the batch. Return this rank's shard of the gradient *averaged over every data-parallel "
            "rank*: reduce-scatter with SUM inside `shard_group` (each rank receives the slice of its own "
            "shard) and divide by the shard group's size; for HSDP (`replicate_group` not None) then "
            "all-reduce that slice with SUM across the replicas holding the same shard and divide by the "
            "number of replicas. A group of None means one rank (no collective, return a copy). The check "
            "runs ZeRO-3 on 2 and 4 ranks and HSDP 2x2 (`ParallelDims(4, dp_shard=2, dp_replicate=2)`)."
        ),
        hint="return this rank's shard of the gradient averaged over every rank of the world (both the "
        "shard group and, in HSDP, the replicas), shape of one shard",
        cases=_reduce_cases,
        kinds=_reduce_kinds,
        hidden=_hidden_reduce_cases,
        hidden_kinds=lambda world: [
            f"other gradients, ZeRO-3 over {world} ranks",
            f"other gradients, HSDP with 2 replicas of {world // 2} shards",
        ],
        hidden_world_sizes=(6,),
        world_sizes=(2, 4),
        points=3,
        minutes=15,
        normalize=_as_shard_grad,
        bugs=[
            ("sum instead of mean", reduce_sum_not_mean, "world 2, rank 0, case 0, gradient shard"),
            (
                "HSDP divides by dp_shard and again by the world size",
                hsdp_divides_twice,
                "world 4, rank 0, case 1, gradient shard",
            ),
            (
                "HSDP without the replica all-reduce",
                no_replica_all_reduce,
                "world 4, rank 0, case 1, gradient shard",
            ),
        ],
    ),
]
