# %% [markdown]
# # Lab 10 — All the training axes on one set of ranks: world = DP × CP × TP × PP (EP on DP × TP)
#
# **You will learn** how one descriptor gives every rank its place when every training axis
# consumes ranks (`world = dp_replicate · dp_shard · cp · tp · pp`); why the doc group lays
# them out inner → outer TP → CP → PP → DP and torchtitan pp outermost; how the tensor-,
# context-, pipeline- and data-parallel code of labs 01, 02, 07 and 08 (and lab 09's experts)
# runs together in one training step, nothing re-implemented; which group carries the most
# bytes, at this lab's toy size and at Llama-3-8B's; and why TP outermost computes the same
# bits but is the wrong layout on real hardware. **Prerequisites:** labs 07 (tensor parallelism), 08
# (pipelines), 02 (the ring), 01 (FSDP, HSDP) and 09 (experts). **Time:** about 40 minutes to
# read; the run time of this notebook is printed by its last cell.
#
# **Two readings of the same ranks.** Lab 00's `ParallelDims` (and Cosmos's) reads cp as an
# *overlay*: the dp ranks grouped a second time. That works because cp partners hold the
# **same** parameters. tp and pp partners hold **different** parameters (a column of a
# weight, a later stage), so they cannot be two dp ranks at once: they must **consume**
# ranks. torchtitan's `ParallelDims` consumes a rank for every axis, cp included; so does
# this lab's `Grid`:
#
#     world = dp_replicate × dp_shard × cp × tp × pp    (ep reuses dp_shard × cp, × tp when etp = 1)
#     rank layout, inner -> outer:  TP -> CP -> PP -> DP
#
# | axis | what its partners hold | what travels | how often |
# |---|---|---|---|
# | tp | different columns of every weight | every activation, all-gathered and reduce-scattered over the sequence (SP) | per block per micro-batch the bytes of 4 all-reduces, plus 2 re-gathers, on the critical path |
# | cp | the same weights, other tokens | the other ranks' K/V: all-gathered by torch's and torchtitan's default (`context_parallel_rotate_method = "allgather"`), passed round lab 02's ring here | per attention |
# | pp | different layers | one activation per boundary, cut by tp under SP | per micro-batch, point to point |
# | dp (dp_shard × dp_replicate) | the same weights (sharded), other samples | gradients; FSDP's parameter all-gathers | gradients once per step; FSDP gathers per micro-batch unless the parameters stay gathered (torchtitan's choice under PP) |

# %%
import time

import torch
from IPython.display import Markdown, display

from paralab import viz
from paralab.check import claim, summary, verdict_table
from paralab.compose import DOC_ORDER, TORCHTITAN_ORDER, TP_OUTERMOST, Grid, GridError
from paralab.compose.bridge import from_overlay, to_overlay
from paralab.compose.costs import group_phase_bytes, per_group
from paralab.compose.grid import pipeline_neighbours, rank_coordinates
from paralab.compose.model import CONFIG, stage_blocks
from paralab.compose.runs import (
    check_bytes,
    check_params,
    compose_worker,
    cross_node_bytes,
    describe,
    measured_bytes,
    padded_batch,
    rows_worker,
)
from paralab.exercises.lab10 import replica_setup
from paralab.launch import run
from paralab.parallel_dims import ParallelDims, predict_groups
from paralab.scale.hardware import hardware
from paralab.scale.plan import MODELS, plan_train
from paralab.scale.plan import describe as describe_layout
from paralab.tables import text_table
from paralab.tp.model import LMConfig, build_model
from paralab.tp.runs import sample_rows
from paralab.viz import show

LAB_START = time.monotonic()
print(CONFIG)

# %% [markdown]
# ## 1. The descriptor: every axis consumes ranks
#
# A rank's place is one coordinate per axis, read off its global rank in mixed radix with the
# axes in `order` (outer → inner). A group is the ranks that agree on every other axis;
# flattened groups are named as torchtitan names them: `dp` (which sample a rank loads),
# `dp_shard_cp` (the FSDP group: cp partners hold the same parameters), `dp_cp` (the loss and
# gradient-mean group), and `ep` carved from dp_shard × cp (`dp_shard = dp_shard_mod_ep ×
# dp_shard_in_ep`).
#
# A rank's coordinates are its global rank written in mixed radix: the innermost axis is the
# last digit, so it varies fastest.

# %%
# show: paralab.compose.grid.rank_coordinates

# %% [markdown]
# **Predict** before running: on 16 ranks with dp_replicate 2 × cp 2 × tp 2 × pp 2, what are
# rank 5's coordinates in the doc group's order (inner → outer TP → CP → PP → DP), and in
# torchtitan's (pp outermost)?

# %%
GRID16 = Grid(16, dp_replicate=2, cp=2, tp=2, pp=2, order=DOC_ORDER)
for order, label in ((DOC_ORDER, "doc group"), (TORCHTITAN_ORDER, "torchtitan")):
    print(f"{label:>10}: rank 5 ->", rank_coordinates(5, GRID16.sizes, order))

# %% [markdown]
# 5 = 0·8 + 1·4 + 0·2 + 1 in the doc group's order: tp 1, cp 0, pp 1, dp_replicate 0. In
# torchtitan's the same digits, with pp and dp_replicate swapped. A pipeline stage's
# neighbour agrees with it on every other axis, so it is one pp step away: as many ranks as
# every axis inside pp holds together.

# %%
# show: paralab.compose.grid.pipeline_neighbours

# %% [markdown]
# **Predict:** on the same grid in the doc group's order, which ranks hand rank 5 its
# activations, and receive them from it? And on a 24-rank grid with dp_shard 2 × tp 4 × pp 3,
# who are rank 6's?

# %%
UNEVEN = Grid(24, dp_shard=2, tp=4, pp=3, order=DOC_ORDER)
print("16 ranks, rank 5: (previous, next) =", pipeline_neighbours(5, GRID16.sizes, DOC_ORDER))
print("24 ranks, rank 6: (previous, next) =", pipeline_neighbours(6, UNEVEN.sizes, DOC_ORDER))

# %% [markdown]
# Rank 5 is on the last of two stages: its previous stage is rank 1, four ranks back (tp 2 ×
# cp 2 inside pp), and nothing follows it. On 24 ranks rank 6 is on the middle stage, 4 ranks
# (tp 4) from each neighbour. `Grid` validates the sizes and lists every group the same way:
# a group is its first rank plus fixed offsets, one stride per step on each of its axes.

# %%
# show: paralab.compose.grid.Grid._steps

# %%
# show: paralab.compose.grid.Grid._table paralab.compose.grid.Grid.group

# %% jupyter={"source_hidden": true}
# show: paralab.compose.grid.Grid

# %% [markdown]
# **Predict** before running: on the 16-rank grid, in the doc group's order, who are rank
# 5's tp, cp, pp and dp_replicate partners? How far apart are partners on each axis?

# %%
print("rank 5:", GRID16.coords(5))
print({name: GRID16.group(5, name) for name in ("tp", "cp", "pp", "dp_replicate", "dp_cp")})
rows = []
for order, label in (
    (DOC_ORDER, "doc group"),
    (TORCHTITAN_ORDER, "torchtitan"),
    (TP_OUTERMOST, "tp outermost"),
):
    g = Grid(16, dp_replicate=2, cp=2, tp=2, pp=2, order=order)
    rows.append(
        [label, " -> ".join(reversed(order))]
        + [g.stride(a) for a in ("tp", "cp", "pp", "dp_replicate")]
    )
print(text_table(["layout", "inner -> outer", "tp", "cp", "pp", "dp_replicate"], rows))

# %% [markdown]
# The doc group and torchtitan agree up to pp and dp: torchtitan puts pp **outermost**
# (`pp, dp_replicate, dp_shard, cp, tp`, outer first), the doc group dp. Each has its reason.
# torchtitan's pipeline crosses the slowest links: its P2P is small and infrequent, and with
# pp outermost each pipeline stage is a contiguous block of nodes that can hold the whole
# data-parallel job of one stage. The doc group puts DP outermost because its gradient
# traffic comes once per step, after the last micro-batch's backward (overlapping at most that
# backward: torch's pipeline stage reduces FSDP's gradients once every micro-batch's backward
# has run, and this lab's step reduce-scatters after the pipeline), so it tolerates the slowest
# link best (FSDP's parameter all-gathers come per micro-batch, unless the parameters stay
# gathered across micro-batches: torchtitan's default under PP); PP then sits between CP and
# DP. Both keep TP innermost, on NVLink.
#
# **Validation names the axis.** Every rule below is torchtitan's (re-expressed and tested
# on every factorisation of every world up to 64 ranks in `tests/test_compose_grid.py`: the
# same accept/reject decision and, in torchtitan's order, every rank's groups the same lists).

# %%
rule_checks = []
for sizes, word in (
    (dict(cp=0), "cp"),
    (dict(dp_shard=0), "dp_shard"),
    (dict(tp=3), "world"),
    (dict(tp=2, ep=2, etp=4), "etp"),
    (dict(cp=2, ep=3), "ep = 3"),
):
    try:
        Grid(8, **sizes)
        message = "accepted"
    except GridError as exc:
        message = str(exc)
    rule_checks.append(
        claim(f"Grid(8, {sizes}) rejected, naming {word!r}", word in message, message)
    )
print(verdict_table(rule_checks, "validation"))

# %% [markdown]
# **The bridge to Cosmos.** An overlay `ParallelDims(world, dp_shard=S, cp=C)` (lab 00) is the
# consuming `Grid(world, dp_replicate=world/S, dp_shard=S/C, cp=C)`: the overlay's dp_shard
# group is Grid's `dp_shard_cp`, its cp group Grid's cp. **Predict:** which of these has no
# bridge, and why: `ParallelDims(8, dp_shard=1, cp=2)`, `Grid(8, tp=2)`?

# %%
# show: paralab.compose.bridge.from_overlay paralab.compose.bridge.to_overlay

# %%
overlay = ParallelDims(8, dp_shard=4, cp=2)
bridged = from_overlay(overlay)
same = all(
    list(bridged.group(r, ours)) == predict_groups(overlay, r)[theirs]
    for r in range(8)
    for theirs, ours in (
        ("cp", "cp"),
        ("dp_shard", "dp_shard_cp"),
        ("dp_replicate", "dp_replicate"),
    )
)
bridge_checks = [
    claim(
        "ParallelDims(8, dp_shard=4, cp=2) -> Grid: the same cp, FSDP and replica groups",
        same,
        f"Grid(dp_replicate={bridged.dp_replicate}, dp_shard={bridged.dp_shard}, cp={bridged.cp})",
    )
]
for label, attempt in (
    (
        "ParallelDims(8, dp_shard=1, cp=2) -> Grid",
        lambda: from_overlay(ParallelDims(8, dp_shard=1, cp=2)),
    ),
    ("Grid(8, tp=2) -> ParallelDims", lambda: to_overlay(Grid(8, tp=2))),
):
    try:
        attempt()
        message = "bridged"
    except GridError as exc:
        message = str(exc)
    bridge_checks.append(claim(f"{label}: no bridge", message != "bridged", message))
print(verdict_table(bridge_checks, "the bridge"))

# %% [markdown]
# ## 2. Every rank's place
#
# **Predict:** in the picture below each row is one node of 8 GPUs. Which axes' groups stay
# inside a row (a node), and which cross between the two rows?

# %%
show(viz.plot_rank_places(GRID16))

# %% [markdown]
# tp, cp and pp groups stay inside a node; only dp_replicate partners are 8 ranks apart, on
# the other node.
#
# ## 3. One step, every axis from its own package
#
# The model is lab 07's `TinyLM` (float64, 2 blocks, 4 heads, hidden 16, 8 tokens, 4
# sequences per sample), cut three ways: `tp.model.tensor_parallel` over tp **with sequence
# parallelism** (SP, as Megatron composes TP with PP: between the tp regions each tp rank holds
# 1/tp of the tokens, so a pipeline boundary sends that shard); each attention's `attend`
# swapped for lab 02's `ring_attention` on zigzag shards over cp; by depth into `LMStage`s over
# pp. Under SP a norm's or a row bias's gradient saw only this rank's tokens: after the
# pipeline they are summed over tp in one flattened all-reduce. The step counts the tokens every data-parallel rank holds (one
# all-reduce of one int64 over `dp_cp`), runs lab 08's 1F1B executor (m = 2·pp), its messages
# addressed to the global ranks of the pp group, then reduce-scatters the gradient **sum** over
# `dp_shard_cp` and all-reduces it over `dp_replicate` (HSDP), takes the SGD step on the 1/N
# shard, and all-gathers (ZeRO-2: gradients and the step sharded, the parameters whole between
# steps).
#
# **The loss over the global token count.** Real batches are padded: a target of -100 counts
# for nothing, so ranks hold unequal numbers of counted tokens. torchtitan counts them on every
# rank, sums the count over the data-parallel ranks (`global_valid_tokens`), divides each
# rank's *summed* cross-entropy by it, and sums the gradients (its FSDP divide factor is 1):
# the mean over every counted token of the global batch. This lab's batch is padded so: sample
# d's sequences end in d + 1 ignored targets.

# %%
# show: paralab.compose.model.LMStage paralab.compose.model.context_parallel

# %%
# show: paralab.compose.runs.padded_batch paralab.compose.runs.global_token_count

# %%
# show: paralab.compose.model.microbatch_lm_loss

# %%
# show: paralab.compose.runs.sum_scatter_grads

# %% [markdown]
# **Predict:** two samples hold 28 and 24 counted tokens. Is the mean of the two samples' mean
# losses the mean over all 52 tokens? One process answers, on the lab's model:

# %%
ids2, targets2 = padded_batch(2, 0)
one = build_model(0, CONFIG)
counted = [int((targets2[sample_rows(d, CONFIG)] != -100).sum()) for d in range(2)]
with torch.no_grad():
    means = [
        one.loss(ids2[sample_rows(d, CONFIG)], targets2[sample_rows(d, CONFIG)]) for d in range(2)
    ]
    global_mean = one.loss(ids2, targets2)
print("counted tokens per sample:", counted)
print(f"mean of per-sample means {float(sum(means) / 2):.6f}, global mean {float(global_mean):.6f}")

# %% [markdown]
# They differ as soon as the counts do, and so do their gradients. Every row below runs the
# global count; `tests/test_compose_runs.py` runs the 8-rank dp_shard 2 × cp 2 × tp 2 row with
# each rank's loss over its own count times the ranks (`paralab.exercises.lab10.per_rank_means`)
# and the element-wise check fails it.

# %%
# show: paralab.compose.runs.fsdp_groups

# %%
# show: paralab.compose.runs.one_step

# %% [markdown]
# ## 4. Four rows on real ranks, element by element
#
# **Predict** before running: each row trains 2 SGD steps and gathers the full parameters on
# every rank. One process trains the same model on the global batch (one sample of 4
# sequences per dp rank). Do they agree to rounding (1e-12 of each tensor's scale)? Is every
# rank's copy bitwise the same?

# %%
ROWS = {
    "dp 2 x tp 2 x pp 2": Grid(8, dp_shard=2, tp=2, pp=2),
    "dp_shard 2 x cp 2 x tp 2": Grid(8, dp_shard=2, cp=2, tp=2),
    "dp 2 x cp 2 x tp 2 x pp 2": GRID16,
}
MOE_GRID = Grid(8, dp_shard=4, tp=2, ep=2, etp=2)
MOE_PP_GRID = Grid(8, dp_shard=2, tp=2, pp=2, ep=2, etp=2)
PP8 = ROWS["dp 2 x tp 2 x pp 2"]
EIGHT = [  # every 8-rank row of this lab in one launch; sections 4 and 5 read the later ones
    ("compose", PP8, {}),
    ("compose", ROWS["dp_shard 2 x cp 2 x tp 2"], {}),
    ("moe", MOE_GRID, {}),
    ("compose", PP8, {"virtual": 2}),
    ("moe", MOE_PP_GRID, {}),
    ("compose", PP8, {"reshard_after_forward": True}),
]
per_rank = run(rows_worker, 8, EIGHT, timeout=240)
PP_ROW, CP_ROW, MOE, INTERLEAVED, MOE_PP, RESHARD = (list(r) for r in zip(*per_rank))
RESULTS = {
    "dp 2 x tp 2 x pp 2": PP_ROW,
    "dp_shard 2 x cp 2 x tp 2": CP_ROW,
    "dp 2 x cp 2 x tp 2 x pp 2": run(compose_worker, 16, GRID16, timeout=120),
}
row_verdicts = [
    summary(
        f"{describe(grid)}: parameters after 2 steps",
        check_params([p for p, _ in RESULTS[label]], grid),
    )
    for label, grid in ROWS.items()
]
row_verdicts.append(
    summary(
        "8 ranks: MoE dp_shard 4 x tp 2, ep 2 carved from dp: parameters after 2 steps",
        check_params([p for p, _, _ in MOE], MOE_GRID, moe=True),
    )
)
print(verdict_table(row_verdicts, "the rows"))
print(
    "MoE ep groups:",
    MOE_GRID.groups("ep"),
    " experts replicated over:",
    MOE_GRID.groups("dp_shard_mod_ep"),
)

# %% [markdown]
# In the MoE row the experts are tensor-parallel (etp = tp, torchtitan's ETP=TP) and split
# over the ep group `{0, 2}`: two dp_shard ranks with the same tp coordinate. Each expert's
# gradient already sums the tokens of its ep group (combine's backward brought them). A mean
# would divide by all of `dp_cp`, ep included, not by the reduce-scatter's group alone (lab
# 09's lesson); with the loss already over the global token count the reduction is a plain sum
# over `dp_shard_mod_ep` and nothing is divided. `tests/test_compose_runs.py` reduces the
# experts like the dense weights instead, and the check fails.
#
# **MoE under SP.** The MoE rows run TP with SP like the dense rows, but an MoE layer cannot
# take a sequence shard: its router is replicated and its experts are cut over tp, so every tp
# rank must route the same tokens and compute its slice of the same rows. The layer gathers the
# tp group's tokens in front and keeps this rank's shard of its output behind. **Predict:** is
# the gather's backward a reduce-scatter, as inside SP's column linear?
#
# <details><summary>Answer</summary>
#
# No. Every tp rank ran the whole layer on the same tokens, so the gradient that comes back to
# the gather is already the whole one, the same on every rank: a reduce-scatter would add up tp
# equal copies. Its backward keeps this rank's shard: Megatron's
# `_GatherFromSequenceParallelRegion` with `tensor_parallel_output_grad=False`, the flag lab
# 07's first chapter reads. For the same reason the layer's router and expert biases stay out
# of SP's gradient sum over tp (`saw_every_token`). `tests/test_compose_runs.py` puts the
# reduce-scatter back, then sums those gradients over tp, and the check fails each time.
# </details>
#
# Megatron goes the other way round: each tp rank routes its own tokens, and the token
# dispatcher gathers them over the expert tp group after the ep all-to-all and reduce-scatters
# them after the experts (`MoEAlltoAllTokenDispatcher`,
# NVIDIA/Megatron-LM@d98e8a64:megatron/core/transformer/moe/token_dispatcher.py). Gathering in
# front of the router runs lab 09's layer unchanged, at the price of routing every token on
# every tp rank.

# %%
# show: paralab.compose.moe.MoEMLP.forward

# %% jupyter={"source_hidden": true}
# show: paralab.tp.mappings.GatherToDuplicated paralab.tp.mappings.ScatterToSP

# %% [markdown]
# **Two more rows: interleaved PP, and MoE on a pipeline.** Interleaved 1F1B (lab 08) gives
# each pipeline rank v = 2 stages. Four stages of this 2-block model count the embedding and the
# head as one layer each (Megatron's `account_for_embedding_in_pipeline_split` and
# `account_for_loss_in_pipeline_split`): stages [embedding], [block 0], [block 1], [norm, head],
# pipeline rank 0 holding stages 0 and 2. On a pipeline an MoE layer of stage 0 has an aux loss
# the last stage's loss never sees. Megatron's `MoEAuxLossAutoScaler`
# (NVIDIA/Megatron-LM@d98e8a64:megatron/core/transformer/moe/moe_utils.py) passes the layer's
# output through unchanged and, in the backward, hands the aux loss its gradient: a scale its
# schedule sets to `loss_scale * cp_size_for_scaling / num_microbatches`
# (NVIDIA/Megatron-LM@d98e8a64:megatron/core/pipeline_parallel/schedules.py; with
# `calculate_per_token_loss` it keeps `loss_scale`). Here the scale is aux_coef / (m · |dp_cp|),
# the gradients being summed over dp_cp. **Predict:** does either row still equal one process?

# %%
# show: paralab.compose.moe.AuxLossAutoScaler

# %%
# show: paralab.compose.runs.aux_loss_grad

# %% [markdown]
# **Predict** before the next run: the interleaved row cuts this model's 2 blocks into 4
# stages. Which blocks does each stage run, once the embedding and the head each count as a
# layer? `stage_blocks` decides it for every row of this lab.

# %%
# show: paralab.compose.model.stage_blocks

# %%
more = [
    summary(
        "8 ranks: interleaved 1F1B, dp 2 x tp 2 x pp 2, v = 2: parameters after 2 steps",
        check_params([p for p, _ in INTERLEAVED], ROWS["dp 2 x tp 2 x pp 2"]),
    ),
    summary(
        "8 ranks: MoE dp_shard 2 x tp 2 x pp 2, ep 2, m = 4: parameters after 2 steps",
        check_params([p for p, _, _ in MOE_PP], MOE_PP_GRID, moe=True),
    ),
]
print(verdict_table(more, "interleaved PP and MoE on a pipeline"))
print("blocks of stages 0-3:", [list(stage_blocks(s, 4, CONFIG.blocks)) for s in range(4)])

# %% [markdown]
# `tests/test_compose_runs.py` drops the 1/m from the aux gradient and the check fails; the
# bytes of both rows equal the closed form on every rank (next section).
#
# ## 5. Bytes per group and phase = the closed form
#
# **Predict:** in the 16-rank row, which group does the heaviest rank send the most bytes
# over in one step: tp, cp, pp, dp_shard_cp or dp_replicate? The closed form builds on each
# axis's own `costs.py`; the MoE row's (`moe_group_phase_bytes`) reads the routed counts, as
# lab 09's does, since the all-to-alls and the experts' tp all-reduces move what the router
# sent:

# %%
# show: paralab.compose.costs.group_phase_bytes

# %%
# show: paralab.compose.costs.tp_bytes paralab.compose.costs.data_parallel_bytes

# %%
bytes_verdicts = [
    summary(
        f"{describe(grid)}: ledger = formula, every rank",
        check_bytes([r for _, r in RESULTS[label]], grid),
    )
    for label, grid in ROWS.items()
]
bytes_verdicts.append(
    summary(
        "8 ranks: MoE dp_shard 4 x tp 2, ep 2: ledger = formula from the routed counts, every rank",
        check_bytes([r for _, r, _ in MOE], MOE_GRID, send_counts=[c for _, _, c in MOE]),
    )
)
per_phase = measured_bytes(RESULTS["dp 2 x cp 2 x tp 2 x pp 2"][0][1], GRID16, 0)
shard = CONFIG.batch // 4 * CONFIG.seq // (GRID16.cp * GRID16.tp) * CONFIG.hidden * 8
bytes_verdicts.append(
    claim(
        "16 ranks: rank 0's pipeline sends are m sequence shards, 1/tp of the activation (SP)",
        per_phase[("pp", "forward")] == 4 * shard,
        f"{per_phase[('pp', 'forward')]} B = 4 x {shard} B",
    )
)
moe_shard = CONFIG.batch // 4 * CONFIG.seq // MOE_PP_GRID.tp * CONFIG.hidden * 8
moe_sends = measured_bytes(MOE_PP[0][1], MOE_PP_GRID, 0)[("pp", "forward")]
bytes_verdicts += [
    summary(
        "8 ranks: interleaved, v = 2: ledger = formula, every rank",
        check_bytes([r for _, r in INTERLEAVED], ROWS["dp 2 x tp 2 x pp 2"], virtual=2),
    ),
    summary(
        "8 ranks: MoE on a pipeline: ledger = formula from the routed counts, every rank",
        check_bytes([r for _, r, _ in MOE_PP], MOE_PP_GRID, send_counts=[c for _, _, c in MOE_PP]),
    ),
    claim(
        "8 ranks: MoE on a pipeline: rank 0's pipeline sends are m sequence shards (SP)",
        moe_sends == 4 * moe_shard,
        f"{moe_sends} B = 4 x {moe_shard} B",
    ),
]
print(verdict_table(bytes_verdicts, "bytes per group and phase"))

# %%
print(
    text_table(
        ["group", "phase", "rank 0 sent (B)"],
        [[g, p, b] for (g, p), b in sorted(per_phase.items()) if b],
    )
)

# %% [markdown]
# These are the modelled bytes at the API (ring all-reduce 2(n−1)/n·S, ...), counted by the
# ledger, not what gloo moves. The same formulas at a real size: Llama-3-8B's shapes (hidden
# 4096, 32 heads, ffn 14336, 32 blocks, vocabulary 128256), sequence 8192, bf16, one
# sequence per micro-batch, on the 16-rank grid and on 128 GPUs (tp 8 × cp 2 × pp 4 ×
# dp_replicate 2). They are this lab's block (full multi-head attention, a two-matrix MLP):
# Llama's 8 KV heads would make the ring's K/V a quarter as large, and its SwiGLU MLP adds
# a third matrix to the parameters the dp groups move; the activations tp reduces are the same.

# %%
LLAMA16 = LMConfig(vocab=128256, hidden=4096, heads=32, ffn=14336, blocks=32, seq=8192, batch=4)
GRID128 = Grid(128, dp_replicate=2, cp=2, tp=8, pp=4)
LLAMA128 = LMConfig(vocab=128256, hidden=4096, heads=32, ffn=14336, blocks=32, seq=8192, batch=8)
TABLES = {
    "toy, 16 ranks (float64)": per_group(GRID16, CONFIG, 4),
    "Llama-3-8B shapes, 16 ranks (bf16)": per_group(GRID16, LLAMA16, 4, itemsize=2),
    "Llama-3-8B shapes, 128 GPUs, tp 8 (bf16)": per_group(GRID128, LLAMA128, 8, itemsize=2),
}
names = list(next(iter(TABLES.values())))
print(
    text_table(
        ["group"] + list(TABLES),
        [
            [n]
            + [
                f"{t[n]:.4g} B" if i == 0 else f"{t[n] / 1e9:.4g} GB"
                for i, t in enumerate(TABLES.values())
            ]
            for n in names
        ],
    )
)
show(viz.plot_group_bytes(TABLES))
heaviest = {label: max(t, key=t.get) for label, t in TABLES.items()}
print("heaviest group:", heaviest)

# %% [markdown]
# tp is the heaviest group in every column. At toy size the FSDP group comes close (16-wide
# layers, 8 tokens: the parameters weigh as much as the activations). At a real size the
# activations dominate: tp, which gathers and reduce-scatters every block's activation per
# micro-batch (under SP the same bytes as four all-reduces, plus the column linears'
# re-gathers), is the heaviest by far, and on the critical path: the argument for putting TP
# on NVLink. pp, sending only the sequence shard at each boundary, is the lightest but the
# token count.
#
# **FSDP under PP: keep the parameters gathered.** FSDP on its own
# (`reshard_after_forward=True`, and resharding after the backward too) frees a layer's gathered
# parameters after its forward and gathers them again for its backward: on a pipeline, twice
# per micro-batch, 2m all-gathers of the stage per step, which `reshard_hooks` models.
# torchtitan's default under PP is not to reshard (`reshard_after_forward = not pp_enabled`, "to
# avoid per-microbatch all-gathers" in `apply_fsdp`, pytorch/torchtitan@238fa99): one gather per
# step, the cost of holding the whole stage. torch's pipeline stage also keeps the parameters
# after every backward but the last (`set_reshard_after_backward(False)`), so even with
# `reshard_after_forward=True` a forward that follows a backward finds them gathered, and a
# stage gathers fewer than 2m times. The rows above keep them; `reshard_hooks` frees and
# refills them as FSDP alone does.
#
# **Predict:** on the 8-rank pp row (m = 4), how many times the kept rows' parameter-gather
# bytes does a resharding rank send? And what does that make of the FSDP group's bytes at
# Llama-3-8B size on 128 GPUs?

# %%
# show: paralab.compose.runs.reshard_hooks

# %%
gather = ("dp_shard_cp", "param gather")
kept = measured_bytes(RESULTS["dp 2 x tp 2 x pp 2"][0][1], PP8, 0)[gather]
resharded = measured_bytes(RESHARD[0][1], PP8, 0)[gather]
reshard_verdicts = [
    summary(
        "reshard after forward: parameters after 2 steps equal one process",
        check_params([p for p, _ in RESHARD], PP8),
    ),
    summary(
        "reshard after forward: ledger = formula (2m gathers), every rank",
        check_bytes([r for _, r in RESHARD], PP8, reshard_after_forward=True),
    ),
    claim(
        "rank 0 gathers 2m = 8 times the kept bytes",
        resharded == 8 * kept,
        f"{resharded} B = 8 x {kept} B",
    ),
]
print(verdict_table(reshard_verdicts, "FSDP under PP"))
fsdp_real = [per_group(GRID128, LLAMA128, 8, 2, r)["dp_shard_cp"] / 1e9 for r in (False, True)]
print(
    f"Llama-3-8B shapes, 128 GPUs, m = 8: dp_shard_cp {fsdp_real[0]:.4g} GB kept, {fsdp_real[1]:.4g} GB resharded"
)

# %% [markdown]
# Per step the FSDP group's heaviest rank sends its stage's gradient once and its parameters
# once when they are kept, 2m times when they are not: at m = 8 the gather bytes grow sixteen-fold,
# and these gathers sit before each micro-batch's compute rather than overlapping the backward.
# Keeping them costs the memory of the whole stage (1/pp of the model on a rank, cut by tp), which
# PP has already divided.
#
# ## 6. The wrong layout: TP outermost
#
# **Predict:** the same 16-rank row with tp partners 8 ranks apart (`TP_OUTERMOST`). Same
# bits? On two nodes of 8 GPUs, whose traffic crosses the network now, and how many bytes?

# %%
WRONG = Grid(16, dp_replicate=2, cp=2, tp=2, pp=2, order=TP_OUTERMOST)
wrong_results = run(compose_worker, 16, WRONG, timeout=120)
right_params = [p for p, _ in RESULTS["dp 2 x cp 2 x tp 2 x pp 2"]]
same_bits = all(
    torch.equal(a[k], b[k]) for (a, _), b in zip(wrong_results, right_params) for k in b
)
crossing = {}
for label, grid, results in (
    ("doc group", GRID16, RESULTS["dp 2 x cp 2 x tp 2 x pp 2"]),
    ("tp outermost", WRONG, wrong_results),
):
    totals: dict[str, int] = {}
    for rank, (_, records) in enumerate(results):
        for group, nbytes in cross_node_bytes(records, grid, rank, gpus_per_node=8).items():
            totals[group] = totals.get(group, 0) + nbytes
    crossing[label] = totals
print(
    text_table(
        ["layout", "bytes leaving a node, all ranks, one step"],
        [[k, dict(sorted(v.items()))] for k, v in crossing.items()],
    )
)

# %%
tp_total = sum(
    group_phase_bytes(WRONG, r, CONFIG, 4).get(("tp", p), 0)
    for r in range(16)
    for p in ("forward", "backward", "grad sync")
)
wrong_verdicts = [
    claim(
        "tp outermost: the same parameters, bitwise, on every rank",
        same_bits,
        "torch.equal on every tensor",
    ),
    summary(
        "tp outermost: ledger = formula, every rank",
        check_bytes([r for _, r in wrong_results], WRONG),
    ),
    claim(
        "doc group: only dp_replicate (and the 8-byte token count over dp_cp) crosses nodes",
        set(crossing["doc group"]) == {"dp_replicate", "dp_cp"},
        str(sorted(crossing["doc group"])),
    ),
    claim(
        "tp outermost: all of tp's bytes cross nodes (ledger = tp's closed form)",
        crossing["tp outermost"].get("tp") == tp_total,
        f"{crossing['tp outermost'].get('tp')} B = {tp_total} B",
    ),
]
print(verdict_table(wrong_verdicts, "the wrong layout"))

# %% [markdown]
# The bits are the same because a layout only renames ranks: every group has the same
# members in the same group order, so every collective adds the same numbers in the same
# order. On real hardware the tp all-reduces, the largest and most frequent traffic and on
# the critical path of every block, now go over the inter-node network (tens of GB/s)
# instead of NVLink (hundreds), while dp_replicate's once-per-step all-reduce moves inside a
# node where it was cheap to hide anyway.
#
# ## 7. Bug clinic: a requested HSDP
#
# A change planted in the step, handed to the ranks as a patch set, `run(...,
# patches=replica_setup())` (`paralab.exercises.lab10`; do not read it yet). It replaces one
# function. Below, the 16-rank row runs with it: HSDP requested, dp_replicate 2 across the
# two nodes.

# %%
changed = run(compose_worker, 16, GRID16, timeout=120, patches=replica_setup())
dp_records = [r for r in changed[0][1] if r.group_ranks != GRID16.group(0, "tp")]
used = sorted({r.group_ranks for r in dp_records if r.phase == "grad sync"})
clinic_verdicts = [
    summary(
        "clinic: the parameters still equal one process",
        check_params([p for p, _ in changed], GRID16),
    ),
    claim(
        "clinic: the bytes per group and phase do not match the formula",
        not all(v.passed for v in check_bytes([r for _, r in changed], GRID16)),
        f"rank 0 reduced over {used}; the formula's groups: {GRID16.group(0, 'dp_shard_cp')}, {GRID16.group(0, 'dp_replicate')}",
    ),
]
print(verdict_table(clinic_verdicts, "bug clinic"))
print(
    "rank 0's gradient groups:",
    used,
    " crossing nodes:",
    cross_node_bytes(changed[0][1], GRID16, 0, 8),
)

# %% [markdown]
# **What is wrong?** The parameters are right. Read which groups rank 0 reduced over, and
# compare with the grid's `dp_shard_cp` and `dp_replicate`.

# %% [markdown]
# <details><summary>Answer</summary>
#
# `replica_setup` swaps `fsdp_groups` for `one_flat_group`: the FSDP group becomes `dp_cp`,
# every data-parallel rank (with cp), and the replicate group is gone. What was requested as
# HSDP (shard inside a node, all-reduce the shard across the two nodes) runs as FSDP over all
# four ranks of `{0, 2, 8, 10}`, across both nodes. The sum over the shard group and then
# over the replicas is the sum over all, so every parameter is right: the element-wise check cannot see it. The
# group table does: the reduce-scatter and the all-gather now span the network, and the
# replica all-reduce never runs.
#
# This is torchtitan's issue pytorch/torchtitan#711: with `data_parallel_replicate_degree =
# 2` and `data_parallel_shard_degree = 8` on two nodes, after a change in
# `parallelize_llama.py` its reporter found "only one communicator formed with all 16 ranks",
# the parameters sharded across all 16, a difference "very apparent in pytorch profiles". The fix is the decision `fsdp_groups` makes: shard over
# `dp_shard_cp`, replicate over `dp_replicate`, as torchtitan's `parallelize` does again.
# </details>

# %% [markdown]
# ## 8. Choosing the degrees
#
# The heaviest-group table of [section 5](#5-bytes-per-group-and-phase-the-closed-form) gives each
# group's bytes per step at Llama-3-8B's shapes on 128 GPUs. A link's bus bandwidth turns them
# into seconds (`paralab.scale.hardware`'s H100 SXM preset: NVLink inside a node of 8, the network
# between nodes). **Predict:** which group could least afford the network?

# %%
H100 = hardware("h100-sxm")
REAL = TABLES["Llama-3-8B shapes, 128 GPUs, tp 8 (bf16)"]
print(
    text_table(
        ["group", "GB per step", "s over NVLink", "s over the network"],
        [
            [g, f"{b / 1e9:.4g}", f"{b / H100.intra_busbw:.3g}", f"{b / H100.inter_busbw:.3g}"]
            for g, b in REAL.items()
        ],
    )
)

# %% [markdown]
# tp's bytes are the largest by far and sit on the critical path of every block of every
# micro-batch: on the network they would cost many times what they cost on NVLink, and only
# async TP (lab 07's second chapter: CUDA symmetric memory, not run here) overlaps them with the
# matmuls, one shard at a time. So TP goes inside a node. pp sends the least (a sequence shard per boundary and
# micro-batch, point to point) and waits only at the pipeline's ends: it can cross nodes. dp
# moves the parameters and gradients once per step (kept gathered under PP), after the last
# micro-batch's backward and overlapping at most that one: rare and tolerant of latency, it
# goes outermost.
#
# The planner (`python -m paralab.plan`, `paralab.scale.plan.plan_train`) asks the same question
# of every layout of torchtitan's descriptor, with memory and compute as well as links. It offers
# tp only up to a node (8 GPUs) and lays pp outermost, as torchtitan does. Below: its fastest
# layout for three jobs on 128 H100s, and the fastest step it finds at each degree of each axis.
# **Predict:** which axis grows at 128k tokens, and does Mixtral-8x7B's fastest layout use EP?


# %%
def best_by(rows, axis: str) -> dict[int, str]:
    """degree -> the fastest step (s) among the layouts that fit with that degree."""
    best: dict[int, float] = {}
    for r in (r for r in rows if not r.oom):
        d = getattr(r.layout, axis)
        best[d] = min(best.get(d, float("inf")), r.score)
    return {d: f"{best[d]:.4g}" for d in sorted(best)}


JOBS = {
    "Llama-3.1-70B, 8k tokens": ("llama3.1-70b", 8192, 512),
    "Llama-3.1-70B, 128k tokens": ("llama3.1-70b", 131072, 32),
    "Mixtral-8x7B, 8k tokens": ("mixtral-8x7b", 8192, 512),
}
for label, (model, seq, batch) in JOBS.items():
    plans = plan_train(MODELS[model], H100, 128, seq, batch)
    print(f"{label}: fastest {describe_layout(plans[0].layout, plans[0].ac)}")
    print(
        text_table(
            ["axis", "fastest step (s) by degree"],
            [[a, best_by(plans, a)] for a in ("tp", "pp", "cp", "ep")],
        )
    )

# %% [markdown]
# At 8k tokens the 70B model's fastest layout spreads the cut over every dense axis: cp 4, tp 4
# with async TP (its all-gathers and reduce-scatters fused into the matmuls beside them) and a
# pipeline of 2. Its best layouts without tp are the slowest of the tp row, and the best steps
# at tp 2 to 8, pp 1 to 8 and cp 1 to 4 lie close together: many layouts are nearly as good. At
# 128k tokens the activations and the attention grow with the sequence: the fastest layout
# takes cp 8, tp 8, a whole node, and no pipeline, and cp 1 is about a quarter slower: long
# sequences are what CP is for. For Mixtral-8x7B on these 128 GPUs the fastest layout has no EP
# (it takes tp 4 and pp 2): the planner finds ep 2 to 8 slower here. EP is the
# axis that shards the experts when they are what does not fit or what costs; read a layout's
# breakdown (`python -m paralab.plan --model mixtral-8x7b --hardware h100-sxm --gpus 128 --train
# --layout ...`) to see where its time goes.

# %% [markdown]
# ## Closing note

# %%
display(
    Markdown(
        "Bytes per step of each group's heaviest rank, from the same closed forms the ledger matched "
        "on every rank of every row (toy in B, real in GB):\n\n"
        + "| group | "
        + " | ".join(TABLES)
        + " |\n|---|"
        + "---|" * len(TABLES)
        + "\n"
        + "\n".join(
            f"| {n} | "
            + " | ".join(
                f"{t[n]:.4g}" if i == 0 else f"{t[n] / 1e9:.4g}"
                for i, t in enumerate(TABLES.values())
            )
            + " |"
            for n in names
        )
        + "\n\nSeven rows matched one process element by element in float64, TP with SP and the "
        "loss over the global token count in each (8 ranks dp × tp × pp, kept and resharded; "
        "8 ranks dp_shard × cp × tp; 16 ranks dp × cp × tp × pp; interleaved dp × tp × pp; the MoE "
        "rows with ep carved from dp, without and with a pipeline, each MoE layer gathering the tp "
        "group's tokens); TP outermost gave the same bits "
        "and sent all of tp's bytes across the two nodes. "
        "The last cell prints this run's time."
    )
)

# %% [markdown]
# ## What to try
#
# 1. Put the 16-rank row in torchtitan's order: `g = Grid(16, dp_replicate=2, cp=2, tp=2,
#    pp=2, order=TORCHTITAN_ORDER)`, `out = run(compose_worker, 16, g)`. Same bits as the doc
#    group's? Which group crosses the two nodes now (`cross_node_bytes(out[0][1], g, 0, 8)`)?
#
#    <details><summary>Hint</summary>The same bits. pp is now 8 ranks apart, so rank 0's
#    sends to stage 1 cross the nodes (`pp`), and dp_replicate stays inside a node.</details>
# 2. Run the clinic's patch set on the 8-rank row without replicas: `run(compose_worker, 8,
#    ROWS["dp 2 x tp 2 x pp 2"], patches=replica_setup())`, then `check_bytes`. Does the
#    bug show there?
#
#    <details><summary>Hint</summary>No: with dp_replicate = 1 and cp = 1, `dp_cp` and
#    `dp_shard_cp` are the same ranks, so the planted change is the same step; the bug only
#    exists once HSDP is requested.</details>
# 3. Ask the descriptor for an ep group the experts cannot have: `Grid(8, dp_shard=2, cp=2,
#    tp=2, ep=2, etp=1)`. What does it say, and why must ep borrow all of cp and tp when the
#    experts are not tensor-parallel?
#
#    <details><summary>Hint</summary>It raises `ep = 2 must be a multiple of cp x tp = 4`:
#    with etp = 1 every tp rank holds whole experts, so the tokens of all of cp and tp must
#    reach them through the ep all-to-all.</details>
# 4. Evaluate the formulas at another size: `per_group(Grid(64, cp=2, tp=8, pp=4), LLAMA128,
#    8, itemsize=2)` (dp_shard inferred: 1). Which group is heaviest, and what does dp cost?
#
#    <details><summary>Hint</summary>tp still, by an order of magnitude; with dp_shard = 1
#    the FSDP group is the cp pair, and there are no replicas: `dp_replicate` is absent.</details>

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time: {time.monotonic() - LAB_START:.1f} s")
