"""`Grid`: the consuming descriptor. Every training axis takes rank slots of its own.

world = dp_replicate × dp_shard × cp × tp × pp. A rank's place is one coordinate per
axis, read off its global rank in mixed radix, the axes in `order` (outer -> inner). The
doc group's order, inner -> outer, is TP -> CP -> PP -> DP: tp partners are neighbouring
ranks (one node's NVLink), dp partners are the farthest apart.

Why these axes consume ranks where lab 00's `ParallelDims` overlays cp on the dp ranks:
tp and pp partners hold *different* parameters (a column of a weight, a later stage), so
no rank can be both a tp partner and a dp partner of the same rank for the same tensor;
cp partners hold the same parameters and here still consume ranks, because each rank
also runs its own tp and pp slice of the step.

Flattened groups, named as torchtitan names them at f64bbad (its 238fa99 names in
`TORCHTITAN_NOW`):
- `dp` = dp_replicate × dp_shard: which sample a rank loads;
- `dp_shard_cp` = dp_shard × cp: the FSDP group (cp partners hold the same parameters);
- `dp_cp` = dp_replicate × dp_shard × cp: the loss and gradient-sum group;
- `ep`: carved from dp_shard × cp (× tp when the experts are not tensor-parallel,
  etp = 1): dp_shard = dp_shard_mod_ep × dp_shard_in_ep, ep = dp_shard_in_ep × cp (× tp).

A flattened group lists its ranks in the order of its axes (outer first), whatever the
world order, so the same code runs on the doc group's, torchtitan's or a wrong layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

AXES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")
DOC_ORDER = ("dp_replicate", "dp_shard", "pp", "cp", "tp")
"""Outer -> inner: the doc group's layout, inner -> outer TP -> CP -> PP -> DP."""
TORCHTITAN_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""Outer -> inner: torchtitan's world mesh (pp outermost, then dp, cp, tp innermost)."""
TP_OUTERMOST = ("tp", "dp_replicate", "dp_shard", "pp", "cp")
"""The wrong layout: tp partners world/tp ranks apart."""

FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}
TORCHTITAN_NOW = {"batch": "dp", "fsdp": "dp_shard_cp", "loss": "dp_cp", "efsdp": "dp_shard_mod_ep"}
"""torchtitan@238fa99's names for the same groups (its `efsdp` is dp_shard_mod_ep by size and ranks)."""


class GridError(ValueError):
    """An invalid configuration; the message names the axis."""


def rank_coordinates(rank: int, sizes: dict[str, int], order: tuple[str, ...]) -> dict[str, int]:
    """`rank`'s coordinate on every axis of `order` (outer -> inner), each axis `sizes[axis]` long.

    The global rank read in mixed radix: the innermost axis varies fastest, so its partners are
    neighbouring ranks; the outermost slowest, its partners the farthest apart."""
    ### BEGIN SOLUTION
    coords = {}
    for name in reversed(order):
        rank, coords[name] = divmod(rank, sizes[name])
    return coords
    ### END SOLUTION


def pipeline_neighbours(
    rank: int, sizes: dict[str, int], order: tuple[str, ...]
) -> tuple[int | None, int | None]:
    """The global ranks of `rank`'s previous and next pipeline stage (None past either end).

    They agree with `rank` on every other axis, so they hold the same tp column, cp shard and
    sample: one step on pp is as many ranks as all the axes inside pp hold together."""
    ### BEGIN SOLUTION
    stride = math.prod(sizes[name] for name in order[order.index("pp") + 1 :])
    stage = rank // stride % sizes["pp"]
    previous = rank - stride if stage > 0 else None
    following = rank + stride if stage < sizes["pp"] - 1 else None
    return previous, following
    ### END SOLUTION


@dataclass(frozen=True)
class Grid:
    """Validated axis sizes of a consuming layout and every rank's groups (pure Python)."""

    world: int
    dp_replicate: int = 1
    dp_shard: int = -1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1
    order: tuple[str, ...] = DOC_ORDER

    def __post_init__(self) -> None:
        for name in ("world", *AXES, "ep", "etp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise GridError(f"{name} must be an int, got {value!r}")
        if self.world < 1:
            raise GridError(f"world = {self.world}: needs at least one rank")
        for name in ("dp_replicate", "cp", "tp", "pp", "ep", "etp"):
            if getattr(self, name) < 1:
                raise GridError(
                    f"{name} = {getattr(self, name)}: every degree but dp_shard is >= 1"
                )
        if self.dp_shard != -1 and self.dp_shard < 1:
            raise GridError(f"dp_shard = {self.dp_shard}: -1 (inferred) or >= 1")
        others = self.dp_replicate * self.cp * self.tp * self.pp
        if self.dp_shard == -1:
            object.__setattr__(self, "dp_shard", self.world // others)
            if self.dp_shard < 1:
                raise GridError(
                    f"dp_shard inferred as {self.world} // {others} = 0: dp_replicate x cp x tp x pp"
                    f" = {others} exceeds world = {self.world}"
                )
        product = others * self.dp_shard
        if product != self.world:
            raise GridError(
                f"dp_replicate({self.dp_replicate}) x dp_shard({self.dp_shard}) x cp({self.cp}) x "
                f"tp({self.tp}) x pp({self.pp}) = {product} != world = {self.world}"
            )
        if sorted(self.order) != sorted(AXES):
            raise GridError(f"order {self.order} must name each of {AXES} once")
        if self.ep > 1:
            self._validate_ep()
        strides, step = {}, 1
        for name in reversed(self.order):
            strides[name] = step
            step *= getattr(self, name)
        object.__setattr__(self, "_stride_table", strides)
        object.__setattr__(self, "_group_tables", {})

    def _validate_ep(self) -> None:
        if self.etp not in (self.tp, 1):
            raise GridError(f"etp = {self.etp}: expert tensor parallelism is tp ({self.tp}) or 1")
        borrowed = self.cp if self.etp == self.tp else self.cp * self.tp
        what = "cp" if self.etp == self.tp else "cp x tp"
        if self.ep % borrowed:
            raise GridError(f"ep = {self.ep} must be a multiple of {what} = {borrowed}")
        if (self.dp_shard * borrowed) % self.ep:
            raise GridError(
                f"ep = {self.ep} must divide dp_shard x {what} = {self.dp_shard * borrowed}"
            )

    # ------------------------------------------------------------------ sizes and coordinates
    def size(self, name: str) -> int:
        """The size of an axis or of a flattened group."""
        return len(self.group(0, name))

    @property
    def dp_shard_in_ep(self) -> int:
        """The part of dp_shard the ep group borrows."""
        borrowed = self.cp if self.etp == self.tp else self.cp * self.tp
        return self.ep // borrowed if self.ep > 1 else 1

    @property
    def sizes(self) -> dict[str, int]:
        """Every axis's size, by name."""
        return {name: getattr(self, name) for name in AXES}

    def coords(self, rank: int) -> dict[str, int]:
        """Rank -> one coordinate per axis (mixed radix, `order` outer -> inner)."""
        if not 0 <= rank < self.world:
            raise GridError(f"rank {rank} is outside world = {self.world}")
        place = rank_coordinates(rank, self.sizes, self.order)
        return {name: place[name] for name in AXES}

    def rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for name in self.order:
            rank = rank * getattr(self, name) + coords[name]
        return rank

    @property
    def _strides(self) -> dict[str, int]:
        """How far apart in global rank two ranks one step apart on each axis are."""
        return self._stride_table  # type: ignore[attr-defined]

    def _steps(self, name: str) -> tuple[tuple[int, int], ...]:
        """Group `name` as one (stride, size) per axis, outer first. dp_shard splits as
        (dp_shard_mod_ep, dp_shard_in_ep); ep = dp_shard_in_ep × cp (× tp when etp = 1)."""
        name = TORCHTITAN_NOW.get(name, name)
        strides, inner = self._strides, self.dp_shard_in_ep
        if name in AXES or name in FLATTENED:
            return tuple((strides[a], getattr(self, a)) for a in FLATTENED.get(name, (name,)))
        if name == "dp_shard_in_ep":
            return ((strides["dp_shard"], inner),)
        if name == "dp_shard_mod_ep":
            return ((strides["dp_shard"] * inner, self.dp_shard // inner),)
        if name == "ep":
            tail = ("cp",) if self.etp == self.tp else ("cp", "tp")
            spread = ((strides["dp_shard"], inner), *((strides[a], getattr(self, a)) for a in tail))
            return spread if self.ep > 1 else ()
        raise GridError(f"no group named {name!r}: {self.names()}")

    def _table(self, steps: tuple[tuple[int, int], ...]) -> list[tuple[int, ...]]:
        """Every rank's group, built once per grid: a group is its first rank plus fixed
        offsets, and the first rank not yet placed is the first of its group."""
        table = self._group_tables.get(steps)  # type: ignore[attr-defined]
        if table is None:
            offsets = [0]
            for stride, size in steps:
                offsets = [o + i * stride for o in offsets for i in range(size)]
            table = [()] * self.world
            for first in range(self.world):
                if not table[first]:
                    group = tuple(first + o for o in offsets)
                    for member in group:
                        table[member] = group
            self._group_tables[steps] = table  # type: ignore[attr-defined]
        return table

    def group(self, rank: int, name: str) -> tuple[int, ...]:
        """The global ranks of `rank`'s group `name`, in group-rank order."""
        if not 0 <= rank < self.world:
            raise GridError(f"rank {rank} is outside world = {self.world}")
        return self._table(self._steps(name))[rank]

    def names(self) -> list[str]:
        return [*AXES, *FLATTENED, "ep", "dp_shard_in_ep", "dp_shard_mod_ep"]

    def table(self, name: str) -> list[tuple[int, ...]]:
        """Every rank's group `name`, by global rank."""
        return list(self._table(self._steps(name)))

    def groups(self, name: str) -> list[tuple[int, ...]]:
        """Every group of `name`, each once, in order of its first rank."""
        return sorted(set(self.table(name)), key=min)

    def stride(self, name: str) -> int:
        """How many ranks apart neighbouring partners on axis `name` sit."""
        g = self.group(0, name)
        return g[1] - g[0] if len(g) > 1 else 0
