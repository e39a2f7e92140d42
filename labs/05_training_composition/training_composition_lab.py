# %% [markdown]
# # Lab 05 — Training composition: CP, activation checkpointing, compile and FSDP in one step
#
# Labs 00–02 proved one axis at a time. A real video-model trainer runs them **together on
# the same ranks**: every rank is at once in a dp group (FSDP/HSDP shards the weights) and in
# a cp group (its sample's sequence is split), and the model is wrapped four times, in a
# fixed order: **apply_cp → apply_ac → apply_compile → apply_fsdp**.
#
# **Learning goals.** After this lab you can
# 1. say which sample and which tokens each rank loads (`rest = rank // cp`), and why
#    the plain local mean loss gives the right gradient with no extra cp all-reduce;
# 2. read the four `apply_*` functions and say what each wraps;
# 3. predict the bytes one training step sends per group (dp_shard, dp_replicate, cp) and
#    phase (forward, backward, recompute), and what activation checkpointing adds;
#    and the bytes each AC mode keeps for backward, counted and in closed form;
# 4. predict, then see on real ranks, what each arrangement of the four steps does: an
#    attribute swap after compile recompiles, CP hooks registered after a compiled call are
#    silently skipped, AC before this lab's CP swap is silently wrong;
# 5. say when the local-mean loss is exact (equal loss tokens per shard) and use the global
#    token count when it is not;
# 6. call a method other than `forward` on an FSDP model (`register_fsdp_forward_method`).
#
# **Prerequisites.** Lab 00 (the overlay descriptor), lab 01 (FSDP2 `fully_shard`), lab 02
# (ring and Ulysses attention, their hand-written backward).
#
# **Time.** About 40 minutes to read; the last cell prints how long the runs took.
#
# **What is checked.** Parameters after 3 optimizer steps, element by element in float64,
# against one process training on the whole global batch, on 4 ranks: dp_shard 4, cp 2 with
# the ring under each AC mode (none / full / selective) and with Ulysses; HSDP (dp_replicate 2
# × dp_shard 2) with a cp 4 ring and Adam; the VLM row (HSDP, cp 1: the shape a
# vision-language model trains in, lab 00's workload table, whose sequences need no cp); and
# compiled once (a causal ring, so the zigzag shards are checked too). Every byte of every
# step against its closed form: modelled bytes, counted at the `torch.distributed` API by the
# ledger, not measured on a wire. (Every AC mode × SGD and Adam on three 4-rank layouts,
# Ulysses with cp 4 among them, is `tests/test_train.py::test_every_ac_mode_and_optimizer_on_4_ranks`;
# FSDP's padded shards, which take 8 ranks on this model,
# `tests/test_train.py::test_padded_shards_on_8_ranks_match_one_process_and_the_closed_form`.)
# Before that, two tiny 2-rank runs: `apply_cp` alone (each rank's prediction = one process at
# its positions) and `apply_fsdp` alone (the shards stack to the full weight); in this
# process, the bytes saved for backward per AC mode against a closed form, and AC then
# compile per block (the engines' nesting) against eager, element by element; six
# arrangements of the four steps on 2 ranks (section 3); and one SGD step on a padded batch
# with two loss normalizations (section 4d).

# %%
import time

import torch

from paralab import launch, viz
from paralab.check import claim, compare, summary, verdict_table
from paralab.launch import run
from paralab.parallel_dims import ParallelDims
from paralab.tables import text_table
from paralab.train import apply_ac, apply_compile, reference, runs
from paralab.train.costs import measured_step_bytes, training_step_bytes
from paralab.train.memory import activation_memory, activation_terms
from paralab.train.model import SHAPE, SequenceShard, build_model
from paralab.train.order import order_cases
from paralab.train.runs import (
    compile_report,
    generate_demo,
    local_losses,
    make_sample,
    run_titan,
    run_variants,
    sample_and_positions,
)
from paralab.train.tokens import RULES, masked_reference, masked_step
from paralab.viz import show
from paralab.viz.train import plot_ac_activation_memory, plot_wrapper_nesting

LAB_START = time.monotonic()
torch.set_num_threads(
    1
)  # this process shares the CPU with the ranks: tiny tensors, no thread spinning
launch.FORKSERVER_PRELOAD.append("paralab.train")  # ranks start with this lab's package imported
print(SHAPE)

# %% [markdown]
# ## 1. The model, and which tokens each rank holds
#
# A small DiT-like denoiser in float64: embed the noisy latent tokens, add a learned
# **position** row for each token's *global* position and a noise-level embedding, then 2
# blocks of (norm → multi-head attention → residual, norm → MLP → residual), a head, and the
# MSE against the noise. Only `Block.attention` ever looks at other tokens: it is the seam
# that context parallelism replaces. `DiT.shard` (a `SequenceShard`) says which tokens this
# rank holds; positions come from the same shard, so a cp rank knows where its tokens sit.

# %%
# show: paralab.train.model.Block

# %% [markdown]
# `SequenceShard` is the other seam: shard `rank` of the `cp` shards, contiguous or zigzag (lab 02).
# The same rule cuts the input tokens, the noise target and the position table.

# %%
# show: paralab.train.model.SequenceShard

# %%
for shard in (SequenceShard(), SequenceShard(1, 2), SequenceShard(1, 2, zigzag=True)):
    print(f"{str(shard):<50} holds positions {shard.positions(SHAPE['tokens']).tolist()}")

# %% [markdown]
# **Which sample a rank loads** follows the overlay (lab 00): the cp partners of a sample are
# consecutive ranks, `rest = rank // cp` numbers the groups, so the global batch has
# `world / cp` samples (× the micro-batch, 1 here) and every cp partner loads the same
# sample and keeps its shard of the tokens. (Lab 00's overlay rule is `rank // (cfgp·cp)`;
# cfgp, the guidance branches of inference, is 1 in training, and `sample_index` keeps the
# general form.)

# %%
# show: paralab.train.runs.sample_index paralab.train.runs.make_sample

# %% [markdown]
# **Predict.** 8 ranks, dp_replicate 2 × dp_shard 4, cp 2. How many samples in the global
# batch? Which sample and which token positions does rank 5 hold?
#
# <details><summary>Answer</summary>
#
# 8 / 2 = 4 samples. Rank 5: `rest = 5 // 2 = 2`, sample 2; it is cp rank 1 of its pair, so it
# holds the second half of the tokens, positions 16–31 (with the causal ring, zigzag: chunks 1
# and 2 of 4, positions 8–23). The picture below shows every rank.
# </details>
#
# The same arithmetic for any rank and layout, without the loader or the model: the graded
# exercise `sample_and_positions` (its check compares it with what the training loop loads).

# %%
# show: paralab.train.runs.sample_and_positions


# %%
def ownership(world, dims, *, zigzag=False):
    """Every rank's sample and token positions, from `sample_and_positions`."""
    pd = ParallelDims(world, **dims)
    held = [sample_and_positions(r, pd, SHAPE["tokens"], zigzag) for r in range(world)]
    return [sample for sample, _ in held], [positions for _, positions in held]


show(
    viz.plot_token_ownership(
        *ownership(8, dict(dp_replicate=2, dp_shard=4, cp=2)),
        SHAPE["tokens"],
        "8 ranks, dp_replicate 2 x dp_shard 4, cp 2: sample and tokens per rank",
    )
)

# %% [markdown]
# **Why the gradient still comes out right.** A sample's loss `ℓ_s` is the mean over its `N`
# tokens. Each of its `cp` partners computes the plain mean over its own `N/cp` tokens, so the
# partners' losses sum to `cp·ℓ_s`. FSDP (lab 01) *averages* gradients over all ranks of the
# dp mesh, and in the overlay reading the dp mesh is the whole world
# (`dp_replicate × dp_shard = world`), cp partners included:
#
# `(1/world) Σ_ranks ∇L_r = (1/world) Σ_samples cp·∇ℓ_s = (1/B) Σ_samples ∇ℓ_s`,  with `B = world/cp`.
#
# So the parameter gradient is **summed over cp partners** (each holds a different part of the
# same sample's loss, and the ring/Ulysses backward already sent each partner the gradient of
# the keys and values it owns) and **averaged over samples** — by FSDP's own gradient
# reduction (a reduce-scatter over dp_shard, and with HSDP an all-reduce over dp_replicate),
# with no extra cp all-reduce. The loss is the plain local mean; section 4a checks on real
# ranks that the average over ranks of the cp-local losses equals the mean over samples
# computed by one process.
#
# **The precondition.** This holds because every cp shard of every sample holds the same
# number of loss tokens (`N/cp`, no padding, no packing). When the counts differ, the mean of
# local means weights the tokens of a sparse shard more; section 4d shows the difference on a
# padded batch, and the rule torchtitan uses instead (divide the local sum by the global
# count of loss tokens, and let FSDP sum instead of average).

# %%
# show: paralab.train.model.loss_of

# %% [markdown]
# ## 2. The four steps, in Cosmos's order
#
# `parallelize` runs `apply_cp → apply_ac → apply_compile → apply_fsdp`. Each step below is
# shown on its own, with a tiny run right after it; the whole composition trains in section 4.
#
# **`apply_cp`** swaps every block's attention for lab 02's ring or Ulysses over the cp group
# (the same `autograd.Function`s, with their hand-written backward) and sets the model's
# `SequenceShard` (zigzag for the causal ring). `CPAttention`, folded under it, only picks
# ring or Ulysses and passes the cp group.

# %%
# show: paralab.train.parallelism.apply_cp

# %% jupyter={"source_hidden": true}
# show: paralab.train.parallelism.CPAttention

# %% [markdown]
# A tiny run: 2 ranks, cp 2, CP only (no FSDP yet). Each rank predicts the noise for its 16
# tokens of sample 0; one process predicts all 32. Each rank's prediction should be the
# one-process prediction at its positions.


# %%
def cp_forward(dims):
    """This rank's prediction for sample 0 with CP installed, and which tokens it holds."""
    model = apply_cp(build_model(), runs.dims_of(dims))
    noisy, sigma, _ = make_sample(0, 0, 0)
    with torch.no_grad():
        prediction = model(noisy, sigma)
    return {
        "attention": type(model.blocks[0].attention).__name__,
        "prediction": prediction,
        "positions": model.shard.positions(SHAPE["tokens"]).tolist(),
    }


# dp_shard=2: the overlay needs dp_shard x dp_replicate = world (lab 00); no FSDP is applied here
cp_run = run(cp_forward, 2, dict(dp_shard=2, cp=2), timeout=120)
noisy, sigma, _ = make_sample(0, 0, 0)
with torch.no_grad():
    whole = build_model()(noisy, sigma)
for rank, r in enumerate(cp_run):
    print(
        f"rank {rank}: blocks[i].attention is {r['attention']}, positions {r['positions'][0]}..{r['positions'][-1]}, "
        f"prediction {tuple(r['prediction'].shape)}"
    )
cp_verdicts = [
    claim(
        f"rank {rank}: CP prediction = one process at its positions",
        torch.allclose(r["prediction"], whole[:, r["positions"]], rtol=0, atol=1e-12),
        "within 1e-12",
    )
    for rank, r in enumerate(cp_run)
]
print(verdict_table(cp_verdicts, "apply_cp on 2 ranks"))

# %% [markdown]
# **`apply_ac`** wraps with real `torch.utils.checkpoint` (non-reentrant, through torch's
# `checkpoint_wrapper`, as torchtitan and Cosmos do; `checkpointed`, folded). **full**: each
# block; its backward re-runs the block's forward, the attention's collectives included.
# **selective**: a *region split*: the norm+qkv region and the MLP are checkpointed, the
# attention is not, so its output is saved and the recompute sends nothing.

# %%
# show: paralab.train.parallelism.apply_ac

# %% jupyter={"source_hidden": true}
# show: paralab.train.parallelism._recompute_labelled paralab.train.parallelism.checkpointed

# %% [markdown]
# A tiny run, in this process (wrapping needs no ranks): what sits in `model.blocks[0]` and in
# its `qkv` after each mode.


# %%
def unwrapped(module):
    return getattr(module, "_checkpoint_wrapped_module", module)


for ac in AC_MODES:
    block = apply_ac(build_model(), ac).blocks[0]
    print(
        f"ac={ac:<9} blocks[0]: {type(block).__name__:<17} qkv: {type(unwrapped(block).qkv).__name__}"
    )

# %% [markdown]
# **What AC buys: the bytes a forward keeps for backward.** One process, one sample, no cp
# (the memory of a rank's block depends on its `N/cp` tokens and on the attention code it
# runs; the closed form is for `LocalAttention`). `saved_for_backward` counts, with
# `torch.autograd.graph.saved_tensors_hooks`, every tensor an op saves for its backward, once
# per storage, parameters left out. A non-reentrant checkpoint saves its inputs before it
# installs its own hooks, so those are counted; what is saved *inside* a checkpointed region
# goes to the checkpoint's hooks, and is dropped. The closed form (`activation_terms`, `T = N`
# tokens, `d` = 16, `F` = 32, `h` = 8, float64) counts, per block:
#
# | mode | kept per block |
# |---|---|
# | none | the block input, q, k, v, the scores and the probabilities (`h·N²` each), their log-sum-exp, four other `(T, d)` inputs of norms and matmuls, the tanh output `(T, F)`, two norms' mean and rstd |
# | full | the block input (the checkpoint's input) |
# | selective | the qkv checkpoint's input, the attention's q, k, v, scores, probabilities and log-sum-exp, the out projection's input, the MLP checkpoint's input |
#
# and outside the blocks, in every mode, the inputs, the final norm's input and statistics,
# the head's input and the loss difference. **Predict** the order of the three totals, and
# how much the region split saves.

# %%
# show: paralab.train.memory.saved_for_backward

# %%
memory = activation_memory()
print(
    text_table(
        ["mode", "counted (hooks)", "closed form", "of none"],
        [
            [
                f"ac={ac}",
                f"{m['counted']:,} B",
                f"{m['formula']:,} B",
                f"{m['counted'] / memory['none']['counted']:.0%}",
            ]
            for ac, m in memory.items()
        ],
    )
)
show(
    plot_ac_activation_memory(
        {ac: activation_terms(ac) for ac in memory}, {ac: m["counted"] for ac, m in memory.items()}
    )
)
memory_verdicts = [
    claim(
        f"ac={ac}: bytes saved for backward = closed form",
        m["counted"] == m["formula"],
        f"{m['counted']:,} B",
    )
    for ac, m in memory.items()
]
print(verdict_table(memory_verdicts, "activation memory per AC mode"))

# %% [markdown]
# <details><summary>Answer</summary>
#
# Full AC keeps 5% of what no AC keeps: per block only its input, `T·d·8` = 4 096 B. The
# region split keeps 90%: it saves what it set out to save, the attention, and this
# attention is not a fused kernel: it keeps its `h·N²` scores and probabilities, 2 × 65 536 B
# per block, the largest tensors of the model. A fused attention (flash, cuDNN, the `fmha`
# kernels Cosmos's selective policy saves) keeps only q, k, v, its output and the log-sum-exp,
# linear in `N`, which is why saving the attention is the cheap choice in production and the
# expensive one here. The numbers are modelled at autograd's API, one process: a rank with cp
# keeps its own `N/cp` tokens' share, and lab 02's ring saves what each of its steps needs.
# </details>

# %% [markdown]
# Why not torch's selective policy (`create_selective_checkpoint_contexts`, which Cosmos feeds
# op-name MUST_SAVE/RECOMPUTE lists; torchtitan's `_op_sac_save_list` at 238fa99 starts with
# `aten.mm`, then the SDPA ops, the functional `reduce_scatter_tensor` and `aten.max`)? The policy sees ATen ops; our ring and Ulysses are
# Python `autograd.Function`s that call `torch.distributed` themselves, so a policy cannot mark
# "the CP attention" as saved (it would need the attention registered as one custom op). The
# region split states the same decision (save the attention, recompute the rest) in plain
# modules. The wrapper's `context_fn` labels the recompute in the ledger as its own phase.
#
# **`apply_compile`**: `torch.compile` per block with the `aot_eager` backend (AOTAutograd
# traces forward and backward graphs, runs them eagerly: no C++ compiler needed on this CPU).

# %%
# show: paralab.train.parallelism.apply_compile

# %%
block = apply_compile(apply_ac(build_model(), "full"), True).blocks[0]
print(
    f"blocks[0]: {type(block).__name__} -> {type(block._orig_mod).__name__} -> "
    f"{type(unwrapped(block._orig_mod)).__name__} (compiled lazily, at the first call)"
)

# %% [markdown]
# **Compile and AC together, as both engines run them**: AC first, then `torch.compile` per
# block, so the checkpoint is *inside* the compiled block and Dynamo traces it (a higher-order
# op). In this process there is no cp, so no collective breaks the graph, and the block
# compiles whole. One limit of that: a traced checkpoint's `context_fn` must return two
# `TorchDispatchMode`s (torch 2.13 asserts it), and the ledger's recompute label is a plain
# context manager, so these runs leave it off (`apply_ac(..., label_recompute=False)`, the
# engines' plain wrapper). Each mode's gradients are compared with the eager run above,
# element by element, and its saved bytes counted the same way:

# %%
compiled_memory = activation_memory(compiled=True)
print(
    text_table(
        ["mode", "graphs", "counted, compiled", "counted, eager", "gradients vs eager"],
        [
            [
                f"ac={ac}",
                m["graphs"],
                f"{m['counted']:,} B",
                f"{memory[ac]['counted']:,} B",
                f"max |diff| {max((a - b).abs().max().item() for a, b in zip(m['grads'], memory[ac]['grads'])):.1e}",
            ]
            for ac, m in compiled_memory.items()
        ],
    )
)
compiled_ac_verdicts = [
    summary(
        f"compiled, ac={ac}: gradients = eager",
        compare(m["grads"], memory[ac]["grads"]),
    )
    for ac, m in compiled_memory.items()
] + [
    claim(
        "compiled, ac=full: one graph, the same bytes kept as eager full AC",
        compiled_memory["full"]["graphs"] == 1
        and compiled_memory["full"]["counted"] == memory["full"]["counted"],
        f"{compiled_memory['full']['graphs']} graph, {compiled_memory['full']['counted']:,} B",
    ),
    claim(
        "compiled, ac=selective: keeps no more than eager",
        compiled_memory["selective"]["counted"] <= memory["selective"]["counted"],
        f"{compiled_memory['selective']['counted']:,} B <= {memory['selective']['counted']:,} B",
    ),
]
print(verdict_table(compiled_ac_verdicts, "compile and AC together, one process"))

# %% [markdown]
# Full AC survives compile: the compiled block keeps the same 19 208 B and gives the same
# gradients. Under compile, what the rest of the graph saves is AOTAutograd's partitioner's
# choice, not the eager rule: with the region split it keeps 16 384 B less than eager here,
# two fewer `(8, 32, 2)` q/k/v-shaped tensors per block. On real ranks with the ring, the same
# nesting compiles nothing: case (e) of [section 3](#3-the-order-predict-then-run) shows
# the ring's point-to-point calls breaking the graph inside the checkpoint, and the whole
# checkpointed block running eagerly.

# %% [markdown]
# **`apply_fsdp`**: FSDP2 `fully_shard` on every block, then the root, on `fsdp_mesh` (2-D only
# when dp_replicate > 1, lab 01's trap).

# %%
# show: paralab.train.parallelism.shard_on paralab.train.parallelism.apply_fsdp

# %% [markdown]
# A tiny run: 2 ranks, dp_shard 2. Each rank keeps half the rows of every parameter (a
# `DTensor` shard); its shard of block 0's qkv projection, stacked with its partner's, is the
# full weight.


# %%
def fsdp_shards(dims, name="blocks.0.qkv.proj.weight"):
    """This rank's local shard of one parameter after apply_fsdp."""
    model = apply_fsdp(build_model(), runs.dims_of(dims))
    return dict(model.named_parameters())[name].to_local().clone()


shards = run(fsdp_shards, 2, dict(dp_shard=2), timeout=120)
full_weight = build_model().blocks[0].qkv.proj.weight.detach()
print(
    f"blocks.0.qkv.proj.weight: full {tuple(full_weight.shape)}, "
    f"shards {[tuple(s.shape) for s in shards]} on ranks 0 and 1"
)
fsdp_verdicts = [
    claim(
        "rank 0's rows then rank 1's = the full weight",
        torch.equal(torch.cat(shards), full_weight),
        "bitwise",
    )
]
print(verdict_table(fsdp_verdicts, "apply_fsdp on 2 ranks"))

# %% [markdown]
# **`parallelize`** is the four steps in the order `ORDER` names (section 3 runs it with
# other orders):

# %%
# show: paralab.train.parallelism.parallelize

# %% [markdown]
# And the training loop every rank runs: `train` builds the model, calls `parallelize`, loads
# its sample, and steps; `full_parameters` all-gathers the FSDP shards so every rank returns
# the same full tensors.

# %%
# show: paralab.train.runs.training_loop

# %%
# show: paralab.train.runs.train

# %% [markdown]
# The reference every check compares with: one process, the whole global batch, the same
# samples, the same loss.

# %%
# show: paralab.train.runs.reference

# %% [markdown]
# ## 3. The order: predict, then run
#
# `parallelize` installs CP, then AC, then compile, then FSDP. Does the order matter, and
# how would you know? Each step changes the model in its own way: `apply_cp` **swaps an
# attribute** (`block.attention`); torchtitan installs CP as **hooks** instead
# (`_ContextParallel`, torch's `parallelize_module` plan, registers forward pre- and
# post-hooks on the attention module); AC and compile **wrap** the block in a new module
# (`CheckpointWrapper`, `OptimizedModule`); FSDP2 **changes the block's class in place** and
# registers hooks on it. Six arrangements, each trained one SGD step on 2 real ranks
# (dp_shard 2, cp 2, ring), every parameter compared with one process, element by element:
#
# | case | the steps, in the order they run |
# |---|---|
# | (a) swap after a compiled call | compile, one forward (a warm-up), `apply_cp`, FSDP |
# | (b) hooks after a compiled call | compile, warm-up, CP as forward pre-hooks, FSDP |
# | (b') hooks before the first call | CP as hooks, compile, warm-up, FSDP |
# | (c) compile inside the checkpoint | `apply_cp`, compile each block, AC (full) around it, FSDP |
# | (d) AC before CP | AC (full), `apply_cp`, FSDP |
# | (e) the engines' order, AC and compile both on | `apply_cp`, AC (full), compile, FSDP |
#
# The hook-based CP is the smallest one that works with hooks: a pre-hook on each attention
# all-gathers the cp group's keys and values (the token dim), so each rank's queries attend
# over the whole sequence (bidirectional model). The warm-up runs on the rank's own tokens
# with gradients on, as training does, so the next call differs from it only in what the
# case changed.
#
# **Predict**, before you run the next cells: for each case, a correct result, a silently
# wrong one, or an error?

# %%
# show: paralab.train.order.install_cp_hooks paralab.train.order.warm_up

# %% jupyter={"source_hidden": true}
# show: paralab.train.order.GatherTokens paralab.train.order.build_case

# %%
ORDER_CASES = {
    "swap_after_compile": "(a) swap after a compiled call",
    "hooks_after_compile": "(b) hooks after a compiled call",
    "hooks_before_compile": "(b') hooks before the first call",
    "compile_inside_checkpoint": "(c) compile inside the checkpoint",
    "ac_before_cp": "(d) AC before CP",
    "ac_then_compile": "(e) CP, AC, compile, FSDP",
}
order_run = run(order_cases, 2, dict(dp_shard=2, cp=2), timeout=300)
order_reference = reference(samples=1, steps=1)


def order_outcome(case):
    """error / silently wrong / correct, from both ranks' parameters against one process."""
    per_rank = [r[case] for r in order_run]
    if per_rank[0]["error"]:
        return f"error: {per_rank[0]['error'][:70]}", None
    diffs = [
        max((r["params"][k] - order_reference[k]).abs().max().item() for k in order_reference)
        for r in per_rank
    ]
    wrong = "SILENTLY WRONG" if min(diffs) > 1e-6 else "ranks disagree"  # wrong: on every rank
    return ("correct" if max(diffs) <= 1e-12 else wrong), max(diffs)


order_rows, nesting = [], {}
for case, label in ORDER_CASES.items():
    r = order_run[0][case]
    outcome, diff = order_outcome(case)
    inside = f"{r['attention']}" + (
        f" + {r['attention hooks']} hook" if r["attention hooks"] else ""
    )
    order_rows.append(
        [label, " > ".join(r["nesting"]), inside, r["graphs"], outcome, f"{diff:.1e}"]
    )
    nesting[label] = {"nesting": r["nesting"], "inside": inside, "outcome": outcome}
print(
    text_table(
        ["case", "blocks[0], outside in", "attention it runs", "graphs", "outcome", "max |diff|"],
        order_rows,
    )
)
show(plot_wrapper_nesting(nesting))

# %%
outcomes = {case: order_outcome(case)[0] for case in ORDER_CASES}
order_verdicts = [
    claim(
        "(a) attribute swap after a compiled call: recompiles, correct",
        outcomes["swap_after_compile"] == "correct"
        and {r["swap_after_compile"]["attention"] for r in order_run} == {"CPAttention"},
        outcomes["swap_after_compile"],
    ),
    claim(
        "(b) CP hooks after a compiled call: silently stale",
        outcomes["hooks_after_compile"] == "SILENTLY WRONG"
        and {r["hooks_after_compile"]["graphs"] for r in order_run} == {1},  # traced once
        outcomes["hooks_after_compile"],
    ),
    claim(
        "(b') the same hooks before the first call: correct",
        outcomes["hooks_before_compile"] == "correct",
        outcomes["hooks_before_compile"],
    ),
    claim(
        "(c) compile inside the checkpoint: no CheckpointError on this model",
        outcomes["compile_inside_checkpoint"] == "correct",
        outcomes["compile_inside_checkpoint"],
    ),
    claim(
        "(d) AC before CP: silently wrong",
        outcomes["ac_before_cp"] == "SILENTLY WRONG"
        and {r["ac_before_cp"]["attention"] for r in order_run} == {"LocalAttention"},
        outcomes["ac_before_cp"],
    ),
    claim(
        "(e) CP, AC, compile: correct, the checkpointed block runs eagerly",
        outcomes["ac_then_compile"] == "correct" and order_run[0]["ac_then_compile"]["graphs"] == 0,
        f"{outcomes['ac_then_compile']}, {order_run[0]['ac_then_compile']['graphs']} graphs",
    ),
]
print(verdict_table(order_verdicts, "the order, run on 2 ranks"))

# %% [markdown]
# <details><summary>Answer: what each case shows, and what makes the order a contract</summary>
#
# - **(a) An attribute swap after compile is safe in torch 2.13.** Dynamo guards the
#   attributes of the modules it traced (`guard_nn_modules = True` and
#   `guard_nn_modules_using_dict_tags` in `torch/_dynamo/config.py`): replacing
#   `block.attention` changes the block's `__dict__`, the guard fails at the next call, and
#   Dynamo traces again, now with `CPAttention` (the graph count is the warm-up's graphs plus
#   the ring's). Cosmos's `apply_cp` docstring (`parallelize_unified_mot.py`, 5eee9ed) says
#   that rewiring the dispatch after compile "would silently regress to the non-CP path
#   inside the traced kernel"; for an attribute swap, this run shows the opposite.
# - **(b) Hooks registered after a compiled call are silently skipped.** Dynamo does not
#   guard on module hooks (`skip_nnmodule_hook_guards = True`; its comment: if you add hooks
#   after compiling, "dynamo will not notice and will execute whichever version you first
#   compiled"). The traced block never calls the pre-hook, each rank attends over its own 16
#   tokens, and nothing fails. This is the failure that matters for torchtitan, whose CP *is*
#   hooks (torch's `_ContextParallel._apply` registers `register_forward_pre_hook` and
#   `register_forward_hook` on the attention module).
# - **(b') The same hooks before the first call are correct**: they exist when Dynamo
#   traces, so it traces through them. That is why CP comes before compile.
# - **(c) Compile inside the checkpoint trains correctly here.** Cosmos's
#   `parallelize_vlm.py` (5eee9ed, `apply_ac`) reports `CheckpointError: Recomputed values
#   ... have different metadata` for this nesting in its Qwen3-VL vision blocks (bfloat16,
#   with a float32 round trip that the forward and the recompute trace differently). This
#   float64 block has no such round trip, and the checkpoint's metadata check passes. The
#   arrangement that Dynamo supports is the other one, (e).
# - **(d) AC before CP is silently wrong.** `apply_ac("full")` replaces `model.blocks[i]` by
#   a `CheckpointWrapper`; `apply_cp` then sets `.attention` on the wrapper, which registers
#   a new submodule *on the wrapper*; the wrapped block still calls its `LocalAttention`.
# - **(e) The engines' order with both on is correct, and compiles nothing here.** Compiling
#   the `CheckpointWrapper` puts the `checkpoint` call inside the traced region, where Dynamo
#   turns it into a higher-order op that it must trace whole; the ring's point-to-point
#   calls break the graph inside it, so Dynamo runs the whole checkpointed block eagerly (0
#   graphs, one break reason: P2P). A block without Python collectives inside the
#   checkpoint compiles as one graph.
#
# **What the order does not need: FSDP outermost.** FSDP2 does not wrap; it hooks the module
# it is given, and it composes with AC in either nesting
# (`tests/test_engine_claims.py::test_activation_checkpointing_adds_no_collective` wraps AC
# around the FSDP unit; FSDP2's `_pre_forward` has a branch for hook-based AC that re-gathers
# before the recompute). The reasons FSDP comes last in both engines are two, both in
# Cosmos's `parallelize_vlm.py` docstrings: sharding the `OptimizedModule` keeps FSDP's hooks
# running **eagerly around the traced body** instead of inside it; and `fully_shard` swaps
# each block's `__class__` to `FSDP<Name>`, which **breaks block discovery** by type name,
# so the blocks must be collected, wrapped and compiled before it. The engines do not all
# apply the same order, either: Cosmos-RL's Qwen2.5-VL `parallelize`
# (`nvidia-cosmos/cosmos-rl` at 1d7bbfa) applies **AC before CP** and gets away with it,
# because its `apply_cp` assigns `transformer_block.self_attn.attn_func`: it reaches
# *through* `block.self_attn`, an attribute the checkpoint wrapper forwards to the wrapped
# block. Its later code (89f2e5b) drops the wrapper and checkpoints at call time,
# `torch.utils.checkpoint.checkpoint(layer, ..., use_reentrant=False)` around each compiled
# layer: case (c)'s nesting.
# </details>

# %% [markdown]
# ## 4. Real runs: one launch
#
# One 4-rank launch runs every training of this section in sequence inside the ranks (each one a
# fresh model, the meshes built once), under the ledger: each configuration below, a compiled
# causal run, torchtitan's reading, the padded batch of section 4d and the FSDP `generate` of
# section 7. (The order cases of section 3 and the bug clinic of section 8 are launches of
# their own.) Each configuration teaches one thing, so each runs the AC modes and the optimizer
# that show it:
#
# | configuration | runs | what it shows |
# |---|---|---|
# | dp_shard 4, cp 2, ring | AC none, full, selective | what each AC mode sends again |
# | dp_shard 4, cp 2, Ulysses | AC full | the all-to-alls instead of the ring |
# | HSDP 2 × 2, cp 4, ring | AC full, Adam | the replica all-reduce; a cp group of 4 |
# | VLM: HSDP 2 × 2, cp 1 | AC none | no cp at all: the same code with one-rank cp groups |
#
# (HSDP with cp 2 on 4 ranks would make the cp group and the dp_shard group the same two ranks,
# and the ledger could not tell their bytes apart.)

# %% jupyter={"source_hidden": true}
CONFIGS = {
    "dp_shard 4, cp 2, ring": (
        4,
        dict(dp_shard=4, cp=2),
        [dict(attention="ring", ac=ac) for ac in AC_MODES],
    ),
    "dp_shard 4, cp 2, Ulysses": (
        4,
        dict(dp_shard=4, cp=2),
        [dict(attention="ulysses", ac="full")],
    ),
    "HSDP 2 x 2, cp 4, ring": (
        4,
        dict(dp_replicate=2, dp_shard=2, cp=4),
        [dict(attention="ring", ac="full", optimizer="adam")],
    ),
    "VLM: HSDP 2 x 2, cp 1": (4, dict(dp_replicate=2, dp_shard=2, cp=1), [dict(ac="none")]),
}
COMPILED = dict(
    attention="ring", compile=True, causal=True
)  # causal: 4b checks the zigzag ring once too (every other training is bidirectional)
DIMS4 = CONFIGS["dp_shard 4, cp 2, ring"][1]


def jobs_of(world):
    """(configuration, dims, variant) of every training at this world size."""
    jobs = [
        (name, dims, variant)
        for name, (w, dims, variants) in CONFIGS.items()
        if w == world
        for variant in variants
    ]
    return jobs + ([("compiled", DIMS4, COMPILED)] if world == 4 else [])


def world_job(world):
    """Everything this world size runs, in one launch."""
    out = {"checks": run_variants([(dims, v) for _, dims, v in jobs_of(world)], ledger=True)}
    if world == 4:
        out["compiled"] = compile_report()
        out["losses"] = local_losses(DIMS4)
        out["titan"] = run_titan(1, 2, dict(attention="ring"))
        out["masked"] = {rule: masked_step(DIMS4, rule) for rule in RULES}
        out["generate"] = generate_demo(dict(dp_shard=4))
    return out


RESULTS = {
    world: run(world_job, world, world, timeout=600)
    for world in sorted({w for w, _, _ in CONFIGS.values()})
}

# %% [markdown]
# ### 4a. The loss normalization, on real ranks
#
# The cp-local loss of each rank at the initial parameters, the sample it loaded and its
# global positions; then the claim: the average over ranks equals one process's mean over the
# global batch.

# %%
losses = [r["losses"] for r in RESULTS[4]]
print(
    text_table(
        ["rank", "sample", "global positions", "cp-local loss"],
        [
            [
                rank,
                got["sample"],
                f"{got['positions'][0]}..{got['positions'][-1]}",
                f"{got['loss']:.6g}",
            ]
            for rank, got in enumerate(losses)
        ],
    )
)
one_process = runs.loss_of(
    build_model(), *(torch.cat(p) for p in zip(*(make_sample(0, 0, i) for i in range(2))))
).item()
average = sum(got["loss"] for got in losses) / len(losses)
print(f"\naverage over ranks {average:.6g}, one process on the global batch {one_process:.6g}")
loss_verdicts = [
    claim(
        "cp partners load the same sample",
        losses[0]["sample"] == losses[1]["sample"] != losses[2]["sample"],
        f"samples {[got['sample'] for got in losses]}",
    ),
    claim(
        "average of cp-local losses = mean over samples",
        abs(average - one_process) <= 1e-14 * one_process,
        "equal within 1e-14 relative",
    ),
]
print(verdict_table(loss_verdicts, "loss normalization"))

# %% [markdown]
# ### 4b. Parameters after 3 steps vs one process on the global batch
#
# One row per training; each row folds every parameter and every rank (all ranks must return
# the same full tensors), element by element within 1e-12.

# %% jupyter={"source_hidden": true}
REFERENCES = {}


def reference_for(samples, variant):
    key = (samples, variant.get("optimizer", "sgd"), variant.get("causal", False))
    if key not in REFERENCES:
        REFERENCES[key] = reference(samples=samples, optimizer=key[1], causal=key[2])
    return REFERENCES[key]


def param_verdicts(per_rank_params, dims, variant):
    """Every rank's full parameters vs one process on the world/cp samples of the global batch."""
    world = len(per_rank_params)
    return compare(
        per_rank_params, [reference_for(world // dims["cp"], variant)] * world, atol=1e-12
    )


def row_label(world, name, variant):
    if variant.get("compile"):
        return f"{world} ranks: compiled (aot_eager), causal ring"
    return f"{world} ranks: {name}, ac={variant['ac']}, {variant.get('optimizer', 'sgd')}"


# %%
param_rows = [
    summary(
        row_label(world, name, variant),
        param_verdicts([r["checks"][i]["params"] for r in RESULTS[world]], dims, variant),
    )
    for world in RESULTS
    for i, (name, dims, variant) in enumerate(jobs_of(world))
]
print(verdict_table(param_rows, "parameters after 3 steps vs one process (float64, within 1e-12)"))

# %% [markdown]
# ### 4c. torchtitan's reading of the same ranks
#
# torchtitan *consumes* ranks: `dp_replicate × dp_shard × cp = world`, so on these ranks its
# dp_shard is `world / (dp_replicate·cp)`, and FSDP shards over the flattened `dp_shard_cp`
# mesh (`("dp_replicate", "dp_shard_cp")`, or `("dp_shard_cp",)` without replicas; newer
# torchtitan calls the same flattened mesh `fsdp`).
# `run_titan` builds that 3-D mesh, takes the cp group from it, loads the sample of its dp
# coordinate, and shards on the flattened mesh. The flattened group is the same set of ranks as
# the overlay's dp group, in the same order, so the parameters should not differ by a bit.
# Here without replicas; the reading with replicas (2 replicas × dp_shard 1 × cp 2, FSDP on
# 2 × dp_shard_cp 2) is checked in `tests/test_train.py::test_every_ac_mode_and_optimizer_on_4_ranks`.

# %%
# show: paralab.train.runs.titan_meshes

# %% [markdown]
# `run_titan` (folded) is `train` with those meshes: the cp group and the FSDP mesh come from
# the 3-D mesh, the sample from the dp coordinate; the wrappers are the same four.

# %% jupyter={"source_hidden": true}
# show: paralab.train.runs.run_titan

# %%
titan = RESULTS[4][0]["titan"]
print(f"4 ranks: torchtitan dp_shard = {titan['dp_shard']}, FSDP mesh shape {titan['fsdp_mesh']}")
titan_verdicts = [
    summary(
        "4 ranks, cp 2 ring, AC none: torchtitan reading = overlay reading, bitwise",
        compare(
            [r["titan"]["params"] for r in RESULTS[4]],
            [r["checks"][0]["params"] for r in RESULTS[4]],
        ),
    )
]
print(verdict_table(titan_verdicts, "torchtitan's dp_shard_cp reading"))

# %% [markdown]
# ### 4d. When the ranks hold different numbers of loss tokens
#
# Section 1's rule (the plain local mean, then FSDP's average over the world) assumed that
# every cp shard of every sample holds the same number of loss tokens. Padding and packing
# break that: a padded position carries no loss, and a packed sequence's padding neither.
# The same 4 ranks (dp_shard 4, cp 2) take one SGD step on a padded batch: sample 0 has 32
# loss tokens, sample 1 only its first 20 (the rest is padding, masked out of the loss), so
# the four shards hold 16, 16, 16 and 4 of them. The reference is one process, the squared
# error summed over every loss token and divided by their count (the token mean).
#
# Two rules on the ranks (`paralab.train.tokens`):
# - **local mean**: each rank divides its sum by its own loss tokens; FSDP averages.
# - **global token count** (torchtitan, `torchtitan/train.py` at 238fa99): each rank divides
#   its sum by the loss tokens of the whole batch (an all-reduced count), and FSDP's gradient
#   divide factor is set to 1 (`disable_fsdp_gradient_division`), so the reduction sums.
#
# **Predict:** which rule matches the reference, and which tokens does the other one
# over-weight?

# %%
# show: paralab.train.tokens.masked_step

# %%
masked = [r["masked"] for r in RESULTS[4]]
masked_ref = masked_reference(2)
print(
    text_table(
        ["rank", "sample", "loss tokens it holds"],
        [
            [rank, m["local mean"]["sample"], m["local mean"]["loss tokens"]]
            for rank, m in enumerate(masked)
        ],
    )
)
name = "blocks.0.mlp.up.weight"
show(
    viz.plot_diff_heatmap(
        masked_ref[name],
        masked[0]["local mean"]["params"][name],
        f"{name} after 1 step: local-mean rule vs one process (padded batch)",
        row_label="output unit",
        col_label="input unit",
    )
)
local_mean_diffs = [  # one per rank
    max((m["local mean"]["params"][k] - masked_ref[k]).abs().max().item() for k in masked_ref)
    for m in masked
]
masked_verdicts = [
    claim(
        "local mean with 16, 16, 16, 4 loss tokens: not the token mean",
        min(local_mean_diffs) > 1e-6,
        f"max |diff| {max(local_mean_diffs):.2e}",
    ),
    summary(
        "global token count, divide factor 1 = one process",
        compare([m["global token count"]["params"] for m in masked], [masked_ref] * 4, atol=1e-12),
    ),
]
print(verdict_table(masked_verdicts, "loss normalization on a padded batch"))

# %% [markdown]
# <details><summary>Answer</summary>
#
# The global token count matches, within rounding: each rank's gradient is its share of
# `∇ Σ_tokens ℓ_t / T` (`T` = every loss token of the batch), and a sum over ranks (divide
# factor 1) adds the shares up. The local mean gives each *shard* the same weight: the 4
# loss tokens of rank 3 weigh as much as the 16 of rank 2, so each of them counts 4 times
# as much as in the token mean. It is exact only when every shard holds the same number of
# loss tokens: then it is the token mean, and also the sample mean. Cosmos packs
# sequences; torchtitan never relies on FSDP's averaging.
# </details>

# %% [markdown]
# ## 5. What crosses the wire in one step, by group and phase
#
# Modelled bytes, counted at the API: the ledger (`paralab.ledger`) records, per
# `torch.distributed` call, the bytes that call's algorithm sends per rank, not bytes measured
# on a wire. One step sends bytes in three groups (dp_shard, dp_replicate, cp) and three phases
# (forward, backward, and the recompute of activation checkpointing).
#
# **Predict** before reading the closed form below. Start from AC none and turn on *full* AC:
# which group's traffic changes, in which phase, and by how much? And with *selective* AC?
#
# <details><summary>Answer</summary>
#
# Full AC adds one cell: cp / recompute = the cp forward bytes again, because re-running a
# block re-runs its ring (or Ulysses) forward, sends included. dp traffic does not change: the
# block's parameters are already gathered for its backward when the recompute runs. Selective
# AC saves the attention output, so nothing is sent twice: its row equals AC none.
# </details>
#
# The closed form (`paralab.train.costs`; `n` = dp_shard, `r` = dp_replicate, `L` = 2 blocks,
# `B_u` = one rank's padded FSDP shard of unit `u` in bytes, `S` = one rank's shard of one of
# q, k, v in bytes, `batch·heads·(N/cp)·head_dim·8`):
#
# | group | forward | backward | recompute |
# |---|---|---|---|
# | dp_shard | `Σ_u (n-1)·B_u` (all-gather every unit) | `Σ_blocks (n-1)·B_u + Σ_u (n-1)·B_u` (re-gather the blocks, reduce-scatter every gradient) | 0 |
# | dp_replicate | 0 | `Σ_u 2(r-1)/r·B_u` (all-reduce of gradient shards) | 0 |
# | cp | `L ×` attention forward: ring `2(cp-1)S`, Ulysses `4(cp-1)S/cp` | `L ×` attention backward: ring `4(cp-1)S`, Ulysses `4(cp-1)S/cp` | full AC: `L ×` attention forward again |
#
# Why dp_shard's backward re-gathers the blocks but not the root: FSDP2's `fully_shard` has
# `reshard_after_forward=None` by default, which means True for every unit but the root
# (torch 2.13, `torch/distributed/fsdp/_fully_shard/_fully_shard.py`, `fully_shard`'s
# docstring): the root keeps its parameters gathered after forward, since the backward needs
# them first. The cp columns are lab 02's formulas per attention call (`attention_bytes`),
# times the `L` blocks. For the runs below:

# %%
# show: paralab.train.costs.attention_bytes paralab.train.costs.shard_bytes_of_unit

# %% [markdown]
# The whole table in code is the graded exercise `training_step_bytes`: the nine cells of one
# rank's step, from the units' shapes and the group sizes.

# %%
# show: paralab.train.costs.training_step_bytes

# %%
from paralab.cp.costs import shard_bytes

for attention, cp in (("ring", 2), ("ulysses", 2), ("ring", 4)):
    s_bytes = shard_bytes(1, SHAPE["heads"], SHAPE["tokens"], SHAPE["dim"] // SHAPE["heads"], cp)
    print(
        f"{attention:<8} cp {cp}: S = {s_bytes} B; per block {attention_bytes(attention, cp)}; "
        f"x L = {SHAPE['blocks']}: {training_step_bytes(1, 1, cp, attention=attention, ac='full')[('cp', 'forward')]} B forward"
    )


# %%
def byte_cells(world, job):
    """One training's bytes per (group, phase) per step: the closed form, and the ledger of each rank."""
    name, dims, variant = jobs_of(world)[job]
    pd = ParallelDims(world, **dims)
    formula = training_step_bytes(
        pd.dp_shard,
        pd.dp_replicate,
        pd.cp,
        attention=variant.get("attention", "ring"),
        ac=variant.get("ac", "none"),
    )
    measured = [
        measured_step_bytes(r["checks"][job]["records"], rank, pd, steps=3)
        for rank, r in enumerate(RESULTS[world])
    ]
    return formula, measured


byte_verdicts = []  # (configuration, variant, every rank's ledger = the formula in every cell)
for world in RESULTS:
    for job, (name, _dims, variant) in enumerate(jobs_of(world)):
        formula, measured = byte_cells(world, job)
        byte_verdicts.append(
            (f"{world} ranks: {name}", variant, all(m == formula for m in measured))
        )

# %% [markdown]
# Rank 0's ledger next to the formula, for every training but the compiled one (the picture
# is built in the folded cell; the numbers behind it are in the folded output after it, and the
# claim table below states that every rank's ledger matches):

# %% jupyter={"source_hidden": true}
pictured = {}
for world in RESULTS:
    for job, (name, dims, variant) in enumerate(jobs_of(world)):
        if not variant.get("compile"):
            formula, measured = byte_cells(world, job)
            attention = f" {variant['attention']}" if dims["cp"] > 1 else ""
            kind = " VLM" if "VLM" in name else ""
            short = f"{world}r{kind}{' HSDP' if dims.get('dp_replicate') else ''} cp{dims['cp']}{attention} ac={variant.get('ac', 'none')}"
            pictured[short] = {cell: (measured[0][cell], formula[cell]) for cell in formula}
show(viz.plot_group_phase_bytes(pictured))

# %% jupyter={"outputs_hidden": true}
rows = [
    [
        config,
        group,
        *(
            f"{cells[group, p][0]} = {cells[group, p][1]}"
            for p in ("forward", "backward", "recompute")
        ),
    ]
    for config, cells in pictured.items()
    for group in ("dp_shard", "dp_replicate", "cp")
    if any(cells[group, p][1] for p in ("forward", "backward", "recompute"))
]
print("bytes sent per rank per step, ledger = formula (rank 0; every rank is checked)")
print(text_table(["configuration", "group", "forward", "backward", "recompute"], rows))

# %%
ledger_rows = [
    claim(
        f"{name.split(':')[0]}: compiled causal ring"
        if v.get("compile")
        else f"{name}, ac={v['ac']}",
        ok,
        "every rank, every cell",
    )
    for name, v, ok in byte_verdicts
]
print(verdict_table(ledger_rows, "ledger = closed form, per (group, phase), per step"))

# %% [markdown]
# ## 6. What `torch.compile` captured
#
# The compiled run above traced each block with Dynamo. Our ring attention calls
# `torch.distributed` point-to-point ops from Python; Dynamo does not compile those (P2P
# compilation is off by default), so it **breaks the graph** around them, runs them eagerly, and
# compiles the pieces in between. The result is still correct (section 4b). The counters of
# rank 0, after its compiled training:

# %%
compiled = RESULTS[4][0]["compiled"]
print(
    text_table(
        ["graph break reason", "count"], [[reason, n] for reason, n in compiled["breaks"].items()]
    )
)
graphs = [f for f in compiled["frames"] if f["ops"]]


def frame_name(function):
    """`torch_dynamo_resume_in_forward_at_102` -> `forward, resumed`: the frame after a graph break."""
    if function.startswith("torch_dynamo_resume_in_"):
        return function.removeprefix("torch_dynamo_resume_in_").rsplit("_at_", 1)[0] + ", resumed"
    return function


print(f"\ngraphs compiled: {compiled['graphs']}; the frames that hold them:")
print(
    text_table(
        ["function", "file", "ops", "compiled again because"],
        [
            [
                frame_name(f["function"]),
                f["where"].split(":")[0],
                f["ops"],
                f["recompiled because"][:60],
            ]
            for f in graphs
        ],
    )
)
recompiles = [f for f in graphs if f["recompiled because"]]
compile_verdicts = [
    claim(
        "every graph break is at one of the ring's point-to-point ops",
        bool(compiled["breaks"]) and all("P2P" in reason for reason in compiled["breaks"]),
        f"{sum(compiled['breaks'].values())} breaks, every reason names P2P",
    ),
    claim(
        "the graph count = the compiled frames with ops, recompiles included",
        compiled["graphs"] == len(graphs),
        f"{len(graphs)} frames ({len(recompiles)} recompiles) = {compiled['graphs']} graphs",
    ),
]
print(verdict_table(compile_verdicts, "what torch.compile captured"))

# %% [markdown]
# How the count maps to the model: Dynamo compiles one *frame* (a Python function call) at a
# time, and a graph break ends the frame's graph and resumes in a new frame after the
# untraceable call. The table lists every forward frame that produced a graph: the block's
# code before the attention (norm, qkv projection) and after it (a resume frame: output
# projection, MLP), and the ring's own functions that run between its point-to-point calls
# (`ring_attention`, `_chunks`, `ring_pass` up to its `P2POp`, `attention_block`,
# `merge_partials`). Frames with no ops (the P2P resume points, `CPAttention.forward`) are
# not graphs. Two of the graphs are **recompiles** of code already compiled, each with its
# guard's reason printed: `_chunks` is called once on a tensor that requires grad and once on
# one that does not, and the causal ring calls `attention_block` with `diagonal=True` on its
# diagonal step and `False` on the others. Both blocks run the same code with the same
# guards, so the second block reuses the first one's graphs: the count does not double with
# `L`. A break count is how many times Dynamo stopped tracing at that kind of call while
# compiling, not how many messages the ring sends; the counts follow the torch version (this
# is torch 2.13), which is why the claims compare the count with the frames rather than with
# a number. (The full break reason names the switch: `TORCHDYNAMO_ENABLE_P2P_COMPILATION=1`.)

# %% [markdown]
# ## 7. A method other than `forward`: `register_fsdp_forward_method`
#
# FSDP gathers a unit's parameters in hooks around its `forward`. An autoregressive
# `generate` (Cosmos's reasoner decodes this way) calls the root's layers directly, so the
# root's parameters are still sharded `DTensor`s when it runs. The demo: 4 ranks, dp_shard 4,
# a causal model, each rank decoding 4 tokens after its own 4-token prompt; first unregistered,
# then after `register_fsdp_forward_method(model, "generate")`, compared with one process.

# %%
# show: paralab.train.model.DiT.generate

# %% [markdown]
# The demo every rank ran inside the 4-rank launch of section 4; the line that matters is
# `register_fsdp_forward_method(model, "generate")`:

# %%
# show: paralab.train.runs.generate_demo

# %%
gen = [r["generate"] for r in RESULTS[4]]
print("before registration, rank 0:", gen[0]["before"])
local = build_model(causal=True)
with torch.no_grad():
    expected = [local.generate(g["prompt"], g["sigma"], 4) for g in gen]
generate_verdicts = [
    claim(
        "unregistered generate fails on every rank",
        all(g["before"] != "ran" for g in gen),
        gen[0]["before"].split(",")[0],
    ),
    summary(
        "registered generate = one process (every rank)",
        compare([g["after"] for g in gen], expected, atol=1e-12),
    ),
]
print(verdict_table(generate_verdicts, "register_fsdp_forward_method"))

# %% [markdown]
# ## 8. Bug clinic: a data loader that looks right
#
# Below, the same 4-rank training (dp_shard 4, cp 2) runs once more, in a launch of its own,
# with a seeded bug in *which sample a rank loads*: `loader_clinic_bug()` is a patch set
# (`paralab.exercises.lab05`; do not read it yet), handed to the ranks with `patches=`.
# Training runs without a complaint. The picture is `|buggy - reference|` for the first MLP
# weight after 3 steps.

# %%
from paralab.exercises.lab05 import loader_clinic_bug

clinic = [
    r[0]["params"]
    for r in run(run_variants, 4, [(DIMS4, {})], patches=loader_clinic_bug(), timeout=300)
]
ref = reference_for(2, {})
name = "blocks.0.mlp.up.weight"
show(
    viz.plot_diff_heatmap(
        ref[name],
        clinic[0][name],
        f"{name} after 3 steps: buggy loader vs one process",
        row_label="output unit",
        col_label="input unit",
    )
)
clinic_verdicts = [
    claim(
        "buggy loader caught by the check",
        not all(v.passed for v in compare(clinic, [ref] * 4, atol=1e-12)),
        "parameters differ",
    ),
    claim(
        "every rank still agrees with every other",
        all(v.passed for v in compare(clinic, [clinic[0]] * 4)),
        "FSDP keeps the ranks in sync",
    ),
]
print(verdict_table(clinic_verdicts, "bug clinic"))

# %% [markdown]
# **What is wrong?** Hint: every rank still holds the same parameters (FSDP averaged
# *something*). What did rank 1 train on?
#
# <details><summary>Answer</summary>
#
# The loader picks the sample by **global rank** (`sample_by_global_rank`: `rank` instead of
# `rank // cp`). Ranks 0 and 1, meant to be the two cp halves of sample 0, load samples
# 0 and 1; ranks 2 and 3 load samples 2 and 3, which are not in the global batch at all. Each
# rank still takes its own half of the tokens, so every "sequence" the ring attends over is a
# chimera: the first half of one sample glued to the second half of another. Nothing
# crashes, the shapes are right, FSDP still averages, and every rank agrees — only a comparison
# with the single-process run on the real global batch shows it. The picture of who holds what:
# </details>

# %%
from paralab.exercises.lab05 import sample_by_global_rank

pd4 = ParallelDims(4, **DIMS4)
show(
    viz.plot_token_ownership(
        [sample_by_global_rank(r, pd4) for r in range(4)],
        ownership(4, DIMS4)[1],
        SHAPE["tokens"],
        "the buggy loader: cp partners hold halves of different samples",
    )
)

# %% [markdown]
# ## Closing table

# %%
sections = {
    "2 apply_cp on 2 ranks": cp_verdicts,
    "2 activation memory per AC mode": memory_verdicts,
    "2 compile and AC, one process": compiled_ac_verdicts,
    "2 apply_fsdp on 2 ranks": fsdp_verdicts,
    "3 the order, on 2 ranks": order_verdicts,
    "4a loss normalization": loss_verdicts,
    "4b parameters vs one process": param_rows,
    "4c torchtitan reading": titan_verdicts,
    "4d padded batch: loss tokens differ": masked_verdicts,
    "5 ledger = closed form": ledger_rows,
    "6 torch.compile": compile_verdicts,
    "7 register_fsdp_forward_method": generate_verdicts,
    "8 bug clinic": clinic_verdicts,
}
print(
    text_table(
        ["section", "checks passed"],
        [[s, f"{sum(v.passed for v in vs)}/{len(vs)}"] for s, vs in sections.items()],
    )
)

# %% [markdown]
# ## What to try
#
# The ranks import `paralab.train` from the file: an edit to a shown package cell changes
# this kernel's copy only. A change reaches the ranks as a patch set passed to
# `run(..., patches=...)` (module path -> {name: replacement}), or as a worker defined here
# (it travels by value); each item says which.
#
# 1. **Normalize by the whole sample.** Divide the squared error by the *whole* sample's
#    element count instead of taking the local mean, and train one SGD step on 4 ranks with
#    it. `training_loop` looks `loss_of` up in `paralab.train.runs`, so hand yours to the
#    ranks under that name with `patches=` (the kernel's `loss_of`, which the reference uses,
#    stays as it is):
#
#    ```python
#    def whole_sample_mse(model, noisy, sigma, noise):
#        target = model.shard.tokens(noise)
#        return ((model(noisy, sigma) - target) ** 2).sum() / noise.numel()  # the whole sample's count
#
#    EDIT = {"paralab.train.runs": {"loss_of": whole_sample_mse}}
#    buggy = run(run_variants, 4, [(DIMS4, {})], steps=1, patches=EDIT, timeout=300)[0][0]["params"]
#    p0 = {k: p.detach() for k, p in build_model().named_parameters()}
#    right = reference(samples=2, steps=1)
#    name = "blocks.0.mlp.up.weight"
#    print(((buggy[name] - p0[name]) / (right[name] - p0[name])).aminmax())
#    ```
#
#    One SGD step moves each parameter by the learning rate times its gradient: by what
#    factor is the gradient off, and why does FSDP's average not fix it?
#    <details><summary>Answer</summary>By `1/cp` = 0.5 on every element (up to rounding).
#    The two cp partners' losses now sum to `ℓ_s` instead of `cp·ℓ_s`, and FSDP still
#    divides the sum over ranks by the world size: an average over ranks cannot know that
#    the loss was already normalized per sample. The local mean is right *because* FSDP
#    averages over the cp partners too.</details>
# 2. **Causal Ulysses.** In the folded first cell of section 4, add `causal=True` to the
#    Ulysses entry of `CONFIGS` (`[dict(attention="ulysses", ac="full", causal=True)]`), then
#    re-run from that cell. Does Ulysses need zigzag shards? Does the ledger change?
#    <details><summary>Answer</summary>No zigzag: after its first all-to-all each rank
#    holds the whole sequence for its heads, so the causal mask is applied to the full
#    sequence and every rank does the same work (`CPAttention.zigzag` is True only for the
#    causal ring). The ledger does not change: an all-to-all moves the same bytes whatever
#    the mask. Every row still passes, now against a causal reference.</details>
# 3. **AC selective before CP.** Case (d) of section 3 used full AC. Train with selective AC
#    installed before CP (`runs.run_in_order` trains inside
#    `patched({"paralab.train.parallelism": {"ORDER": order}})` on each rank):
#
#    ```python
#    got = run(runs.run_in_order, 4, DIMS4, ("ac", "cp", "compile", "fsdp"), dict(ac="selective"), timeout=120)
#    print(summary("AC selective before CP", compare([r["params"] for r in got], [reference_for(2, {})] * 4, atol=1e-12)))
#    ```
#
#    Harmless or not? Look at what `apply_ac("selective")` wraps.
#    <details><summary>Answer</summary>Harmless: the row passes. Selective AC wraps
#    `block.qkv` and `block.mlp`, not the block, so `model.blocks[i]` is still the `Block`
#    and `apply_cp`'s attention swap lands on it.</details>
# 4. **The ring at cp = 8.** Predict the cp recompute bytes per step with the ring and full
#    AC at cp = 8, from the formula of section 5. Then check: add
#    `"HSDP 2 x 4, cp 8, ring": (8, dict(dp_replicate=2, dp_shard=4, cp=8), [dict(attention="ring", ac="full")])`
#    to `CONFIGS` and re-run from there: a second launch, on 8 ranks (with dp_shard 8 the
#    dp_shard and cp groups would be the same 8 ranks, and the ledger could not tell them apart).
#    <details><summary>Answer</summary>`S = 1·8·(32/8)·2·8 = 512` B, so `L·2(cp-1)S =
#    2·2·7·512 = 14336` B, the same as the cp forward; the ledger row passes (the global batch is one
#    sample, `world/cp`).</details>
# 5. **A forward first.** The `generate_demo` cell of section 7 is this kernel's copy, and a
#    worker passed to `run` travels to the ranks by value. In that cell, add
#    `model(noisy, sigma)` inside the first `with torch.no_grad():`, before the unregistered
#    `model.generate(...)`; re-run the cell, then
#    `run(generate_demo, 4, dict(dp_shard=4), timeout=120)[0]["before"]`. Does it still
#    fail? Which units' parameters are gathered at that moment, and which are not?
#    <details><summary>Answer</summary>It runs (`'ran'`). FSDP2 leaves the **root**
#    gathered after a forward (`reshard_after_forward` is False for the root by default,
#    section 5), so `embed`, `position` and `head` are plain tensors when `generate` uses
#    them; the **blocks** were resharded after the forward, but each is an FSDP unit whose
#    own forward hooks gather it when `generate` calls it. It works by accident of the
#    root staying gathered; registering the method is what makes it right by
#    design.</details>

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time: {time.monotonic() - LAB_START:.1f} s")
