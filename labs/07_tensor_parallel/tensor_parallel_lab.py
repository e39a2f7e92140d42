# %% [markdown]
# # Lab 07 — Tensor and sequence parallelism: Megatron's f/g pair, by hand and with DTensor
#
# **You will learn** how a weight is cut over `tp` ranks (column against row), why a
# column-parallel linear followed by a row-parallel one needs no collective in between,
# what the conjugate pair f and g does forward and backward (each backward is its
# forward's mirror), how sequence parallelism turns each all-reduce into an all-gather and
# a reduce-scatter and what that saves in activation memory, and how a cross-entropy over a
# vocabulary split over ranks needs three small all-reduces instead of the logits. Every
# output, gradient and parameter is checked element by element against one process, every
# byte against a closed form, and the same model runs under torch's own DTensor tensor
# parallelism and inside FSDP2. Around it, what a real run needs: the gradient norm
# across tp for clipping, dropout masks from an RNG tracker, grouped-query attention with
# fewer kv heads than ranks, and what torch's SP saves against Megatron's. **Prerequisites:** the collectives primer (all-reduce,
# all-gather, reduce-scatter and their backwards), lab 01 (FSDP2, for section 7).
# **Time:** about 45 minutes to read; the last cell prints this notebook's run time.
#
# **What is split.** Data parallelism splits the batch, context parallelism the sequence
# (lab 02). Tensor parallelism splits *each layer's weights*: every rank holds `1/tp` of
# every matrix and computes `1/tp` of every product, on the same tokens. So the ranks must
# talk inside every layer, twice per block each way, which is why TP lives on the fastest
# links (one node's NVLink) and is the innermost axis of a mesh.
#
# | crossing | forward | backward | where |
# |---|---|---|---|
# | **f** | identity | all-reduce | in front of a column-parallel linear |
# | **g** | all-reduce | identity | behind a row-parallel linear |
# | **AG** (SP's f) | all-gather of the sequence | all-gather again, then reduce-scatter | inside a column linear, with SP |
# | **RS** (SP's g) | reduce-scatter of the sequence | all-gather | behind a row linear, with SP |
#
# **Traffic, the formulas this lab checks.** `A = b·s·h·8` bytes: one activation of the
# full sequence in float64. Per rank and micro-batch (here one per step), one block sends
# 4 all-reduces of `A` (`2(tp-1)/tp·A` each) under TP, and under TP+SP 4 all-gathers and 4 reduce-scatters
# (`(tp-1)/tp·A` each), the same bytes, plus 2 all-gathers in the backward: each column
# linear saves only its sequence shard and gathers it again for its weight gradient. The
# vocab-parallel loss sends 3 all-reduces of `b·s` numbers; an all-gather of the logits
# would send `(tp-1)·b·s·V/tp` numbers.

# %%
import time

import torch
from IPython.display import Markdown, display

import paralab.tp.runs as package_runs
from paralab.check import claim, closing_table, compare, summary, verdict_table
from paralab.exercises.lab07 import tp_clinic_change
from paralab.launch import run
from paralab.ledger import format_table
from paralab.tables import text_table
from paralab.tp import reference, train
from paralab.tp.costs import activation_bytes, block_bytes, gathered_logits_bytes, step_bytes
from paralab.tp.dropout import dropout_job, dropout_reference
from paralab.tp.dtensor import dtensor_memory_job, dtensor_train, fsdp_rows
from paralab.tp.layout import Split, shard
from paralab.tp.memory import block_saved_bytes
from paralab.tp.model import CONFIG
from paralab.tp.runs import (
    assemble,
    block_job,
    block_reference,
    check_block,
    check_bytes,
    check_lm,
    check_memory,
    check_train,
    grad_norm_job,
    lm_job,
    measured_bytes,
    memory_job,
    one_process_grad_norm,
    one_process_saved_bytes,
)
from paralab.viz import plot_diff_heatmap, show
from paralab.viz.tp import (
    plot_activation_memory,
    plot_block_regions,
    plot_phase_bytes,
    plot_weight_split,
)

LAB_START = time.monotonic()
TPS = (2, 4)
print(CONFIG)

# %% [markdown]
# ## 1. How a weight splits: column against row
#
# A linear layer computes `y = x Wᵀ` with `W` of shape (out, in). Cut `W` on its **output**
# dimension (column-parallel, in Megatron's naming after `Wᵀ`'s columns): rank `r` computes
# the outputs `y_r = x W_rᵀ`, from the *full* input. Cut it on its **input** dimension
# (row-parallel): rank `r` multiplies *its slice* `x_r` of the input and gets a partial
# sum; `y = Σ_r x_r W_rᵀ`. A fused q/k/v weight is cut inside each of its three blocks, so
# that every rank holds the q, k and v of the same heads.

# %%
# show: paralab.tp.layout.Split paralab.tp.layout.shard paralab.tp.layout.unshard

# %%
show(plot_weight_split(4))

# %% [markdown]
# **Predict before you run.** Column pieces concatenated, row pieces summed: which of the
# two needs a collective to give every rank `y`, and which one *is* the input the other
# wants?
#
# <details><summary>Answer</summary>
#
# The row pieces must be summed across ranks (an all-reduce: that is g). The column
# pieces `y_r` are exactly the split input a row-parallel linear wants, so a column linear
# followed by a row linear (an MLP's up and down, attention's q/k/v and output) passes
# nothing between them. The table below checks both in one process.
# </details>

# %%
g = torch.Generator().manual_seed(0)
x = torch.randn(CONFIG.batch, CONFIG.seq, CONFIG.hidden, dtype=torch.float64, generator=g)
w_up = torch.randn(CONFIG.ffn, CONFIG.hidden, dtype=torch.float64, generator=g)
w_down = torch.randn(CONFIG.hidden, CONFIG.ffn, dtype=torch.float64, generator=g)
split_claims = []
for tp in (2, 3, 4):
    hidden = x @ w_up.T
    column = torch.cat([x @ shard(w_up, Split(0), r, tp).T for r in range(tp)], dim=-1)
    chained = sum(
        (x @ shard(w_up, Split(0), r, tp).T) @ shard(w_down, Split(1), r, tp).T for r in range(tp)
    )
    bound = 1e-12 * (hidden @ w_down.T).abs().max().item()
    split_claims.append(
        summary(
            f"tp={tp}: column pieces = x Wᵀ",
            compare(column, hidden, atol=1e-12 * hidden.abs().max().item()),
        )
    )
    split_claims.append(
        summary(
            f"tp={tp}: Σ_r (column r) → (row r) = the full MLP product",
            compare(chained, hidden @ w_down.T, atol=bound),
        )
    )
print(verdict_table(split_claims, "column and row splits, one process (relative bound 1e-12)"))

# %% [markdown]
# ## 2. The conjugate pair f and g
#
# A column linear's input `x` is used by every rank, so its gradient is the **sum** of every
# rank's partial gradient `∂L/∂x = Σ_r ∂L_r/∂x`: f is the identity forward and an
# all-reduce backward. A row linear's partial sums are added by g's all-reduce; every rank
# then holds the same full output and receives the same full gradient of it, which is
# the gradient of each partial sum: g's backward is the identity. Each is the other's
# mirror. The decisions live in `f_backward` and `g_backward`; the Functions around them
# only carry the group:

# %%
# show: paralab.tp.mappings.f_backward paralab.tp.mappings.g_backward paralab.tp.mappings.CopyToTP paralab.tp.mappings.ReduceFromTP

# %% jupyter={"source_hidden": true}
# show: paralab.tp.mappings.all_reduce_sum paralab.tp.mappings.copy_to_tp paralab.tp.mappings.reduce_from_tp

# %% [markdown]
# The layers place them: f in front of the column linear, g behind the row linear, the
# row bias added once, after the sum.

# %%
# show: paralab.tp.layers.ColumnParallelLinear

# %%
# show: paralab.tp.layers.RowParallelLinear

# %% [markdown]
# ## 3. One block on tp ranks: 2 all-reduces forward, 2 backward
#
# The block's forward code is written once (`paralab.tp.model.Block`, folded below);
# `tensor_parallel_block` swaps its linears for the parallel ones and gives each rank
# `heads/tp` heads. Attention needs no collective of its own: heads never mix.

# %% jupyter={"source_hidden": true}
# show: paralab.tp.model.Attention paralab.tp.model.MLP paralab.tp.model.Block

# %%
# show: paralab.tp.model.tensor_parallel_block

# %%
show(plot_block_regions(sequence_parallel=False))

# %% [markdown]
# **Predict before you run.** How many all-reduces does one block make in the forward, how
# many in the backward, and of what size?
#
# <details><summary>Answer</summary>
#
# Forward: two, g after attention's output projection and g after the MLP's down
# projection. Backward: two, f's in front of q/k/v and of the MLP's up projection. Each of
# `b·s·h` numbers, the full activation. The ledger below shows them, per rank.
# </details>
#
# Each rank runs the job below: the first block of the model cut over tp ranks, forward
# and backward on the same `x` and output gradient, under the ledger.

# %%
# show: paralab.tp.runs.block_job

# %%
blocks = {(tp, sp): run(block_job, tp, sp) for tp in TPS for sp in (False, True)}
print(format_table([r["records"] for r in blocks[(2, False)]]))

# %% [markdown]
# **The symmetry, read from the ledger.** Each collective of the forward beside the one
# that mirrors it in the backward (rank 0, tp = 4, one block):


# %%
def ops(records, phase):
    """The collectives of one phase, in the order this rank called them."""
    return [r.op.replace("_single", "") for r in records if r.phase == phase]


def split_regathers(backward):
    """(mirrors, re-gathers): under SP a column linear's backward all-gathers its saved shard
    right before it reduce-scatters the input gradient; that all-gather mirrors nothing."""
    regather = [
        op == "all_gather" and backward[k + 1 : k + 2] == ["reduce_scatter"]
        for k, op in enumerate(backward)
    ]
    mirrors = [op for op, again in zip(backward, regather) if not again]
    return mirrors, sum(regather)


# %%
rows, regathers = [], {}
for sp in (False, True):
    mode = "TP+SP" if sp else "TP"
    records = blocks[(4, sp)][0]["records"]
    forward = ops(records, "forward")
    backward, regathers[mode] = split_regathers(ops(records, "backward"))
    for k, op in enumerate(forward):
        rows.append((mode, k, op, backward[len(backward) - 1 - k]))
print(text_table(("mode", "crossing", "forward", "its mirror in the backward"), rows))
print(f"all-gathers of a saved shard in the backward (re-gathers): {regathers}")
MIRROR = {
    "TP": {"all_reduce": "all_reduce"},
    "TP+SP": {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"},
}
symmetry = [
    claim(
        f"{mode}: the backward mirrors the forward, crossing by crossing",
        all(MIRROR[mode].get(fwd) == bwd for m, _, fwd, bwd in rows if m == mode),
        f"{sum(m == mode for m, *_ in rows)} forward collectives, each mirrored",
    )
    for mode in ("TP", "TP+SP")
]
symmetry.append(
    claim(
        "TP+SP: besides the mirrors, one re-gather per column linear (q/k/v, MLP up), none under TP",
        regathers == {"TP": 0, "TP+SP": 2},
        f"re-gathers {regathers}",
    )
)
print(verdict_table(symmetry, "\nforward beside backward"))

# %% [markdown]
# Under TP the mirror of g's all-reduce is f's all-reduce: the backward runs the crossings
# in reverse, and where the forward all-reduced (g), the backward passes straight through,
# and where the forward passed through (f), the backward all-reduces. The rows pair the
# k-th forward collective with the k-th from the end of the backward. Under TP+SP the
# backward holds two all-gathers more, which mirror nothing: each column linear gathers its
# saved sequence shard again (section 4), right before it reduce-scatters its input
# gradient; the table sets them aside.
#
# Now the values: the output, the input gradient `dx` and every parameter gradient against
# the same block in one process. Tensor parallelism re-orders sums (a row linear adds `tp`
# partial products), so results agree to rounding, not bitwise: each tensor is checked
# element by element within `1e-12` of its reference's largest value.

# %%
block_verdicts = {key: check_block(per_rank, key[1]) for key, per_rank in blocks.items()}
block_claims = [
    summary(f"tp={tp}{' +SP' if sp else ''}: out, dx, every grad = one process", found)
    for (tp, sp), found in block_verdicts.items()
]
block_bytes_verdicts = [
    v for (tp, sp), per_rank in blocks.items() for v in check_bytes(per_rank, sp, block=True)
]
block_claims.append(
    summary(
        "one block's calls and bytes per (phase, op) = block_step_bytes, tp 2, 4, ±SP",
        block_bytes_verdicts,
    )
)
print(verdict_table(block_claims, "one block, forward and backward (values: relative bound 1e-12)"))

# %% jupyter={"outputs_hidden": true}
print(verdict_table([v for found in block_verdicts.values() for v in found], "the detail"))

# %% [markdown]
# ## 4. Sequence parallelism: the norms and residuals hold s/tp tokens
#
# Under TP the norms and the residual adds run on the full sequence on every rank: the
# same work and the same activations, `tp` times. Megatron-SP (Korthikanti et al.) keeps
# them on `s/tp` tokens per rank. An all-reduce is a reduce-scatter followed by an
# all-gather; SP keeps the tensor scattered in between, across the norm and the residual:
# g becomes a reduce-scatter along the sequence, f an all-gather. The replicated
# parameters (norm weights, row biases, positions) now see only this rank's tokens, so their
# gradients are partial sums, summed over the group after the backward.
#
# The all-gather lives inside the column linear's own Function, as in Megatron: a linear
# keeps its input for its weight gradient, and if autograd kept the gathered input, every
# rank would hold the full sequence there and SP would not divide it. So the Function saves
# only this rank's shard and all-gathers it again in the backward, then reduce-scatters the
# input gradient (the forward all-gather's mirror): memory bought with one all-gather per
# column linear (sections 6 and 9 count both).

# %%
# show: paralab.tp.layers.SequenceParallelColumnLinear

# %%
# show: paralab.tp.mappings.ReduceScatterToSP

# %%
# show: paralab.tp.model.sync_replicated_grads

# %% jupyter={"source_hidden": true}
# show: paralab.tp.mappings.all_gather_seq paralab.tp.mappings.reduce_scatter_seq

# %%
show(plot_block_regions(sequence_parallel=True))
print(format_table([r["records"] for r in blocks[(2, True)]]))

# %% [markdown]
# The rows `tp=… +SP` of section 3's claims table are these runs: out and dx are
# reassembled from the ranks' sequence shards, and every gradient equals one process.
#
# **Dropout: which ranks must draw the same mask.** This model has no dropout; a real one
# drops attention probabilities and the residual branch. Attention's probabilities are
# cut by head: if every rank drew from one seed, head j of every rank would be dropped
# alike. The residual stream under TP is held whole by every rank: if the ranks drew
# different masks, their copies would drift apart. Megatron keeps a generator seeded alike
# on every tp rank and one seeded per tp rank (and a third for expert layers), and forks to
# the per-rank one where the activation is split (attention; under SP the whole block, whose
# residual holds this rank's tokens):

# %%
# show: paralab.tp.dropout.RNGTracker paralab.tp.dropout.dropout_job

# %% [markdown]
# **Predict before you run.** At tp = 2, with the tracker and without it (everything from
# the seed every rank shares), which masks agree across the two ranks?
#
# <details><summary>Answer</summary>
#
# With it: the residual masks under TP agree, the head masks differ, and under SP the
# residual masks differ too (different tokens). Without it: the head masks agree, so head
# 0 of rank 0 and head 0 of rank 1 (head 6 of the model) lose the same positions.
# </details>

# %%
dropped = {sp: run(dropout_job, 2, sp) for sp in (False, True)}
untracked = run(dropout_job, 2, False, tracked=False)


def masks_agree(per_rank, name):
    """Whether both ranks zeroed the same positions of their part of `name`."""
    return torch.equal(per_rank[0][name] == 0, per_rank[1][name] == 0)


dropout_claims = []
for sp, per_rank in dropped.items():
    want = dropout_reference(2, sp)
    got = {
        "probs": torch.cat([r["probs"] for r in per_rank], dim=1),
        "residual": torch.cat([r["residual"] for r in per_rank], dim=1)
        if sp
        else per_rank[0]["residual"],
    }
    mode = "TP+SP" if sp else "TP"
    for name in ("probs", "residual"):
        dropout_claims.append(
            summary(
                f"{mode}: {name} after dropout = one process, same masks",
                compare(got[name], want[name]),
            )
        )
    dropout_claims.append(
        claim(
            f"{mode}: residual masks {'differ' if sp else 'agree'} across ranks, head masks differ",
            masks_agree(per_rank, "residual") != sp and not masks_agree(per_rank, "probs"),
            f"residual agree: {masks_agree(per_rank, 'residual')}, heads agree: {masks_agree(per_rank, 'probs')}",
        )
    )
dropout_claims.append(
    claim(
        "no tracker: every rank drops its heads alike",
        masks_agree(untracked, "probs"),
        "rank 0's head j and rank 1's head j lose the same positions",
    )
)
print(verdict_table(dropout_claims, "dropout at tp = 2 with Megatron's RNG tracker (exact)"))

# %% [markdown]
# ## 5. The whole model: vocab-parallel embedding and loss
#
# The embedding table is cut by token: rank `r` holds rows `[r·V/tp, (r+1)·V/tp)`, looks up
# zeros for tokens it does not own, and g (or SP's reduce-scatter) adds the ranks' rows.
# The head is a column linear whose output, the logits, stays split over the vocabulary,
# and the loss never gathers it:

# %%
# show: paralab.tp.layers.VocabParallelEmbedding

# %%
# show: paralab.tp.cross_entropy.VocabParallelCrossEntropy

# %% jupyter={"source_hidden": true}
# show: paralab.tp.cross_entropy.vocab_parallel_loss

# %% jupyter={"source_hidden": true}
# show: paralab.tp.model.TinyLM paralab.tp.model.tensor_parallel

# %% [markdown]
# **Predict before you run.** Is the loss's backward a collective? Which rank contributes
# the target logit?
#
# <details><summary>Answer</summary>
#
# No collective: `∂loss/∂z = softmax(z) - onehot(target)`, and each rank holds its own
# columns of both (the softmax from the log-sum-exp the forward already reduced). Only the
# rank whose vocabulary range holds the target adds its logit; every other rank adds 0.
# </details>

# %%
models = {(tp, sp): run(lm_job, tp, sp) for tp in (2, 3, 4) for sp in (False, True)}
lm_verdicts = {key: check_lm(per_rank, key[1]) for key, per_rank in models.items()}
lm_claims = [
    summary(f"tp={tp}{' +SP' if sp else ''}: logits, loss, every grad = one process", found)
    for (tp, sp), found in lm_verdicts.items()
]
print(verdict_table(lm_claims, "the whole model, one step (relative bound 1e-12)"))

# %% jupyter={"outputs_hidden": true}
print(verdict_table([v for found in lm_verdicts.values() for v in found], "the detail"))

# %% [markdown]
# ## 6. What crossed the wire: ledger vs formula, per phase and collective
#
# Every collective went through `torch.distributed` under the ledger (these are the bytes
# the algorithm needs at the API under the ledger's cost model, not what gloo moves).
# The closed form, per (phase, collective):

# %%
# show: paralab.tp.costs.block_bytes

# %% jupyter={"source_hidden": true}
# show: paralab.tp.costs.step_bytes paralab.tp.costs.block_step_bytes

# %%
byte_verdicts = {key: check_bytes(per_rank, key[1]) for key, per_rank in models.items()}
byte_claims = [
    summary(f"tp={tp}{' +SP' if sp else ''}: calls and bytes = formula, every rank", found)
    for (tp, sp), found in byte_verdicts.items()
]
print(
    verdict_table(byte_claims, "bytes sent per rank per (phase, op), ledger vs closed form (exact)")
)
rows = []
for tp in (2, 4):
    for sp in (False, True):
        measured = measured_bytes(models[(tp, sp)][0]["records"])
        for (phase, op), (calls, nbytes) in sorted(step_bytes(CONFIG, tp, sp).items()):
            rows.append(
                (tp, "TP+SP" if sp else "TP", phase, op, calls, nbytes, measured[(phase, op)][1])
            )
print(
    text_table(
        ("tp", "mode", "phase", "op", "calls", "formula (B)", "ledger (B)"),
        rows,
        align_right=(0, 4, 5, 6),
    )
)

# %%
labelled = {}
for tp in (2, 4):
    for sp in (False, True):
        per_phase = {}
        for (phase, op), (_, nbytes) in measured_bytes(models[(tp, sp)][0]["records"]).items():
            per_phase.setdefault(phase, {})[op.replace("_single", "")] = nbytes
        labelled[f"tp={tp}\n{'TP+SP' if sp else 'TP'}"] = per_phase
show(plot_phase_bytes(labelled))
loss_rows = [
    (tp, 3 * 2 * (tp - 1) * CONFIG.batch * CONFIG.seq * 8 // tp, gathered_logits_bytes(CONFIG, tp))
    for tp in (2, 3, 4)
]
print(
    text_table(
        ("tp", "vocab-parallel loss: 3 all-reduces (B)", "all-gather of the logits (B)"),
        loss_rows,
        align_right=(0, 1, 2),
    )
)

# %% [markdown]
# **What to conclude.** Forward plus backward, SP's crossings send the same activation
# bytes as TP's all-reduces; on top, each column linear's re-gather adds one all-gather of
# `A` in the backward (2 per block and the head's: `(tp-1)/tp·A` each, 5 in this model).
# That is the price of saving `1/tp` of their input (section 9): SP buys memory with a
# quarter more activation bytes per block, `10(tp-1)/tp·A` against `8(tp-1)/tp·A`. SP also
# adds one small all-reduce (`grad sync`): the replicated parameters' gradients flattened
# into one buffer, as Megatron's `finalize_model_grads` does, one collective instead of one
# per parameter. The loss's three reductions send `3·2(tp-1)/tp` numbers per position against `(tp-1)·V/tp` for gathering the logits: with a real vocabulary
# (`V` = 131072, `b·s` = 8·4096 positions, float32, tp = 8) that is 672 KiB against 14 GiB
# per micro-batch.
#
# ## 7. Training: parameters after 2 steps, alone and inside FSDP2
#
# `paralab.tp.train(tp, dp_shard, ...)` runs on every rank of a `dp_shard × tp` world (tp
# innermost, as on one node), trains with SGD, and returns the full parameters;
# `reference` trains one process on the same global batch. With `dp_shard > 1` the
# tensor-parallel model is wrapped in FSDP2's `fully_shard` over the dp mesh: TP inside
# each dp replica.

# %%
# show: paralab.tp.runs.train

# %% jupyter={"source_hidden": true}
# show: paralab.tp.runs.fsdp_over_dp

# %% jupyter={"source_hidden": true}
# show: paralab.tp.runs.reference

# %%
trained = {
    (tp, dp, sp): run(train, tp * dp, tp, dp, sequence_parallel=sp)
    for tp, dp, sp in ((2, 1, False), (4, 1, False), (2, 1, True), (4, 1, True), (2, 2, True))
}
train_verdicts = {key: check_train(per_rank, *key) for key, per_rank in trained.items()}
train_claims = [
    summary(f"dp={dp} x tp={tp}{' +SP' if sp else ''}: params after 2 steps = one process", found)
    for (tp, dp, sp), found in train_verdicts.items()
]
moved = reference(samples=1, steps=2)
start = reference(samples=1, steps=0)
train_claims.append(
    claim(
        "the check is not vacuous: 2 steps move every parameter",
        all(not torch.equal(moved[n], start[n]) for n in start),
        f"{len(start)} parameters",
    )
)
print(verdict_table(train_claims, "training (relative bound 1e-12; every rank bitwise the same)"))

# %% [markdown]
# **Clipping the gradient norm across TP.** Clipping scales every gradient by
# `max_norm / norm` when the whole model's norm is larger. No rank holds the whole
# gradient: each adds the squares of what it holds, and one all-reduce sums them. But a
# replicated gradient (norms, row biases, positions) is held whole by every rank, so
# only one rank may add it; Megatron counts a parameter if it is sharded or this is tp
# rank 0 (`param_is_not_tensor_parallel_duplicate` in
# NVIDIA/Megatron-LM@d98e8a64:megatron/core/tensor_parallel/layers.py, applied by
# `MegatronOptimizer._filter_grads_for_norm` in
# NVIDIA/Megatron-LM@d98e8a64:megatron/core/optimizer/optimizer.py), and
# `get_grad_norm_fp32` (NVIDIA/Megatron-LM@d98e8a64:megatron/core/optimizer/clip_grads.py)
# sums the squares of the list it is handed. Under SP, clip after the replicated gradients
# are summed.

# %%
# show: paralab.tp.clip.tp_grad_norm paralab.tp.clip.clip_tp_grads_

# %% [markdown]
# **Predict before you run.** Counted on every rank instead, is the norm too large by a
# factor of tp?
#
# <details><summary>Answer</summary>
#
# No: only the replicated part counts tp times, `sqrt(sharded² + tp·replicated²)`. Here
# the replicated parameters are small and the error is a few per cent, which a loss curve
# would never show: only a check against one process catches it.
# </details>

# %%
norms = {(tp, sp): run(grad_norm_job, tp, sp)[0] for tp, sp in ((2, False), (4, True))}
one_norm = one_process_grad_norm()
print(
    text_table(
        ("tp", "mode", "counted once", "counted on every rank", "one process"),
        [
            (
                tp,
                "TP+SP" if sp else "TP",
                f"{n['counted once']:.6f}",
                f"{n['counted on every rank']:.6f}",
                f"{one_norm:.6f}",
            )
            for (tp, sp), n in norms.items()
        ],
    )
)
# %%
clipped = run(train, 2, 2, sequence_parallel=True, max_norm=1.0)
clip_claims = [
    claim(
        f"tp={tp}{' +SP' if sp else ''}: the norm, replicated counted once = one process",
        abs(n["counted once"] - one_norm) <= 1e-12 * one_norm,
        f"{n['counted once']:.6f}",
    )
    for (tp, sp), n in norms.items()
]
clip_claims.append(
    summary(
        "tp=2 +SP, clipped at 1.0: params after 2 steps = one process with clip_grad_norm_",
        check_train(clipped, 2, 1, True, max_norm=1.0),
    )
)
clip_claims.append(
    claim(
        "the clipping is not vacuous: the norm exceeds 1.0, the clipped run differs",
        one_norm > 1.0
        and not torch.equal(
            clipped[0]["blocks.0.mlp.up.weight"], trained[(2, 1, True)][0]["blocks.0.mlp.up.weight"]
        ),
        f"one-process norm {one_norm:.6f}",
    )
)
print(verdict_table(clip_claims, "\ngradient-norm clipping across tp (relative bound 1e-12)"))

# %% [markdown]
# ## 8. The same model under torch's DTensor tensor parallelism
#
# torch writes the same crossings as *styles* applied to modules: `ColwiseParallel`
# (weight `Shard(0)`, input replicated or all-gathered from a sequence shard, output
# sharded), `RowwiseParallel` (weight `Shard(1)`, output all-reduced or reduce-scattered),
# `SequenceParallel` (a norm on a sequence shard, its parameters replicated) and
# `loss_parallel` (a cross-entropy over logits sharded on the vocabulary). The plan is
# torchtitan's `apply_tp` for a Llama, with the sequence all-gather on each column linear's
# input instead of on the attention and MLP modules, and SP optional; below it the loop that
# trains it, FSDP2 around it when dp > 1:

# %%
# show: paralab.tp.dtensor.tp_plan

# %%
# show: paralab.tp.dtensor.dtensor_train

# %% jupyter={"source_hidden": true}
# show: paralab.tp.dtensor.head_aligned_qkv paralab.tp.dtensor.params_in_model_order paralab.tp.dtensor.dtensor_model paralab.tp.dtensor.full_parameters

# %%
dtensor_runs = {
    (tp, dp, sp): run(dtensor_train, tp * dp, tp, dp, sequence_parallel=sp, timeout=120)
    for tp, dp, sp in ((2, 1, False), (2, 1, True), (2, 2, True))
}
dtensor_claims = [
    summary(
        f"DTensor dp={dp} x tp={tp}{' +SP' if sp else ''}: params after 2 steps = one process",
        check_train(per_rank, tp, dp, sp),
    )
    for (tp, dp, sp), per_rank in dtensor_runs.items()
]
print(verdict_table(dtensor_claims, "torch's TP styles on gloo, CPU (relative bound 1e-12)"))

# %% [markdown]
# All four styles run on gloo on the CPU in this torch (2.13): `ColwiseParallel`,
# `RowwiseParallel`, `SequenceParallel` and `loss_parallel`, and `fully_shard` composes
# with them on a 2-D `(dp_shard, tp)` mesh. Two adaptations were needed, both outside
# torch: the fused q/k/v weight is permuted so that torch's contiguous shard holds one
# rank's heads (torchtitan keeps `wq`, `wk`, `wv` apart instead), and the position
# table, added outside any plan, has its partial gradient summed by hand under SP.
# The ledger does not see DTensor's traffic (it goes through functional collectives),
# so this section checks values only.
#
# | | Megatron's SP (section 4) | torch's `ColwiseParallel(input_layouts=Shard(1))` |
# |---|---|---|
# | forward | all-gather of the sequence | the same all-gather |
# | where | inside the linear's Function | in the module's input hook, before the linear |
# | the linear saves | its shard, `b·s·h/tp` | the gathered input, `b·s·h` |
# | backward | re-gather, then reduce-scatter | reduce-scatter only |
#
# The collective is the same; the memory is not. Section 9 measures it.
#
# **FSDP2 over TP: strided shards.** `fully_shard` cuts the tensor each rank already
# holds, so with dp = 2 over tp = 2 it halves *this rank's TP rows*. On the
# `(dp_shard, tp)` mesh, whose flattened order puts rank `(d, t)` at place `d·tp + t`, a
# dp shard does not sit at its rank's place: DTensor names that placement
# `_StridedShard(dim=0, sf=tp)`. **Predict before you run:** of the MLP-up weight's 96
# rows, which does rank `(d, t)` hold? `fsdp_rows` writes each row's number into it and reads
# the shard back.
#
# <details><summary>Answer</summary>
#
# Rows `t·96/tp + d·96/(tp·dp)` onwards, 24 of them: rank (0, 1) holds 48-71, not 24-47.
# </details>

# %%
tp, dp, n = 2, 2, CONFIG.ffn
held = run(fsdp_rows, tp * dp, tp, dp)
ranks = {rank: divmod(rank, tp) for rank in range(tp * dp)}  # (d, t): tp innermost
first_row = {rank: t * n // tp + d * n // (tp * dp) for rank, (d, t) in ranks.items()}
rows = [(rank, ranks[rank], f"{r[0]}-{r[-1]}", first_row[rank]) for rank, r in enumerate(held)]
print(text_table(("rank", "(d, t)", "rows held", "t·n/tp + d·n/(tp·dp)"), rows))
strided = claim(
    "FSDP2 over TP: rank (d, t) holds rows t·n/tp + d·n/(tp·dp) onwards, n/(tp·dp) of them",
    all(r == list(range(first_row[k], first_row[k] + n // (tp * dp))) for k, r in enumerate(held)),
    f"dp {dp} x tp {tp}, n = {n} rows",
)
dtensor_claims.append(strided)
print(verdict_table([strided], "\nwhere FSDP's shards lie"))

# %% [markdown]
# To gather such a weight, no single all-gather over the 4 ranks returns the rows in
# order: `full_tensor()` runs 2 sequential all-gathers, one per mesh axis, and torch logs
# a warning that says so. The bytes are those of one all-gather over the 4 ranks,
# `(dp-1)/(dp·tp)·P + (tp-1)/tp·P = (dp·tp-1)/(dp·tp)·P` for a weight of `P` bytes; the cost
# is a second collective's latency, on the path. The package says the two steps aloud,
# FSDP's unshard over dp and then TP's over tp, and torch has nothing to warn about:

# %%
# show: paralab.tp.dtensor.gather_dp_then_tp

# %% [markdown]
# **Megatron's answer to the q/k/v permutation, and fewer kv heads than tp.** This
# lab's fused weight is `q | k | v`, so torch's contiguous cut needs `head_aligned_qkv`.
# Megatron lays it out per query group, `q1 q2 k1 v1 | q3 q4 k2 v2 | ...`: a contiguous
# cut then hands each rank whole groups. With grouped-query attention (8 query heads
# sharing `groups` kv heads here, head dim 6), a rank holds `groups/tp` groups, until
# there are fewer groups than ranks: then a piece holds part of a group, and Megatron
# all-gathers the q/k/v output, slices out group `rank // (tp/groups)` and keeps its
# `8/tp` query heads; the group's kv head is computed on `tp/groups` ranks.

# %%
# show: paralab.tp.gqa.interleaved_qkv

# %%
# show: paralab.tp.gqa.gqa_job

# %% jupyter={"source_hidden": true}
# show: paralab.tp.gqa.grouped_attention paralab.tp.gqa.GatherLastDim

# %%
from paralab.tp.gqa import check_gqa

gqa_claims = [
    summary(
        f"GQA, {groups} kv heads at tp={tp}{' (fewer kv heads than tp)' if groups < tp else ''}: "
        "out, dx, both weights' grads = one process",
        check_gqa(run(gqa_job, tp, groups), groups),
    )
    for groups, tp in ((4, 2), (2, 4), (1, 4))
]
dtensor_claims += gqa_claims
print(verdict_table(gqa_claims, "Megatron's per-group q/k/v layout (relative bound 1e-12)"))

# %% [markdown]
# ## 9. Activation memory per rank: what SP divides
#
# Saved-tensor hooks see every tensor autograd keeps for the backward; counting each
# storage once, parameters excluded, gives the activation memory of one block's forward
# per rank. The closed form names each saved tensor:

# %%
# show: paralab.tp.memory.block_saved_bytes

# %% jupyter={"source_hidden": true}
# show: paralab.tp.memory.SavedBytes

# %% jupyter={"source_hidden": true}
# show: paralab.tp.runs.memory_job

# %% [markdown]
# **Predict before you run.** At tp = 4, how does a rank's saved memory under TP+SP compare
# with one process, and with TP alone?
#
# <details><summary>Answer</summary>
#
# Exactly 4 times less than one process. TP alone divides what lies between a column and a
# row linear (attention's q/k/v and output, the MLP's hidden), but every rank still saves
# the norms and the column linears' inputs for the full sequence. SP divides those too: the
# norms run on `s/tp` tokens, and each column linear saves only its shard (re-gathered in
# the backward). Every part is then divided by tp, Korthikanti et al.'s accounting.
# </details>

# %%
saved = {(1, False): [one_process_saved_bytes()]}
for tp in TPS:
    for sp in (False, True):
        saved[(tp, sp)] = run(memory_job, tp, sp)
memory_claims = [
    summary("saved bytes per rank = closed form, tp 1, 2, 4, ±SP", check_memory(saved)),
    summary(
        "TP+SP: every rank saves exactly 1/tp of one process, tp 2, 4",
        compare(
            torch.tensor([tp * b for tp in TPS for b in saved[(tp, True)]]),
            torch.tensor([saved[(1, False)][0]] * sum(len(saved[(tp, True)]) for tp in TPS)),
        ),
    ),
]
MODES = {
    (1, False): "one process",
    **{(tp, sp): "TP+SP" if sp else "TP" for tp in TPS for sp in (False, True)},
}
rows = [
    (tp, MODES[(tp, sp)], per_rank[0], sum(block_saved_bytes(CONFIG, tp, sp).values()))
    for (tp, sp), per_rank in saved.items()
]
print(text_table(("tp", "mode", "measured (B)", "closed form (B)"), rows, align_right=(0, 2, 3)))
print(verdict_table(memory_claims, "\nactivation memory of one block, per rank (exact)"))
labels = {key: f"tp={key[0]}\n{mode}" for key, mode in MODES.items()}
show(
    plot_activation_memory(
        {labels[key]: block_saved_bytes(CONFIG, *key) for key in saved},
        {labels[key]: per_rank[0] for key, per_rank in saved.items()},
    )
)

# %% [markdown]
# **torch's SP, measured the same way.** `dtensor_memory_job` cuts the same block with
# section 8's styles (`paralab.tp.dtensor.block_plan`) and counts what autograd saves.
# **Predict before you run:** at tp = 4 with SP, which parts change against the package's
# 28416 B, and by how much?
#
# <details><summary>Answer</summary>
#
# Only the column inputs: `ColwiseParallel` gathers in its input hook, so q/k/v and MLP-up
# each save the full `b·s·h` instead of their shard. `2·b·s·h·8·(tp-1)/tp` = 13824 B more:
# 42240 B, what "What to try" 4 computes for a plain `F.linear` after the all-gather.
# </details>

# %%
torch_sp = {tp: run(dtensor_memory_job, tp, True) for tp in TPS}
rows = [
    (
        tp,
        saved[(tp, True)][0],
        torch_sp[tp][0],
        sum(block_saved_bytes(CONFIG, tp, True, saves_gathered_input=True).values()),
        saved[(1, False)][0] // tp,
    )
    for tp in TPS
]
print(
    text_table(
        ("tp", "Megatron SP (B)", "torch SP (B)", "closed form, gathered (B)", "one process/tp"),
        rows,
        align_right=(0, 1, 2, 3, 4),
    )
)
torch_sp_claims = [
    summary(
        "torch SP saves the gathered column inputs: measured = closed form, tp 2, 4",
        compare(
            torch.tensor([b for tp in TPS for b in torch_sp[tp]]),
            torch.tensor([row[3] for row in rows for _ in range(row[0])]),
        ),
    ),
    claim(
        "torch SP saves more than 1/tp of one process; Megatron's SP exactly 1/tp",
        all(torch_b > megatron_b == one_b for _, megatron_b, torch_b, _, one_b in rows),
        ", ".join(f"tp={r[0]}: {r[2]} > {r[1]}" for r in rows),
    ),
]
print(verdict_table(torch_sp_claims, "\ntorch's SequenceParallel + ColwiseParallel(Shard(1))"))

# %% [markdown]
# The norms are divided alike (`SequenceParallel` runs them on `s/tp` tokens); the column
# inputs are not. torchtitan's `apply_tp` puts the gather on the attention and MLP modules
# (`PrepareModuleInput`), which keeps the gathered input too. The price of Megatron's
# saving is the backward's re-gather (section 6); torch's SP sends less and saves more.

# %% [markdown]
# ## 10. Bug clinic: a block whose forward is right
#
# The package's block job runs twice on 2 ranks, once as it is and once with a change
# handed to the ranks with `run(..., patches=tp_clinic_change())` (a patch set from
# `paralab.exercises.lab07`; do not read it yet). The same forward, the same inputs. It is
# the package's `paralab.tp.runs.block_job`, not this kernel's copy from section 3: a patch
# set replaces functions of the package, which the package's job calls; this kernel's copy
# calls this kernel's copies (an edit of a shown cell reaches the ranks that way, by value). The
# picture is `|buggy dx - correct dx|`, the input gradient, per token (rows: batch ×
# token) and hidden feature.

# %%
correct = run(package_runs.block_job, 2)
buggy = run(package_runs.block_job, 2, patches=tp_clinic_change())
got, want = assemble(buggy, False), block_reference()
show(
    plot_diff_heatmap(
        want["dx"],
        got["dx"],
        "tp = 2, one block: dx, changed vs one process",
        "batch x token",
        "hidden",
    )
)
clinic = []
for name in ("out", "dx"):
    v = compare(got[name], want[name], atol=1e-12 * want[name].abs().max().item())[0]
    clinic.append(
        claim(
            f"clinic: {name} {'still matches' if name == 'out' else 'caught by the check'}",
            v.passed == (name == "out"),
            "matches one process" if v.passed else f"{v.n_diff} of {v.numel} elements differ",
        )
    )
clinic.append(
    claim(
        "clinic: the ranks' dx now differ from each other",
        not torch.equal(buggy[0]["dx"], buggy[1]["dx"]),
        "rank 0 and rank 1 disagree",
    )
)
clinic.append(
    summary("clinic: the unchanged run still passes every check", check_block(correct, False))
)
print(verdict_table(clinic, "bug clinic: the check sees the change"))

# %% [markdown]
# **What is wrong?** The output matches, and so do the MLP's four gradients
# (`check_block(buggy, False)` lists every row); everything further back (the second norm,
# all of attention, the first norm, `dx`) is off, and differently on each rank. Which
# crossing's backward lost its collective?
#
# <details><summary>Answer</summary>
#
# f's backward returns its input unchanged: the all-reduce is dropped
# (`keep_own_gradient` in `src/paralab/exercises/lab07.py`, patched over
# `paralab.tp.mappings.f_backward`). In front of the q/k/v and MLP-up linears each rank then
# keeps only the part of `∂L/∂x` that flows through *its* heads and *its* MLP columns: a
# partial gradient. The forward is untouched (f is the identity), so the loss would match a
# single process to the last digit. The MLP's weights get correct gradients: they need only
# the activations and the gradient at the block's output, and no f lies between. The first
# f the backward meets is the MLP's: from there the residual stream's gradient is partial,
# so the second norm, all of attention (its output gradient arrives partial), the first
# norm and `dx` are wrong. In a model every layer below would train on a partial gradient,
# and the ranks would drift apart (each its own `dx`). The same family as
# [picotron#23](https://github.com/huggingface/picotron/issues/23), an open report, not
# confirmed by the maintainers, that the weight-loading step
# (`init_model_with_materialized_weights`) silently replaces the final projection's
# `ColumnParallelLinear` by a plain `nn.Linear`: a layer that runs, but not the layer the
# parallel plan assumes. A forward check cannot see such a thing; comparing every gradient
# element by element can.
# </details>

# %% [markdown]
# ## Closing note

# %%
print(
    closing_table(
        {
            "1 · column and row splits": split_claims,
            "3 · the symmetry": symmetry,
            "3-4 · one block, TP and SP": [v for f in block_verdicts.values() for v in f]
            + block_bytes_verdicts,
            "4 · dropout and the RNG tracker": dropout_claims,
            "5 · the whole model": [v for f in lm_verdicts.values() for v in f],
            "6 · bytes = formula": [v for f in byte_verdicts.values() for v in f],
            "7 · training, alone and in FSDP2": [v for f in train_verdicts.values() for v in f],
            "7 · clipping across tp": clip_claims,
            "8 · DTensor parity": dtensor_claims,
            "9 · activation memory": memory_claims + torch_sp_claims,
            "10 · bug clinic": clinic,
        }
    )
)
a = activation_bytes(CONFIG)
closing = [
    "| tp | A (B) | TP: fwd + bwd per block | TP+SP: fwd + bwd per block, re-gathers included | loss (3 all-reduces) | logits all-gather |",
    "|---|---|---|---|---|---|",
]
for tp in TPS:
    block_tp, block_sp = (
        sum(b for _, b in block_bytes(a, tp, sp).values()) for sp in (False, True)
    )
    closing.append(
        f"| {tp} | {a} | {block_tp} | {block_sp} | {3 * 2 * (tp - 1) * CONFIG.batch * CONFIG.seq * 8 // tp} | {gathered_logits_bytes(CONFIG, tp)} |"
    )
display(
    Markdown(
        "Bytes sent per rank per micro-batch (here one per step), from the closed forms section 6 checked against the "
        "ledger on every rank (float64, b = 2, s = 12, h = 48, V = 48):\n\n" + "\n".join(closing)
    )
)

# %% [markdown]
# ## What to try
#
# 1. Set `TPS = (2, 3, 4)` in the first code cell and re-run from the top. Do the blocks,
#    the bytes and the memory hold at an odd tp?
#
#    <details><summary>Hint</summary>Yes: 12 heads, hidden 48, ffn 96, vocab 48 and 12 tokens
#    all divide by 3; the formulas use `(tp-1)/tp` and nothing assumes a power of two.</details>
# 2. Hand the ranks g with an all-reduce in its backward too:
#    `from paralab.exercises.lab07 import sum_gradients`, then
#    `bad = run(package_runs.block_job, 2, patches={"paralab.tp.mappings": {"g_backward": sum_gradients}})`
#    and `print(verdict_table(check_block(bad, False)))`. Which rows still pass? By what
#    factor is the MLP's down-projection weight gradient off
#    (`assemble(bad, False)["grads"]["mlp.down.weight"]` against `block_reference()`)?
#
#    <details><summary>Hint</summary>Only `out`, `mlp.down.bias` (added after g) and "dx,
#    every rank the same" pass: the ranks still agree, all wrongly. The last g's backward
#    receives the block's output gradient and sums 2 identical copies of it, so
#    `mlp.down.weight`'s gradient is 2 (= tp) times too large, to rounding;
#    further back the doubled gradient mixes with the residual's correct one, and no
#    simple factor is left.</details>
# 3. Run the clinic with sequence parallelism:
#    `run(package_runs.block_job, 2, True, patches=tp_clinic_change())` and
#    `check_block(..., True)`.
#    Is the change still caught? Why?
#
#    <details><summary>Hint</summary>It passes: under SP the column linear's input comes
#    through the all-gather, whose backward is a reduce-scatter; f (and its backward) is not
#    used at all. A test of the SP path alone would never see this bug.</details>
# 4. From `block_saved_bytes` and `block_bytes`, what would one block save per rank at
#    tp = 4 with SP if the two column linears let autograd keep their *gathered* input (a
#    plain `F.linear` after the all-gather), and what would it send less?
#
#    <details><summary>Hint</summary>The "column inputs" part, 4608 B (`2·b·s·h·8/tp`),
#    becomes `2·b·s·h·8` = 18432 B: 28416 - 4608 + 18432 = 42240 B, no longer `1/tp` of the
#    one-process 113664 B. It would save the two re-gathers, `2·(tp-1)/tp·A` = 13824 B per
#    block per micro-batch: the backward's all-gathers drop from 4 to 2. At scale the memory is
#    the scarcer of the two, and Megatron hides the re-gather behind the input-gradient
#    matmul. torch's `ColwiseParallel(input_layouts=Shard(1))` makes the other choice:
#    section 9 measures 42240 B.</details>
# 5. Why must tp be the innermost axis of a `(dp_shard, tp)` mesh? Count the bytes one block
#    sends per micro-batch at tp = 8 for `b·s·h` = 8·4096·8192 numbers in bf16, and compare them
#    with a training step's compute.
#
#    <details><summary>Hint</summary>`4·2·7/8·A` with `A` = 512 MiB: 3.5 GiB per block per
#    micro-batch (a step of m micro-batches sends m times that; under full activation
#    recomputation the backward re-runs the forward's 2 all-reduces: 6, 5.25 GiB), on the
#    critical path (each all-reduce waits for the matmul before it). At NVLink's hundreds of
#    GB/s that is milliseconds; across nodes at tens of GB/s it would dominate.</details>

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time: {time.monotonic() - LAB_START:.1f} s")
