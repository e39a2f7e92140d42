# %% [markdown]
# # Lab 03 — CFG parallelism (cfgp): the two guidance branches on two ranks
#
# **You will learn** how classifier-free guidance's two forwards are split over a pair of
# ranks, what crosses the wire each step (one latent each way), why the result is bitwise
# equal to one process (and why batching the branches on one GPU is not), and how cfgp
# composes with lab 02's context parallelism on 4 and 8 ranks. **Prerequisites:** lab 00
# (`ParallelDims`), the collectives primer (send/recv, broadcast, all-gather), and lab 02
# for section 9. **Time:** about 35 minutes to read; the last code cell prints this
# notebook's run time.
#
# **What is split.** Diffusion / flow samplers with *classifier-free guidance*
# run the denoiser **twice per step** on the same latent `x`: once with the
# prompt (the *conditional* branch) and once with a null prompt (the
# *unconditional* branch), then extrapolate
#
# $$v = v_u + w\,(v_c - v_u)$$
#
# with guidance scale `w`. The two forwards are independent, so cfgp puts
# them on two ranks: the rank with `cfgp_rank == 0` runs the conditional
# branch, the rank with `cfgp_rank == 1` the unconditional one.
#
# **What moves.** After its forward, each rank needs the other rank's
# prediction: **one latent-sized tensor each way per step** (a point-to-point
# swap). Both ranks then compute the *same* combine and the *same* Euler step,
# so both hold the same latent, bit for bit, with no further communication.
# Once, before the first step, the initial noise is **broadcast** from the
# group's first rank: the two branches must see the same `x`.
#
# | what | collective | bytes sent per rank |
# |---|---|---|
# | initial noise | broadcast over the cfgp group, once | `B·S·C·8` at cfgp rank 0, 0 at rank 1 |
# | branch prediction | send + recv (or all_gather), every step | `B·S·C·8` per step |
# | with the cp overlay | the same swap of this rank's shard | `B·(S/cp)·C·8` per step |
#
# (`B` batch, `S` latent tokens, `C` latent channels, 8 bytes per float64.)
# Note the swap moves the *latent* (C = 4 channels here), not the model's
# hidden states (width D), and its size does not grow with the depth of the
# network, while cp pays per attention layer (section 9).
#
# **No backward.** cfgp is an *inference-only* axis: guidance is a sampling
# trick, training runs one forward per sample (with the prompt randomly
# dropped), so there is no second branch to split. `ParallelDims` enforces
# it (section 4).
#
# Sections: 1 the denoiser and the sampler · 2 the single-process reference
# and a picture · 3 why batching cond+uncond changes bits · 4 the
# `ParallelDims` rules · 5 cfgp = 2 on real ranks, bit for bit · 6 a
# broken variant · 7 the ledger · 8 time per step · 9 cfgp × cp on 4 and 8
# ranks (lab 02's ring and Ulysses attention) · 10 bug clinic: a report
# from the field · the closing table · 11 what to try.

# %%
import time

LAB_START = time.perf_counter()

import torch

from paralab import ParallelDims
from paralab.cfgp import runs as cfgp_runs
from paralab.cfgp.costs import cfgp_bytes, cp_attention_bytes, latent_shard_bytes
from paralab.cfgp.runs import EXCHANGE_VARIANTS, sample_variants
from paralab.check import claim, closing_table, compare, summary, verdict_table
from paralab.exercises.lab03 import SAMPLER_BUGS
from paralab.launch import run
from paralab.ledger import format_table, received, sent
from paralab.models import CondDenoiser, make_text_embedding, null_text_embedding
from paralab.tables import text_table
from paralab.viz import (
    plot_cfg_branches,
    plot_cfgp_timeline,
    plot_diff_heatmap,
    plot_step_traffic,
    show,
)

torch.set_num_threads(1)  # the ranks run one thread each; the reference does too
print("torch", torch.__version__)


# %% [markdown]
# ## 1. A small conditional denoiser and a guided sampler
#
# The denoiser is a tiny DiT-like network in float64 over a latent "video"
# of `frames × height × width` tokens with `C` channels, conditioned on a
# text-like embedding (cross-attention plus an adaLN modulation from the
# time and the pooled text). Its **self-attention is a pluggable callable**:
# the default is plain full attention; on a cp group each rank holds a
# sequence shard and passes ring or Ulysses attention instead, together with
# the global `positions` of its shard.
#
# The weights are random (seeded): the lab is about *which numbers every rank
# computes*, not about pretty videos.

# %%
# show: paralab.models.full_attention

# %% [markdown]
# The denoiser itself (folded: a small transformer; what matters below is
# only that `forward(x, t, text, attention=..., positions=...)` runs one
# branch for one latent):

# %% jupyter={"source_hidden": true}
# show: paralab.models.CondDenoiser


# %%
model = CondDenoiser(
    channels=4, dim=32, heads=4, text_dim=16, n_blocks=2, frames=4, height=6, width=6, seed=0
)
cond = make_text_embedding(seed=1)  # "a prompt", (1, n_text, text_dim)
uncond = null_text_embedding(cond)  # the empty prompt: zeros
STEPS, W, SEED = 8, 4.0, 0
B, S, C = model.latent_shape
print(
    f"latent (B, S, C) = {model.latent_shape}, text {tuple(cond.shape)}, "
    f"{sum(p.numel() for p in model.parameters())} parameters, {STEPS} steps, w = {W}"
)

# %% [markdown]
# The sampler is Euler over flow-matching time `t = 1 → 0`. Each piece is
# its own small function: the guidance combine, one Euler step, drawing the
# noise from a *fresh* generator, the single-process way to run the two
# branches (each at batch 1) and the usual single-GPU shortcut (both in one
# batch-2 forward).

# %%
# show: paralab.cfgp.sampling.cfg_combine paralab.cfgp.sampling.timesteps paralab.cfgp.sampling.euler_step paralab.cfgp.sampling.draw_noise paralab.cfgp.sampling.predict_branches paralab.cfgp.sampling.predict_branches_batched

# %% [markdown]
# The cfgp pieces: each rank runs its own branch and swaps the prediction
# with its peer (`batch_isend_irecv` posts the send and the receive
# together, so neither rank blocks the other); `all_gather` is the
# collective alternative. The noise is drawn on cfgp rank 0 and broadcast.
# Both ranks call the same `cfg_combine(cond_pred, uncond_pred, w)` on the
# same operands: had one rank computed the algebraically equal
# `(1 − w)·uncond + w·cond`, the two ranks would round differently and
# their latents would drift apart by a few ulps per step.

# %%
# show: paralab.cfgp.sampling.broadcast_noise paralab.cfgp.sampling.exchange_prediction paralab.cfgp.sampling.exchange_prediction_all_gather paralab.cfgp.sampling.predict_cfgp

# %%
# show: paralab.cfgp.sampling.initial_latent

# %% [markdown]
# The loop itself is the same for every layout; only *who predicts what*
# (`predict`) and *which part of the latent this rank holds* change.

# %%
# show: paralab.cfgp.sampling.sample

# %% [markdown]
# Who predicts what: with cfgp = 2 each rank runs its own branch and swaps;
# otherwise this process runs both.

# %%
# show: paralab.cfgp.sampling.branch_predictor

# %% jupyter={"source_hidden": true}
# show: paralab.cfgp.runs.sample_on_rank

# %% [markdown]
# ## 2. The single-process reference, and what each rank computes
#
# The reference runs the two branches one after the other, each at batch 1,
# exactly the forwards the two cfgp ranks will run.

# %%
trajectory = []
reference = sample(
    model, cond, uncond, steps=STEPS, guidance_scale=W, seed=SEED, trajectory=trajectory
)
print("reference latent", tuple(reference.shape), reference.dtype)

# %% [markdown]
# What the two ranks of a cfgp group compute at one step (here step 4, at
# `t = 0.5`): rank 0 the conditional velocity, rank 1 the unconditional
# one, and both the same guided velocity. Guidance multiplies the small
# difference the prompt makes by `w`. (The weights are random, so the images
# are noise-like; what matters is which rank computes which panel. Frame 0,
# channel 0 of the latent "video", each panel with its colour scale.)

# %%
ts = timesteps(STEPS)
with torch.no_grad():
    cond_pred, uncond_pred = predict_branches(model, trajectory[4], ts[4], cond, uncond)
show(
    plot_cfg_branches(
        cond_pred,
        uncond_pred,
        cfg_combine(cond_pred, uncond_pred, W),
        W,
        model.frames,
        model.height,
        model.width,
    )
)

# %% [markdown]
# ## 3. Why batching cond and uncond in one forward can change the last bits
#
# On one GPU, the usual implementation concatenates the two branches into a
# batch of 2 and runs one forward: fewer, bigger kernels. The two rows of the
# batch are still computed independently, so mathematically nothing changes.
# But a matrix multiply is free to pick a different kernel, and with it a
# different order of summation, for a different shape. The adaLN modulation
# is a `Linear` on the embedding vector: `(1, D)` when each branch runs
# alone (a matrix-vector product) and `(2, D)` when batched (a
# matrix-matrix product). Floating-point addition is not associative, so the
# two can differ in the last bit, and the sampler carries the difference
# into the final latent. cfgp runs each branch at batch 1 on its own rank,
# so the matching reference is the batch-1 loop above, not the batched one.
#
# The counts below depend on this CPU's BLAS kernels (MKL here), so the
# cell's output is not compared by CI; the assertion is only that the
# difference stays at rounding level.

# %%
# NBVAL_IGNORE_OUTPUT
block = model.blocks[0]
emb = torch.randn(
    2, block.modulation.in_features, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
)
with torch.no_grad():
    alone = block.modulation(emb[:1])  # (1, D) @ W^T: matrix-vector
    batched_row = block.modulation(emb)[:1]  # (2, D) @ W^T: matrix-matrix, same row 0
    x0 = draw_noise(model.latent_shape, SEED)
    sep = predict_branches(model, x0, 1.0, cond, uncond)
    bat = predict_branches_batched(model, x0, 1.0, cond, uncond)
batched_latent = sample(
    model, cond, uncond, steps=STEPS, guidance_scale=W, seed=SEED, batch_branches=True
)
for name, a, b in [
    ("modulation Linear, row 0", batched_row, alone),
    ("first-step cond prediction", bat[0], sep[0]),
    ("first-step uncond prediction", bat[1], sep[1]),
    ("final latent after 8 steps", batched_latent, reference),
]:
    print(
        f"{name:<30} {int((a != b).sum()):4d} of {a.numel():4d} elements differ, max |diff| {float((a - b).abs().max()):.1e}"
    )

# %%
batching_verdicts = compare(
    batched_latent, reference, atol=1e-12, name="batched cond+uncond vs batch-1 loop (<= 1e-12)"
)
print(verdict_table(batching_verdicts, "Batching changes at most rounding-level bits"))

# %% [markdown]
# ## 4. `ParallelDims`: cfgp is an inference-only axis of size 2
#
# Two branches, so `cfgp` is 1 or 2; and no backward pass ever needs it, so
# it must be asked for with `enable_inference_mode=True`.

# %%
for kwargs in [dict(world_size=2, cfgp=2), dict(world_size=6, cfgp=3, enable_inference_mode=True)]:
    try:
        ParallelDims(**kwargs)
        print(f"ParallelDims({kwargs}) accepted (unexpected)")
    except ValueError as err:
        print(
            f"ParallelDims({', '.join(f'{k}={v}' for k, v in kwargs.items())})\n  -> ValueError: {err}"
        )
pd_ok = ParallelDims(world_size=2, cfgp=2, enable_inference_mode=True)
print(f"accepted: {pd_ok}")

# %% [markdown]
# ## 5. cfgp = 2 on two real ranks, bit for bit
#
# One sampling step on the pair, as the loop above runs it (the swap's size
# is this lab's latent, `B·S·C·8` bytes):

# %%
show(plot_cfgp_timeline(steps=2, latent_bytes=B * S * C * 8))

# %% [markdown]
# One launch runs the package's sampler two ways (launches cost time): with the
# point-to-point swap and with the all_gather alternative
# (`paralab.cfgp.runs.sample_variants`). It hands the ranks this kernel's swap,
# combine and noise with `patches=SAMPLER_EDIT`, so an edit of their cells is what
# the ranks run (sections 8 and 9 pass it too). Every rank returns its final latent
# and its ledger records.
#
# **Predict before you run.** Will the final latent of the cfgp pair equal the
# single-process batch-1 reference *bitwise*, or only to ~1e-15?
#
# <details><summary>Answer</summary>
#
# Bitwise (the text after the table says why): each rank runs exactly one of the
# reference's two forwards, the swap copies bytes, and both ranks combine the
# same operands in the same order.
# </details>

# %%
SAMPLER_EDIT = {
    "paralab.cfgp.sampling": {
        "exchange_prediction": exchange_prediction,
        "cfg_combine": cfg_combine,
        "initial_latent": initial_latent,
    }
}
cfgp_out = run(
    sample_variants,
    2,
    model,
    cond,
    uncond,
    {"cfgp": 2},
    EXCHANGE_VARIANTS,
    patches=SAMPLER_EDIT,
    steps=STEPS,
    guidance_scale=W,
    seed=SEED,
)
print("cfgp_rank of each rank:", [r["p2p"]["cfgp_rank"] for r in cfgp_out])
cfgp_verdicts, cfgp_claims = [], []
for exchange in ("p2p", "all_gather"):
    latents = [r[exchange]["latent"] for r in cfgp_out]
    vs_reference = compare(latents, [reference, reference], name=f"cfgp=2 {exchange} vs reference")
    agree = compare(latents[1], latents[0], name=f"cfgp=2 {exchange}: rank 1 vs rank 0")
    cfgp_verdicts += vs_reference + agree
    cfgp_claims += [
        summary(f"{exchange}: both ranks = one process, bitwise", vs_reference),
        summary(f"{exchange}: rank 1 = rank 0, bitwise", agree),
    ]
print(
    verdict_table(
        cfgp_claims, "cfgp = 2: the final latent vs the single-process batch-1 loop (exact)"
    )
)

# %% jupyter={"outputs_hidden": true}
print(verdict_table(cfgp_verdicts, "the detail: one row per rank"))


# %% [markdown]
# **Bitwise, and why.** Rank 0's forward *is* the reference's conditional
# forward (same weights, same `x`, same batch-1 shapes, same kernels), rank
# 1's is the unconditional one; the swap moves bytes without touching them;
# and both ranks evaluate `cfg_combine(cond_pred, uncond_pred, w)` and the
# Euler step with identical operands in identical order. No operation is
# reordered anywhere, so there is nothing to round differently. (Against the
# *batched* single-GPU loop of section 3 it would only be close.)
#
# ## 6. What goes wrong: a flipped sign
#
# *A flipped sign* in the combine (`u − w(c − u)`) runs without any error:
# only the comparison with the reference notices. The broken combine reaches
# the ranks as a patch set, `run(..., patches=BROKEN[name])`, which replaces
# `cfg_combine` in `paralab.cfgp.sampling` on every rank for that launch
# (`SAMPLER_BUGS` in `paralab.exercises.lab03`). (Section 10 is a second,
# subtler way to go wrong.)

# %%
BROKEN = {"wrong_sign": SAMPLER_BUGS["wrong_sign"]}
broken_verdicts = []
for name, patches in BROKEN.items():
    broken_run = run(
        cfgp_runs.sample_on_rank,
        2,
        model,
        cond,
        uncond,
        {"cfgp": 2},
        patches=patches,
        steps=STEPS,
        guidance_scale=W,
        seed=SEED,
    )
    latents = [r["latent"] for r in broken_run]
    found = compare(latents, [reference, reference], atol=1e-12)
    disagree = float((latents[0] - latents[1]).abs().max())
    print(
        f"{name:<14} "
        + "  ".join(
            f"{v.path}: {'matches' if v.passed else f'{v.n_diff}/{v.numel} differ, max |diff| {v.max_abs:.1e}'}"
            for v in found
        )
        + f"  | rank 0 vs rank 1 max |diff| {disagree:.1e}"
    )
    broken_verdicts.append(
        claim(
            f"check catches the {name} variant",
            not all(v.passed for v in found),
            f"{sum(not v.passed for v in found)} of {len(found)} ranks differ",
        )
    )
print(verdict_table(broken_verdicts, "The same check fails the broken variant"))

# %% [markdown]
# ## 7. The ledger: one latent each way per step
#
# Per rank and per step, the swap sends `B·S·C·8` bytes and receives as
# many; over the whole sampler `steps·B·S·C·8`. The noise broadcast sends
# `B·S·C·8` once, from cfgp rank 0. The all_gather alternative moves the
# *same* bytes at `n = 2`: `(n−1)·B·S·C·8` per rank. The difference is not
# traffic but mechanics: all_gather is a collective over the group (it
# allocates `n` buffers, one of them a copy of your own prediction), the
# swap is a pairwise exchange that needs no group-wide agreement and
# generalizes to pairing ranks across any mesh.

# %% [markdown]
# **Predict before you run.** Over the 8 steps, how many bytes does each rank
# send through the swap, and does the all_gather variant send more?
#
# <details><summary>Answer</summary>
#
# `8·B·S·C·8` bytes each (one latent per step), the same for all_gather at
# `n = 2`; only cfgp rank 0 also sends the noise once.
# </details>

# %% jupyter={"outputs_hidden": true}
latent_bytes = B * S * C * 8
print(format_table([r["p2p"]["records"] for r in cfgp_out], by=("op", "group_ranks")))
print()
print(format_table([r["all_gather"]["records"] for r in cfgp_out], by=("op", "group_ranks")))
ledger_verdicts, ledger_by_key, rows = [], {}, []
for rank, r in enumerate(cfgp_out):
    p2p, gathered = r["p2p"]["records"], r["all_gather"]["records"]
    measured = {
        "p2p sent": sent(p2p, op="isend"),
        "p2p received": received(p2p, op="irecv"),
        "all_gather sent": sent(gathered, op="all_gather"),
        "noise broadcast sent": sent(p2p, op="broadcast"),
    }
    want = cfgp_bytes(model.latent_shape, STEPS, cfgp_rank=rank)
    formula = {
        "p2p sent": want["cfgp swap"],
        "p2p received": want["cfgp swap"],
        "all_gather sent": want["cfgp swap"],
        "noise broadcast sent": want["noise broadcast"],
    }
    rows += [(rank, key, formula[key], measured[key]) for key in measured]
    for key in measured:
        found = compare(
            torch.tensor(measured[key]),
            torch.tensor(formula[key]),
            name=f"ledger rank {rank}: {key}",
        )
        ledger_verdicts += found
        ledger_by_key.setdefault(key, []).extend(found)
print(text_table(("rank", "bytes", "formula", "measured"), rows, align_right=(0, 2, 3)))
print(
    verdict_table(
        ledger_verdicts,
        f"the detail: ledger vs formula per rank (steps={STEPS}, B·S·C·8 = {latent_bytes} B)",
    )
)

# %%
ledger_claims = [
    summary(f"{key}: ledger = formula on both ranks", found) for key, found in ledger_by_key.items()
]
print(
    verdict_table(
        ledger_claims,
        f"the ledger vs the formulas (detail folded above; B·S·C·8 = {latent_bytes} B)",
    )
)

# %% [markdown]
# ## 8. Time per step: cfgp = 1 vs cfgp = 2
#
# Ideally cfgp = 2 halves the time per step: each rank runs one forward
# instead of two, and the extra cost is one small swap (`B·S·C·8` bytes,
# about a latency of a message) plus a duplicated combine and Euler step
# (elementwise, negligible). It is never quite 2×: the swap is on the
# critical path (nothing overlaps it here), and the two branches do not take
# exactly the same time (the faster rank waits). On this machine there is a
# bigger effect: two cores, shared with other jobs. When they are idle, the
# two ranks run truly in parallel and the speed-up approaches 2×; when other
# work keeps them busy, the two ranks compete for the same CPU time and
# cfgp = 2 can even be *slower* than one process (it adds the swap and the
# scheduling of two processes, and saves nothing). Below, a bigger denoiser
# so that compute dominates; the two layouts alternate twice, best of 6
# runs of 4 steps each. The numbers are
# whatever this machine measured when the notebook last ran.

# %%
# NBVAL_IGNORE_OUTPUT
big = CondDenoiser(
    channels=4, dim=64, heads=4, text_dim=16, n_blocks=4, frames=4, height=8, width=8, seed=0
)
layouts = [
    ("cfgp=1 (one process, 2 forwards/step)", 1, None),
    ("cfgp=2 (2 ranks, 1 forward/step each)", 2, {"cfgp": 2}),
]
timing = {label: float("inf") for label, _, _ in layouts}
for _ in range(
    2
):  # alternate the two layouts, so a burst of other work does not hit only one of them
    for label, world, dims in layouts:
        out = run(
            cfgp_runs.sample_on_rank,
            world,
            big,
            cond,
            uncond,
            dims,
            patches=SAMPLER_EDIT,
            repeats=4,
            steps=4,
            guidance_scale=W,
            seed=SEED,
        )
        timing[label] = min(timing[label], max(r["seconds_per_step"] for r in out))
for label, sec in timing.items():
    print(f"{label:<40} {1000 * sec:7.1f} ms per step")
t1, t2 = timing.values()
print(f"speed-up {t1 / t2:.2f}x (ideal 2x)")

# %% [markdown]
# ## 9. cfgp × cp: four ranks, two branches, each context-parallel
#
# `ParallelDims(world_size=4, cfgp=2, cp=2, enable_inference_mode=True)`
# builds the overlay mesh `(rest, cfgp, cp) = (1, 2, 2)`, row-major: rank
# `r` has `cfgp_rank = r // 2` and `cp_rank = r % 2`. Ranks 0 and 1 run the
# **conditional** branch, context-parallel over the cp group {0, 1}; ranks 2
# and 3 the **unconditional** one over {2, 3}. Each rank holds half the latent
# tokens (`S/cp`), and its self-attention is lab 02's ring or Ulysses
# attention over its cp group; everything else in the denoiser is per token.
# The cfgp groups are {0, 2} and {1, 3}: a rank swaps its prediction with the
# rank that holds the **same shard** of the other branch, so the swap shrinks
# to `B·(S/cp)·C·8` bytes. The noise: cfgp rank 0 (ranks 0, 1) draws the full
# noise from the seed, keeps its shard, and broadcasts it to its cfgp peer. At
# the end the cp shards are all-gathered so every rank returns the whole
# latent (the latent return path).
#
# | rank | cfgp_rank (branch) | cp_rank (tokens) | cfgp peer | cp peer |
# |---|---|---|---|---|
# | 0 | 0 (cond) | 0 (first half) | 2 | 1 |
# | 1 | 0 (cond) | 1 (second half) | 3 | 0 |
# | 2 | 1 (uncond) | 0 (first half) | 0 | 3 |
# | 3 | 1 (uncond) | 1 (second half) | 1 | 2 |

# %%
# show: paralab.cfgp.sampling.cp_forward_kwargs

# %%
# show: paralab.cfgp.sampling.shard_latent paralab.cfgp.sampling.gather_latent

# %% [markdown]
# **Predict before you run: exact or close?** Two references, both single-process with each branch at
# batch 1: the one of section 2 (PyTorch's `scaled_dot_product_attention`)
# and the same loop with lab 02's own attention math (`attention_block`: scores,
# log-sum-exp, weighted sum) over the whole sequence. Which of ring and Ulysses
# matches the `attention_block` reference bitwise?
#
# <details><summary>Answer</summary>
#
# - **Ulysses** trades the sequence split for a head split and then runs
#   *whole-sequence* attention on `H/cp` heads: every head sees exactly the
#   sums it sees in one process, so against the `attention_block` reference
#   it is **bitwise**. (Against SDPA, a different kernel, it is only close.)
# - **Ring** attention computes each key block's softmax partial on its own
#   and merges them with the log-sum-exp rule: the sum over keys is split
#   into per-block sums that are rescaled and added, a different summation
#   order, so it is **close (≤ 1e-12), not bitwise**.
#
# The per-token layers give the same bits on a shard as on the full sequence
# here (a `Linear` on 72 rows sums each row like on 144 rows; on very small
# shards MKL switches kernels, see section 3). The cfgp part adds no
# rounding at all.
# </details>

# %%
from paralab import cp


def block_attention(q, k, v):
    """Whole-sequence attention with the cp kernels' math (lab 02's attention_block)."""
    return cp.attention_block(q, k, v)[0]


reference_block = sample(
    model, cond, uncond, steps=STEPS, guidance_scale=W, seed=SEED, attention=block_attention
)


cp_out = {
    world: run(
        sample_variants,
        world,
        model,
        cond,
        uncond,
        {"cfgp": 2, "cp": world // 2},
        {"ring": {"cp_attention": "ring"}, "ulysses": {"cp_attention": "ulysses"}},
        patches=SAMPLER_EDIT,
        steps=STEPS,
        guidance_scale=W,
        seed=SEED,
        timeout=120,
    )
    for world in (4, 8)
}
print(
    "world 4 (cfgp_rank, cp_rank) per rank:",
    [(r["ring"]["cfgp_rank"], r["ring"]["cp_rank"]) for r in cp_out[4]],
)
print(
    "world 8 (cfgp_rank, cp_rank) per rank:",
    [(r["ring"]["cfgp_rank"], r["ring"]["cp_rank"]) for r in cp_out[8]],
)

# %%
cp_verdicts, cp_groups = [], {}
for world, out in cp_out.items():
    n = world
    tag = f"cfgp=2 x cp={world // 2}"
    found = {
        "ulysses = attention_block ref, bitwise": compare(
            [r["ulysses"]["latent"] for r in out],
            [reference_block] * n,
            name=f"{tag} ulysses vs attention_block ref (exact)",
        ),
        "ring = attention_block ref (<= 1e-12)": compare(
            [r["ring"]["latent"] for r in out],
            [reference_block] * n,
            atol=1e-12,
            name=f"{tag} ring vs attention_block ref (<=1e-12)",
        ),
    }
    for kind in ("ring", "ulysses"):
        found[f"{kind} = SDPA ref (<= 1e-12)"] = compare(
            [r[kind]["latent"] for r in out],
            [reference] * n,
            atol=1e-12,
            name=f"{tag} {kind} vs SDPA ref (<=1e-12)",
        )
    for key, rows in found.items():
        cp_verdicts += rows
        cp_groups.setdefault(key, []).extend(rows)
cp_claims = [summary(f"cp = 2 and 4, every rank: {key}", rows) for key, rows in cp_groups.items()]
print(verdict_table(cp_claims, "cfgp x cp: the final latent on every rank of worlds 4 and 8"))
ring_bitwise = [torch.equal(r["ring"]["latent"], reference_block) for r in cp_out[4]]
print("ring bitwise equal to the attention_block reference on ranks 0-3:", ring_bitwise)

# %% jupyter={"outputs_hidden": true}
print(verdict_table(cp_verdicts, "the detail: one row per world, attention and rank"))

# %% [markdown]
# **The ledger on 4 ranks.** Per rank and per step, the cfgp swap moves one
# *latent* shard, `B·(S/cp)·C·8` bytes, whatever the depth of the network. cp
# moves *hidden states* (width `D`, not `C`) in **every attention layer**:
# ring sends K and V round the ring, `2(cp−1)·Sq` per layer, Ulysses does four
# all-to-alls, `4(cp−1)/cp·Sq` per layer, with `Sq = B·H·(S/cp)·(D/H)·8` one
# rank's share of one of q, k, v (lab 02's formulas, `paralab.cp.costs`).
# So per step cp costs `layers·2(cp−1)·D / C` times the cfgp swap for ring:
# in activation traffic the guidance axis is almost free next to the sequence
# axis. That compares the swap with cp only. Under FSDP-sharded inference
# (`dp_shard > 1`, lab 00's use-case table for VFM inference) every step also
# all-gathers every unit's parameters on every rank, far more bytes than a
# latent; cfgp puts two ranks on one sample, so per sample those all-gathers
# run on twice as many ranks. The swap stays cheap; cfgp's real price there is
# parameter traffic and the samples the world runs at once.

# %% jupyter={"outputs_hidden": true}
out4 = cp_out[4]
cpn = 2
D, H, L = model.inp.out_features, model.blocks[0].heads, model.n_attention_layers
shard_bytes = latent_shard_bytes(model.latent_shape, cpn)
print(format_table([r["ring"]["records"] for r in out4], by=("op", "group_ranks")))
cp_ledger, cp_ledger_by_key, rows = [], {}, []
for rank, r in enumerate(out4):
    cfgp_peer = (rank + 2) % 4
    ring_recs, uly_recs = r["ring"]["records"], r["ulysses"]["records"]
    swap = sent(ring_recs, op="isend", peer=cfgp_peer)
    measured = {
        "cfgp swap sent": swap,
        "ring K/V sent": sent(ring_recs, op="isend") - swap,
        "ulysses a2a sent": sent(uly_recs, op="all_to_all_single"),
        "noise broadcast sent": sent(ring_recs, op="broadcast"),
        "latent return sent": sent(ring_recs, op="all_gather"),
    }
    want = cfgp_bytes(model.latent_shape, STEPS, r["ring"]["cfgp_rank"], cpn)
    formula = {
        "cfgp swap sent": want["cfgp swap"],
        "ring K/V sent": cp_attention_bytes("ring", STEPS, L, B, H, S, D // H, cpn),
        "ulysses a2a sent": cp_attention_bytes("ulysses", STEPS, L, B, H, S, D // H, cpn),
        "noise broadcast sent": want["noise broadcast"],
        "latent return sent": want["latent return"],
    }
    rows += [(key, formula[key], measured[key]) for key in measured if rank == 0]
    for key in measured:
        found = compare(
            torch.tensor(measured[key]),
            torch.tensor(formula[key]),
            name=f"ledger rank {rank}: {key}",
        )
        cp_ledger += found
        cp_ledger_by_key.setdefault(key, []).extend(found)
print(text_table(("rank 0", "formula", "measured"), rows, align_right=(1, 2)))
print(verdict_table(cp_ledger, "the detail: one row per rank and kind of traffic"))

# %%
cp_ledger_claims = [
    summary(f"{key}: ledger = formula on all 4 ranks", rows)
    for key, rows in cp_ledger_by_key.items()
]
print(
    verdict_table(
        cp_ledger_claims,
        f"cfgp x cp ledger vs formulas (steps={STEPS}, layers={L}, D={D}, C={C}, cp={cpn})",
    )
)
per_step_cfgp = shard_bytes
per_step_ring = cp_attention_bytes("ring", 1, L, B, H, S, D // H, cpn)
print(
    f"per step and rank: cfgp swap {per_step_cfgp} B, ring attention {per_step_ring} B "
    f"= {per_step_ring // per_step_cfgp}x the swap (= layers*2(cp-1)*D/C = {L * 2 * (cpn - 1) * D // C})"
)

# %% [markdown]
# The same comparison measured at cp = 2 (world 4) and cp = 4 (world 8),
# rank 0, per step: the swap shrinks with cp (a smaller shard); ring
# attention's traffic per rank grows, `2(cp−1)/cp · B·S·D·8` per layer,
# towards twice the whole sequence's K (or V); Ulysses' shrinks,
# `4(cp−1)/cp² · B·S·D·8` per layer.

# %%
per_step = {}
for world, out in cp_out.items():
    recs_ring, recs_uly = out[0]["ring"]["records"], out[0]["ulysses"]["records"]
    cfgp_peer = world // 2  # rank 0's cfgp peer holds the same shard of the other branch
    swap = sent(recs_ring, op="isend", peer=cfgp_peer)
    per_step[f"cfgp=2 x cp={world // 2}"] = {
        "cfgp swap": swap // STEPS,
        "cp ring attention": (sent(recs_ring, op="isend") - swap) // STEPS,
        "cp Ulysses attention": sent(recs_uly, op="all_to_all_single") // STEPS,
    }
for layout, row in per_step.items():
    print(f"{layout:<16} " + "  ".join(f"{k} {v:>6} B" for k, v in row.items()))
show(plot_step_traffic(per_step))

# %% [markdown]
# ## 10. Bug clinic: the videos that do not match
#
# A report from the field: *"with cfgp = 2 the videos look plausible, but
# they are not the ones the single-GPU pipeline makes for the same seed;
# with cfgp = 1 they match."* No error, no hang, no NaN. The folded cell
# below runs the reported code on two ranks next to the correct code: the
# reported sampler is the package's, launched with the bug as a patch set,
# `run(..., patches=...)` (its source names the bug: open it after answering). Below, first each rank's
# **initial** latent, buggy vs correct, then each rank's **final** latent
# after 8 steps against the single-process reference. Rows are
# rank · channel, columns the 144 latent tokens; white means equal.

# %% jupyter={"source_hidden": true}
from paralab.exercises import EXERCISES
from paralab.exercises.lab03 import noise_per_rank_seed
from paralab.grade import grade, report


def clinic_noise(shape, seed):
    """Each rank's start, drawn the correct way and the reported way."""
    pd = ParallelDims(dist.get_world_size(), cfgp=2, enable_inference_mode=True)
    pd.build_meshes("cpu")
    return {
        "correct": initial_latent(shape, seed, pd),
        "buggy": noise_per_rank_seed(shape, seed, pd),
    }


def by_rank_and_channel(latents):
    """(1, S, C) per rank -> (ranks * C, S): one row per rank and channel, tokens along x."""
    return torch.cat([latent[0].T for latent in latents])


clinic = run(clinic_noise, 2, model.latent_shape, SEED)
reported = run(
    cfgp_runs.sample_on_rank,
    2,
    model,
    cond,
    uncond,
    {"cfgp": 2},
    patches=SAMPLER_BUGS["per_rank_seed"],
    steps=STEPS,
    guidance_scale=W,
    seed=SEED,
)
start_ok = by_rank_and_channel([r["correct"] for r in clinic])
start_bug = by_rank_and_channel([r["buggy"] for r in clinic])
end_ok = by_rank_and_channel([reference, reference])
end_bug = by_rank_and_channel([r["latent"] for r in reported])
for label, ok, bug in [("initial latent", start_ok, start_bug), ("final latent", end_ok, end_bug)]:
    print(
        f"{label:<15} "
        + "   ".join(
            f"rank {r}: {int((bug[r * C : (r + 1) * C] != ok[r * C : (r + 1) * C]).sum()):3d} of {S * C} elements differ"
            for r in range(2)
        )
    )
for title, ok, bug in [
    ("initial latent: buggy vs correct", start_ok, start_bug),
    (f"final latent after {STEPS} steps: buggy vs the reference", end_ok, end_bug),
]:
    show(
        plot_diff_heatmap(
            ok, bug, title, row_label="rank · channel (rank 0 on top)", col_label="latent token"
        )
    )

# %% [markdown]
# **What is wrong?** Rank 0 starts from exactly the right noise (top half of
# the first picture is white), yet its final latent is wrong everywhere, and
# the two ranks do not even agree with each other. Why does rank 0 go wrong,
# and what is the fix?

# %% [markdown]
# <details><summary>Answer</summary>
#
# Each rank seeded its noise with `seed + rank`: rank 0 drew from `seed`,
# rank 1 from `seed + 1`, so the two members of the cfgp pair started from
# **different latents** `x_a` and `x_b`. Rank 0 computes `v_c(x_a)`, rank 1
# `v_u(x_b)`, and after the swap each combines its own prediction with one
# taken at *another* latent. Rank 0's first step already mixes `v_u(x_b)`
# into `x_a`, so its trajectory leaves the reference at step 1 even though
# its start was right; rank 1 is wrong from the start. The error is spread
# over every token and channel (the whole noise differs), not a block or a
# shard: a diff heatmap that is red everywhere points at an input every
# element depends on.
#
# `seed + rank` is the right habit for data parallelism (different samples
# per rank) and a common default in distributed setup code; cfgp ranks must
# instead hold the **same** sample. Fix: draw on cfgp rank 0 and broadcast
# over the cfgp group (`initial_latent`), or seed by the *data-parallel*
# index only, never by the global rank. The check that catches it is the
# same element-wise comparison as everywhere in this lab; the exercise
# `initial_latent` grades exactly this (the cell below runs the grader on
# the bug: it fails on rank 1, the rank whose noise differs).
#
# </details>

# %%
outcome = grade(EXERCISES["initial_latent"], noise_per_rank_seed)
print(report(EXERCISES["initial_latent"], outcome))
latents = [r["latent"] for r in reported]
found = compare(latents, [reference, reference], atol=1e-12)
print(
    "per_rank_seed  "
    + "  ".join(
        f"{v.path}: {'matches' if v.passed else f'{v.n_diff}/{v.numel} differ, max |diff| {v.max_abs:.1e}'}"
        for v in found
    )
    + f"  | rank 0 vs rank 1 max |diff| {float((latents[0] - latents[1]).abs().max()):.1e}"
)
final_check = compare(latents, [reference, reference])
clinic_verdicts = [
    claim(
        "check catches the per_rank_seed variant",
        not all(v.passed for v in found),
        f"{sum(not v.passed for v in found)} of {len(found)} ranks differ",
    ),
    claim(
        "grader fails per-rank noise (initial_latent)",
        outcome.verdict == "FAIL",
        f"grader says {outcome.verdict}",
    ),
    claim(
        "final latent check fails per-rank noise",
        not all(v.passed for v in final_check),
        f"{sum(not v.passed for v in final_check)} of {len(final_check)} ranks differ",
    ),
]
print(verdict_table(clinic_verdicts, "Bug clinic: the checks catch ranks drawing different noise"))

# %% [markdown]
# ## The closing table
#
# What this lab showed, one row per claim group, with how many checks stand
# behind it (every check's row is in a table above, the long ones folded).

# %%
checks = {
    "3 · batching cond+uncond changes at most rounding-level bits": batching_verdicts,
    "5 · cfgp = 2 gives one process's latent, bitwise, on both ranks": cfgp_verdicts,
    "6 · the check catches a flipped guidance sign": broken_verdicts,
    "7 · the ledger: one latent each way per step, noise once": ledger_verdicts,
    "9 · cfgp × cp on 4 and 8 ranks: Ulysses bitwise, ring ≤ 1e-12": cp_verdicts,
    "9 · cfgp × cp ledger: the swap shrinks with cp, attention traffic per layer": cp_ledger,
    "10 · the clinic's per-rank noise is caught (check and grader)": clinic_verdicts,
}
print(closing_table(checks))

# %% [markdown]
# Measured when this notebook last ran (CI does not compare these lines): the
# time per step with cfgp = 1 and cfgp = 2 from section 8, and how long the
# whole lab took, launches included.

# %%
# NBVAL_IGNORE_OUTPUT
for label, sec in timing.items():
    print(f"{label:<40} {1000 * sec:7.1f} ms per step")
print(f"speed-up {t1 / t2:.2f}x (ideal 2x)")
print(f"lab run time {time.perf_counter() - LAB_START:.1f} s")

# %% [markdown]
# ## 11. What to try
#
# The ranks import `paralab.cfgp` from its file and run the package's
# `sample_on_rank`: editing a shown cell changes only this kernel's copy. What
# reaches the ranks: the `model`, `W` and the other arguments of `run(...)`, and
# the patch set passed with `run(..., patches={module path: {name: replacement}})`,
# which replaces those names on every rank for that launch (the shown cell's
# header prints the `EDIT` that hands it over; section 5's `SAMPLER_EDIT`,
# section 6's `BROKEN` and `SAMPLER_BUGS` are patch sets too). A function defined
# or edited in this kernel travels in it by value.
#
# 1. Change `W` to 1.0 and re-run the notebook. Is the cfgp result still
#    bitwise equal to the reference? What does `cfg_combine` compute at
#    `w = 1`, and could a sampler skip the unconditional branch entirely then?
#
#    <details><summary>Hint</summary>Still bitwise: both ranks and the reference
#    evaluate the same `u + 1·(c − u)`. That is `c` up to rounding: the uncond
#    branch contributes nothing but rounding, so a sampler may skip it (lab 06,
#    section 6, shows when a *parallel* sampler may not).</details>
# 2. In section 3, change the first `Linear`'s batch from 2 to 3 or 8 (the
#    `torch.randn(2, ...)` of `emb`). Does row 0 still differ from the batch-1
#    result?
#
#    <details><summary>Hint</summary>It depends on which kernel MKL picks for
#    that shape, so try it: the cell runs in this kernel, no ranks
#    involved.</details>
# 3. Write a `predict_no_swap`: a copy of the shown `predict_cfgp` that returns
#    `(mine, theirs)` on both ranks (forget to swap the roles on rank 1). Hand it
#    to the ranks next to `wrong_sign`: add
#    `"no_swap": {"paralab.cfgp.sampling": {"predict_cfgp": predict_no_swap}}` to
#    section 6's `BROKEN` and re-run that cell. Which ranks fail, and do they agree?
#
#    <details><summary>Hint</summary>Both ranks fail against the reference and
#    they disagree. Rank 1 applies guidance with the roles swapped from step 1;
#    from step 2 on rank 0 goes wrong too, because the prediction it receives
#    was made at rank 1's wrong latent.</details>
# 4. In section 1's `model = CondDenoiser(...)`, set `frames=8` and re-run the
#    notebook (the model travels to the ranks as an argument): how do the
#    ledger bytes change, and does the formula still hold? What about `dim=64`
#    (the model's width)?
#
#    <details><summary>Hint</summary>The swap scales with `S` (frames), not with `dim`: the
#    formula `B·S·C·8` holds, and `dim` changes no cfgp byte.</details>
# 5. Re-run the timing cell a few times. How noisy is the speed-up on a
#    shared two-core machine?
#
#    <details><summary>Hint</summary>No fixed answer: compare the printed
#    speed-ups; section 8 says what moves them.</details>
# 6. Double `n_blocks` in section 1's `model = CondDenoiser(...)` and re-run
#    the notebook. Which ledger rows of section 9 double and which stay put?
#    Recompute the "x the swap" ratio.
#
#    <details><summary>Hint</summary>Ring K/V and Ulysses all-to-all bytes double (per
#    layer); the swap, the noise broadcast and the latent return stay.</details>
# 7. Run cfgp × cp with Ulysses on a denoiser with `heads=2` at cp = 4:
#    `run(sample_variants, 8, CondDenoiser(channels=4, dim=32, heads=2, text_dim=16,
#    n_blocks=2, frames=4, height=6, width=6, seed=0), cond, uncond, {"cfgp": 2, "cp": 4},
#    {"ulysses": {"cp_attention": "ulysses"}}, steps=2, guidance_scale=W, seed=SEED)`.
#    What does the error say?
#
#    <details><summary>Hint</summary>Every rank raises `ValueError: ulysses_attention:
#    heads = 2 (dim 1) is not divisible by cp = 4`, and the launcher reports it
#    per rank: Ulysses splits heads, so cp may not exceed them.</details>
# 8. Write a combine that computes `(1 - w)·uncond + w·cond` on cfgp rank 1
#    only (`torch.distributed.get_rank() == 1`) and `cfg_combine`'s own formula on
#    rank 0, and hand it over the way item 3 does: add
#    `"rank1_combine": {"paralab.cfgp.sampling": {"cfg_combine": your_combine}}` to
#    section 6's `BROKEN`. Do the two ranks still agree bit for bit? With the
#    reference?
#
#    <details><summary>Hint</summary>Neither: rank 1 rounds differently, its
#    latent drifts by a few ulps, and rank 0, which combines rank 1's
#    predictions, drifts too. Both stay within ~1e-15 of the reference, so
#    only an exact check sees it: section 6's row for it, at `atol=1e-12`,
#    says FAIL (not caught), while its rank 0 vs rank 1 column is not 0.</details>
# 9. Section 9 compares the cp runs with both references. Why is Ulysses only
#    close to section 2's reference (`full_attention`, SDPA), although no sum
#    was split?
#
#    <details><summary>Hint</summary>SDPA is a different kernel from `attention_block`:
#    its own order of summation, so it agrees only to rounding.</details>
