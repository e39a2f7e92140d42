"""Closed-form bytes one rank sends per step, per group and phase, from the axes' own formulas.

m micro-batches of b/m sequences of s/cp tokens each, hidden h: a micro-batch activation is
A = (b/m)·(s/cp)·h·itemsize. For the rank at pipeline stage k, which runs L/pp blocks:

| group | phase | bytes (per step) | from |
|---|---|---|---|
| tp | forward | m·(L/pp·2 all-reduces of A, + g of the embedding, + 3 of the loss) | `tp.costs` |
| tp | backward | m·(L/pp·2 all-reduces of A, + f of the head) | `tp.costs` |
| tp | grad sync | SP only: one all-reduce of the replicated gradients, flattened | `tp.costs` |
| cp | forward, backward | m·L/pp·(2, 4)·(cp-1)·S | `cp.costs.ring_bytes` |
| pp | forward, backward | m·A per boundary the stage feeds, each way (A/tp under SP) | `pp.costs` |
| dp_cp | token count | all-reduce of one int64 (the loss's global token count) | `tp.costs` |
| dp_shard_cp | grad sync, param gather | reduce-scatter, all-gather of the stage | `fsdp.costs` |
| dp_replicate | grad sync | all-reduce of the 1/N shard over the replicas | `fsdp.costs` |

The embedding's g is on the first stage; the head's f and the loss (3 all-reduces of
(b/m)·(s/cp) numbers) on the last. The table is TP without SP; under SP (at tp > 1, every row of
lab 10) each all-reduce becomes an all-gather and a reduce-scatter of the same bytes, and each
column linear re-gathers its saved shard in the backward (`tp_bytes`, `ends_bytes`).
S = (b/m)·(heads/tp)·(s/cp)·head_dim·itemsize, one of q, k, v. The stage's local parameters
are padded to a multiple of N = |dp_shard_cp|.

These are the bytes the algorithm needs at the API, in the ledger's cost model (ring
all-reduce 2(n-1)/n, ...), not what a backend moves on a wire.
"""

from __future__ import annotations

import dataclasses

import torch

from paralab.compose.grid import Grid
from paralab.compose.model import stage_blocks
from paralab.cp.costs import ring_bytes
from paralab.ep.costs import layer_bytes, split_matrix
from paralab.ep.model import MoEConfig
from paralab.fsdp.costs import ITEMSIZE, traffic_formula
from paralab.pp.costs import step_bytes_sent
from paralab.tp.costs import (
    all_gather_bytes,
    all_reduce_bytes,
    block_bytes,
    reduce_scatter_bytes,
)
from paralab.tp.model import LMConfig

PHASE_ORDER = ("token count", "forward", "backward", "grad sync", "param gather")
TOKEN_COUNT_BYTES = 8
"""The loss's global token count: one int64, all-reduced over dp_cp before the forward."""


def block_numel(config: LMConfig, tp: int) -> int:
    """One block's parameters on one tp rank: column/row shards, replicated norms and row biases."""
    h, f = config.hidden, config.ffn
    qkv = 3 * h * h // tp + 3 * h // tp
    proj = h * h // tp + h
    mlp = f * h // tp + f // tp + h * f // tp + h
    return qkv + proj + mlp + 4 * h


@dataclasses.dataclass(frozen=True)
class RankLayers:
    """What one pipeline rank runs: its blocks, and whether it holds the first stage (the
    embedding) and the last (the norm, the head, the loss)."""

    blocks: int
    first: bool
    last: bool


def rank_layers(config: LMConfig, pp_rank: int, pp: int, virtual: int = 1) -> RankLayers:
    """The layers of pipeline rank `pp_rank`, which runs stages pp_rank + k·pp (k < virtual)."""
    n = pp * virtual
    stages = [pp_rank + k * pp for k in range(virtual)]
    blocks = sum(len(stage_blocks(s, n, config.blocks)) for s in stages)
    return RankLayers(blocks, 0 in stages, n - 1 in stages)


def stage_numel(config: LMConfig, tp: int, layers: RankLayers) -> int:
    """The parameters one pipeline rank's stages hold on one tp rank."""
    n = layers.blocks * block_numel(config, tp)
    if layers.first:
        n += config.vocab // tp * config.hidden + config.seq * config.hidden
    if layers.last:
        n += 2 * config.hidden + config.vocab // tp * config.hidden
    return n


def group_phase_bytes(
    grid: Grid,
    rank: int,
    config: LMConfig,
    microbatches: int,
    itemsize: int = ITEMSIZE,
    reshard_after_forward: bool = False,
    sequence_parallel: bool = True,
    virtual: int = 1,
) -> dict[tuple[str, str], int]:
    """(group, phase) -> bytes this rank sends in one step (0-byte entries dropped); the stages
    gathered once (kept: FSDP under PP) or 2m times (`reshard_after_forward`); SP at tp > 1."""
    stage, m, tp, cp, pp = grid.coords(rank)["pp"], microbatches, grid.tp, grid.cp, grid.pp
    sequence_parallel, layers = (
        sequence_parallel and tp > 1,
        rank_layers(config, stage, pp, virtual),
    )
    rows, tokens, blocks = config.batch // m, config.seq // cp, layers.blocks
    a = rows * tokens * config.hidden * itemsize
    out: dict[tuple[str, str], int] = {}

    def add(group: str, phase: str, nbytes: int) -> None:
        if nbytes:
            out[(group, phase)] = out.get((group, phase), 0) + nbytes

    for phase, nbytes in tp_bytes(a, tp, m, layers, sequence_parallel, config, itemsize).items():
        add("tp", phase, nbytes)
    s = rows * (config.heads // tp) * tokens * config.head_dim * itemsize
    for phase, nbytes in ring_bytes(s, cp).items():
        add("cp", phase, m * blocks * nbytes)
    boundary = a // tp if sequence_parallel else a  # SP: the sequence shard
    owner = tuple(s % pp for s in range(pp * virtual))  # interleaved: stage s on rank s mod pp
    for phase, nbytes in step_bytes_sent(owner, m, boundary)[stage].items():
        add("pp", phase, nbytes)
    add("dp_cp", "token count", all_reduce_bytes(TOKEN_COUNT_BYTES, grid.size("dp_cp")))
    gathers, numel = 2 * m if reshard_after_forward else 1, stage_numel(config, tp, layers)
    for key, nbytes in data_parallel_bytes(grid, numel, itemsize, gathers).items():
        add(*key, nbytes)
    return out


def tp_bytes(
    a: int,
    tp: int,
    m: int,
    layers: RankLayers,
    sequence_parallel: bool,
    config: LMConfig,
    itemsize: int,
) -> dict[str, int]:
    """phase -> bytes over tp per step: m times each block's crossings (`tp.costs.block_bytes`)
    and the ends' (`ends_bytes`); under SP one flattened all-reduce of the replicated gradients."""
    out = {"forward": 0, "backward": 0}
    for (phase, _), (_, nbytes) in block_bytes(a, tp, sequence_parallel).items():
        out[phase] += m * layers.blocks * nbytes
    for phase, nbytes in ends_bytes(a, tp, layers, sequence_parallel, config.hidden).items():
        out[phase] += m * nbytes
    if sequence_parallel:
        out["grad sync"] = all_reduce_bytes(replicated_numel(config, layers) * itemsize, tp)
    return out


def ends_bytes(
    a: int, tp: int, layers: RankLayers, sequence_parallel: bool, hidden: int
) -> dict[str, int]:
    """phase -> bytes of the embedding's (first stage) and the head's (last) tp crossings per
    micro-batch: g and f without SP; with SP the embedding's reduce-scatter and its mirror, the
    head's all-gather, its mirror, and its re-gather of the saved shard (`tp.costs.step_bytes`);
    and the vocab-parallel loss's 3 all-reduces of one number per token (last stage)."""
    out = {"forward": 0, "backward": 0}
    if layers.last:
        out["forward"] += 3 * all_reduce_bytes(a // hidden, tp)
    if not sequence_parallel:
        out["forward"] += all_reduce_bytes(a, tp) if layers.first else 0
        out["backward"] += all_reduce_bytes(a, tp) if layers.last else 0
        return out
    if layers.first:
        out["forward"] += reduce_scatter_bytes(a, tp)
        out["backward"] += all_gather_bytes(a, tp)
    if layers.last:
        out["forward"] += all_gather_bytes(a, tp)
        out["backward"] += all_gather_bytes(a, tp) + reduce_scatter_bytes(a, tp)
    return out


def replicated_numel(config: LMConfig, layers: RankLayers) -> int:
    """The numbers of a rank's stages every tp rank holds whole: per block two norms and two row
    biases (6·hidden), the position table on the first stage, the final norm on the last."""
    n = layers.blocks * 6 * config.hidden
    n += config.seq * config.hidden if layers.first else 0
    return n + (2 * config.hidden if layers.last else 0)


def data_parallel_bytes(
    grid: Grid, numel: int, itemsize: int, gathers: int
) -> dict[tuple[str, str], int]:
    """HSDP's bytes for `numel` local parameters: the reduce-scatter over dp_shard_cp, the
    shard's all-reduce over dp_replicate, and `gathers` all-gathers (`fsdp.costs`)."""
    shard, replicas = grid.size("dp_shard_cp"), grid.dp_replicate
    dp = traffic_formula("fsdp", [numel], shard * replicas, replicas, False)
    scale = itemsize / ITEMSIZE
    return {
        ("dp_shard_cp", "grad sync"): round(dp["reduce_scatter_tensor"] * scale),
        ("dp_replicate", "grad sync"): round(dp.get("all_reduce", 0) * scale),
        ("dp_shard_cp", "param gather"): gathers * round(dp["all_gather_into_tensor"] * scale),
    }


def mlp_bytes(a: int, tp: int, sequence_parallel: bool) -> dict[str, int]:
    """phase -> one dense MLP's tp bytes per micro-batch: f and g; under SP the up linear's
    all-gather, its mirror and its re-gather, and the down linear's reduce-scatter and mirror."""
    if not sequence_parallel:
        return {"forward": all_reduce_bytes(a, tp), "backward": all_reduce_bytes(a, tp)}
    gather, scatter = all_gather_bytes(a, tp), reduce_scatter_bytes(a, tp)
    return {"forward": gather + scatter, "backward": scatter + 2 * gather}


def moe_layer_tp_bytes(a: int, tp: int, sequence_parallel: bool) -> dict[str, int]:
    """phase -> an MoE layer's own tp bytes per micro-batch, its experts' f and g aside: under SP
    the all-gather of the tokens in front (backward: a split, no bytes) and the all-gather of the
    gradient behind (forward: a split); nothing without SP."""
    if not sequence_parallel:
        return {}
    return {"forward": all_gather_bytes(a, tp), "backward": all_gather_bytes(a, tp)}


def moe_group_phase_bytes(
    grid: Grid,
    rank: int,
    config: LMConfig,
    moe: MoEConfig,
    group_send_counts: list[list[list[torch.Tensor]]],
    itemsize: int = ITEMSIZE,
) -> dict[tuple[str, str], int]:
    """The MoE model's bytes (cp = 1, SP at tp > 1, m = `default` micro-batches), from routed
    counts.

    `group_send_counts[i][b][k]`: the (E,) rows rank i of this rank's ep group sends each expert
    in block b of its stage, micro-batch k. The dense formula, less each block's MLP crossings on
    tp (`mlp_bytes`), plus the MoE layer's (`moe_layer_tp_bytes`: under SP it gathers the tokens
    in front and all-gathers the gradient behind); per block and micro-batch, the ep layer's
    count exchange, dispatch and combine (`ep.costs.layer_bytes`) and, for each local expert,
    the f and g of its R rows over tp (R·h numbers); SP's replicated gradients without the
    MLP's row bias (the MoE layer's saw every token); the dense parameters over dp_shard_cp,
    the local experts' over dp_shard_mod_ep."""
    if grid.cp > 1:
        raise ValueError("the MoE formula covers cp = 1")
    tp, ep, experts, h, pp = grid.tp, grid.ep, moe.experts, config.hidden, grid.pp
    m = 2 * pp if pp > 1 else 1
    sequence_parallel = tp > 1
    out = group_phase_bytes(grid, rank, config, m, itemsize, sequence_parallel)
    a = config.batch // m * config.seq * h * itemsize
    me = grid.group(rank, "ep").index(rank)
    local = experts // ep
    layers = rank_layers(config, grid.coords(rank)["pp"], pp)
    for key in [k for k in out if k[0] in ("dp_shard_cp", "dp_replicate")]:
        del out[key]

    def add(group: str, phase: str, nbytes: int) -> None:
        out[(group, phase)] = out.get((group, phase), 0) + nbytes
        if not out[(group, phase)]:
            del out[(group, phase)]

    for phase, nbytes in mlp_bytes(a, tp, sequence_parallel).items():
        add("tp", phase, -m * layers.blocks * nbytes)
    for phase, nbytes in moe_layer_tp_bytes(a, tp, sequence_parallel).items():
        add("tp", phase, m * layers.blocks * nbytes)
    if sequence_parallel:
        replicated = replicated_numel(config, layers) - layers.blocks * h  # no MLP row bias
        out[("tp", "grad sync")] = all_reduce_bytes(replicated * itemsize, tp)
    for block in range(layers.blocks):
        for k in range(m):
            counts = [sent[block][k] for sent in group_send_counts]
            calls = layer_bytes(split_matrix(counts, ep), me, h, experts)
            for call, nbytes in calls.items():
                add("ep", "backward" if "backward" in call else "forward", nbytes)
            for j in range(local):
                rows = sum(int(c[me * local + j]) for c in counts)
                for phase in ("forward", "backward"):
                    add("tp", phase, all_reduce_bytes(rows * h * itemsize, tp))
    mlp = config.ffn * h // tp + config.ffn // tp + h * config.ffn // tp + h
    expert = moe.hidden * h // tp + moe.hidden // tp + h * moe.hidden // tp + h
    dense = stage_numel(config, tp, layers) - layers.blocks * (mlp - experts * h)  # + the gate
    units = (
        ("dp_shard_cp", dense, grid.size("dp_shard_cp")),
        ("dp_shard_mod_ep", layers.blocks * local * expert, grid.size("dp_shard_mod_ep")),
    )
    replicas = grid.dp_replicate
    for group, numel, shard in units:
        dp = traffic_formula("fsdp", [numel], shard * replicas, replicas, False)
        add(group, "grad sync", dp["reduce_scatter_tensor"])
        add("dp_replicate", "grad sync", dp.get("all_reduce", 0))
        add(group, "param gather", dp["all_gather_into_tensor"])
    return out


def per_group(
    grid: Grid,
    config: LMConfig,
    microbatches: int,
    itemsize: int = ITEMSIZE,
    reshard_after_forward: bool = False,
):
    """group -> the most bytes any one rank sends over it in a step (its heaviest member)."""
    out: dict[str, int] = {}
    for rank in range(grid.world):
        totals: dict[str, int] = {}
        for (group, _), nbytes in group_phase_bytes(
            grid, rank, config, microbatches, itemsize, reshard_after_forward
        ).items():
            totals[group] = totals.get(group, 0) + nbytes
        for group, nbytes in totals.items():
            out[group] = max(out.get(group, 0), nbytes)
    return out
