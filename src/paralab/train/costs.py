"""Closed-form bytes each rank sends per training step, by group (dp_shard, dp_replicate, cp) and phase.

Notation: n = dp_shard, r = dp_replicate, L = blocks. FSDP2 cuts every parameter on
dim 0 after padding it to a multiple of n, so a unit's shard on one rank holds
B_u = sum over its parameters of ceil(dim0 / n) * (other dims) * 8 bytes.
Units: every block, and the root (embedding, positions, noise level, final norm, head).

| group | forward | backward | recompute |
|---|---|---|---|
| dp_shard | all-gather every unit: sum_u (n-1) B_u | all-gather the blocks again (the root stays gathered) + reduce-scatter every unit's gradient: sum_blocks (n-1) B_u + sum_u (n-1) B_u | 0 |
| dp_replicate | 0 | all-reduce every unit's gradient shard: sum_u 2(r-1)/r B_u | 0 |
| cp | L x attention forward (lab 02: ring 2(cp-1)S, Ulysses 4(cp-1)S/cp) | L x attention backward | full AC: L x attention forward again; none / selective: 0 |

S = one rank's shard of one of q, k, v (`paralab.cp.shard_bytes`).
"""  # noqa: E501 - table rows, one line each

from __future__ import annotations

import math

from torch import nn

from paralab.cp.costs import ring_bytes, shard_bytes, ulysses_bytes
from paralab.train.model import SHAPE, build_model

PHASES = ("forward", "backward", "recompute")
GROUPS = ("dp_shard", "dp_replicate", "cp")


def unit_shapes(model: nn.Module | None = None) -> list[list[tuple[int, ...]]]:
    """Parameter shapes per FSDP unit: [root, block 0, block 1, ...]."""
    model = model or build_model()
    blocks = [[tuple(p.shape) for p in block.parameters()] for block in model.blocks]
    in_blocks = {id(p) for block in model.blocks for p in block.parameters()}
    root = [tuple(p.shape) for p in model.parameters() if id(p) not in in_blocks]
    return [root, *blocks]


def shard_bytes_of_unit(shapes: list[tuple[int, ...]], n: int, itemsize: int = 8) -> int:
    """B_u: one rank's padded shard of a unit."""
    return sum(math.ceil(s[0] / n) * math.prod(s[1:]) * itemsize for s in shapes)


def attention_bytes(attention: str, cp: int, batch: int = 1) -> dict[str, int]:
    s = shard_bytes(batch, SHAPE["heads"], SHAPE["tokens"], SHAPE["dim"] // SHAPE["heads"], cp)
    return ring_bytes(s, cp) if attention == "ring" else ulysses_bytes(s, cp)


def training_step_bytes(
    dp_shard_size: int,
    dp_replicate_size: int,
    cp: int,
    attention: str = "ring",
    ac: str = "none",
    units: list[list[tuple[int, ...]]] | None = None,
) -> dict[tuple[str, str], int]:
    """{(group, phase): bytes one rank sends per step}, for every group and phase in the table above.

    `units`: the parameter shapes of each FSDP unit, the root first, then one entry per block
    (`unit_shapes`); `attention_bytes` and `shard_bytes_of_unit` give the per-call sizes.
    """
    units = units or unit_shapes()
    ### BEGIN SOLUTION
    n, r, blocks = dp_shard_size, dp_replicate_size, len(units) - 1
    b = [shard_bytes_of_unit(u, n) for u in units]
    out = {(g, p): 0 for g in GROUPS for p in PHASES}
    out["dp_shard", "forward"] = sum((n - 1) * bu for bu in b)
    out["dp_shard", "backward"] = sum((n - 1) * bu for bu in b[1:]) + sum((n - 1) * bu for bu in b)
    out["dp_replicate", "backward"] = sum(2 * (r - 1) * bu // r for bu in b)
    if cp > 1:
        per_block = attention_bytes(attention, cp)
        out["cp", "forward"] = blocks * per_block["forward"]
        out["cp", "backward"] = blocks * per_block["backward"]
        out["cp", "recompute"] = blocks * per_block["forward"] if ac == "full" else 0
    return out
    ### END SOLUTION


def measured_step_bytes(
    records, rank: int, parallel_dims, steps: int
) -> dict[tuple[str, str], int]:
    """The ledger's bytes per step in the same (group, phase) cells: groups named by `predict_groups`."""
    from paralab.parallel_dims import predict_groups

    groups = {
        axis: tuple(ranks)
        for axis, ranks in predict_groups(parallel_dims, rank).items()
        if axis in GROUPS
    }
    names = {ranks: axis for axis, ranks in groups.items()}
    if len(names) < len(groups):
        raise ValueError(
            f"rank {rank}: two axes share one group {groups}; the ledger cannot tell them apart"
        )
    out = {(g, p): 0 for g in GROUPS for p in PHASES}
    for rec in records:
        if rec.phase in PHASES and rec.group_ranks in names:
            out[names[rec.group_ranks], rec.phase] += rec.bytes_sent
        elif rec.phase in PHASES:
            raise ValueError(
                f"rank {rank}: a {rec.op} on group {rec.group_ranks} belongs to no dp/cp group"
            )
    return {k: v // steps for k, v in out.items()}
