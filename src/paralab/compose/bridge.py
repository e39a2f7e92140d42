"""The bridge between the two readings: lab 00's overlay `ParallelDims` (Cosmos's) and `Grid`.

Overlay: dp_replicate × dp_shard = world, and cp groups the same ranks again (cp partners are
neighbouring ranks inside one dp_shard group, holding the same parameters, FSDP over all of
dp_shard). Consuming: the same ranks as Grid(dp_replicate, dp_shard / cp, cp), whose
`dp_shard_cp` group is the overlay's dp_shard group, its cp group the overlay's cp group.

Where there is no bridge:
- overlay -> Grid: cp must divide dp_shard. An overlay cp group that spans dp_shard groups
  (cp = 2 with dp_shard = 1: each cp pair is two replicas) replicates its parameters over the
  pair, where a consuming cp shards them (Grid's FSDP group always holds the cp partners);
  cfgp and lb are inference overlays that Grid has no axis for.
- Grid -> overlay: tp, pp and ep must be 1. Their partners hold different parameters, so the
  overlay descriptor, whose only rank-consuming axes are dp, has nowhere to put them.
"""

from __future__ import annotations

from paralab.compose.grid import DOC_ORDER, Grid, GridError
from paralab.parallel_dims import ParallelDims


def from_overlay(dims: ParallelDims) -> Grid:
    """The consuming Grid with the same groups as an overlay `ParallelDims`, where one exists."""
    if dims.cfgp > 1 or dims.lb > 1:
        raise GridError(
            f"cfgp = {dims.cfgp}, lb = {dims.lb}: inference overlays Grid has no axis for"
        )
    if dims.dp_shard % dims.cp:
        raise GridError(
            f"cp = {dims.cp} does not divide dp_shard = {dims.dp_shard}: the overlay's cp partners "
            "are replicas of each other, a consuming cp would shard over them"
        )
    return Grid(
        dims.world_size,
        dp_replicate=dims.dp_replicate,
        dp_shard=dims.dp_shard // dims.cp,
        cp=dims.cp,
        order=DOC_ORDER,
    )


def to_overlay(grid: Grid) -> ParallelDims:
    """The overlay `ParallelDims` with the same groups as a Grid without tp, pp or ep."""
    for axis in ("tp", "pp", "ep"):
        if getattr(grid, axis) > 1:
            raise GridError(
                f"{axis} = {getattr(grid, axis)}: its partners hold different parameters; "
                "the overlay descriptor has no rank-consuming axis for it"
            )
    dims = ParallelDims(
        grid.world, dp_shard=grid.dp_shard * grid.cp, dp_replicate=grid.dp_replicate, cp=grid.cp
    )
    if from_overlay(dims).table("cp") != grid.table("cp"):
        raise GridError(f"order {grid.order}: cp partners are not neighbours, as the overlay's are")
    return dims
