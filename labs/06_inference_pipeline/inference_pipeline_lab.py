# %% [markdown]
# # Lab 06 — The whole video foundation model (VFM) inference pipeline on one set of ranks
#
# **Learning goals.** After this lab you can
# - run a video model's inference end to end on one set of ranks: the VAE
#   encode balanced over the `lb` axis, the denoiser sharded with FSDP2 over
#   `dp_shard`, guided sampling with the two branches on `cfgp` and the
#   sequence on `cp`, then the decode;
# - tell, for a layout and a cp attention, whether the result can equal the
#   single-process result bit for bit, and why;
# - predict the ledger of one denoising step, group by group, from closed forms;
# - choose `reshard_after_forward` from a measured memory/traffic trade-off;
# - find why a shortcut taken on one branch stops the whole pipeline, and fix
#   it; say what a `dp_replicate` axis would buy in inference.
#
# **Prerequisites.** Lab 00 (the descriptor), 01 (FSDP), 02 (ring and Ulysses),
# 03 (cfgp), 04 (lb). This lab writes no new algorithm: it composes theirs.
#
# **Time.** About 40 minutes to read; the last code cell prints how long the runs took.
#
# The **loader** of a sample group is its first rank (cfgp rank 0, cp rank 0):
# the rank where the group's raw videos arrive.
#
# | stage | what runs where | communication |
# |---|---|---|
# | 1. encode | the raw videos of a sample group arrive on its loader rank; the lb group shares the encode (lab 04) | lb: cost all-gathers, videos out and latents back (P2P), **once** |
# | | the loader hands each latent to its cp peers (the cond branch's cross-attention context) | broadcast over cp, once |
# | 2. denoise | the initial noise, drawn on cfgp rank 0, reaches both branches | broadcast over cfgp, once |
# | | the denoiser is sharded over `dp_shard` = the whole world; every step, cond on cfgp rank 0, uncond on cfgp rank 1, each over a cp group | FSDP2 parameter all-gathers on dp_shard; the cfgp swap; ring P2P or Ulysses all-to-alls on cp; **every step** |
# | | each rank's cp shard of the final latent is put back together | all-gather over cp, once |
# | 3. decode | every rank decodes its group's latents | all-gather of the videos over the world, once |
#
# One public function does all of it, on any layout:
# `paralab.pipeline.generate(parallel_dims=None, *, steps, guidance_scale, seed, attention, reshard_after_forward)`.
#
# Sections: 1 the pipeline and its reference · 2 who does what on 8 ranks ·
# 3 three layouts against one process · 4 the ledger of one step ·
# 5 memory: `reshard_after_forward` · 6 bug clinic: a shortcut on one branch ·
# 7 dp_replicate > 1 in inference · the closing table; then what to try.

# %%
import time

LAB_START = time.perf_counter()

import torch
import torch.distributed as dist

from paralab import ParallelDims, cp
from paralab.check import claim, closing_table, compare, verdict_table
from paralab.launch import LaunchError, run
from paralab.ledger import Ledger, calls, sent
from paralab.parallel_dims import predict_groups
from paralab.pipeline import costs, inference, runs
from paralab.tables import text_table
from paralab.viz import plot_bytes_by_phase, plot_pipeline_memory, plot_pipeline_samples, show

torch.set_num_threads(1)  # the ranks run one thread each; the reference does too
STEPS, W, SEED = 4, 5.0, 0

# %% [markdown]
# ## 1. The pipeline, one function, and its single-process reference
#
# The fixed batch: 4 conditioning videos of unequal sizes (raw uint8, a
# seeded set). Each is encoded by lab 04's tiny VAE encoder; its latent
# tokens are the denoiser's cross-attention context (the cond branch), and
# zeros of the same shape the null context (the uncond branch). The denoiser
# is lab 03's `CondDenoiser` with 8 heads (Ulysses splits them at cp = 2, 4
# and 8) over a 2 × 4 × 4 latent: 32 tokens, so cp = 2, 4 and 8 each give a
# rank a whole, contiguous range of tokens (no causal mask, so no zigzag). A
# tiny decoder turns each final latent into a video.
#
# The stages, in the order `generate` runs them; each is shown below it.

# %%
# show: paralab.pipeline.inference.generate

# %% [markdown]
# **Stage 1, encode.** On ranks, the loader (the group's first rank) holds
# its group's raw videos; the lb group shares their encode (lab 04's
# `offload_encode`; every lb rank enters it, with or without videos), and the
# loader broadcasts each latent to its cp peers of the cond branch. `conditioning_contexts` (folded) wraps
# it: which samples this rank holds, the cond contexts, and zeros for the
# uncond branch; `check_layout` (folded) refuses layouts the pipeline cannot
# run (section 7).

# %%
# show: paralab.pipeline.inference.encode_conditioning

# %% jupyter={"source_hidden": true}
# show: paralab.pipeline.inference.conditioning_contexts paralab.pipeline.inference.check_layout

# %% [markdown]
# A tiny run of the one-process path: videos of unequal sizes become
# contexts of unequal lengths (the latent's tokens × its 4 channels), which is
# why their encode costs differ and lb has something to balance.

# %%
samples, conds, unconds = conditioning_contexts(None, inference.TinyVideoEncoder())
print(
    text_table(
        ["sample", "raw video (3, T, H, W)", "cond context (1, tokens, C)", "uncond context"],
        [
            [i, tuple(video.shape), tuple(c.shape), f"zeros {tuple(u.shape)}"]
            for i, video, c, u in zip(samples, inference.conditioning_videos(), conds, unconds)
        ],
    )
)

# %% [markdown]
# **Stage 2, the denoiser on FSDP2.** Each block is one unit, the rest the
# root unit, all over `dp_shard` = the whole world. Sections 4 and 5 measure
# what this costs per step (all-gathers) and per rank (memory).

# %%
# show: paralab.pipeline.inference.shard_denoiser

# %% [markdown]
# A tiny run of both on 2 real ranks (`cp 2, lb 2`: one sample group, all 4
# samples, rank 0 its loader): what each rank holds after the encode, what
# the encode sent, and one parameter after `shard_denoiser`. The worker calls
# the package's functions, the ones the ranks import.


# %%
def encode_and_shard():
    pd = ParallelDims(2, cp=2, lb=2, enable_inference_mode=True)
    pd.build_meshes("cpu")
    with Ledger() as ledger:
        samples, conds, _ = inference.conditioning_contexts(pd, inference.TinyVideoEncoder())
    model = inference.shard_denoiser(inference.make_denoiser(), pd, reshard_after_forward=True)
    weight = model.blocks[0].qkv.weight  # a DTensor: this rank's rows of the whole (96, 32) weight
    sent_encode = runs.sent_by_group(
        {"records": ledger.records, "groups": pd.group_ranks()}, "encode"
    )
    return {
        "raw videos": inference.videos_held(pd, dist.get_rank()),
        "contexts": [tuple(c.shape) for c in conds],
        "lb exchange B": sent_encode["lb exchange"],
        "cp broadcast B": sent_encode["one-off (noise, context, return)"],
        "qkv.weight": f"{tuple(weight.shape)} -> local {tuple(weight.to_local().shape)}",
        "shard B": runs.shard_storage_bytes(model),
    }


tiny = run(encode_and_shard, 2, timeout=60)
print(
    text_table(
        ["rank", *tiny[0]],
        [[rank, *r.values()] for rank, r in enumerate(tiny)],
        align_right=(3, 4, 6),
    )
)
print(f"whole model: {sum(p.numel() for p in inference.make_denoiser().parameters()) * 8} B")

# %% [markdown]
# Rank 1 starts with no video, yet enters the lb exchange (it encodes what
# lab 04's planner moves to it and sends the latents back), and ends with
# every context through the cp broadcast from the loader. After
# `shard_denoiser` each rank holds half the rows of every parameter: half the
# model's bytes (at `n = 2` no parameter needs padding).

# %% [markdown]
# **Stage 2, the sampling loop.** Steps outside, samples inside: at every
# step a rank runs one forward per sample of its group, so **every rank runs
# the same FSDP units the same number of times** (they all share one
# dp_shard group), whichever branch and samples it holds.

# %%
# show: paralab.pipeline.inference.denoise

# %% [markdown]
# `predict` is lab 03's cfgp step (this rank's branch, then the swap with its
# cfgp peer) plus one decision, `should_skip_uncond`: may the uncond forward
# be skipped? Section 6 is about that decision; its code is shown there.

# %%
# show: paralab.pipeline.inference.predict

# %%
# show: paralab.pipeline.inference.guided_velocity

# %% [markdown]
# A tiny run of the combine, in this process:

# %%
cond_pred, uncond_pred = torch.ones(2), torch.zeros(2)
print(
    f"guided_velocity(cond=1, uncond=0): w=1 -> {guided_velocity(cond_pred, uncond_pred, 1.0).tolist()}, "
    f"w=5 -> {guided_velocity(cond_pred, uncond_pred, 5.0).tolist()}"
)

# %% [markdown]
# The reference is the same code with `parallel_dims=None`: one process, each
# sample and each branch at batch 1, attention over the whole sequence with
# lab 02's own kernel math (`whole_sequence_attention`).

# %%
reference = generate(None, steps=STEPS, guidance_scale=W, seed=SEED)
model = inference.make_denoiser()
print(
    f"denoiser: latent {tuple(model.latent_shape)} (batch, tokens, channels), width {model.inp.out_features}, "
    f"{model.blocks[0].heads} heads, {len(model.blocks)} blocks, {model.n_attention_layers} self-attention layers"
)
print("output", tuple(reference.shape), reference.dtype, "(samples, RGB, frames, height, width)")
show(plot_pipeline_samples(inference.conditioning_videos(), reference))

# %% [markdown]
# ## 2. Who does what: 8 ranks, dp_shard 8, cfgp 2, cp 2, lb 2
#
# `ParallelDims(8, cfgp=2, cp=2, lb=2, enable_inference_mode=True)`: dp_shard
# is inferred as 8 (overlays take no dp budget). The overlay mesh
# `(rest, cfgp, cp) = (2, 2, 2)` makes **2 sample groups** of 4 ranks; each
# generates 2 of the 4 samples. Inside a group, cfgp rank 0 runs the cond
# branch and cfgp rank 1 the uncond one, each over a cp pair. The lb groups
# are consecutive pairs, independent of the rest. The table is row-major
# arithmetic (lab 00's `predict_groups`), no process needed.

# %%
pd8 = ParallelDims(8, cfgp=2, cp=2, lb=2, enable_inference_mode=True)
rows = []
for rank in range(8):
    g = predict_groups(pd8, rank)
    cfgp_rank, cp_rank = g["cfgp"].index(rank), g["cp"].index(rank)
    rows.append(
        [
            rank,
            inference.samples_of_rank(pd8, rank),
            "cond" if cfgp_rank == 0 else "uncond",
            f"{cp_rank + 1} of 2",
            g["cp"],
            g["cfgp"],
            g["lb"],
            inference.videos_held(pd8, rank),
        ]
    )
print(pd8)
print(
    text_table(
        [
            "rank",
            "samples",
            "branch",
            "token half",
            "cp group",
            "cfgp group",
            "lb group",
            "raw videos",
        ],
        rows,
    )
)

# %% [markdown]
# The loaders (ranks 0 and 4, each its group's first rank) receive both raw
# videos of their group; their lb partners (ranks 1 and 5) receive none, so lab 04's planner moves one
# video to the partner. All 8 ranks are in the one dp_shard group.
#
# **Predict** the other way round: which ranks hold sample 3's latent, in which branch, and in
# which order of its tokens? And at `cfgp 1, cp 2` on 8 ranks?
#
# <details><summary>Answer</summary>
#
# With cfgp 2, cp 2: sample 3 is in the second sample group (samples 2 and 3), ranks 4–7:
# cond on ranks 4 and 5 (first and second token half), uncond on 6 and 7. With cfgp 1 the four
# sample groups are the cp pairs, one sample each: sample 3 on ranks 6 and 7, both branches.
# </details>
#
# The graded exercise `latent_ranks` answers it for any layout and batch:

# %%
# show: paralab.pipeline.inference.latent_ranks

# %%
pd8_no_cfgp = ParallelDims(8, cp=2, enable_inference_mode=True)
print(
    text_table(
        ["sample", "cond ranks (cfgp 2, cp 2, lb 2)", "uncond ranks", "both branches (cp 2)"],
        [
            [s, *latent_ranks(pd8, s).values(), latent_ranks(pd8_no_cfgp, s)["cond"]]
            for s in range(inference.BATCH)
        ],
    )
)

# %% [markdown]
# ## 3. Three layouts against one process
#
# One launch per world size; inside it, each rank runs `generate` several
# times in a row (layouts and variants), under a ledger and a memory probe
# (section 5). Every rank returns the whole output.
#
# | world | layout | attention | checked |
# |---|---|---|---|
# | 4 | dp_shard 4, cfgp 2, cp 2 | Ulysses and ring | `reshard_after_forward` True and False |
# | 8 | dp_shard 8, cfgp 2, cp 2, lb 2 | Ulysses | True and False |
# | 8 | dp_shard 8, cfgp 2, cp 4 | ring | True and False |
#
# **Predict before you run.** Which of these runs equal the reference bit for
# bit? Does `reshard_after_forward` change any bit?
#
# <details><summary>Answer</summary>
#
# Ulysses: bitwise. Each rank's Ulysses attention is whole-sequence attention
# on `heads/cp` heads, the same sums in the same order as the reference's
# whole-sequence attention; every other layer works token by token, and a
# `Linear` over a 16-token shard sums each token exactly like over 32
# tokens; the cfgp branch runs at batch 1 like the reference's; the swap,
# the all-gathers and the broadcasts move bytes without touching them. Ring:
# close, not bitwise: it sums each query's softmax over key blocks and merges
# them by log-sum-exp, another order of summation. `reshard_after_forward`
# changes *when* parameters are gathered, never their values: no bit changes.
#
# The bitwise Ulysses result is a property of this CPU's matmul: the same sums in the same
# order give the same bits only if the GEMM kernel splits them the same way for a 16-token
# and a 32-token input. GPU GEMMs pick tiles and split-K by shape, so on a GPU expect
# Ulysses within a small tolerance (≤ ε), not bitwise.
#
# </details>

# %% jupyter={"source_hidden": true}
VARIANTS_4 = {
    "ulysses, reshard": dict(attention="ulysses", reshard_after_forward=True),
    "ulysses, keep": dict(attention="ulysses", reshard_after_forward=False),
    "ring, reshard": dict(attention="ring", reshard_after_forward=True),
    "ring, keep": dict(attention="ring", reshard_after_forward=False),
    "ulysses, w=1": dict(attention="ulysses", guidance_scale=1.0),
}
for kwargs in VARIANTS_4.values():
    kwargs.update(steps=STEPS, seed=SEED, guidance_scale=kwargs.get("guidance_scale", W))
MESHES = {"FSDP (4,)": (4,), "HSDP (2, 2)": (2, 2)}


def world4(variants, meshes):
    """Both world-4 experiments in one launch: the pipeline (section 3) and dp_replicate (section 7)."""
    return {
        "pipeline": runs.pipeline_job({"w4": dict(cfgp=2, cp=2)}, variants),
        "replicated": runs.replicated_denoiser_job(meshes),
        "training step": runs.training_step_records(),
    }


VARIANTS_8 = {
    "w8 lb2": {name: VARIANTS_4[name] for name in ("ulysses, reshard", "ulysses, keep")},
    "w8 cp4": {name: VARIANTS_4[name] for name in ("ring, reshard", "ring, keep")},
}


def world8(variants):
    """Both world-8 layouts in one launch."""
    layouts = {"w8 lb2": dict(cfgp=2, cp=2, lb=2), "w8 cp4": dict(cfgp=2, cp=4)}
    return {
        k: v
        for name, dims in layouts.items()
        for k, v in runs.pipeline_job({name: dims}, variants[name]).items()
    }


# %%
out4 = run(world4, 4, VARIANTS_4, MESHES, timeout=240)
out8 = run(world8, 8, VARIANTS_8, timeout=240)
RUNS = {key: [r["pipeline"][key] for r in out4] for key in out4[0]["pipeline"]}
RUNS.update({key: [r[key] for r in out8] for key in out8[0]})
print("runs (layout: variant):", *(f"{layout}: {variant}" for layout, variant in RUNS), sep="\n  ")

# %%
LABELS = {"w4": "4: cfgp2 cp2", "w8 lb2": "8: cfgp2 cp2 lb2", "w8 cp4": "8: cfgp2 cp4"}
output_verdicts = []
for (layout, variant), results in RUNS.items():
    if variant == "ulysses, w=1":
        continue  # section 6
    stacked = torch.stack([r["output"] for r in results])
    exact = variant.startswith("ulysses")
    output_verdicts += compare(
        stacked,
        reference.expand_as(stacked),
        atol=0 if exact else 1e-12,
        name=f"{LABELS[layout]} {variant} ({'bitwise' if exact else '<= 1e-12'})",
    )
print(
    verdict_table(
        output_verdicts,
        "generate(pd) on every rank vs generate(None), element by element (rows: all ranks stacked)",
    )
)
same_everywhere = all(
    torch.equal(r["output"], results[0]["output"]) for results in RUNS.values() for r in results
)
output_claims = [
    claim(
        "every rank returns the same tensor, in every run",
        same_everywhere,
        f"{sum(len(v) for v in RUNS.values())} rank results, all equal"
        if same_everywhere
        else "some differ",
    )
]
print(verdict_table(output_claims, "Across ranks"))

# %% [markdown]
# ## 4. The ledger of one denoising step, by group
#
# The ledger sorts every call into the group it travels on (`runs.classify`,
# by the call's process group and the stage it was made in). Per rank and per
# step (`paralab.pipeline.costs`), with `k` samples per sample group, `b`
# forwards per sample (1 with cfgp, 2 without), `n` = dp_shard, `L`
# self-attention layers (cross-attention is not split over cp), and the
# latent and model sizes printed in section 1: `B` the batch of one forward
# (1), `S` latent tokens, `C` latent channels, `D` the model width;
# `Sq = B·(S/cp)·D·8` is one rank's share of the queries in bytes (the same
# for keys and values):
#
# | group | bytes sent per step, per rank |
# |---|---|
# | dp_shard: FSDP2 parameter all-gathers | `k·b·(n−1)·Σ_units shard`; with `reshard_after_forward=False` only the first forward gathers |
# | cfgp: the prediction swap | `k·B·(S/cp)·C·8` |
# | cp: attention | ring `k·b·L·2(cp−1)·Sq`, Ulysses `k·b·L·4(cp−1)/cp·Sq` |
# | lb: the encode exchange | once, before step 1 (lab 04's closed forms) |
#
# A unit's shard is its parameters with dim 0 padded to a multiple of `n`,
# as FSDP2 cuts them: `Σ ceil(d0/n)·(numel/d0)·8` bytes. No reduce-scatter:
# inference has no backward (the check below counts every reduce-scatter FSDP2
# can record, `reduce_scatter_single` included, and is shown failing on a planted
# training step). Bytes are the ledger's model: counted per call at the
# `torch.distributed` API, not measured on a wire. The inputs at 4 ranks (cfgp 2, cp 2, so one
# sample group with all 4 samples):

# %%
pd4 = ParallelDims(4, cfgp=2, cp=2, enable_inference_mode=True)
unit_shards = costs.unit_shard_bytes(model, pd4.dp_shard)
batch, tokens, channels = model.latent_shape
dim, heads = model.inp.out_features, model.blocks[0].heads
print(
    f"k·b = {costs.forwards_per_step(pd4)} forwards per step, n = {pd4.dp_shard}, L = {model.n_attention_layers}, "
    f"Sq = B·(S/cp)·D·8 = {cp.shard_bytes(batch, heads, tokens, dim // heads, pd4.cp)} B, "
    f"one swap B·(S/cp)·C·8 = {batch * (tokens // pd4.cp) * channels * 8} B"
)
print(
    f"unit shards at n = {pd4.dp_shard}: {unit_shards}, Σ_units shard = {sum(unit_shards.values())} B"
)

# %% [markdown]
# The table in code is the graded exercise `denoising_step_bytes`:

# %%
# show: paralab.pipeline.costs.denoising_step_bytes

# %% [markdown]
# **Predict:** at 4 ranks, which group sends the most per step, and by
# roughly what factor over the cfgp swap?
#
# <details><summary>Answer</summary>
#
# At this toy size, the all-gathers: each forward re-gathers the whole model, `(n−1)/n` of its
# padded bytes (`4·3·Σ` per step here), while the swap moves one latent
# shard per sample (4 channels × 16 tokens × 8 B) and cp moves hidden
# states of the model's width. The factor is several hundred; the cell
# below prints it.
#
# </details>

# %%
one = RUNS[("w4", "ulysses, reshard")][0]
measured = runs.sent_by_group(one, "step 2")
formula = denoising_step_bytes(model, pd4, "ulysses", True, step=2)
ops = runs.calls_by_group(one, "step 2")
rows = [
    [
        group,
        ", ".join(f"{n} {op}" for op, n in ops.get(group, {}).items()),
        measured[group],
        formula.get(group, "-"),
    ]
    for group in runs.GROUPS
    if group in formula or measured[group]
]
print("4 ranks (cfgp 2, cp 2, Ulysses, reshard_after_forward=True), step 2, rank 0:")
print(text_table(["group", "calls", "bytes sent", "formula"], rows, align_right=(2, 3)))
print(
    f"all-gathers / cfgp swap = {measured['dp_shard all-gather'] / measured['cfgp swap']:.6g}, "
    f"all-gathers / cp attention = {measured['dp_shard all-gather'] / measured['cp attention']:.6g}"
)

# %% [markdown]
# The same check for every step of every run on every rank (folded code,
# its verdicts below), and the lb exchange of the 8-rank lb layout against
# lab 04's formula per rank: ranks 0 and 4 send a video out and get its
# latent back, ranks 1 and 5 the mirror; the lb groups without videos
# ({2, 3} and {6, 7}) only all-gather their costs, `8(n−1)(1 + W)` bytes with
# `W` = 0 videos per rank.

# %% jupyter={"source_hidden": true}
ledger_verdicts = []
for (layout, variant), results in RUNS.items():
    pd = ParallelDims(
        len(results),
        enable_inference_mode=True,
        **{
            "w4": dict(cfgp=2, cp=2),
            "w8 lb2": dict(cfgp=2, cp=2, lb=2),
            "w8 cp4": dict(cfgp=2, cp=4),
        }[layout],
    )
    kw = VARIANTS_4[variant]
    mismatches = 0
    for r in results:
        for step in range(1, STEPS + 1):
            expected = denoising_step_bytes(
                model, pd, kw["attention"], kw.get("reshard_after_forward", True), step
            )
            got = runs.sent_by_group(r, f"step {step}")
            mismatches += sum(got[g] != b for g, b in expected.items())
            mismatches += sum(
                1 for g, b in got.items() if g not in expected and b
            )  # nothing else in a step
    ledger_verdicts.append(
        claim(
            f"{LABELS[layout]} {variant}: every step = formula",
            mismatches == 0,
            f"{len(results)} ranks x {STEPS} steps x 3 groups, {mismatches} differ",
        )
    )
lb_run = RUNS[("w8 lb2", "ulysses, reshard")]
lb_measured = {
    rank: runs.sent_by_group(r, "encode")["lb exchange"] for rank, r in enumerate(lb_run)
}
lb_formula = costs.lb_bytes(ParallelDims(8, cfgp=2, cp=2, lb=2, enable_inference_mode=True))
print(
    "lb exchange, bytes sent per rank:",
    lb_measured,
    "\nformula:                           ",
    lb_formula,
)
ledger_verdicts.append(
    claim(
        "lb exchange once, before step 1 = lab 04 formula",
        lb_measured == lb_formula,
        f"8 ranks, {sum(lb_measured.values())} B in all",
    )
)
reduce_scatters = sum(
    runs.gradient_reductions(r["records"]) for results in RUNS.values() for r in results
)
planted = [runs.gradient_reductions(r["training step"]) for r in out4]
ledger_verdicts += [
    claim(
        "no reduce-scatter, no all-reduce (no backward)",
        reduce_scatters == 0,
        f"{reduce_scatters} calls",
    ),
    claim(
        "the same count fails on a planted training step (forward + backward)",
        all(n > 0 for n in planted),
        f"{planted[0]} gradient reductions on rank 0 "
        f"({', '.join(sorted({r.op for r in out4[0]['training step'] if r.op.startswith('reduce')}))})",
    ),
]
print(verdict_table(ledger_verdicts, "Ledger by group vs the closed forms"))

# %% [markdown]
# Where the bytes go, phase by phase, on one rank of the 8-rank lb layout
# (rank 0: a loader and an lb owner). "one-off" is the noise broadcast over
# cfgp, the context broadcast over cp and the returns (cp all-gather of the
# final latent, world all-gather of the videos). The last one is not small:
# decoded videos are bigger than latents, and every rank receives all of
# them; a real server would gather them on one rank only.

# %%
panels = {}
for variant in ("ulysses, reshard", "ulysses, keep"):
    r = RUNS[("w8 lb2", variant)][0]
    phases = ["encode", "noise"] + [f"step {s}" for s in range(1, STEPS + 1)] + ["return"]
    panels[f"8 ranks, reshard_after_forward={VARIANTS_4[variant]['reshard_after_forward']}"] = {
        p: runs.sent_by_group(r, p) for p in phases
    }
show(plot_bytes_by_phase(panels))

# %% [markdown]
# ## 5. Memory per rank: `reshard_after_forward`
#
# **How it is measured.** FSDP2 registers on each module either its sharded
# parameters (DTensors: this rank's rows) or, between its pre-forward and its
# reshard, the gathered plain tensors; a freed gathered buffer is resized to
# 0 bytes. A probe (`runs.probe_memory`, global module hooks) sums the
# distinct storages behind the plain-tensor parameters of the whole model:
# before each root forward (what the previous step left gathered) and after
# each unit's forward, before FSDP2 frees it (the largest of those is the
# peak). The shards are the DTensors' local storage.
#
# **The formulas** (`costs.memory`): shards `Σ_units shard`, always held.
# `True`: nothing gathered between steps; the gathered parameters peak at the
# root (its forward wraps the blocks) plus one block. `False`: after the first
# forward every unit stays gathered: `n·Σ_units shard` (padding included), which
# with the shards is `(1 + 1/n)` times the model, not one replica.
#
# These columns count **gathered parameter storages** only. The true peak adds
# the flat all-gather output FSDP2 keeps after a unit's copy-out until the next
# unit's (`AllGatherState`, so that the copy-out can overlap the next
# all-gather): one more gathered block, about root + 2 × block; the probe reads
# it from FSDP2's communication context (`runs.held_all_gather_bytes`).

# %%
memory_verdicts, measured_mem, formula_mem = [], {}, {}
for layout, n in (("w4", 4), ("w8 lb2", 8)):
    for variant in ("ulysses, reshard", "ulysses, keep"):
        keep = VARIANTS_4[variant]["reshard_after_forward"]
        expected = costs.memory(model, n, keep)
        per_rank = [
            {
                "shards": r["memory"].shards,
                "gathered between steps": max(r["memory"].between[1:]),
                "gathered peak": r["memory"].peak,
                "peak with all-gather buffer": r["memory"].peak_with_buffer,
            }
            for r in RUNS[(layout, variant)]
        ]
        label = f"{n} ranks, reshard={keep}"
        measured_mem[label], formula_mem[label] = per_rank[0], expected
        memory_verdicts.append(
            claim(
                f"{label}: shards, between, peak = formula",
                all(m == expected for m in per_rank),
                f"rank 0: {per_rank[0]['shards']} / {per_rank[0]['gathered between steps']} / "
                f"{per_rank[0]['gathered peak']} B",
            )
        )
print(
    text_table(
        ["setting", *next(iter(measured_mem.values()))],
        [
            [s, *(f"{m[k]} (formula {formula_mem[s][k]})" for k in m)]
            for s, m in measured_mem.items()
        ],
    )
)
print(
    verdict_table(memory_verdicts, "Parameter bytes per rank, measured on the storages vs formula")
)
show(
    plot_pipeline_memory(
        {k: v for k, v in measured_mem.items() if k.startswith("4")},
        {k: v for k, v in formula_mem.items() if k.startswith("4")},
    )
)

# %% [markdown]
# The trade-off, in numbers (4 ranks, per rank):

# %%
held_true = measured_mem["4 ranks, reshard=True"]
held_false = measured_mem["4 ranks, reshard=False"]
gather_true = runs.sent_by_group(RUNS[("w4", "ulysses, reshard")][0], "step 2")[
    "dp_shard all-gather"
]
gather_false = runs.sent_by_group(RUNS[("w4", "ulysses, keep")][0], "step 2")["dp_shard all-gather"]
print(
    f"reshard_after_forward=True holds {held_true['shards'] + held_true['gathered between steps']} B of parameters "
    f"between steps instead of {held_false['shards'] + held_false['gathered between steps']} B, "
    f"and pays {gather_true} B of all-gathers per step and rank instead of {gather_false} B after the first step."
)

# %% [markdown]
# In inference nothing else competes for the memory that `False` keeps (no
# gradients, no optimizer state, no activations saved for a backward): if
# the gathered model fits next to the activations, keeping it removes the
# dominant traffic of every step after the first. `True` is for models that
# do not fit gathered.
#
# ### At a Cosmos-like size the balance turns
#
# "The all-gathers dominate" holds at this toy size only. The same formulas at a
# Cosmos-like size: 14B parameters in bf16 on 8 ranks (dp_shard 8), one
# 75,600-token sequence, width D = 5120, 36 blocks (the 14B net,
# `TRANSFER2_CONTROL2WORLD_NET_14B` in
# nvidia-cosmos/cosmos-transfer2.5@ecbc860:cosmos_transfer2/_src/interactive/configs/registry_defaults/net_transfer.py:
# 36 blocks of 5120, 40 heads), Ulysses cp 2 (bf16: 2 bytes an element), per rank
# and per forward:

# %%
n_big, params_big, bytes_per = 8, 14e9, 2
tokens_big, dim_big, layers_big, cp_big = 75_600, 5120, 36, 2
gathers_big = (n_big - 1) * params_big * bytes_per / n_big  # (n-1) x one rank's shard
sq_big = 1 * (tokens_big // cp_big) * dim_big * bytes_per  # B·(S/cp)·D·2
cp_big_bytes = layers_big * 4 * (cp_big - 1) / cp_big * sq_big  # Ulysses, L layers
print(
    f"all-gathers (n-1)·Σ shard: {gathers_big / 1e9:.1f} GB; Ulysses cp traffic "
    f"L·4(cp-1)/cp·Sq: {cp_big_bytes / 1e9:.1f} GB per forward and rank"
)

# %% [markdown]
# About 28 GB of cp traffic against 24.5 GB of all-gathers: at that size the
# sequence, not the parameters, dominates each forward, and the all-gathers ride
# on dp_shard's links while the all-to-alls need cp's.
#
# ## 6. Bug clinic: "skip the uncond branch when guidance is 1"
#
# At `w = 1` guidance returns the cond prediction, so the uncond forward is
# wasted work. A tempting patch answers `should_skip_uncond` (called in
# `predict`, section 1) from the guidance scale alone. Only the uncond branch
# acts on the answer (the cond branch has nothing to skip). The patch below
# is that one decision, planted into the real loop on every rank: the patch set
# `{"paralab.pipeline.inference": {"should_skip_uncond": ...}}` passed to
# `run(..., patches=...)` replaces the function `predict` looks up there, on
# each rank, for this launch only.
#
# **Predict:** at 4 ranks (cfgp 2, cp 2, dp_shard 4) and `w = 1`, which ranks
# finish, and with what output?

# %%
# show: paralab.exercises.lab06.skip_uncond_whenever_guidance_is_one

# %%
from paralab.exercises.lab06 import skip_uncond_whenever_guidance_is_one

try:
    run(
        runs.pipeline_job,
        4,
        {"w4": dict(cfgp=2, cp=2)},
        {"w=1": VARIANTS_4["ulysses, w=1"]},
        patches={
            "paralab.pipeline.inference": {
                "should_skip_uncond": skip_uncond_whenever_guidance_is_one
            }
        },
        timeout=5,
    )
    clinic_error = None
except LaunchError as err:
    clinic_error = err
print(f"{type(clinic_error).__name__}: {clinic_error}")

# %% [markdown]
# <details><summary>Answer: what is wrong, and the fix</summary>
#
# No rank finishes: the run hangs, and the launcher stops it at its timeout.
# Ranks 2 and 3 (the uncond branch) skip their forward and go straight to the
# cfgp swap, where each waits to receive its cond partner's prediction.
# Ranks 0 and 1 (cond) enter their forward, whose first FSDP2 unit
# all-gathers its parameters **over dp_shard = {0, 1, 2, 3}**: both wait in
# that one all-gather for ranks 2 and 3, which wait in the swap for them.
# Nothing fails, nothing returns. On one GPU the shortcut is right;
# with a replicated denoiser (dp_shard 1) it is right too, because then the
# uncond forward enters no collective with the cond ranks (its cp partners
# skip with it).
#
# The fix is the package's `should_skip_uncond`: skip only where the skipped
# forward shares no collective with ranks that do not skip, which under FSDP
# is never (dp_shard spans both branches). The uncond rank also still enters
# the swap when it skips, with zeros. **A rank may skip work, never a
# collective its group enters.** The correct code at `w = 1` ran in section
# 3's launch; the reference skips the uncond forward (one process, no
# collective) and both give the same bits, because `guided_velocity` returns
# the cond prediction at `w = 1` on every path.
#
# </details>
#
# The package's decision, and a tiny run of it in this process (a
# `ParallelDims` answers without building meshes; the last layout has 4 dp
# replicas and no dp_shard, which `generate` itself refuses, section 7):

# %%
# show: paralab.pipeline.inference.should_skip_uncond

# %%
pd_sharded = ParallelDims(4, cfgp=2, cp=2, enable_inference_mode=True)
pd_unsharded = ParallelDims(4, dp_shard=1, dp_replicate=4, cfgp=2, cp=2, enable_inference_mode=True)
for w, pd in ((5.0, None), (1.0, None), (1.0, pd_sharded), (1.0, pd_unsharded)):
    print(
        f"w = {w}, {'one process' if pd is None else f'dp_shard {pd.dp_shard}'}: skip the uncond forward? "
        f"{should_skip_uncond(w, pd)}"
    )

# %%
reference_w1 = generate(None, steps=STEPS, guidance_scale=1.0, seed=SEED)
fixed = torch.stack([r["output"] for r in RUNS[("w4", "ulysses, w=1")]])
clinic_claims = [
    claim(
        "the one-branch skip hangs; the launcher stops it at its timeout",
        type(clinic_error).__name__ == "LaunchTimeout",
        type(clinic_error).__name__,
    ),
    claim(
        "the timeout names the stuck ranks",
        clinic_error is not None and clinic_error.hung_ranks == [0, 1, 2, 3],
        f"hung ranks {getattr(clinic_error, 'hung_ranks', None)}",
    ),
]
print(verdict_table(clinic_claims, "Bug clinic: the one-branch skip"))
clinic_fixed = compare(
    fixed, reference_w1.expand_as(fixed), name="fixed code at w=1, 4 ranks vs reference (bitwise)"
)
print(verdict_table(clinic_fixed, "The fix"))

# %% [markdown]
# ## 7. dp_replicate > 1 in inference
#
# Lab 00's workload table says VFM inference forces `dp_replicate = 1`. What
# would a replica axis do? The experiment (same 4-rank launch as section 3)
# shards the denoiser on a 1-D mesh (FSDP, 4 shards) and on a 2-D mesh
# (HSDP: 2 replicas × 2 shards; FSDP2 picks HSDP from the mesh's dimension),
# runs 4 forwards on fixed inputs and compares with the unsharded model.

# %% jupyter={"source_hidden": true}
unsharded = runs.repeated_forwards(inference.make_denoiser())
replica_verdicts, rows = [], []  # the forwards vs the unsharded model; one table row per mesh
for name in MESHES:
    per_rank = [r["replicated"][name] for r in out4]
    replica_verdicts += compare(
        torch.stack([r["output"] for r in per_rank]),
        unsharded.expand(4, *unsharded.shape),
        name=f"{name}: 4 forwards vs unsharded model (bitwise)",
    )
    rows.append(
        [
            f"{name}, reshard=True",
            per_rank[0]["shards"],
            sent(per_rank[0]["records"], op="all_gather_single") // 4,
            calls(per_rank[0]["records"], op="all_reduce"),
        ]
    )
keep_run = RUNS[("w4", "ulysses, keep")][0]
rows.append(
    [
        "FSDP (4,), reshard=False (section 5)",
        held_false["shards"] + held_false["gathered between steps"],
        0,
        calls(keep_run["records"], op="all_reduce"),
    ]
)

# %%
print(
    text_table(
        [
            "mesh",
            "parameter bytes held between forwards",
            "all-gather bytes per forward (steady)",
            "all-reduces",
        ],
        rows,
        align_right=(1, 2, 3),
    )
)
shard_ratio = rows[1][1] / rows[0][1]
print(verdict_table(replica_verdicts, "dp_replicate > 1 in inference: the same bits"))
replica_claims = [
    claim(
        "HSDP holds each parameter twice: shard bytes per rank x2",
        shard_ratio == 2,
        f"ratio {shard_ratio:.6g}",
    ),
    claim(
        "no all-reduce: the replica axis carries nothing in inference",
        rows[1][3] == 0,
        f"{rows[1][3]} all-reduces",
    ),
]

# %% [markdown]
# Nothing goes numerically wrong: both give the unsharded model's bits. The
# replica axis carries no traffic at all (in training its only job is to
# all-reduce gradients), so in inference replicas are purely a choice of how
# many copies of the parameters to keep: twice the shard bytes per rank buy
# all-gathers over 2 ranks instead of 4, a point between
# `reshard_after_forward=True` and `False` on the same memory/traffic curve.
# FSDP2 already turns that knob on the dp_shard mesh (`reshard_after_forward`,
# which also takes an int: re-shard to a smaller group after forward). And the
# data split of inference comes from the overlay mesh (sample groups), not
# from dp replicas, so the replica index means nothing to the pipeline.
#
# **Decision.** Should `ParallelDims` reject `dp_replicate > 1` with
# `enable_inference_mode=True`? No: the descriptor only builds groups, and its
# reference layout (lab 00: 8 ranks, 2 replicas × 4 shards, cfgp 2, cp 2, lb 2)
# is in inference mode precisely to show every axis at once. The rule belongs
# to the workload: `generate` refuses a layout with dp replicas, naming the
# axis and its value (`check_layout`):

# %%
pd_replicas = ParallelDims(
    4, dp_shard=2, cfgp=2, cp=2, enable_inference_mode=True
)  # dp_replicate = 4 / dp_shard = 2, inferred
try:
    generate(pd_replicas)
    rejected = None
except ValueError as err:
    rejected = str(err)
print(f"{pd_replicas}\n  accepted by ParallelDims; generate -> ValueError: {rejected}")
replica_claims.append(
    claim(
        "generate rejects dp_replicate=2, naming it",
        rejected is not None and "dp_replicate=2" in rejected,
        "ValueError naming dp_replicate=2"
        if rejected and "dp_replicate=2" in rejected
        else str(rejected),
    )
)
print(
    verdict_table(
        replica_claims,
        "dp_replicate > 1 in inference: twice the shards, no replica traffic, refused by generate",
    )
)

# %% [markdown]
# ## The closing table
#
# One row per section: how many of its checks ran and whether all passed (the
# tables above hold each check).

# %%
checks = {
    "3 three layouts vs one process": output_verdicts + output_claims,
    "4 ledger by group vs formulas": ledger_verdicts,
    "5 memory per rank vs formulas": memory_verdicts,
    "6 bug clinic": clinic_claims + clinic_fixed,
    "7 dp_replicate > 1": replica_verdicts + replica_claims,
}
print(closing_table(checks))

# %% [markdown]
# **Closing note.** How long the whole lab took when this notebook last ran
# (launches included; CI does not compare this line).

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time {time.perf_counter() - LAB_START:.1f} s")

# %% [markdown]
# ## What to try
#
# The ranks import `paralab.pipeline` from its file: an edit to a shown cell
# changes only this kernel's copy (the reference). To change what the ranks
# run, pass the replacement to `run` as a patch set,
# `run(runs.pipeline_job, ..., patches={"paralab.pipeline.inference": {name:
# function}})`, which puts it into `paralab.pipeline.inference` on every rank
# for that launch (as the bug clinic does), or edit `src/paralab/pipeline/`
# and restart the kernel.
#
# 1. Re-run the bug clinic with the parameters kept gathered:
#    `run(runs.pipeline_job, 4, {"w4": dict(cfgp=2, cp=2)}, {"w=1, keep":
#    dict(VARIANTS_4["ulysses, w=1"], reshard_after_forward=False)},
#    patches={"paralab.pipeline.inference": {"should_skip_uncond":
#    skip_uncond_whenever_guidance_is_one}}, timeout=10)`. Does it still hang? Why does keeping the parameters
#    gathered not save the uncond ranks?
#    <details><summary>Answer</summary>It still hangs (`LaunchTimeout`, ranks
#    0–3). With `False` FSDP2 keeps the units gathered *after* the first
#    forward, but that first forward's all-gathers still need every rank of
#    dp_shard, and the uncond ranks never run one.</details>
# 2. Swap the loops of `denoise` (samples outside, steps inside). In a new
#    cell, copy the shown `denoise` (keep `@torch.no_grad()`) as
#    `denoise_samples_outside`, put `for i, x in enumerate(xs):` outside the
#    steps, keep `with in_phase(f"step {step}"):` around each `predict`, and
#    run it on the ranks: `run(runs.pipeline_job, 4, {"w4": dict(cfgp=2, cp=2)},
#    {name: VARIANTS_4[name] for name in ("ulysses, reshard", "ulysses, keep")},
#    patches={"paralab.pipeline.inference": {"denoise": denoise_samples_outside}},
#    timeout=120)`. Do the
#    outputs change? The ledger per step (`runs.sent_by_group(r, "step 2")`)?
#    The all-gather count with `reshard_after_forward=False`
#    (`calls(r["records"], op="all_gather_single")`)?
#    <details><summary>Answer</summary>Nothing changes: the outputs are the
#    reference's bits, every step's bytes by group are the same, and with
#    `False` the model is still gathered once (one call per unit). What
#    matters for FSDP2 is that every rank runs the same units the same number
#    of times in the same order, which both loop orders do.</details>
# 3. Give the denoiser a third block. Define `three_blocks()` returning
#    `CondDenoiser(channels=4, dim=32, heads=8, text_dim=4, n_blocks=3, frames=2,
#    height=4, width=4, seed=0)` (`from paralab.models import CondDenoiser`);
#    predict the step-2 all-gather bytes and the peak with
#    `denoising_step_bytes(three_blocks(), pd4, "ulysses", True, 2)` and
#    `costs.memory(three_blocks(), 4, True)`, then check on the ranks:
#    `run(runs.pipeline_job, 4, {"w4": dict(cfgp=2, cp=2)}, {"v":
#    VARIANTS_4["ulysses, reshard"]}, patches={"paralab.pipeline.inference":
#    {"make_denoiser": three_blocks}}, timeout=120)`, reading `runs.sent_by_group(r, "step 2")`
#    and `r["memory"].peak`.
#    <details><summary>Answer</summary>The all-gathers grow by one block's
#    shard × `k·b·(n−1)`, and cp attention by half (a third layer); the
#    peak does not move: with `True` it is the root plus one block, gathered,
#    however many blocks there are. The ledger and the probe agree with the
#    formulas.</details>
# 4. At 8 ranks, cfgp 2, cp 2, lb 2, the lab ran Ulysses. Which ledger group
#    would the ring change, and by how much? Compare
#    `denoising_step_bytes(model, pd8, "ring", True, 2)` with `"ulysses"` (the
#    formulas section 4 matched for both), then the same at
#    `ParallelDims(8, cfgp=2, cp=4, enable_inference_mode=True)`.
#    <details><summary>Answer</summary>At cp 2 nothing changes: the ring
#    sends `2(cp−1)·Sq = 2·Sq` per layer and Ulysses `4(cp−1)/cp·Sq = 2·Sq`. At
#    cp 4 only cp attention changes: the ring sends twice Ulysses' bytes
#    (`6·Sq` vs `3·Sq`); in general `cp/2` times.</details>
# 5. Put the raw videos on every rank of a sample group instead of its
#    loader: `run(runs.pipeline_job, 8, {"w8 lb2": dict(cfgp=2, cp=2, lb=2)},
#    {"v": VARIANTS_4["ulysses, reshard"]}, patches={"paralab.pipeline.inference":
#    {"videos_held": lambda pd, rank: inference.samples_of_rank(pd, rank)}},
#    timeout=120)`. What does lb
#    do then (`runs.sent_by_group(r, "encode")` on each rank's result `r`), and
#    what is wasted?
#    <details><summary>Answer</summary>The output is unchanged. Every lb
#    group is already balanced, so lb only shares costs (`8(n−1)(1 + W)` = 24
#    B per rank with `W` = 2) and moves nothing. Each video is encoded by all
#    four ranks of its group, but only the loader's latent is used: the uncond
#    ranks drop theirs, and the loader still broadcasts its latents to a cp
#    partner that had encoded them already.</details>
# 6. Skip the uncond forward where it is safe. The package's
#    `should_skip_uncond` says yes without dp_shard; `generate` refuses that
#    layout, so write a worker that runs the stages itself on
#    `ParallelDims(2, dp_shard=1, dp_replicate=2, cfgp=2, enable_inference_mode=True)`
#    (call `pd.build_meshes("cpu")`): `inference.conditioning_contexts(pd,
#    encoder)`, then `inference.denoise(model, conds, unconds,
#    [inference.sample_seed(SEED, i) for i in samples], steps=STEPS,
#    guidance_scale=1.0, pd=pd, attention="ulysses")` on an unsharded
#    `inference.make_denoiser()` inside a `Ledger()`, and decode each latent
#    with `inference.make_decoder(model)`. Run it with `run(worker, 2)`. Is the
#    output `generate(None, steps=STEPS, guidance_scale=1.0, seed=SEED)`? Which
#    collectives did the uncond rank still enter?
#    <details><summary>Answer</summary>Bit for bit the reference's. The
#    uncond rank skipped every forward but still entered the noise broadcast
#    over cfgp and, every step, the swap (`isend` + `irecv`), sending zeros:
#    skipping work is safe, skipping a collective its partner enters is
#    not.</details>
