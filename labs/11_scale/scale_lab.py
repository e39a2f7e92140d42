# %% [markdown]
# # Lab 11 — From exact bytes to seconds at real scale
#
# **You will learn** how the byte formulas every earlier lab proves exactly, at toy sizes on
# CPU ranks, become seconds at the sizes people run: the α-β model of a collective (a
# latency per step plus bytes over a bus bandwidth), the roofline of a kernel (FLOPs over
# peak, or bytes over memory bandwidth, whichever is slower), which traffic hides behind
# compute and which is exposed, why a parallel run can be slower than one GPU, how far such
# a model lands from twelve published GPU measurements it is fitted on and 86 it is not, and how
# it ranks the layouts of a model on a cluster. **Prerequisites:** [the collectives
# primer](../00_collectives_primer/collectives_primer_lab.ipynb) (the ring's bytes), labs
# [01](../01_fsdp_hsdp/fsdp_hsdp_lab.ipynb), [02](../02_cp_ring_vs_ulysses/cp_ring_vs_ulysses_lab.ipynb),
# [03](../03_cfgp/cfgp_lab.ipynb), [06](../06_inference_pipeline/inference_pipeline_lab.ipynb),
# [07](../07_tensor_parallel/tensor_parallel_lab.ipynb) and
# [08](../08_pipeline_parallel/pipeline_parallel_lab.ipynb) for the formulas this lab evaluates.
# **Time:** about 30 minutes to read; nothing here launches ranks; the last cell prints this
# notebook's run time.
#
# **What is new.** Every lab so far checks *bytes* against a closed form, exactly. Bytes
# only become knowledge once they are turned into *seconds*, at real sizes and on real
# links. `paralab.scale` does that with the labs' own `costs.py` functions, not copies:
#
# | quantity | model | constants |
# |---|---|---|
# | one collective | `α_base + steps·α_step + bytes_sent / busbw` | NCCL's latency table; busbw per link class, each from a cited figure (`paralab.scale.hardware.SOURCES`: NVLink the datasheet × NCCL's NVLink efficiency, PCIe a measured share, the network what NCCL's maintainers expect of a NIC) |
# | one kernel | `FLOPs / (peak × efficiency)` | datasheet peak; one fitted efficiency per (hardware, GEMM, attention or a video VAE's convolutions) |
# | overlap | FSDP prefetch, ring hops and async TP's fused matmuls run beside compute (exposed only for what outlasts it; Megatron's TP overlap hides all of TP's); Ulysses, TP without overlap, ep, cfgp wait for their collectives; PP idles for `paralab.pp.simulate`'s bubble and its sends per schedule | none |
#
# Every picture below is drawn by `paralab.viz.scale` from those functions; no number is
# typed in.

# %%
from time import monotonic

from paralab.check import claim, closing_table, verdict_table
from paralab.collectives.costs import all_gather_bytes
from paralab.exercises import EXERCISES
from paralab.exercises.lab11 import (
    base_row_all_denoiser,
    edge_table_clinic,
    everything_over_tp,
    forwards_as_steps,
    sp_ignored,
)
from paralab.grade import grade, report
from paralab.patches import patched
from paralab.pp import bubble_formula, simulate
from paralab.scale import FITTED, Layout, Workload, fit, hardware, load_cases, model, predict
from paralab.scale import cases as case_files
from paralab.scale import plan as planner
from paralab.scale.__main__ import check_rows, error_table
from paralab.scale.axes import (
    cp_gather_seconds,
    fsdp_block_seconds,
    inference_step_bytes,
    ring_collective_seconds,
)
from paralab.scale.cases import SHIPPED
from paralab.scale.fit import GRID, predict_case, relative_error
from paralab.scale.hardware import BASE_LATENCY, LL_BASE_LATENCY, LL_STEP_LATENCY, STEP_LATENCY
from paralab.scale.heldout import GENERALIZATION, MISSES, fixed_seconds
from paralab.scale.memory import published_memory
from paralab.scale.models import COSMOS_LIKE_14B, LAB06_TOY
from paralab.scale.plan import LB_EXCHANGE, LB_LOAD, plan_inference, plan_train, table, why
from paralab.scale.predict import fsdp_unit_bytes, link_for, ring_critical_blocks, train_links
from paralab.tables import text_table
from paralab.tp.costs import block_bytes
from paralab.viz import (
    plot_alpha_beta,
    plot_axis_seconds,
    plot_cosmos_step_bytes,
    plot_plan,
    plot_prediction_scatter,
    plot_ring_efficiency,
    plot_roofline,
    show,
)

# %%
LAB_START = monotonic()
H100, NVL = hardware("h100-sxm"), hardware("h100-nvl")
print(
    f"h100-sxm: {H100.peak_bf16 / 1e12:.0f} TFLOP/s bf16, {H100.hbm_bandwidth / 1e12:.2f} TB/s "
    f"HBM, NVLink busbw {H100.intra_busbw / 1e9:.0f} GB/s, network {H100.inter_busbw / 1e9:.0f} GB/s"
)
print(f"fitted efficiencies: {FITTED}")

# %% [markdown]
# ## 1. α-β and the roofline, on the primer's ring formulas
#
# The primer proved that a ring all-gather of a tensor of `S` bytes over `n` ranks makes
# `n − 1` steps and sends `(n−1)/n · S` bytes from every rank. A real link adds a cost per
# step that does not depend on the size (α: launch, synchronization, the first byte's
# trip) to the cost per byte (β = 1/busbw). NCCL's own tuning model, for one algorithm and
# protocol, has this shape:
#
# ```
# time = baseLat + steps · hwLat(link) + bytes_sent / busbw
# ```
#
# with, for the ring and the Simple protocol, `baseLat` = 8.4 µs and `hwLat` = 3.4 µs over
# NVLink, 5.7 µs over PCIe, 14 µs over the network. Of a group that spans nodes, only the
# steps that cross a node boundary pay the network's `hwLat` (NCCL's `nInterSteps`: nodes − 1
# of an all-gather's n − 1 steps); the rest pay the intra-node one. This model is Ring/Simple
# only: NCCL also models the LL and LL128 protocols and runs each call on the fastest, so
# messages of a few KB run LL, cheaper than the α here (a claim below sets them side by
# side). nccl-tests' *bus bandwidth* is defined
# so that `bytes_sent / busbw` is the time for every collective; an all-gather,
# reduce-scatter or all-to-all sends `(n−1)/n·S`.
#
# **Predict before you run.** On 8 H100s (NVLink busbw 370 GB/s), below which size is an
# all-gather's time mostly α? Is all-reducing 1 GiB about twice as slow as all-gathering it?

# %%
# show: paralab.scale.predict.Link.time paralab.scale.predict.link_for

# %%
link = link_for(H100, 1, 8)
alpha = BASE_LATENCY + 7 * STEP_LATENCY["nvlink"]
ll_alpha = LL_BASE_LATENCY + 7 * LL_STEP_LATENCY["nvlink"]
knee = alpha * link.busbw * 8 / 7  # where alpha equals the bandwidth term
small, big = ring_collective_seconds(H100, 1024, 8), ring_collective_seconds(H100, 2**30, 8)
hand = 8.4e-6 + 7 * 3.4e-6 + all_gather_bytes(2**30, 8) / (450e9 * 370 / 450)
alpha_claims = [
    claim(
        "all-gather of 1 GiB = 8.4 µs + 7 × 3.4 µs + (7/8 GiB) / 370 GB/s",
        abs(big["all_gather"] - hand) < 1e-12,
        f"{big['all_gather'] * 1e3:.4f} ms",
    ),
    claim(
        "1 KiB, Ring/Simple: the α part is more than 99 % of the time",
        alpha / small["all_gather"] > 0.99,
        f"{alpha / small['all_gather']:.4f}",
    ),
    claim(
        "1 KiB: NCCL's Ring/LL latency (6.6 µs + 7 × 0.6 µs) is a third of Simple's: NCCL runs LL",
        ll_alpha < alpha / 2,
        f"{ll_alpha * 1e6:.1f} µs vs {alpha * 1e6:.1f} µs",
    ),
    claim(
        "1 GiB: the bandwidth part is more than 98 % of the time",
        1 - alpha / big["all_gather"] > 0.98,
        f"{1 - alpha / big['all_gather']:.4f}",
    ),
    claim(
        "ring all-reduce (NCCL_ALGO=RING) of 1 GiB takes 2x the all-gather (within 1 %)",
        abs(big["all_reduce"] / big["all_gather"] - 2) < 0.02,
        f"ratio {big['all_reduce'] / big['all_gather']:.4f}",
    ),
]
print(f"knee: alpha x busbw = {knee / 1e6:.1f} MB gathered")
print(verdict_table(alpha_claims, "α-β on the primer's ring"))
show(plot_alpha_beta())

# %% [markdown]
# A ring all-reduce is a reduce-scatter followed by an all-gather: it sends `2(n−1)/n·S`,
# twice the all-gather's bytes, which is the ratio the last claim checks. That is the ring
# algorithm, what NCCL runs with `NCCL_ALGO=RING`; on 8 H100s NCCL's default all-reduce is
# NVLink SHARP, faster: "allreduce uses NVLink SHARP by default … On 8 GPUs, you should reach a
# peak busBw of ~480GB/s" (NVIDIA/nccl-tests#212), which this model does not price.
#
# The knee sits at about 14 MB gathered on NVLink (α × busbw ≈ 12 MB sent): a collective of
# a few MB is latency, not bandwidth, which is why FSDP groups parameters into units and why
# the small all-reduces of a vocabulary-parallel loss
# ([lab 07](../07_tensor_parallel/tensor_parallel_lab.ipynb)) cost steps, not bytes. The
# knee is Ring/Simple's. Across nodes (dashed: one GPU a node, so every step crosses) the
# bandwidth is 8× lower (NDR's 46 GB/s a NIC against NVLink's 370) and every step 4× slower.
#
# **The roofline** is the same idea for a kernel: it takes `max(FLOPs / peak, bytes / HBM
# bandwidth)`. A kernel whose FLOPs per byte exceed the *ridge* (peak / bandwidth, about 295
# on an H100) is compute-bound. A transformer's matmuls at training sizes are far above the
# ridge, its norms and elementwise ops far below, which is why this model times GEMMs and
# attention by FLOPs, and the optimizer step (28 bytes of HBM traffic per parameter, no
# reuse) by bytes.

# %%
gemm_intensity = 2 * 4096 * 4096 * 16384 / (2 * (4096 * 4096 + 2 * 4096 * 16384))
ridge = H100.peak_bf16 / H100.hbm_bandwidth
roofline_claims = [
    claim(
        "a 4096 x 4096 GEMM on 16,384 tokens is compute-bound (intensity > ridge)",
        gemm_intensity > ridge,
        f"{gemm_intensity:.0f} FLOPs/B vs ridge {ridge:.0f}",
    ),
    claim("a LayerNorm (about 1 FLOP a byte) is memory-bound", 1 < ridge, f"ridge {ridge:.0f}"),
]
print(verdict_table(roofline_claims, "the roofline"))
show(plot_roofline())

# %% [markdown]
# ## 2. Every lab's formula at a real size
#
# Each lab's `costs.py` counts float64 bytes of a toy model. Here the same functions run on
# real shapes, scaled to the dtypes engines move (bf16 parameters and activations, fp32
# gradient reductions): the *modelled bytes at the API*, what each collective call is handed,
# not what the wire carries (no NVLS, no LL/LL128 protocol expansion). Then each traffic is
# set against the compute it competes with.
#
# **Predict before you run.** [Lab 06](../06_inference_pipeline/inference_pipeline_lab.ipynb#at-a-cosmos-like-size-the-balance-turns) found the dp_shard all-gathers dominating the
# per-step traffic at its toy size, and the sequence's Ulysses traffic at a Cosmos-like size
# (14B parameters, 36 blocks of 5120 with 40 heads as in Cosmos-Transfer2.5's 14B net,
# TRANSFER2_CONTROL2WORLD_NET_14B of
# nvidia-cosmos/cosmos-transfer2.5@ecbc860:cosmos_transfer2/_src/interactive/configs/registry_defaults/net_transfer.py;
# 75,600 tokens, cp 2).
# Check it with a ring at cp 8 (8 ranks of dp_shard and of cp): which is larger, the
# all-gathers or the ring's K/V hops? And does FSDP's per-block all-gather still hide behind a block's forward when the
# shard group grows from 8 GPUs (one node) to 128 (16 nodes)?

# %%
# show: paralab.scale.predict.fsdp_unit_bytes paralab.scale.predict.prefetched

# %%
eight_b, seventy_b = model("llama3.1-8b"), model("llama3.1-70b")
two_8k = Workload("train", seq=8192, micro_batch=2, ac="selective")  # 16,384 tokens a GPU
fsdp8 = fsdp_block_seconds(eight_b, H100, 8, two_8k, FITTED["h100-sxm"])
fsdp128 = fsdp_block_seconds(eight_b, H100, 128, two_8k, FITTED["h100-sxm"])
gather_256k = cp_gather_seconds(eight_b, H100, 262144, 8, FITTED["h100-sxm"]["attention"])
cosmos14, toy = model(COSMOS_LIKE_14B), model(LAB06_TOY)  # 14B: 36 blocks of 5120, 40 heads
real_step, toy_step = (
    inference_step_bytes(cosmos14, 8, 8, 75_600),
    inference_step_bytes(toy, 4, 2, 64),
)

ring_256k = predict(
    eight_b,
    H100,
    Layout(cp=8, cp_kind="zigzag"),
    Workload("train", seq=262144, dtype="fp8", ac="full"),
    FITTED["h100-sxm"],
)

# %%
from paralab.scale.predict import ring_merge_time

q_256k = 262144 // 8 * eight_b.attention_width  # one rank's elements of q
merges_256k = eight_b.layers * (  # 7 merges a pass: forward twice (full AC), backward once
    2 * ring_merge_time(q_256k, 7, H100, "forward") + ring_merge_time(q_256k, 7, H100, "backward")
)
hunyuan = predict(
    model("hunyuanvideo"),
    H100,
    Layout(cp=8, cp_kind="ulysses"),
    Workload("diffusion", seq=119056, steps=50),
    FITTED["h100-sxm"],
)
consisid = predict(
    model("consisid"),
    H100,
    Layout(cfgp=2),
    Workload("diffusion", seq=17776, steps=50),
    FITTED["h100-sxm"],
)
tp8 = train_links(H100, Layout(tp=8))["tp"]
act = 1 * 8192 * seventy_b.hidden * 2
tp_block = block_bytes(act, 8, sequence_parallel=False)
tp_seconds = sum(tp8.time(n, 14, c) for c, n in tp_block.values())
tp_compute = (
    2 * seventy_b.matmul_per_layer * 8192 * 3 / 8 / (H100.peak_bf16 * FITTED["h100-sxm"]["gemm"])
)
bubble = simulate("1f1b", 8, 32).bubble_fraction

# %% jupyter={"source_hidden": true}
rows = [
    (
        "01 FSDP, 8B block, dp_shard 8",
        f"{fsdp_unit_bytes(eight_b.block_params(), Layout(dp_shard=8))['all_gather'] / 1e6:.0f} MB",
        f"{fsdp8['all-gather'] * 1e3:.2f} ms ({fsdp8['link']})",
        f"block fwd {fsdp8['block forward'] * 1e3:.1f} ms",
        "hidden",
    ),
    (
        "01 FSDP, 8B block, dp_shard 128",
        f"{fsdp_unit_bytes(eight_b.block_params(), Layout(dp_shard=128))['all_gather'] / 1e6:.0f} MB",
        f"{fsdp128['all-gather'] * 1e3:.2f} ms ({fsdp128['link']})",
        f"block fwd {fsdp128['block forward'] * 1e3:.1f} ms",
        "hidden, about half",
    ),
    (
        "02 ring, 8B at 256K tokens, cp 8",
        "7 x 128 MiB, one all-gather",
        f"{gather_256k['K/V all-gather'] * 1e3:.2f} ms a layer",
        f"first block {gather_256k['first block'] * 1e3:.1f} ms",
        "hidden",
    ),
    (
        "02 Ulysses, HunyuanVideo, cp 8",
        "4 all-to-alls a layer",
        f"{hunyuan.breakdown['exposed: cp']:.1f} s",
        f"compute {hunyuan.breakdown['compute: attention'] + hunyuan.breakdown['compute: GEMM']:.0f} s",
        "exposed",
    ),
    (
        "03 cfgp swap, ConsisID",
        "2.2 MB a step",
        f"{consisid.breakdown['exposed: cfgp swap'] * 1e3:.1f} ms",
        f"compute {consisid.breakdown['compute: GEMM'] + consisid.breakdown['compute: attention']:.0f} s",
        "exposed",
    ),
    (
        "07 TP, 70B block, tp 8, 8K tokens",
        f"{sum(n for _, n in tp_block.values()) / 1e9:.2f} GB",
        f"{tp_seconds * 1e3:.1f} ms",
        f"block GEMMs {tp_compute * 1e3:.1f} ms",
        "exposed",
    ),
    ("08 PP, 1F1B, pp 8, m 32", "b·s·h a boundary", f"bubble {bubble:.1%}", "of the step", "idle"),
]
print(
    text_table(
        ("lab · axis · size", "modelled bytes at the API", "seconds", "competes with", "overlap"),
        rows,
    )
)

# %%
axis_claims = [
    claim(
        "lab 06 at toy size: the all-gathers exceed the cp ring's bytes",
        toy_step["dp_shard all-gather"] > toy_step["cp ring"],
        f"{toy_step['dp_shard all-gather']:,.0f} B vs {toy_step['cp ring']:,.0f} B",
    ),
    claim(
        "lab 06 at 14B, 75,600 tokens: the cp ring's bytes exceed the all-gathers",
        real_step["cp ring"] > real_step["dp_shard all-gather"],
        f"{real_step['cp ring'] / 1e9:.1f} GB vs {real_step['dp_shard all-gather'] / 1e9:.1f} GB a step",
    ),
    claim(
        "FSDP at 8 GPUs: a block's all-gather hides behind a block's forward",
        fsdp8["all-gather"] < fsdp8["block forward"],
        f"{fsdp8['all-gather'] * 1e3:.2f} < {fsdp8['block forward'] * 1e3:.1f} ms",
    ),
    claim(
        "FSDP at 128 GPUs: about the same bytes cross the network, over 9x slower",
        fsdp128["all-gather"] > 9 * fsdp8["all-gather"] and fsdp128["link"] == "network",
        f"{fsdp128['all-gather'] / fsdp8['all-gather']:.1f}x",
    ),
    claim(
        "FSDP at 128 GPUs: the all-gather takes about half of the block forward it hides behind",
        0.4 < fsdp128["all-gather"] / fsdp128["block forward"] < 0.6,
        f"{fsdp128['all-gather'] / fsdp128['block forward']:.0%}",
    ),
    claim(
        "torchtitan's K/V all-gather at 256K tokens hides behind the first block: "
        "only the merges of partial outputs show",
        ring_256k.breakdown["exposed: cp"] == merges_256k
        and gather_256k["K/V all-gather"] < gather_256k["first block"],
        f"{ring_256k.breakdown['exposed: cp']:.3g} s, all merges",
    ),
    claim(
        "PP bubble from the schedule simulator = (p-1)/(m+p-1) for 1F1B",
        abs(bubble - bubble_formula("1f1b", 8, 32)) < 1e-12,
        f"{bubble:.6f}",
    ),
]
print(verdict_table(axis_claims, "every lab's formula at a real size"))

# %% jupyter={"source_hidden": true}
show(plot_cosmos_step_bytes())
show(
    plot_axis_seconds(
        {
            "FSDP 8 vs 128 GPUs": {
                "AG @8": fsdp8["all-gather"],
                "AG @128": fsdp128["all-gather"],
                "block fwd": fsdp8["block forward"],
            },
            "cp K/V all-gather, 8B at 256K, cp 8": gather_256k,
            "Ulysses, HunyuanVideo": {
                "all-to-alls": hunyuan.breakdown["exposed: cp"],
                "attention": hunyuan.breakdown["compute: attention"],
            },
            "cfgp, ConsisID": {
                "swaps": consisid.breakdown["exposed: cfgp swap"],
                "compute": consisid.breakdown["compute: attention"],
            },
            "TP 8, 70B block": {"all-reduces": tp_seconds, "GEMMs": tp_compute},
        }
    )
)

# %% [markdown]
# At the toy size of lab 06 the weights are everything and the activations nothing, so the
# all-gathers dominate. At 75,600 tokens the ring's K/V hops carry more bytes than the
# weights, but they ride behind attention that grows with the square of the tokens. FSDP's
# bytes per rank hardly change from 8 to 128 GPUs (7/8 against 127/128 of a block); the link
# does: at 16,384 tokens a GPU the all-gather goes from 5 % of the block forward it hides
# behind (its GEMMs and attention, the compute `predict_train` hides it behind) to about half
# of it, and the backward adds the fp32 reduce-scatter's twice-as-many bytes: fewer tokens per
# GPU and it shows. torchtitan's CP does not pass K/V a hop at a time: its default rotate
# method all-gathers every shard once, behind the first (diagonal) block alone, which at 256K
# tokens still hides it many times over. TP's all-reduces
# cost about a quarter of a 70B block's GEMM time at 8 GPUs on NVLink, all of it exposed (no async
# TP, which fuses only all-gathers and reduce-scatters, the SP form); `Layout(tp=16)` would put them on the network, which is why TP stays inside a node.

# %% [markdown]
# ## 3. Why is my parallel run slower than one GPU?
#
# Asked again and again of ring attention (zhuzilin/ring-flash-attention#49,
# zhuzilin/ring-flash-attention#8). **Normalize the work first.** The benchmark's
# "flash_attn" line runs 8 GPUs on 8K tokens each, independently; the ring runs 8 GPUs on
# *one* 64K sequence, 8× the attention FLOPs (64² against 8 × 8²). Its efficiency is the
# ring's throughput over the single GPU's, divided by 8. Then the model can answer the real
# question.
#
# Two more costs a ring pays, both counted. **Causal imbalance:** with contiguous shards, rank
# r needs the K/V of ranks 0..r only, so the last rank computes a full block on every step while
# rank 0 idles; the ranks move in lockstep, so the plain ring takes 0.5 + (cp − 1) blocks
# where the work spread evenly is cp / 2: at 8 GPUs 7.5 against 4, an efficiency of at most
# 8/15. Zigzag (chunks i and 2cp − 1 − i on rank i) and stripe (every cp-th token) give every
# rank half a block a step. **Merges:** each hop's partial output is folded into the running
# one in fp32 (`_update_out_and_lse`), HBM traffic between the attention kernels.
#
# **Predict before you run.** On 8 H100 NVL (PCIe between pairs), is a ring over 2,048 tokens
# in all faster than one GPU doing the same 2,048 tokens?

# %%
# show: paralab.scale.predict.ring_exposed paralab.scale.predict.ring_critical_blocks

# %%
shape = model("llama3-8b-attention")
ring_nvl = predict(
    shape, NVL, Layout(cp=8, cp_kind="zigzag"), Workload("attention", seq=256), FITTED["h100-nvl"]
)
one_nvl = predict(shape, NVL, Layout(cp=1), Workload("attention", seq=8 * 256), FITTED["h100-nvl"])
h800, plain = (
    predict(
        shape,
        hardware("h800"),
        Layout(cp=8, cp_kind=kind),
        Workload("attention", seq=8192),
        FITTED["h100-sxm"],
    )
    for kind in ("zigzag", "ring")
)
slow_claims = [
    claim(
        "8 H800, 8K tokens a GPU: the zigzag ring's hops hide; merges cost a few % "
        "(the README measures 90.2 %)",
        h800.breakdown["exposed: cp"] == 0 and 0.95 < h800.efficiency < 0.99,
        f"predicted {h800.efficiency:.3f}",
    ),
    claim(
        "the plain ring's last rank works every step: 7.5 blocks for 4, 8/15 (README: 53.9 %)",
        ring_critical_blocks("ring", 8) == 7.5 and 0.5 < plain.efficiency < 8 / 15,
        f"predicted {plain.efficiency:.3f}",
    ),
    claim(
        "8 H100 NVL, 2,048 tokens in all: the ring is slower than one GPU",
        ring_nvl.seconds > one_nvl.seconds,
        f"{ring_nvl.seconds * 1e3:.3f} ms vs {one_nvl.seconds * 1e3:.3f} ms",
    ),
]
print(verdict_table(slow_claims, "slower than one GPU?"))
show(plot_ring_efficiency())

# %% [markdown]
# The ring is slower than one GPU only where a hop's transfer is longer than the block of
# attention it hides behind, or where the merges and the latency per hop outweigh the work a
# GPU saves: short sequences per GPU, slow links. 256 tokens a GPU over PCIe is that regime.

# %% [markdown]
# ## 4. Predicted against measured
#
# `python -m paralab.scale check` runs the model on every row of `CASES.toml` (shipped in the
# package, `src/paralab/scale/CASES.toml`): twelve published measurements, each with the table
# it is copied from. The only fitted numbers are four efficiencies, as shares of peak: GEMM,
# attention and a video VAE's convolutions for the h100-sxm group (the convolutions first, on
# the two rows that time the Wan2.1 VAE alone, at 81 frames: an assumed count, as their source
# says only "5s 720p"), attention alone for h100-nvl (its Cosmos rows
# are mostly attention, so it takes h100-sxm's GEMM and VAE efficiencies), each chosen on the
# grid to make the largest |log error| the smallest; the next cell refits them from the file
# and checks they are the ones the predictor uses.
#
# **Predict before you run.** Which rows should a model without kernel-size effects, a
# pipeline's other fixed costs, or launch overheads miss the most?

# %%
# NBVAL_IGNORE_OUTPUT
check = check_rows(str(SHIPPED))
refit = fit(load_cases())
print(error_table(check))

# %%
case_claims = [
    claim(
        f"{r['name']}: |error| <= 25 %",
        abs(r["relative_error"]) <= 0.25,
        f"{r['relative_error']:+.0%}",
    )
    for r in check
]
case_claims.append(
    claim("the stored efficiencies are the fit of the shipped cases", refit == FITTED, str(refit))
)
print(verdict_table(case_claims, "python -m paralab.scale check"))

# %% [markdown]
# **Held out.** A model fitted on the shipped rows proves little until it meets rows it was not
# fitted on. `GENERALIZATION.toml` (next to `CASES.toml`) holds every one the case vocabulary
# can express, of five of the six sources (FastVAE's other rows split the VAE over processes
# or time other VAEs) and of four more (torchtitan's async-TP and H200 benchmarks,
# Megatron-LM's weak-scaling table up to 6,144 GPUs, the Megatron-Bridge summary): 86 rows,
# none read by the fit. Its check exits 1, honestly: `paralab.scale.heldout.MISSES`
# names each row that misses and why, and the claims below check that exactly those miss.

# %%
# NBVAL_IGNORE_OUTPUT
held = check_rows(str(GENERALIZATION))
print(error_table(held, "held-out case"))

# %% [markdown]
# **Seconds outside the denoiser.** Cosmos' table times each video twice on the same GPUs:
# with the base model (35 steps of two branches, conditional and unconditional: 70 denoiser
# forwards) and with the distilled one (4 steps of one branch: 4 forwards). If both times are
# the same fixed seconds (whatever runs outside the denoiser) plus their forwards, the two rows
# are two equations in two unknowns, which `fixed_seconds` solves.

# %%
# show: paralab.scale.heldout.fixed_seconds

# %%
by_cases = {c.name: c for c in load_cases(GENERALIZATION)} | {c.name: c for c in load_cases()}
cosmos_one = fixed_seconds(
    by_cases["cosmos-transfer2.5-2b edge 35 steps 1 h100-nvl"],
    by_cases["cosmos-transfer2.5-2b edge distilled 4 steps 1 h100-nvl"],
)
print(f"one H100 NVL: {cosmos_one[0]:.3f} s a forward, {cosmos_one[1]:.2f} s outside the forwards")

# %% [markdown]
# **What the model counts of them.** Part of those seconds is the Wan2.1 VAE: a chunk's two
# encodes (its conditioning frames and the edge map) and its decode, which every rank of the
# video's group runs whole. The model times them from their FLOPs at the share of peak the
# shipped VAE rows give, and adds them to every layout alike.
#
# **Predict before you run.** At 4 steps on 8 H100 NVLs, is the VAE more or less than half of
# a predicted video? And on one GPU?
#
# In the table, *denoiser s* is the rest of each prediction: the 4 forwards' GEMMs and
# attention and, on 4 and 8 GPUs, the Ulysses all-to-alls left exposed (these rows have no
# cfgp or dp_shard, so nothing else); *measured s* is the doc's diffusion time, VAE included.

# %%
# show: paralab.scale.predict.vae_seconds

# %%
from paralab.scale.predict import VAE_ITEM

amdahl = []
for gpus in (1, 4, 8):
    distilled = by_cases[f"cosmos-transfer2.5-2b edge distilled 4 steps {gpus} h100-nvl"]
    video = predict_case(distilled)
    vae = video.breakdown[VAE_ITEM]
    denoiser, share = f"{video.seconds - vae:.3g}", f"{vae / video.seconds:.0%}"
    amdahl.append((gpus, denoiser, f"{vae:.3g}", share, f"{distilled.measured:g}"))
print(
    text_table(
        ["H100 NVLs", "denoiser s", "VAE s", "VAE share", "measured s"],
        amdahl,
        align_right=(0, 1, 2, 3, 4),
    )
)

# %% [markdown]
# **The exercise.** `fixed_seconds` is this lab's graded exercise (`paralab.exercises.lab11`):
# in the student release its body is a stub, with its task above it and a `check(...)` cell
# under it. The grader runs it on the three published pairs (one H100 NVL, one H200 NVL, eight
# B200s) and, hidden, on two pairs drawn from a seed, one of whose distilled rows keeps both
# branches. The cell below prints the task and runs the grader on the two readings that look
# right one row at a time, as they would be handed in: forwards counted in steps (the two
# branches forgotten), and the base row taken as denoiser time only. Both must fail.

# %%
exercise = EXERCISES["fixed_seconds"]
print(f"exercise {exercise.name} ({exercise.points} point): {exercise.prompt}\n")
graded_bugs = {
    bug.__name__: grade(exercise, bug) for bug in (forwards_as_steps, base_row_all_denoiser)
}
for outcome in graded_bugs.values():
    print(report(exercise, outcome))
exercise_claims = [
    claim(
        f"the fixed_seconds grader fails {name}",
        outcome.verdict == "FAIL",
        f"{outcome.points:g}/{exercise.points} points",
    )
    for name, outcome in graded_bugs.items()
]
print(verdict_table(exercise_claims, "the graded exercise"))

# %% jupyter={"source_hidden": true}
missed = {r["name"] for r in held if abs(r["relative_error"]) > 0.25}


def _tally(prefix: str) -> str:
    rows = [r for r in held if r["name"].startswith(prefix)]
    return f"{sum(r['name'] not in missed for r in rows)}/{len(rows)}"


distilled_one = by_cases["cosmos-transfer2.5-2b edge distilled 4 steps 1 h100-nvl"]
cosmos_vae = predict_case(distilled_one).breakdown[VAE_ITEM]
async_405b = [
    c
    for c in by_cases.values()
    if c.layout.async_tp and "405b" in c.name and c.name.startswith("torchtitan")
]

# %%
held_claims = [
    claim("the fit is unchanged by the held-out file", refit == FITTED, "CASES.toml"),
    claim(
        "exactly the rows heldout.MISSES names miss the 25 % band",
        missed == set(MISSES),
        f"{len(held) - len(missed)}/{len(held)} within",
    ),
    claim(
        "torchtitan, 8 to 512 GPUs, compile, Float8, CP, TP, async TP, PP, H200: "
        "one misses, 8B TP 8 with async TP in fp8",
        {n for n in missed if n.startswith("torchtitan")}
        == {"torchtitan 2025-06 llama3.1-8b fsdp8 tp8 async-tp seq8k sac fp8"},
        _tally("torchtitan"),
    ),
    claim(
        "Megatron-LM's GPT table, 48 to 6,144 GPUs: every row within",
        _tally("megatron-lm") == "9/9",
        _tally("megatron-lm"),
    ),
    claim(
        "Megatron-Bridge: its dense rows within, its mixtures of experts miss",
        all(("qwen3" in n or "deepseek" in n) for n in missed if n.startswith("megatron-bridge")),
        _tally("megatron-bridge"),
    ),
    claim(
        "torchtitan's 405B rows, async TP too (Tables 5-6), are within",
        all(c.name not in missed for c in async_405b) and len(async_405b) == 6,
        f"{sum(c.name not in missed for c in async_405b)}/{len(async_405b)}",
    ),
    claim(
        "ring-flash-attention: every ring and zigzag row within, stripe's fwd rows miss",
        all("stripe" in n and n.endswith("fwd") for n in missed if n.startswith("ring")),
        _tally("ring"),
    ),
]

# %%
held_claims += [
    claim(
        "xDiT HunyuanVideo, 1 to 6 GPUs: all but the 960x960 1-GPU run within",
        _tally("xdit hunyuan") == "5/6",
        _tally("xdit hunyuan"),
    ),
    claim(
        "xDiT ConsisID with sequence parallelism: none within",
        _tally("xdit consisid") == "0/10",
        _tally("xdit consisid"),
    ),
    claim(
        "Cosmos base, H100 NVL, H200 NVL, B200: the 1- and 4-GPU H200 NVL and 1-GPU B200 miss",
        _tally("cosmos-transfer2.5-2b edge base") == "4/7",
        _tally("cosmos-transfer2.5-2b edge base"),
    ),
    claim(
        "Cosmos distilled (4 steps): the 1- and 4-GPU H200 NVL rows within; base against "
        "distilled puts more seconds outside the denoiser than the VAE's",
        _tally("cosmos-transfer2.5-2b edge distilled") == "2/9" and cosmos_one[1] > cosmos_vae > 0,
        f"{cosmos_one[1]:.0f} s against the VAE's {cosmos_vae:.1f} s on one H100 NVL",
    ),
]
print(verdict_table(held_claims, "python -m paralab.scale check GENERALIZATION.toml"))
show(plot_prediction_scatter(check, held_out=held))

# %% [markdown]
# The largest errors are where the model is knowingly blind, and the held-out rows show
# where that matters. Where the run is what the model counts (a dense model's training step,
# the ring, a denoiser on one chip family) it generalizes: every torchtitan row but one, eager
# and compiled, bf16 and Float8, async TP or not, every row of Megatron-LM's table up to 6,144
# GPUs, and the ring benchmark's plain-ring rows, once its causal imbalance is counted, land
# inside the band. It misses where the measurement holds work it does not count:
# - **async TP on Llama 3.1 8B in Float8**: the model hides each fused TP collective behind
#   its whole matmul, in both passes, as torch's pass fuses them, and so gives async TP more
#   than the measured gain; it counts no cost for running each fused matmul as tp slices;
# - **Cosmos' distilled rows** (4 steps, one branch) are predicted short on every card. The
#   model counts the Wan2.1 VAE's two encodes and one decode, which every rank runs whole
#   (`vae_seconds`; Cosmos' parallel tokenizer is off by default), and that brings the 1-
#   and 4-GPU H200 NVL rows inside the band; set against the base rows on the same GPUs, the
#   rest imply more seconds outside the denoiser's forwards than the VAE's (the claim above),
#   shrinking with the GPUs (control extraction, whatever else the timer holds), and no cited
#   figure times them. The VAE's share of peak is measured only on an A800, at an assumed 81
#   frames, and carried to these cards as a share;
# - **xDiT's ConsisID with sequence parallelism** runs far below its FLOPs and bytes, while
#   its CFG-parallel row scales almost linearly; no source read names the links of the
#   machine it was measured on, so no slower-link preset is cited for it;
# - **H200 NVL** has H100 NVL's dense peak on the datasheet yet runs the same forward 1.35×
#   faster; the same doc's Segmentation table has an H100 PCIe, the card with the lower
#   datasheet peak, finish well before the H100 NVL, so that H100 NVL runs below its
#   datasheet, and no public sustained figure per card was found to put in a preset;
# - **mixtures of experts** in Megatron-Bridge's summary: Qwen3-30B-A3B's 128 narrow experts
#   cost grouped GEMMs, a router and a dropless dispatcher the model does not count, and it
#   predicts more than twice the measured rate; DeepSeek-V3 on 1,024 H100s runs faster than
#   the model, which shows every all-to-all over the network in full, where the run sent a
#   token once a node (DeepEP) and overlapped them.
#
# Each reason is in `paralab.scale.heldout.MISSES`, word for word. None is tuned away: the
# fitted efficiencies come from `CASES.toml` alone.

# %% [markdown]
# ## 5. The planner on two real questions
#
# `python -m paralab.plan` answers "which layout for this model on this cluster". For training
# it enumerates every layout whose degrees multiply to exactly the GPUs asked for: dp_replicate
# × dp_shard (HSDP), cp and its kind, tp with or without sequence parallelism and async TP, pp
# with its schedule (1F1B, interleaved with v stages a rank, ZB-H1, GPipe) and micro-batch
# count, under each AC mode; without pp, a dp rank may run its sequences as micro-batches one
# after another (gradient accumulation), as many as an AC mode needs to fit. It prunes what
# cannot run (heads and kv heads by tp, more stages than layers, the sequence by 2·cp, the
# global batch by dp and the micro-batches), counts memory first, and times only what fits,
# with the least recompute that fits. It ranks by step time:
# the same job on the same GPUs, so the fastest step is also the most tokens/s/GPU. MFU sits
# beside it. Inference plans the diffusion models with `paralab.ParallelDims` (dp_shard shards
# the weights; cp, cfgp and lb overlay the same ranks), and it times a Cosmos video's VAE
# passes, which every rank of its group runs whole. lb (lab 04) balances the VAE encode of
# uneven batches of raw videos before the denoiser: its columns are the exchange's seconds and
# the busiest rank's encode load in pixels (`vae_lb_effect`).
#
# Memory per GPU is itemised by `paralab.scale.memory.stage_memory`, each item a count of
# tensors times their dtype: fp32 master weights, fp32 gradients and AdamW's two fp32 moments
# over the GPU's shard of its pipeline stage (`stage_params`: the stage's own layers, the
# embedding on the first, the head on the last); activations per AC mode (cut over tp inside
# the TP regions, outside them only under SP), times the micro-batches a pipeline schedule
# holds in flight, plus the layer in its backward (its working set, twice when recomputed:
# activations and their gradients); the loss's fp32 logits on the last stage; FSDP's gathered
# blocks, or under pp the whole gathered stage and its unsharded fp32 gradients. It is
# *allocated* memory; torchtitan reports the allocator's reserved peak, above it by
# fragmentation that is not modelled.
#
# **Predict before you run.** (a) Llama 3.1 70B on 64 H100s, 8K tokens, full AC: does pure
# FSDP fit, and does any other layout beat it? (b) Cosmos-Transfer2.5-2B on 8 H100 NVL: all 8
# on cp, or cfgp 2 × cp 4?

# %%
# show: paralab.scale.memory.stage_memory

# %% [markdown]
# The activations are the item a layout changes most, and one function holds their arithmetic:
# the bytes a layer keeps per token, from `layer_tensors` (elements per token outside and
# inside the TP regions, per AC mode). **The exercise.** `per_token_layer_bytes` is this lab's
# second graded exercise: outside the TP regions the tensors are cut over tp only under SP.
# The grader runs it on four Llama layers and, hidden, on three shapes drawn from a seed; the
# cell after it grades the two wrong readings: SP ignored, and every tensor cut over tp.

# %%
# show: paralab.scale.memory.per_token_layer_bytes

# %%
layer_exercise = EXERCISES["per_token_layer_bytes"]
print(f"exercise {layer_exercise.name} ({layer_exercise.points} point): {layer_exercise.prompt}\n")
layer_graded = {
    bug.__name__: grade(layer_exercise, bug) for bug in (sp_ignored, everything_over_tp)
}
for outcome in layer_graded.values():
    print(report(layer_exercise, outcome))
layer_claims = [
    claim(
        f"the per_token_layer_bytes grader withholds points from {name}",
        outcome.points < layer_exercise.points,
        f"{outcome.points:g}/{layer_exercise.points} points",
    )
    for name, outcome in layer_graded.items()
]
print(verdict_table(layer_claims, "the second graded exercise"))

# %%
train_rows = plan_train(seventy_b, H100, 64, 8192, 64, "full", "bf16")
print(
    "python -m paralab.plan --model llama3.1-70b --hardware h100-sxm --gpus 64 --seq 8192 "
    "--global-batch 64 --ac full --train"
)
print(table(train_rows, 6))
print(why(train_rows))
show(plot_plan(train_rows))

# %% [markdown]
# The memory model against the 18 Memory (GiB) figures of torchtitan's December 2024 H100
# tables (`src/paralab/scale/MEMORY.toml`, each row with its table). The model counts neither
# torch.compile nor float8, so the three variants of a row get one prediction.

# %%
published = published_memory()
print(
    text_table(
        ("table", "run", "torchtitan (GiB, reserved)", "model (GiB, allocated)", "error"),
        [
            (
                r["table"],
                r["name"],
                f"{r['memory_gib']:.1f}",
                f"{r['predicted_gib']:.1f}",
                f"{r['relative_error']:+.1%}",
            )
            for r in published
        ],
    )
)

# %%
video_rows = plan_inference(
    model("cosmos-transfer2.5-2b"), NVL, 8, 84480, 35, video=planner.RAW_VIDEO
)
print(
    "python -m paralab.plan --model cosmos-transfer2.5-2b --hardware h100-nvl --gpus 8 "
    "--steps 35 --inference"
)
print(table(video_rows, 8))
print(why(video_rows))
show(plot_plan(video_rows))

# %%
best_video = video_rows[0].layout
cp8 = next(r for r in video_rows if r.layout.cp == 8 and r.layout.dp_shard == 1)
fitting = [r for r in train_rows if not r.oom]
pure_dp = next(r for r in fitting if (r.layout.cp, r.layout.tp, r.layout.pp) == (1, 1, 1))
worst = max(published, key=lambda r: abs(r["relative_error"]))
plan_claims = [
    claim(
        "70B: every layout uses exactly the 64 GPUs asked for",
        all(r.layout.world == 64 for r in train_rows),
        f"{len(train_rows)} layouts, {len(fitting)} fit",
    ),
    claim(
        "70B: the fitting layouts come first, fastest step first; the OOM ones after",
        [r.oom for r in train_rows] == sorted(r.oom for r in train_rows)
        and [r.score for r in fitting] == sorted(r.score for r in fitting),
        f"best {train_rows[0].score:.2f} s a step, MFU {train_rows[0].extras['MFU']:.1%}",
    ),
    claim(
        "70B: tp with async TP comes first, pure dp (FSDP, or HSDP) within 5 %: a near tie",
        train_rows[0].layout.tp > 1
        and train_rows[0].layout.async_tp
        and 0 < pure_dp.score / train_rows[0].score - 1 < planner.NEAR_TIE,
        f"{train_rows[0].score:.2f} s vs {pure_dp.score:.2f} s",
    ),
    claim(
        "memory: 17 of the 18 torchtitan figures within 20 %, the miss at CP 8 (chapter 1)",
        len(published) == 18
        and [r for r in published if abs(r["relative_error"]) >= 0.2] == [worst]
        and worst["name"].startswith("405B FSDP 1, CP 8"),
        f"worst {worst['relative_error']:+.1%} ({worst['table']}, {worst['name']})",
    ),
    claim(
        "Cosmos, one video per group: lb changes no encode load, only adds its all-gather",
        len({r.extras[LB_LOAD] for r in video_rows}) == 1
        and all(r.layout.lb == 1 or r.prediction.breakdown[LB_EXCHANGE] < 1e-4 for r in video_rows),
        f"{video_rows[0].extras[LB_LOAD]:.0f} Mpx on the busiest rank for every lb",
    ),
    claim(
        "Cosmos on H100 NVL: the best layout uses cfgp 2 (a cheap swap beats wider all-to-alls)",
        best_video.cfgp == 2 and video_rows[0].prediction.seconds < cp8.prediction.seconds,
        f"{video_rows[0].prediction.seconds:.1f} s vs cp 8: {cp8.prediction.seconds:.1f} s",
    ),
]
print(verdict_table(plan_claims, "the planner"))

# %% [markdown]
# **A video's memory.** A video pipeline keeps more than its denoiser on the GPU:
# Cosmos-Transfer2.5 keeps its 7B text encoder (whole on one GPU; on more, sharded over all of
# them but for its root, which stays whole), and its VAE's passes peak above the denoiser's
# working set, one after the other ([chapter 2](02_reading_the_planner.md#2-where-it-is-wrong)).
# **Predict:** on one GPU, which weighs more, the denoiser or the text encoder? And is the total
# near the 65.4 GB the doc asks for single-GPU inference (`COSMOS_SINGLE_GPU_VRAM_GB`)?

# %%
from paralab.scale.hardware import GiB
from paralab.scale.models import COSMOS_SINGLE_GPU_VRAM_GB

one_gpu = plan_inference(model("cosmos-transfer2.5-2b"), NVL, 1, 84480, 35)[0]
for item, size in one_gpu.memory.items():
    print(f"{item:42} {size / GiB:5.1f} GiB")
denoiser, encoder = (one_gpu.memory[k] for k in ("parameters", "text encoder (bf16)"))
video_claims = [
    claim(
        "Cosmos on one GPU: the text encoder it keeps outweighs the denoiser",
        encoder > denoiser,
        f"{encoder / GiB:.1f} GiB against {denoiser / GiB:.1f} GiB",
    ),
    claim(
        f"all it counts stays under the doc's {COSMOS_SINGLE_GPU_VRAM_GB} GB (guardrails, "
        "image-context encoder, load-time peak, CUDA context, allocator reserve uncounted)",
        one_gpu.total_memory < COSMOS_SINGLE_GPU_VRAM_GB * 1e9,
        f"{one_gpu.total_memory / GiB:.1f} GiB",
    ),
]
print(verdict_table(video_claims, "a video's memory"))

# %% [markdown]
# ### Published layouts against the planner
#
# A planner earns trust where people have already chosen. Every published training row in
# `CASES.toml` and `GENERALIZATION.toml` states the layout it ran. `rank_published` asks the
# planner that row's question (model, hardware, GPUs, sequence, global batch, dtype, compile
# and engine) and says where the run's own degrees dp·cp·tp·pp come among the distinct degree
# tuples that fit, each at its fastest row; "at its AC" asks again with the planner held to
# the run's AC mode ("-": the run's degrees do not fit in the memory model at that mode).
# `tests/test_plan_published.py` asks it of every row and holds each to the top three or to a
# reason whose numbers it checks; below, eight of them.
#
# **Predict before you run.** torchtitan ran Llama 3.1 70B on 256 H100s as FSDP 32 × TP 8
# with full AC; Megatron-LM ran its 462B GPT on 6,144 as TP 8 × PP 16 × DP 48. Which of the
# two does the planner rank in its top three, and what would it do instead with the other?

# %%
PUBLISHED_SAMPLE = (
    "torchtitan llama3.1-8b fsdp8 seq8k sac bf16",
    "torchtitan llama3.1-8b fsdp8 cp1 seq32k full-ac fp8",
    "torchtitan llama3.1-70b fsdp32 tp8 seq8k full-ac fp8",
    "torchtitan llama3.1-405b fsdp4 cp2 tp8 pp8 seq64k full-ac fp8",
    "megatron-lm gpt-1.7b tp1 pp1 dp48 48 gpus bf16",
    "megatron-lm gpt-462b tp8 pp16 dp48 6144 gpus bf16",
    "megatron-bridge 25.11 llama3.1-405b tp8 pp8 cp2 vp8 dp8 gbs512 fp8",
    "megatron-bridge 25.11 qwen3-30b-a3b pp2 vp24 ep8 dp8 gbs512 fp8",
)
published_rows = {c.name: c for c in planner.published_training_rows()}
rank_checks = [planner.rank_published(published_rows[name]) for name in PUBLISHED_SAMPLE]
print(planner.rank_table(rank_checks))
for reason in dict.fromkeys(c.reason() for c in rank_checks if c.reason()):
    print(f"{reason}: {planner.WHY_NOT_FIRST[reason]}")

# %%
by_name = {c.name: c for c in rank_checks}
seventy_check = by_name["torchtitan llama3.1-70b fsdp32 tp8 seq8k full-ac fp8"]
megatron_check = by_name["megatron-lm gpt-462b tp8 pp16 dp48 6144 gpus bf16"]
published_claims = [
    claim(
        "published rows: each in the top three, or with a reason",
        all((c.rank <= planner.TOP) == (c.reason() is None) for c in rank_checks),
        f"{sum(c.rank <= planner.TOP for c in rank_checks)}/{len(rank_checks)} in the top three",
    ),
    claim(
        "Megatron-LM's 462B GPT: its own degrees in the top three",
        megatron_check.rank <= planner.TOP,
        f"{megatron_check.first.score:.1f} s a step, MFU {megatron_check.first.extras['MFU']:.1%}",
    ),
    claim(
        "torchtitan's 70B: the first has less TP; the run's best exposes TP's backward",
        seventy_check.reason() == "exposed: tp",
        f"exposed TP {seventy_check.saving()[1]:.2f} s, a step {seventy_check.gap:+.0%}",
    ),
    claim(
        "torchtitan's 32K 8B row: held to full AC, its degrees come first",
        by_name["torchtitan llama3.1-8b fsdp8 cp1 seq32k full-ac fp8"].rank_at_ac == 1,
        f"free: rank {by_name['torchtitan llama3.1-8b fsdp8 cp1 seq32k full-ac fp8'].rank}",
    ),
]
fsdp_alone = published_rows["torchtitan llama3.1-8b fsdp128 seq8k sac bf16 compile"].measured
with_tp = published_rows["torchtitan 2025-06 llama3.1-8b fsdp8 tp8 async-tp seq8k sac bf16"]
megatron_mfu = [
    c.measured / c.hardware.peak_bf16 * 1e12 for n, c in published_rows.items() if "gpt-" in n
]
published_claims += [
    claim(
        "torchtitan measured, two files: 8B on FSDP 128 (2024-12) beats FSDP 8 x async TP 8 "
        "(2025-06, 64 GPUs)",
        fsdp_alone > with_tp.measured,
        f"{fsdp_alone:.0f} against {with_tp.measured:.0f} tokens/s/GPU",
    ),
    claim(
        "Megatron-LM's GPT table: one code, one cluster, MFU spread by GEMM size",
        f"{min(megatron_mfu):.0%} to {max(megatron_mfu):.0%}" == "41% to 49%",
        f"{min(megatron_mfu):.1%} to {max(megatron_mfu):.1%}",
    ),
]
print(verdict_table(published_claims, "published layouts"))

# %% [markdown]
# Read the columns from left to right. Where the run's degrees are not in the top three, the
# planner's first row shows what it does instead, and "first saves most on" the item of the
# step where the difference sits:
# - **recompute.** torchtitan's CP rows (Table 2) and its 405B rows of Table 5 ran full AC; the planner
#   cuts the sequence over cp, or runs more micro-batches, until less recompute fits, and
#   saves the recomputed attention or GEMM FLOPs. Held to the run's AC mode, the 32K row's
#   degrees come first: the layout was right, the AC was the run's choice. Megatron-Bridge's
#   dense rows ran without AC; for all but its 8B the memory model, built from torchtitan's figures, does not fit those degrees
#   without AC ("-"), and no memory figure of those runs is published to say which is right.
# - **exposed TP.** torchtitan's async TP fuses TP's transfers into their matmuls, but the
#   backward's re-gathers for the weight gradients stay exposed, and a transfer longer than its
#   matmul shows ([chapter 2](02_reading_the_planner.md)); at 8K tokens the first runs less
#   TP (for the 70B, tp 4 beside cp 2, which the model times as nearly free at 8K). torchtitan's
#   measurements agree in direction, across two files (the claim above): its 8B on FSDP 128
#   alone (Dec 2024, local batch 2) moves more tokens a GPU than FSDP 8 × async TP 8 on 64 GPUs
#   (June 2025, local batch 12): two setups, not one controlled pair.
# - **pp bubble.** The 405B long-sequence rows (Table 6) ran 8 micro-batches through 8
#   stages, a pipe that is never full; the planner drops pp or fills it.
# - **exposed ep.** The model times every all-to-all of ep in full; the DeepSeek-V3 row of
#   [section 4](#4-predicted-against-measured) runs faster than that. The planner keeps the
#   experts whole and gathers them instead.
# - **near tie.** The 1.7B GPT's degrees are within 5 % of the first: one fitted GEMM
#   efficiency cannot separate them, while Megatron's own table spans 41 % to 49 % MFU as the
#   GEMMs grow (the claim above).
#
# [Chapter 2](02_reading_the_planner.md) says which of these are the model's blind spots and
# which are the run's choices.

# %% [markdown]
# ## 6. Bug clinic: the Edge table, read again
#
# A change planted in how the case files are read, handed over as a patch set, `with
# patched(edge_table_clinic()):` (`paralab.exercises.lab11`; do not read it yet). It replaces
# one function. Below, the shipped check, the fit and `fixed_seconds` run with it, on the same
# model and the same efficiencies.
#
# **Predict before you run.** If some of the measurements were wrong, which of this lab's
# checks would say so: the 25 % band, the refit, or `fixed_seconds`? And would any of them
# tell a wrong measurement from a wrong model?

# %%
with patched(edge_table_clinic()):
    check_then = check_rows(str(SHIPPED))
    cases_then = case_files.load_cases()
    held_then = {c.name: c for c in case_files.load_cases(GENERALIZATION)}
    refit_then = fit(cases_then)
errors_then = {r["name"]: r["relative_error"] for r in check_then}
cosmos_then = [c for c in cases_then if c.name.startswith("cosmos")]
distilled_then = held_then["cosmos-transfer2.5-2b edge distilled 4 steps 1 h100-nvl"]
pair_then = fixed_seconds(cosmos_then[0], distilled_then)
print(
    text_table(
        ("Cosmos row, as read with the patch", "measured (s)"),
        [(c.name, f"{c.measured:g}") for c in [*cosmos_then, distilled_then]],
        align_right=(1,),
    )
)

# %%
clinic_claims = [
    claim(
        "clinic: the torchtitan, ring, xDiT and FastVAE rows keep their errors",
        all(
            errors_then[r["name"]] == r["relative_error"]
            for r in check
            if not r["name"].startswith("cosmos")
        )
        and all(n.startswith("cosmos") for n in errors_then if abs(errors_then[n]) > 0.25),
        f"{sum(abs(e) <= 0.25 for e in errors_then.values())}/{len(errors_then)} within 25 %",
    ),
    claim(
        "clinic: with the stored fit, both Cosmos rows leave the 25 % band",
        all(abs(errors_then[c.name]) > 0.25 for c in cosmos_then),
        ", ".join(f"{errors_then[c.name]:+.0%}" for c in cosmos_then),
    ),
    claim(
        "clinic: refitted, h100-nvl's attention hits the grid's top and the rows still miss",
        refit_then["h100-nvl"]["attention"] == max(GRID)
        and all(abs(relative_error(c, refit_then)) > 0.25 for c in cosmos_then),
        f"attention {refit_then['h100-nvl']['attention']}, "
        + ", ".join(f"{relative_error(c, refit_then):+.0%}" for c in cosmos_then),
    ),
    claim(
        "clinic: fixed_seconds gives a denoiser forward a negative time",
        pair_then[0] < 0,
        f"{pair_then[0]:.2f} s a forward, {pair_then[1]:.0f} s outside",
    ),
]
print(verdict_table(clinic_claims, "bug clinic"))

# %% [markdown]
# **What is wrong?** The model, the efficiencies and every other row are as before. Read the
# Cosmos rows' measurements above against the table of
# [section 4](#4-predicted-against-measured), and the sign of the forward.

# %% [markdown]
# <details><summary>Answer</summary>
#
# `edge_table_clinic` swaps `load_cases` for `load_cases_first_edge_table`: each Cosmos row
# takes the measurement of its partner on the same GPUs, base for distilled and distilled for
# base, so the 35-step base row on one H100 NVL reads 64.5 s and the 4-step distilled row
# 502.6 s. That is the Edge table as it first appeared, in
# nvidia-cosmos/cosmos-transfer2.5@ecbc860:docs/inference.md: the row of 4-step times labelled
# *Base*, the row of 35-step times *Distilled*. nvidia-cosmos/cosmos-transfer2.5#184
# (nvidia-cosmos/cosmos-transfer2.5@c9ad44b) corrected the labels, three days later.
#
# The 25 % band catches it, and so does the refit: no attention efficiency on the grid brings
# 70 forwards down to 64.5 s, so the fit stops at the grid's top and the rows still miss. But
# both say only that model and data disagree; a lab that trusts its data would go tuning the
# model. `fixed_seconds` is the check that points at the data: solved on the swapped pair, a
# denoiser forward takes a negative time, which no model, right or wrong, can produce. Seventy
# forwards cannot take less time than four of the same kind.
# </details>

# %% [markdown]
# ## Closing note

# %%
print(
    closing_table(
        {
            "1 · α-β and the roofline": alpha_claims + roofline_claims,
            "2 · every lab at a real size": axis_claims,
            "3 · slower than one GPU": slow_claims,
            "4 · predicted vs measured": case_claims + held_claims + exercise_claims,
            "5 · the planner": plan_claims + layer_claims + published_claims,
            "6 · bug clinic": clinic_claims,
        }
    )
)

# %% [markdown]
# ## What to try
#
# 1. Ask the planner the inference question on B200s: `print(why(plan_inference(model(
#    "cosmos-transfer2.5-2b"), hardware("b200"), 8, 84480, 35)))`. Does cfgp still win?
#
#    <details><summary>Hint</summary>Barely: 32.1 s against 32.4 s for cp 8. On NVLink 5
#    (740 GB/s busbw) the all-to-alls cost almost nothing; on H100 NVL's PCIe the smaller
#    Ulysses group is what made cfgp win by 1.5 s.</details>
# 2. Check a row the model was not fitted on: ConsisID with Ring 3 × CFG 2 on 6 GPUs took
#    35.78 s (xDiT's table). Run `predict(model("consisid"), H100, Layout(cp=3,
#    cp_kind="ring", cfgp=2), Workload("diffusion", seq=17776, steps=50), FITTED["h100-sxm"])`
#    and compare (it is a row of `GENERALIZATION.toml`).
#
#    <details><summary>Hint</summary>About 16.8 s, half the measurement: at 6 GPUs each
#    one holds about 5,925 tokens (17,776 / 3) of a model of 6.0 B parameters, and the overheads a FLOP count does not see, per step
#    (kernel launches, Python) and per video inside xDiT's timer (the text encode, the image's
#    VAE encode and the decode; the face models run before it starts), no longer shrink. A
#    model is only as
#    good as the regime it was checked in.</details>
# 3. Make NVLink slower: `from dataclasses import replace`, `slow = replace(H100,
#    intra_busbw=H100.intra_busbw / 20)`, then re-run the 256K ring row of
#    [section 2](#2-every-labs-formula-at-a-real-size) (the
#    `ring_256k = predict(...)` line) with `slow` in place of `H100`, and print
#    `breakdown["exposed: cp"]` less the merges (`merges_256k`, the same on any link). Try
#    `/ 100` and `/ 200`, then the same with `Layout(cp=8, cp_kind="zigzag",
#    cp_rotate="alltoall")`: when does the transfer stop hiding?
#
#    <details><summary>Hint</summary>Already about 1 s at 1/20: torchtitan's default
#    all-gathers the 7 other shards' K/V (7 × 128 MiB, 51 ms at 18.5 GB/s) behind the first
#    block alone, about 36 ms of forward attention; about 18 s at 1/100 and 50 s at 1/200.
#    Passed a hop at a time (`"alltoall"`), each 128 MiB hop (7 ms) hides behind its own
#    block: still zero at 1/20, a third of a second at 1/100, about 40 s at 1/200 (the
#    backward's dK and dV travel in fp32). A ring's hops are the most forgiving traffic there
#    is at long sequences; one all-gather is simpler and hides only while the link is
#    fast.</details>
# 4. Give lb something to balance: `from paralab.scale.plan import vae_lb_effect`, `videos =
#    [(f, 704, 1280) for f in (121, 29, 93, 29, 121, 61, 29, 29)]`, then for `lb` in 1, 2, 4, 8
#    print `vae_lb_effect(NVL, Layout(cp=2, lb=lb), 8, videos)`: the busiest rank's encode load
#    (pixels) and the exchange's seconds. Why does lb 2 change nothing?
#
#    <details><summary>Hint</summary>218 M pixels at lb 1 and 2, 164 M at lb 4, 133 M at lb 8,
#    for 9 to 10 ms of exchange (lb 4 and lb 8). With cp 2 the two ranks of an lb-2 group are one cp group:
#    they hold the same videos, so there is no gap to close; lb must span several cp groups.
#    </details>

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time: {monotonic() - LAB_START:.1f} s")
