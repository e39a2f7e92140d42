# %% [markdown]
# # Lab 06 — The whole VFM inference pipeline on one set of ranks
#
# **Learning goals.** After this lab you can
# - run a video model's inference end to end on one set of ranks: the VAE
#   encode balanced over the `lb` axis, the denoiser sharded with FSDP2 over
#   `dp_shard`, guided sampling with the two branches on `cfgp` and the
#   sequence on `cp`, then the decode;
# - say why the result is the single-process result bit for bit (Ulysses)
#   or to 1e-12 (ring), whatever the layout;
# - read the ledger of one denoising step by group and predict it: the
#   parameter all-gathers, not the guidance swap, dominate;
# - choose `reshard_after_forward` from a measured memory/traffic trade-off;
# - explain why a rank may skip work but never a collective its group enters,
#   and why inference runs with `dp_replicate = 1`.
#
# **Prerequisites.** Lab 00 (the descriptor), 01 (FSDP), 02 (ring and Ulysses),
# 03 (cfgp), 04 (lb). This lab writes no new algorithm: it composes theirs.
#
# | stage | what runs where | communication |
# |---|---|---|
# | 1. encode | the raw videos of a sample group arrive on its loader rank; the lb group shares the encode (lab 04) | lb: cost all-gathers, videos out and latents back (P2P), **once** |
# | | the loader hands each latent to its cp peers (the cond branch's cross-attention context) | broadcast over cp, once |
# | 2. denoise | the denoiser is sharded over `dp_shard` = the whole world; every step, cond on cfgp rank 0, uncond on cfgp rank 1, each over a cp group | FSDP2 parameter all-gathers on dp_shard; the cfgp swap; ring P2P or Ulysses all-to-alls on cp; **every step** |
# | 3. decode | every rank decodes its group's latents | all-gather of the videos over the world, once |
#
# One public function does all of it, on any layout:
# `paralab.pipeline.generate(parallel_dims=None, *, steps, guidance_scale, seed, attention, reshard_after_forward)`.
#
# Sections: 1 the pipeline and its reference · 2 who does what on 8 ranks ·
# 3 three layouts against one process · 4 the ledger of one step ·
# 5 memory: `reshard_after_forward` · 6 bug clinic: a shortcut on one branch ·
# 7 dp_replicate > 1 in inference · 8 summary and what to try.

# %%
import time

LAB_START = time.perf_counter()

import torch
import torch.distributed as dist

from paralab import ParallelDims
from paralab.check import claim, closing_table, compare, verdict_table
from paralab.launch import LaunchError, run
from paralab.ledger import calls, sent
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
# and 8) over a 2 × 4 × 4 latent (32 tokens, divisible by 16). A tiny decoder
# turns each final latent into a video.
#
# The stages, in the order `generate` runs them; each is shown below it.

# %%
# show: paralab.pipeline.inference.generate

# %% [markdown]
# **Stage 1, encode.** On ranks, the loader holds its group's raw videos; the
# lb group shares their encode (lab 04's `offload_encode`; every lb rank
# enters it, with or without videos), and the loader broadcasts each latent
# to its cp peers of the cond branch. `conditioning_contexts` (folded) wraps
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
print(text_table(["sample", "raw video (3, T, H, W)", "cond context (1, tokens, C)", "uncond context"],
                 [[i, tuple(video.shape), tuple(c.shape), f"zeros {tuple(u.shape)}"]
                  for i, video, c, u in zip(samples, inference.conditioning_videos(), conds, unconds)]))

# %% [markdown]
# **Stage 2, the denoiser on FSDP2.** Each block is one unit, the rest the
# root unit, all over `dp_shard` = the whole world. Sections 4 and 5 measure
# what this costs per step (all-gathers) and per rank (memory).

# %%
# show: paralab.pipeline.inference.shard_denoiser

# %% [markdown]
# **Stage 2, the sampling loop.** Steps outside, samples inside: at every
# step a rank runs one forward per sample of its group, so **every rank runs
# the same FSDP units the same number of times** (they all share one
# dp_shard group), whichever branch and samples it holds.

# %%
# show: paralab.pipeline.inference.denoise

# %% [markdown]
# `predict` is lab 03's cfgp step (this rank's branch, then the swap with its
# cfgp peer) plus one decision, `should_skip_uncond` (section 6 is about it).

# %%
# show: paralab.pipeline.inference.predict

# %%
# show: paralab.pipeline.inference.should_skip_uncond paralab.pipeline.inference.guided_velocity

# %% [markdown]
# A tiny run of the decision and the combine, in this process (a
# `ParallelDims` answers without building meshes):

# %%
pd_sharded = ParallelDims(4, cfgp=2, cp=2, enable_inference_mode=True)
for w, pd in ((5.0, None), (1.0, None), (1.0, pd_sharded)):
    print(f"w = {w}, {'one process' if pd is None else f'dp_shard {pd.dp_shard}'}: skip the uncond forward? "
          f"{should_skip_uncond(w, pd)}")
cond_pred, uncond_pred = torch.ones(2), torch.zeros(2)
print(f"guided_velocity(cond=1, uncond=0): w=1 -> {guided_velocity(cond_pred, uncond_pred, 1.0).tolist()}, "
      f"w=5 -> {guided_velocity(cond_pred, uncond_pred, 5.0).tolist()}")

# %% [markdown]
# The reference is the same code with `parallel_dims=None`: one process, each
# sample and each branch at batch 1, attention over the whole sequence with
# lab 02's own kernel math (`whole_sequence_attention`).

# %%
reference = generate(None, steps=STEPS, guidance_scale=W, seed=SEED)
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
    rows.append([rank, inference.samples_of_rank(pd8, rank), "cond" if cfgp_rank == 0 else "uncond",
                 f"{cp_rank + 1} of 2", g["cp"], g["cfgp"], g["lb"],
                 inference.videos_held(pd8, rank)])
print(pd8)
print(text_table(["rank", "samples", "branch", "token half", "cp group", "cfgp group", "lb group", "raw videos"], rows))

# %% [markdown]
# The loaders (ranks 0 and 4) receive both raw videos of their group; their
# lb partners (ranks 1 and 5) receive none, so lab 04's planner moves one
# video to the partner. All 8 ranks are in the one dp_shard group.

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
    return {"pipeline": runs.pipeline_job({"w4": dict(cfgp=2, cp=2)}, variants),
            "replicated": runs.replicated_denoiser_job(meshes)}


VARIANTS_8 = {
    "w8 lb2": {name: VARIANTS_4[name] for name in ("ulysses, reshard", "ulysses, keep")},
    "w8 cp4": {name: VARIANTS_4[name] for name in ("ring, reshard", "ring, keep")},
}


def world8(variants):
    """Both world-8 layouts in one launch."""
    layouts = {"w8 lb2": dict(cfgp=2, cp=2, lb=2), "w8 cp4": dict(cfgp=2, cp=4)}
    return {k: v for name, dims in layouts.items()
            for k, v in runs.pipeline_job({name: dims}, variants[name]).items()}


# %%
out4 = run(world4, 4, VARIANTS_4, MESHES, timeout=240)
out8 = run(world8, 8, VARIANTS_8, timeout=240)
RUNS = {key: [r["pipeline"][key] for r in out4] for key in out4[0]["pipeline"]}
RUNS.update({key: [r[key] for r in out8] for key in out8[0]})
print("runs:", ", ".join(f"{layout} {variant}" for layout, variant in RUNS))

# %%
LABELS = {"w4": "4: cfgp2 cp2", "w8 lb2": "8: cfgp2 cp2 lb2", "w8 cp4": "8: cfgp2 cp4"}
output_verdicts = []
for (layout, variant), results in RUNS.items():
    if variant == "ulysses, w=1":
        continue  # section 6
    stacked = torch.stack([r["output"] for r in results])
    exact = variant.startswith("ulysses")
    output_verdicts += compare(stacked, reference.expand_as(stacked), atol=0 if exact else 1e-12,
                               name=f"{LABELS[layout]} {variant} ({'bitwise' if exact else '<= 1e-12'})")
same_everywhere = all(torch.equal(r["output"], results[0]["output"]) for results in RUNS.values() for r in results)
output_verdicts.append(claim("every rank returns the same tensor, in every run", same_everywhere,
                             f"{sum(len(v) for v in RUNS.values())} rank results"))
print(verdict_table(output_verdicts, "generate(pd) on every rank vs generate(None), element by element (rows: all ranks stacked)"))

# %% [markdown]
# ## 4. The ledger of one denoising step, by group
#
# The ledger sorts every call into the group it travels on (`runs.classify`,
# by the call's process group and the stage it was made in). Per rank and per
# step, with `k` samples per group, `b` forwards per sample (1 with cfgp),
# `n` = dp_shard, `L` attention layers (`paralab.pipeline.costs`):
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
# inference has no backward. **Predict:** at 4 ranks, which group sends the
# most per step, and by what factor over the cfgp swap?
#
# <details><summary>Answer</summary>
#
# The all-gathers: each forward re-gathers the whole model, `(n−1)/n` of its
# padded bytes, while the swap moves one latent shard (4 channels × 16
# tokens) and cp moves hidden states of 32 channels. The factor is printed
# below.
#
# </details>

# %%
model = inference.make_denoiser()
pd4 = ParallelDims(4, cfgp=2, cp=2, enable_inference_mode=True)
one = RUNS[("w4", "ulysses, reshard")][0]
measured = runs.sent_by_group(one, "step 2")
formula = costs.step_bytes(model, pd4, "ulysses", True, step=2)
ops = runs.calls_by_group(one, "step 2")
rows = [[group, ", ".join(f"{n} {op}" for op, n in ops.get(group, {}).items()), measured[group], formula.get(group, "-")]
        for group in runs.GROUPS if group in formula or measured[group]]
print("4 ranks (cfgp 2, cp 2, Ulysses, reshard_after_forward=True), step 2, rank 0:")
print(text_table(["group", "calls", "bytes sent", "formula"], rows, align_right=(2, 3)))
print(f"all-gathers / cfgp swap = {measured['dp_shard all-gather'] / measured['cfgp swap']:.6g}, "
      f"all-gathers / cp attention = {measured['dp_shard all-gather'] / measured['cp attention']:.6g}")

# %% [markdown]
# The same check for every step of every run on every rank, and the lb
# exchange of the 8-rank lb layout against lab 04's formula per rank (ranks 0
# and 4 send a video out and get its latent back; ranks 1 and 5 the mirror).

# %%
ledger_verdicts = []
for (layout, variant), results in RUNS.items():
    pd = ParallelDims(len(results), enable_inference_mode=True,
                      **{"w4": dict(cfgp=2, cp=2), "w8 lb2": dict(cfgp=2, cp=2, lb=2), "w8 cp4": dict(cfgp=2, cp=4)}[layout])
    kw = VARIANTS_4[variant]
    mismatches = 0
    for r in results:
        for step in range(1, STEPS + 1):
            expected = costs.step_bytes(model, pd, kw["attention"], kw.get("reshard_after_forward", True), step)
            got = runs.sent_by_group(r, f"step {step}")
            mismatches += sum(got[g] != b for g, b in expected.items())
            mismatches += sum(1 for g, b in got.items() if g not in expected and b)  # nothing else in a step
    ledger_verdicts.append(claim(f"{LABELS[layout]} {variant}: every step = formula", mismatches == 0,
                                 f"{len(results)} ranks x {STEPS} steps x 3 groups, {mismatches} differ"))
lb_run = RUNS[("w8 lb2", "ulysses, reshard")]
lb_measured = {rank: runs.sent_by_group(r, "encode")["lb exchange"] for rank, r in enumerate(lb_run)}
lb_formula = costs.lb_bytes(ParallelDims(8, cfgp=2, cp=2, lb=2, enable_inference_mode=True))
print("lb exchange, bytes sent per rank:", lb_measured, "\nformula:                           ", lb_formula)
ledger_verdicts.append(claim("lb exchange once, before step 1 = lab 04 formula", lb_measured == lb_formula,
                             f"8 ranks, {sum(lb_measured.values())} B in all"))
reduce_scatters = sum(calls(r["records"], op=op) for results in RUNS.values() for r in results
                      for op in ("reduce_scatter_tensor", "reduce_scatter", "all_reduce"))
ledger_verdicts.append(claim("no reduce-scatter, no all-reduce (no backward)", reduce_scatters == 0,
                             f"{reduce_scatters} calls"))
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
        p: runs.sent_by_group(r, p) for p in phases}
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
# `True`: nothing gathered between steps; the peak is the root (its forward
# wraps the blocks) plus one block, gathered. `False`: after the first
# forward every unit stays gathered: `n·Σ_units shard` (padding included).

# %%
memory_verdicts, measured_mem, formula_mem = [], {}, {}
for layout, n in (("w4", 4), ("w8 lb2", 8)):
    for variant in ("ulysses, reshard", "ulysses, keep"):
        keep = VARIANTS_4[variant]["reshard_after_forward"]
        expected = costs.memory(model, n, keep)
        per_rank = [{"shards": r["memory"].shards, "gathered between steps": max(r["memory"].between[1:]),
                     "gathered peak": r["memory"].peak} for r in RUNS[(layout, variant)]]
        label = f"{n} ranks, reshard={keep}"
        measured_mem[label], formula_mem[label] = per_rank[0], expected
        memory_verdicts.append(claim(f"{label}: shards, between, peak = formula", all(m == expected for m in per_rank),
                                     f"rank 0: {per_rank[0]['shards']} / {per_rank[0]['gathered between steps']} / "
                                     f"{per_rank[0]['gathered peak']} B"))
print(text_table(["setting", *next(iter(measured_mem.values()))],
                 [[s, *(f"{m[k]} (formula {formula_mem[s][k]})" for k in m)] for s, m in measured_mem.items()]))
print(verdict_table(memory_verdicts, "Parameter bytes per rank, measured on the storages vs formula"))
show(plot_pipeline_memory({k: v for k, v in measured_mem.items() if k.startswith("4")},
                          {k: v for k, v in formula_mem.items() if k.startswith("4")}))

# %% [markdown]
# The trade-off, in numbers (4 ranks, per rank):

# %%
held_true = measured_mem["4 ranks, reshard=True"]
held_false = measured_mem["4 ranks, reshard=False"]
gather_true = runs.sent_by_group(RUNS[("w4", "ulysses, reshard")][0], "step 2")["dp_shard all-gather"]
gather_false = runs.sent_by_group(RUNS[("w4", "ulysses, keep")][0], "step 2")["dp_shard all-gather"]
print(f"reshard_after_forward=True holds {held_true['shards'] + held_true['gathered between steps']} B of parameters "
      f"between steps instead of {held_false['shards'] + held_false['gathered between steps']} B, "
      f"and pays {gather_true} B of all-gathers per step and rank instead of {gather_false} B after the first step.")

# %% [markdown]
# In inference nothing else competes for the memory that `False` keeps (no
# gradients, no optimizer state, no activations saved for a backward): if
# the gathered model fits next to the activations, keeping it removes the
# dominant traffic of every step after the first. `True` is for models that
# do not fit gathered.
#
# ## 6. Bug clinic: "skip the uncond branch when guidance is 1"
#
# At `w = 1` guidance returns the cond prediction, so the uncond forward is
# wasted work. A tempting patch answers `should_skip_uncond` from the
# guidance scale alone. Only the uncond branch acts on the answer (the cond
# branch has nothing to skip). The patch below is that one decision, planted
# into the real loop on every rank (`paralab.exercises.planted`); the
# launcher stops the ranks after a short timeout.
#
# **Predict:** at 4 ranks (cfgp 2, cp 2, dp_shard 4), which ranks finish?

# %%
# show: paralab.exercises.lab06.skip_uncond_whenever_guidance_is_one

# %%
from paralab.exercises.lab06 import skip_uncond_whenever_guidance_is_one

try:
    run(runs.pipeline_job, 4, {"w4": dict(cfgp=2, cp=2)}, {"w=1": VARIANTS_4["ulysses, w=1"]},
        planted_bugs={"should_skip_uncond": skip_uncond_whenever_guidance_is_one}, timeout=10)
    clinic_error = None
except LaunchError as err:
    clinic_error = err
print(f"{type(clinic_error).__name__}: {clinic_error}")

# %% [markdown]
# <details><summary>Answer: what is wrong, and the fix</summary>
#
# No rank finishes. Ranks 2 and 3 (the uncond branch) skip their forward and
# go straight to the cfgp swap, where they wait for the cond predictions.
# Ranks 0 and 1 (cond) enter their forward, whose first FSDP2 unit
# all-gathers its parameters **over dp_shard = {0, 1, 2, 3}**: they wait for
# ranks 2 and 3, which wait for them. Every rank is stuck in a different
# call; nothing fails, nothing returns. On one GPU the shortcut is right;
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

# %%
reference_w1 = generate(None, steps=STEPS, guidance_scale=1.0, seed=SEED)
fixed = torch.stack([r["output"] for r in RUNS[("w4", "ulysses, w=1")]])
clinic_verdicts = [
    claim("the one-branch skip is stopped, not hung (LaunchTimeout)", type(clinic_error).__name__ == "LaunchTimeout",
          type(clinic_error).__name__),
    claim("the timeout names the stuck ranks", clinic_error is not None and clinic_error.hung_ranks == [0, 1, 2, 3],
          f"hung ranks {getattr(clinic_error, 'hung_ranks', None)}"),
]
clinic_verdicts += compare(fixed, reference_w1.expand_as(fixed), name="fixed code at w=1, 4 ranks vs reference (bitwise)")
print(verdict_table(clinic_verdicts, "Bug clinic: the one-branch skip, and the fix"))

# %% [markdown]
# ## 7. dp_replicate > 1 in inference
#
# Lab 00's workload table says VFM inference forces `dp_replicate = 1`. What
# would a replica axis do? The experiment (same 4-rank launch as section 3)
# shards the denoiser on a 1-D mesh (FSDP, 4 shards) and on a 2-D mesh
# (HSDP: 2 replicas × 2 shards; FSDP2 picks HSDP from the mesh's dimension),
# runs 4 forwards on fixed inputs and compares with the unsharded model.

# %%
unsharded = runs.repeated_forwards(inference.make_denoiser())
replica_verdicts, rows = [], []
for name in MESHES:
    per_rank = [r["replicated"][name] for r in out4]
    replica_verdicts += compare(torch.stack([r["output"] for r in per_rank]), unsharded.expand(4, *unsharded.shape),
                                name=f"{name}: 4 forwards vs unsharded model (bitwise)")
    rows.append([f"{name}, reshard=True", per_rank[0]["shards"],
                 sent(per_rank[0]["records"], op="all_gather_single") // 4,
                 calls(per_rank[0]["records"], op="all_reduce")])
keep_run = RUNS[("w4", "ulysses, keep")][0]
rows.append(["FSDP (4,), reshard=False (section 5)", held_false["shards"] + held_false["gathered between steps"], 0,
             calls(keep_run["records"], op="all_reduce")])
print(text_table(["mesh", "parameter bytes held between forwards", "all-gather bytes per forward (steady)",
                  "all-reduces"], rows, align_right=(1, 2, 3)))
shard_ratio = rows[1][1] / rows[0][1]
replica_verdicts.append(claim("HSDP holds each parameter twice: shard bytes per rank x2", shard_ratio == 2,
                              f"ratio {shard_ratio:.6g}"))
replica_verdicts.append(claim("no all-reduce: the replica axis carries nothing in inference",
                              rows[1][3] == 0, f"{rows[1][3]} all-reduces"))

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
pd_replicas = ParallelDims(4, dp_shard=2, cfgp=2, cp=2, enable_inference_mode=True)
try:
    generate(pd_replicas)
    rejected = None
except ValueError as err:
    rejected = str(err)
print(f"{pd_replicas}\n  accepted by ParallelDims; generate -> ValueError: {rejected}")
replica_verdicts.append(claim("generate rejects dp_replicate=2, naming it",
                              rejected is not None and "dp_replicate=2" in rejected, "ValueError"))
print(verdict_table(replica_verdicts, "dp_replicate > 1 in inference: same bits, twice the shards, no replica traffic"))

# %% [markdown]
# ## 8. Summary

# %%
checks = {
    "3 three layouts vs one process": output_verdicts,
    "4 ledger by group vs formulas": ledger_verdicts,
    "5 memory per rank vs formulas": memory_verdicts,
    "6 bug clinic": clinic_verdicts,
    "7 dp_replicate > 1": replica_verdicts,
}
print(closing_table(checks))

# %% [markdown]
# ## What to try
#
# 1. Run `generate` with `guidance_scale=1.0` and `reshard_after_forward=False`
#    under the planted bug: does it still hang? Why does keeping the
#    parameters gathered not save the uncond ranks?
# 2. Swap the loop in `denoise` (samples outside, steps inside). Do the
#    outputs change? Does the ledger per step? (Count the all-gathers with
#    `reshard_after_forward=False`.)
# 3. Add a third block to `make_denoiser`: predict the new all-gather bytes
#    per step and the new peak with `reshard_after_forward=True`, then check.
# 4. At 8 ranks, cfgp 2, cp 2, run the ring instead of Ulysses: which ledger
#    group grows and by how much (`costs.step_bytes`)?
# 5. Put the raw videos on every rank of a sample group instead of its
#    loader: what does lb do then, and what is wasted?
# 6. Make `should_skip_uncond` return True on a replicated denoiser (call
#    `inference.denoise` on an unsharded model with cfgp 2): is the output
#    still the reference's? Which collective did the uncond ranks still enter?

# %% [markdown]
# **Closing note.** How long the whole lab took when this notebook last ran
# (launches included; CI does not compare this line).

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time {time.perf_counter() - LAB_START:.1f} s")
