"""Seconds from FLOPs and bytes: a roofline for compute, alpha-beta for every collective.

Compute: a roofline per operation, the slower of FLOPs / (peak x efficiency), with one fitted
efficiency per hardware and kernel class (GEMM, attention, a video VAE's convolutions:
`fit.FITTED`), and the bytes it moves over HBM bandwidth (`compute_time`; a training layer's
matmuls, each micro-batch reading the weights again: `gemm_pass_bytes`, the routed experts
apart, `routed_expert_pass`). What moves bytes and does no matmul is timed by its bytes alone:
the norms, residual adds, RoPE, the MLP's activation, a MoE layer's permutation and fp8's casts
(`elementwise_bytes`, eager or fused by the engine), the loss (`loss_bytes`) and the optimizer
step. Communication: the bytes one rank sends come from the labs' own `costs.py` (evaluated here
at real sizes and dtypes), the time of a collective is alpha x steps + bytes / busbw on the link
its group crosses. Overlap, per mechanism, as the engines do it:

| traffic | how it overlaps |
|---|---|
| FSDP all-gather / reduce-scatter | prefetched: hidden behind the neighbouring block's compute, the excess shows |
| ring attention hop | hidden behind the block of attention it feeds, the excess shows |
| torchtitan CP's K/V all-gather (default) | hidden behind the first sub-SDPA, the excess shows |
| TP, async under torchtitan | fused with its matmul in both passes: the excess shows; dW's re-gathers exposed |
| TP, overlapped under Megatron | hidden in both passes |
| Ulysses all-to-all, EP all-to-all (MoE layers only), TP without overlap, cfgp swap | exposed |
| PP | the bubble of `paralab.pp.simulate`'s schedule, plus each schedule's exposed sends (`pp_send_stretch`) |
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields

from paralab.cfgp.costs import cfgp_bytes
from paralab.cp.costs import ring_bytes, shard_bytes, ulysses_gqa_bytes, usp_bytes
from paralab.fsdp.costs import traffic_formula
from paralab.pp.clock import simulate
from paralab.pp.costs import boundary_bytes, bubble_formula, exposed_link_formula
from paralab.scale.hardware import BASE_LATENCY, NET_OVERHEAD, STEP_LATENCY, Hardware
from paralab.scale.models import AUTOENCODERS, ModelShape, attention_matmul
from paralab.tp.costs import block_bytes

LEDGER_ITEMSIZE = 8
"""The labs' cost formulas count float64 bytes; real runs move bf16 (2) or fp32 (4)."""
PARAM_BYTES, REDUCE_BYTES, ACT_BYTES = 2, 4, 2
"""bf16 parameters all-gathered, fp32 gradients reduced (torchtitan's mixed_precision_reduce),
bf16 activations."""
ADAM_BYTES_PER_PARAM = 28
"""AdamW's HBM traffic per parameter of the local shard: read fp32 param, grad, 2 moments
(16 B), write param and moments (12 B)."""
BACKWARD_GEMM, BACKWARD_ATTENTION = 2.0, 2.5
"""Backward FLOPs over forward: 2 for a matmul (dX and dW); 2.5 for flash attention, whose
backward runs five GEMMs to the forward's two (it recomputes the scores; T. Dao in
Dao-AILab/flash-attention#1525)."""
BACKWARD_ATTENTION_SPEED = 1117.9 / 1418.1
"""Flash attention's backward FLOP rate over its forward's: 79 %, BORROWED from Blackwell. The
figure is FlashAttention-4 on SM100 ("FA Python fwd: 0.775ms, 1418.1 TFLOPS", "bwd: 2.459ms,
1117.9 TFLOPS", causal, head dim 128, 8K tokens, batch 4 x 16 heads; Dao-AILab/flash-attention#2280),
not a measurement on the Hopper chips the cases ran on. Hopper figures found, from
hopper/benchmark_attn.py in Dao-AILab/flash-attention#1791 (causal, head dim 128, 8K tokens):
FlashAttention-2 "fwd: 1.935ms, 284.1 TFLOPS", "bwd: 4.788ms, 287.1 TFLOPS" (101 %: FA2 is what
ring-flash-attention calls and what torch's SDPA tries first) and FlashAttention-3, backward
531.6 TFLOPS against forward 630.0 (84 %). Refitted with each, FA2's 101 % leaves two shipped
rows outside the 25 % band (27 %: training attention then costs too little against the
forward-only attention of the xDiT rows that share its efficiency); FA3's 84 % keeps all twelve
within (largest 22 %, with other fitted efficiencies), as the borrowed 79 % does
(`tests/test_scale.py::test_the_backward_speed_ratio_refit`). So the
shipped rows rule out FA2's ratio but do not choose between FA3's and FA4's: keeping FA4's 79 %
is a choice, not a fit. A Hopper figure of one of the kernels the cases ran, torch's SDPA, now
brackets it: on an H200 at three training shapes the backward ran at 0.73 to 0.88 of the
forward's FLOP rate (`KERNELS.toml`, tools/kernel_rates.py); xDiT's backends are not measured."""
RECOMPUTE = {
    "none": (0.0, 0.0),
    "selective": (0.5, 0.0),
    "attention": (0.0, 1.0),
    "full": (1.0, 1.0),
}
"""(GEMM, attention) forward FLOPs recomputed in the backward: torchtitan's op-level selective
AC saves attention and every other matmul output; Megatron's selective recompute ("attention"
here) redoes the core attention alone (its default `recompute_modules`); full AC recomputes the
whole forward."""
TRAIN_MESH = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""torchtitan's mesh order, outermost first: tp is innermost, so tp partners share a node."""


@dataclass(frozen=True)
class Layout:
    dp_shard: int = 1
    dp_replicate: int = 1
    cp: int = 1
    cp_kind: str = "ring"
    ulysses: int = 0
    """For USP: the all-to-all degree inside cp (cp = ulysses x ring); 0 = cp_kind alone."""
    cfgp: int = 1
    lb: int = 1
    """Inference: ranks that share raw videos before the VAE encode (`paralab.vae_lb`); an
    overlay like cp and cfgp, outside the denoiser's time."""
    tp: int = 1
    pp: int = 1
    schedule: str = "1f1b"
    microbatches: int = 0
    virtual: int = 1
    async_tp: bool = False
    ep: int = 1
    """Expert parallel: a mixture of experts' experts split over ep ranks carved from dp_shard x
    cp (as torchtitan carves them), tokens sent to their experts' ranks by all-to-alls; it uses
    no ranks of its own."""
    sp: bool = False
    """Sequence parallel beside tp: the block's all-reduces become all-gathers and
    reduce-scatters (`paralab.tp.costs.block_bytes`), and activations outside the TP regions
    are cut over tp too (`paralab.scale.plan.train_memory`)."""
    cp_rotate: str = "allgather"
    """Training only: torchtitan's `context_parallel_rotate_method`. "allgather" (its default,
    pytorch/torchtitan@6b03ffa:torchtitan/config_manager.py) gathers every K/V shard once, behind
    the first sub-SDPA; "alltoall" passes them a hop at a time, as a ring."""

    @property
    def world(self) -> int:
        return self.dp_shard * self.dp_replicate * self.cp * self.tp * self.pp * self.cfgp


LAYOUT_FIELDS = frozenset(f.name for f in fields(Layout))


def changed(layout: Layout, **changes: object) -> Layout:
    """`dataclasses.replace` of a `Layout` at a fifth of its cost: the fields copied, `__init__`
    (which only stores them) not run again. A planner search asks for about a million."""
    if not changes.keys() <= LAYOUT_FIELDS:
        raise TypeError(f"Layout has no field {sorted(changes.keys() - LAYOUT_FIELDS)}")
    new = object.__new__(Layout)
    vars(new).update(vars(layout), **changes)
    return new


@dataclass(frozen=True)
class Workload:
    kind: str  # "train", "diffusion", "attention"
    seq: int = 0
    """Tokens of one sample: a training sequence, a video's latent patches + text, or (for
    "attention") the tokens each GPU holds."""
    micro_batch: int = 1
    steps: int = 1
    dtype: str = "bf16"
    ac: str = "none"
    compile: bool = False
    """torchtitan's torch.compile of each block: the block's elementwise ops fused
    (`elementwise_bytes`); the loss, outside the blocks, stays eager."""
    forward_only: bool = False
    """For "attention": the forward alone (ring-flash-attention's "fwd only" rows)."""
    video: tuple[int, int, int] = (0, 0, 0)
    """(frames, height, width) of the decoded video, for a model whose autoencoder is priced
    (`ModelShape.autoencoder`); (0, 0, 0): its passes are not timed."""
    engine: str = "torchtitan"
    """Whose kernels and overlap run a training step: "torchtitan" (torch ops, eager unless
    `compile`; async TP fuses TP collectives into their matmuls) or "megatron" (Megatron-Core with
    Transformer Engine: fused norm, RoPE, activation and loss kernels; TP communication
    overlapped in both passes). `ENGINES`."""


@dataclass(frozen=True)
class Link:
    """The link a group's collectives cross: its busbw, the latency of a step inside a node, and,
    for a group spanning `nodes` > 1 nodes, the network's latency on the steps that cross."""

    name: str
    busbw: float
    step_latency: float
    nodes: int = 1
    size: int = 0
    """Ranks in the group."""

    def inter_steps(self, steps: int) -> int:
        """NCCL's `nInterSteps` (NVIDIA/nccl@b647562:src/graph/tuning.cc): of an all-reduce's
        2 (n - 1) steps 2 x nodes cross a node boundary, of an all-gather's or reduce-scatter's
        n - 1 steps nodes - 1; an all-to-all (grouped sends, outside tuning.cc's table) is charged
        as an all-gather, a single send between neighbours (a ring hop) as crossing."""
        if self.nodes <= 1:
            return 0
        if steps == 2 * (self.size - 1):
            return min(steps, 2 * self.nodes)
        if steps == self.size - 1:
            return self.nodes - 1
        return steps

    def time(self, bytes_sent: float, steps: int, calls: int = 1) -> float:
        """alpha + bytes / busbw, NCCL's Ring / Simple model for `calls` collectives of `steps`
        steps: baseLat, then hwLat(NET) on the node-crossing steps and the intra-node hwLat on
        the rest."""
        inter = self.inter_steps(steps)
        alpha = BASE_LATENCY + (steps - inter) * self.step_latency + inter * STEP_LATENCY["net"]
        return calls * alpha + bytes_sent / self.busbw


@functools.cache
def link_for(hw: Hardware, stride: int, size: int) -> Link:
    """The link a group of `size` ranks, `stride` apart in rank order, crosses.

    Ranks fill nodes in order, so node_size / stride of the group share a node: it stays in one
    when stride x size <= node size. A group across nodes runs at the network's busbw; its steps
    inside a node pay the intra-node latency, at least NCCL's `NET_OVERHEAD`. A bridged pair of
    NVL cards (stride 1, size 2) uses its NVLink bridge."""
    per_node = max(1, min(size, hw.gpus_per_node // stride))
    nodes = -(-size // per_node)
    if nodes > 1:
        intra = max(STEP_LATENCY[hw.intra_link], NET_OVERHEAD)
        return Link("network", hw.inter_busbw, intra, nodes, size)
    if hw.pair_busbw and size == 2 and stride == 1:
        return Link("nvlink bridge", hw.pair_busbw, STEP_LATENCY["nvlink"], 1, size)
    return Link(hw.intra_link, hw.intra_busbw, STEP_LATENCY[hw.intra_link], 1, size)


def train_links(hw: Hardware, layout: Layout) -> dict[str, Link]:
    """Each training axis' link, from torchtitan's mesh order (pp, dp_replicate, dp_shard, cp,
    tp), and "dp_shard_cp", the flattened dp_shard x cp group FSDP shards over (adjacent in the
    mesh, so its stride is tp's size)."""
    return _mesh_links(hw, *(getattr(layout, axis) for axis in TRAIN_MESH))


@functools.lru_cache(maxsize=1 << 12)  # keyed by the mesh's sizes alone: a search's few hundred
def _mesh_links(hw: Hardware, *sizes: int) -> dict[str, Link]:
    out, stride = {}, 1
    mesh = dict(zip(TRAIN_MESH, sizes, strict=True))
    for axis in reversed(TRAIN_MESH):
        out[axis] = link_for(hw, stride, mesh[axis])
        stride *= mesh[axis]
    out["dp_shard_cp"] = link_for(hw, mesh["tp"], mesh["dp_shard"] * mesh["cp"])
    return out


def fsdp_block_params(m: ModelShape, layout: Layout) -> int:
    """A block's parameters one FSDP all-gather assembles on a rank: under ep, the rank's 1/ep
    of the experts (each expert group shards over the rest of dp_shard x cp), the rest whole."""
    experts = m.routed_expert_params() // m.layers  # 0 for a dense model
    return m.block_params() - experts + experts // layout.ep


def fsdp_shard(layout: Layout) -> int:
    """The ranks one FSDP group shards a parameter over in training: torchtitan's dp_shard x cp
    (pytorch/torchtitan@6b03ffa:torchtitan/parallelisms/parallelize_llama.py applies FSDP on the
    flattened "dp_shard_cp" mesh whenever dp_shard or cp is on)."""
    return layout.dp_shard * layout.cp


@dataclass
class Prediction:
    """Seconds (per training step, per video, or per attention call) and where they go."""

    seconds: float
    breakdown: dict[str, float] = field(default_factory=dict)
    tokens_per_s_per_gpu: float = 0.0
    efficiency: float = 0.0
    notes: list[str] = field(default_factory=list)
    tflops_per_gpu: float = 0.0
    """Training: model TFLOP/s per GPU (`flops_per_token` x tokens/s/GPU), as papers publish."""
    mfu: float = 0.0
    """Training: those FLOPs over the GPU's dense bf16 peak."""

    def value(self, measured_key: str) -> float:
        return {
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "seconds": self.seconds,
            "efficiency": self.efficiency,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
        }[measured_key]


@functools.cache  # the planner asks for each of its layouts
def flops_per_token(m: ModelShape, seq: int) -> float:
    """Model FLOPs of one trained token, as torchtitan's MFU counts them: 6 x the parameters
    outside the embedding, plus 12 x layers x heads x head_dim x seq for attention. For a
    mixture of experts, only the experts a token is routed to count."""
    idle = m.idle_expert_params()
    return 6 * (m.params - m.vocab * m.hidden - idle) + 12 * m.layers * m.attention_width * seq


def megatron_flops_per_token(m: ModelShape, seq: int) -> float:
    """Model FLOPs of one trained token as Megatron-LM counts them for its tables
    (`num_floating_point_operations`, NVIDIA/Megatron-LM@f2e5db4:megatron/training/training.py):
    12 L h^2 ((1 + g/a + s/h) a d / h + f/h x k x glu) + 6 V h, with g kv heads of a heads of
    width d, k the experts a token is routed to and glu 3/2 for a gated MLP. For Megatron's GPT
    (4h GELU MLP) it is torchtitan's count but for the norms' parameters."""
    if m.latent or m.dense_layers or m.shared_experts:
        raise ValueError(
            f"{m.name}: Megatron's count at f2e5db4 has no latent attention, dense "
            "layers or shared experts; give the measure in tokens/s"
        )
    h, a, d, g = m.hidden, m.heads, m.head_dim, m.kv_heads
    glu = m.mlp_matrices / 2
    per_layer = (1 + g / a + seq / h) * a * d / h + m.ffn / h * (m.top_k or 1) * glu
    return 12 * m.layers * h * h * per_layer + 6 * m.vocab * h


FLOP_COUNTS = {"torchtitan": flops_per_token, "megatron": megatron_flops_per_token}
"""How a source counts a token's FLOPs when it publishes TFLOP/s or MFU (a case's
`measured.flops`)."""


def compute_time(
    flops: float, hw: Hardware, dtype: str, efficiency: float, bytes_moved: float = 0.0
) -> float:
    """The roofline of one operation: its FLOPs at the fitted share of peak, or the bytes it
    moves through HBM at the datasheet bandwidth, whichever is slower."""
    return max(flops / (hw.peak(dtype) * efficiency), bytes_moved / hw.hbm_bandwidth)


def gemm_pass_bytes(m: ModelShape, lo: Layout, tokens: float) -> float:
    """HBM bytes one pass of a layer's matmuls moves on one rank (bf16): its weight shard read
    once, and each matmul's input read and output written once: per token q, k, v and o, and
    the MLP's matrices (SwiGLU's w1 and w3 write and w2 reads the width a token passes through,
    GPT's fc1 writes and fc2 reads it), elements 4 h + 2 attn + 2 kv + mlp_matrices x width,
    cut over tp."""
    kv = m.kv_heads * m.head_dim
    per_token = 4 * m.hidden + 2 * m.attention_width + 2 * kv + m.mlp_matrices * m.mlp_width()
    return ACT_BYTES * (m.matmul_per_layer + tokens * per_token) / lo.tp


def routed_expert_pass(m: ModelShape, lo: Layout, tokens: float) -> tuple[float, float, float]:
    """(forward FLOPs, HBM bytes a pass, of them `gemm_pass_bytes` counts) of one layer's routed
    experts on one rank, averaged over the layers; zeros for a dense model. Each token passes
    through top_k experts, but a grouped GEMM is handed every expert the rank holds (experts /
    ep, cut over tp; pytorch/torchtitan@238fa99:torchtitan/models/moe/moe.py,
    `_run_experts_grouped_mm`) and reads each that receives a token once a pass: at thousands
    of tokens a micro-batch, all of them. `gemm_pass_bytes` counts the top_k a token multiplies
    by; the routed copies' activations stay counted there. Few tokens to many experts a rank
    make these GEMMs memory-bound, which ep relieves."""
    if not m.experts:
        return 0.0, 0.0, 0.0
    share = m.moe_layers / m.layers / lo.tp
    expert = m.mlp_weights(m.ffn)
    flops = 2 * tokens * m.top_k * expert * share
    held = ACT_BYTES * m.layer_routed_params() / lo.ep * share
    return flops, held, ACT_BYTES * m.top_k * expert * share


ENGINES = ("torchtitan", "megatron")

EAGER_BYTES = {"norm": 36, "add": 6, "rope": 20, "glu": 10, "gelu": 4}
"""HBM bytes an eager elementwise op moves per element of the bf16 tensor it runs over, read
from the ops torchtitan's Llama block calls (pytorch/torchtitan@820504e:
torchtitan/models/llama3/model.py): `nn.RMSNorm`, torch's composite rms_norm, upcasts (read 2,
write 4), squares (4 + 4), means (4), scales (4 + 4), downcasts (4 + 2) and multiplies by the
weight (2 + 2): 36; a residual add reads two and writes one (6); `apply_rotary_emb` upcasts q
and k (6), multiplies them by the complex frequencies (8) and downcasts (6): 20; SwiGLU's silu
(2 + 2) and product (4 + 2): 10 an ffn element; GELU (2 + 2): 4. Measured on an H200
(`KERNELS.toml`, at its measured copy rate) the add and SwiGLU move what is counted, eager RoPE
about 28 (the count is a floor), and torch 2.11 runs `nn.RMSNorm` as one fused kernel (about
5); the 36 is the composite path, assumed for the torch of the December 2024 eager rows."""
FUSED_BYTES = {"norm": 4, "add": 6, "rope": 4, "glu": 6, "gelu": 4}
"""The same ops fused (torch.compile of a block, or Transformer Engine's kernels): each reads
its inputs and writes its output once (a compiled SwiGLU measures so on an H200, a compiled
RMSNorm about 5, `KERNELS.toml`)."""
COPY_BYTES = 4
"""torchtitan's copies around SDPA, per element of q (read 2, write 2): the attention output
made contiguous again, and, under grouped-query attention, `repeat_kv` writing k and v at q's
width. Transformer Engine's attention takes the heads it is given and needs neither."""
LOSS_BYTES = {"eager": 32, "fused": 6}
"""Per logit, forward and backward: torchtitan's `cross_entropy(pred.float())` upcasts (2 + 4),
log-softmaxes (4 + 4), then in the backward reads the gradient and the output and writes the
input's gradient (4 + 4 + 4) and downcasts it (4 + 2): 32; a fused vocab-parallel loss (Megatron
with Transformer Engine) reads the bf16 logits twice and writes their gradient once: 6."""
BACKWARD_ELEMENTWISE = 2.0
"""An elementwise op's backward moves twice its forward's bytes: it reads the output gradient
and the saved inputs, and writes an input gradient for each input."""
RECOMPUTE_ELEMENTWISE = {"none": 0.0, "selective": 1.0, "attention": 0.0, "full": 1.0}
"""Forward elementwise passes recomputed in the backward: torchtitan's op-level selective AC
saves matmul and attention outputs only, so every elementwise op runs again, as under full AC."""
FP8_CAST_BYTES, FP8_TRANSPOSE_BYTES = 5, 3
"""Dynamic tensorwise float8: a bf16 GEMM operand is read for its amax and again to be cast,
and its fp8 copy written (2 + 2 + 1); the transposed fp8 copy a weight-gradient GEMM needs reads
the bf16 input once more and writes one byte (2 + 1)."""
PERMUTE_BYTES = 6
"""A mixture of experts' token permutation, per element of a routed copy (top_k x hidden a
token): the dispatch gathers (read 2, write 2), the combine reads the experts' outputs (2)
before weighting and summing them."""


def elementwise_forward_bytes(m: ModelShape, lo: Layout, w: Workload) -> float:
    """HBM bytes one layer's elementwise ops move on one rank for one token in the forward: the
    two norms and residual adds (full hidden, cut over tp only under SP), RoPE on q and k, the
    MLP's activation (GLU or GELU, over the width a token passes through), torchtitan's copies
    around SDPA and a MoE layer's permutation; each op's bytes an element from `EAGER_BYTES`, or
    `FUSED_BYTES` under torch.compile or Megatron's engine."""
    fused = w.compile or w.engine == "megatron"
    cost = FUSED_BYTES if fused else EAGER_BYTES
    h = m.hidden / (lo.tp if lo.sp else 1)
    q, kv = m.attention_width / lo.tp, m.kv_heads * m.head_dim / lo.tp
    act = cost["glu"] if m.mlp_matrices == 3 else cost["gelu"]
    forward = 2 * (cost["norm"] + cost["add"]) * h + cost["rope"] * (q + kv)
    forward += act * m.mlp_width() / lo.tp
    if w.engine == "torchtitan":
        forward += COPY_BYTES * q * (2 if m.kv_heads < m.heads else 1)
    if m.experts:
        forward += PERMUTE_BYTES * m.top_k * h * m.moe_layers / m.layers
    return forward


def elementwise_bytes(m: ModelShape, lo: Layout, w: Workload) -> float:
    """`elementwise_forward_bytes` through a training step (forward, backward, recompute), and
    under fp8 the casts of every GEMM operand: the inputs of the attention block, of wo, of the
    MLP and of its down matmul, and the gradient of every GEMM output."""
    passes = 1 + BACKWARD_ELEMENTWISE + RECOMPUTE_ELEMENTWISE[w.ac]
    total = elementwise_forward_bytes(m, lo, w) * passes
    if w.dtype == "fp8":
        h = m.hidden / (lo.tp if lo.sp else 1)
        q, kv = m.attention_width / lo.tp, m.kv_heads * m.head_dim / lo.tp
        ffn = m.mlp_width() / lo.tp
        inputs = 2 * h + q + ffn
        grads = (q + 2 * kv) + (m.mlp_matrices - 1) * ffn + 2 * h
        total += FP8_CAST_BYTES * (inputs + grads) + FP8_TRANSPOSE_BYTES * inputs
    return total


def loss_bytes(m: ModelShape, lo: Layout, w: Workload) -> float:
    """HBM bytes of the loss on the last stage, per token: the logits (vocab / tp a rank)."""
    fused = "fused" if w.engine == "megatron" else "eager"
    return LOSS_BYTES[fused] * m.vocab / lo.tp


def _scaled(ledger_bytes: int, itemsize: int) -> float:
    return ledger_bytes * itemsize / LEDGER_ITEMSIZE


@functools.lru_cache(maxsize=1 << 16)  # keyed by layout: a search's worth
def fsdp_unit_bytes(numel: int, layout: Layout, inference: bool = False) -> dict[str, float]:
    """Lab 01's `traffic_formula` for one unit at real dtypes: bytes one rank sends per gather
    (bf16), per reduce-scatter and per replica all-reduce (fp32). Training shards over
    `fsdp_shard` (dp_shard x cp); inference over dp_shard alone (cp overlays the same ranks)."""
    shard = layout.dp_shard if inference else fsdp_shard(layout)
    world = shard * layout.dp_replicate
    ledger = traffic_formula("fsdp", [numel], world, layout.dp_replicate, not inference)
    gathers = 1 if inference else 2
    return {
        "all_gather": _scaled(ledger["all_gather_into_tensor"], PARAM_BYTES) / gathers,
        "reduce_scatter": _scaled(ledger["reduce_scatter_tensor"], REDUCE_BYTES),
        "all_reduce": _scaled(ledger.get("all_reduce", 0), REDUCE_BYTES),
    }


@functools.lru_cache(maxsize=1 << 12)  # keyed by what it reads: a search's few hundred
def _train_unit_bytes(numel: int, shard: int, replicate: int) -> dict[str, float]:
    """`fsdp_unit_bytes` of a training layout that shards over `shard` (dp_shard x cp) ranks
    and replicates `replicate` times: all it reads of the layout."""
    return fsdp_unit_bytes(numel, Layout(dp_shard=shard, dp_replicate=replicate))


def prefetched(comm: float, compute: float, units: int) -> float:
    """Exposed time of `units` equal transfers, each prefetched behind one unit of compute:
    the first cannot hide, each later one shows only what exceeds its neighbour's compute."""
    return comm + (units - 1) * max(0.0, comm - compute) if units else 0.0


def ring_exposed(hop_bytes: float, hop_compute: float, cp: int, link: Link) -> float:
    """cp - 1 hops, each hidden behind the block of attention computed meanwhile."""
    hop = link.time(hop_bytes, 1)
    return (cp - 1) * max(0.0, hop - hop_compute)


# ------------------------------------------------------------------ training
def layer_forward_flops(m: ModelShape, lo: Layout, w: Workload) -> tuple[float, float]:
    """(GEMM, causal attention) forward FLOPs of one layer on one rank: `micro_batch` sequences
    of `seq` tokens cut over cp x tp; a plain ring's busiest rank does (2cp - 1) / cp of the
    even share of attention."""
    split = lo.cp * lo.tp
    imbalance = (2 * lo.cp - 1) / lo.cp if lo.cp_kind == "ring" and lo.cp > 1 else 1.0
    gemm = 2 * m.matmul_per_layer * w.seq * w.micro_batch / split
    attn = 2 * w.seq * w.seq * m.attention_width * w.micro_batch / split * imbalance
    return gemm, attn


def head_forward_flops(m: ModelShape, lo: Layout, w: Workload) -> float:
    """The output layer's forward FLOPs on one rank of the last stage: the logits of
    `micro_batch` sequences of `seq` tokens, cut over cp x tp."""
    return 2 * m.vocab * m.hidden * w.seq * w.micro_batch / (lo.cp * lo.tp)


def stage_split(m: ModelShape, lo: Layout, w: Workload) -> tuple[int, int]:
    """(layers on the busiest of the first pp - 1 stages, layers on the last stage).

    The output layer and the loss run on the last stage only, which paces the pipeline if it
    also holds its even share of the layers. Megatron lets a run move layers off it
    (`num_layers_in_last_pipeline_stage`, or `account_for_loss_in_pipeline_split`, which counts
    the output layer and loss as a layer; NVIDIA/Megatron-LM@d98e8a6:
    megatron/core/transformer/transformer_block.py); torchtitan weighs them the same way
    (`pipeline_parallel_last_stage_less_layers`, pytorch/torchtitan@b5bcd76:
    torchtitan/distributed/pipeline_parallel.py). The planner picks the last stage's share (at
    least one layer) whose training FLOPs, the head's included, best balance the busiest other
    stage's; the embedding's lookup on the first stage does no matmul and is not weighed."""
    if lo.pp == 1:
        return 0, m.layers
    # tp and the micro-batch scale a layer and the head alike: the split does not depend on them
    return _balanced_split(m, lo.pp, lo.cp, lo.cp_kind, w.seq, w.ac)


@functools.lru_cache(maxsize=1 << 16)  # keyed by plain numbers: a search asks a million times
def _balanced_split(
    m: ModelShape, pp: int, cp: int, cp_kind: str, seq: int, ac: str
) -> tuple[int, int]:
    lo, w = Layout(cp=cp, cp_kind=cp_kind), Workload("train", seq=seq, ac=ac)
    gemm, attn = layer_forward_flops(m, lo, w)
    re_gemm, re_attn = RECOMPUTE[w.ac]
    layer = gemm * (1 + BACKWARD_GEMM + re_gemm)
    layer += attn * (1 + re_attn + BACKWARD_ATTENTION / BACKWARD_ATTENTION_SPEED)
    head = head_forward_flops(m, lo, w) * (1 + BACKWARD_GEMM)
    others = pp - 1

    def pace(last: int) -> tuple[float, int]:
        busiest = -(-(m.layers - last) // others)
        return max(busiest * layer, last * layer + head), -last

    last = min(range(1, m.layers - others + 1), key=pace)
    return -(-(m.layers - last) // others), last


def block_forward_seconds(
    m: ModelShape, hw: Hardware, lo: Layout, w: Workload, eff: dict[str, float]
) -> float:
    """One block's forward on one rank, GEMMs (at the workload's dtype), attention (bf16) and
    its elementwise ops: the work FSDP's prefetched all-gather of the next block hides behind in
    `predict_train`."""
    gemm, attn = layer_forward_flops(m, lo, w)
    tokens = w.micro_batch * w.seq / lo.cp
    elementwise = tokens * elementwise_forward_bytes(m, lo, w) / hw.hbm_bandwidth
    return (
        compute_time(gemm, hw, w.dtype, eff["gemm"])
        + compute_time(attn, hw, "bf16", eff["attention"])
        + elementwise
    )


@functools.cache
def ring_backward_bytes(m: ModelShape, tp: int, seq: int, cp: int) -> dict[str, float]:
    """A ring's backward traffic at the dtypes engines send: K and V again in bf16 (half of
    `ring_bytes`' backward), and dK, dV home in fp32, the other half scaled to REDUCE_BYTES
    (zhuzilin/ring-flash-attention@8996282 sends `dk_buffer.to(torch.float32)`; torch's CP
    rotates its fp32 accumulators). `paralab.cp.costs.ring_bytes` counts one dtype for both."""
    kv = ring_bytes(shard_bytes(1, m.kv_heads // tp, seq, m.head_dim, cp, ACT_BYTES), cp)
    grads = ring_bytes(shard_bytes(1, m.kv_heads // tp, seq, m.head_dim, cp, REDUCE_BYTES), cp)
    return {"kv": kv["backward"] - kv["forward"], "dkv": grads["backward"] - grads["forward"]}


def stage_compute(
    m: ModelShape, hw: Hardware, lo: Layout, w: Workload, eff: dict[str, float]
) -> tuple[dict[str, float], int, float, float]:
    """The busiest pipeline stage's compute in a step on one rank: the items "compute: GEMM",
    "compute: attention" and "elementwise (HBM)", the layers the stage runs, one layer's
    seconds and one block's forward (what FSDP's prefetches hide behind). The busiest stage is
    the last (its layers, the head and the loss) or another. It reads tp, cp (and its kind),
    pp, SP, ep and the micro-batch count of the layout: a search's layouts that differ in dp,
    async TP or the schedule alone share one answer."""
    return _stage_compute(
        m,
        hw,
        w,
        eff["gemm"],
        eff["attention"],
        lo.tp,
        lo.cp,
        lo.cp_kind,
        lo.pp,
        lo.sp,
        lo.ep,
        microbatch_count(lo, w.micro_batch),
    )


def microbatch_count(lo: Layout, sequences: int) -> int:
    """Micro-batches a dp rank's `sequences` run as in one pass: under a pipeline the layout's
    count, by default as many as stages or, with more sequences, one a sequence; else one."""
    return (lo.microbatches or max(lo.pp, sequences)) if lo.pp > 1 else 1


@functools.lru_cache(maxsize=1 << 14)  # keyed by what it reads: a search's few thousand
def _stage_compute(
    m: ModelShape,
    hw: Hardware,
    w: Workload,
    gemm_efficiency: float,
    attention_efficiency: float,
    tp: int,
    cp: int,
    cp_kind: str,
    pp: int,
    sp: bool,
    ep: int,
    microbatches: int,
) -> tuple[dict[str, float], int, float, float]:
    lo = Layout(tp=tp, cp=cp, cp_kind=cp_kind, pp=pp, sp=sp, ep=ep)
    eff = {"gemm": gemm_efficiency, "attention": attention_efficiency}
    seq, b = w.seq, w.micro_batch
    re_gemm, re_attn = RECOMPUTE[w.ac]
    first_layers, last_layers = stage_split(m, lo, w)
    gemm_fwd_layer, attn_fwd_layer = layer_forward_flops(m, lo, w)
    head_fwd = head_forward_flops(m, lo, w)
    passes = 1 + BACKWARD_GEMM + re_gemm
    gemm_layer = gemm_fwd_layer * passes
    attn_layer = attn_fwd_layer * (1 + re_attn + BACKWARD_ATTENTION / BACKWARD_ATTENTION_SPEED)
    tokens_local = b * seq / lo.cp
    # each micro-batch's passes read the weights again
    routed_fwd, held, counted = routed_expert_pass(m, lo, tokens_local / microbatches)
    dense_bytes = gemm_pass_bytes(m, lo, tokens_local / microbatches) - counted
    routed = routed_fwd * passes * microbatches
    reads = passes * microbatches
    t_gemm_layer = compute_time(gemm_layer - routed, hw, w.dtype, eff["gemm"], dense_bytes * reads)
    t_gemm_layer += compute_time(routed, hw, w.dtype, eff["gemm"], held * reads)
    t_attn_layer = compute_time(attn_layer, hw, "bf16", eff["attention"])
    t_elementwise_layer = tokens_local * elementwise_bytes(m, lo, w) / hw.hbm_bandwidth
    t_head = compute_time(head_fwd * (1 + BACKWARD_GEMM), hw, "bf16", eff["gemm"])
    t_loss = tokens_local * loss_bytes(m, lo, w) / hw.hbm_bandwidth
    t_layer = t_gemm_layer + t_attn_layer + t_elementwise_layer
    last_paces = last_layers * t_layer + t_head + t_loss >= first_layers * t_layer
    layers = last_layers if last_paces else first_layers
    items = {
        "compute: GEMM": layers * t_gemm_layer + (t_head if last_paces else 0.0),
        "compute: attention": layers * t_attn_layer,
        "elementwise (HBM)": layers * t_elementwise_layer + (t_loss if last_paces else 0.0),
    }
    return items, layers, t_layer, block_forward_seconds(m, hw, lo, w, eff)


def predict_train(
    m: ModelShape, hw: Hardware, layout: Layout, w: Workload, eff: dict[str, float]
) -> Prediction:
    """One optimizer step on every GPU: `micro_batch` sequences of `seq` tokens per dp rank."""
    lo, seq, b = layout, w.seq, w.micro_batch
    re_gemm = RECOMPUTE[w.ac][0]
    compute, layers, t_block, t_fwd_block = stage_compute(m, hw, lo, w, eff)
    s = fsdp_shard(lo)
    local_params = m.params / (s * lo.tp * lo.pp)
    t_optim = local_params * ADAM_BYTES_PER_PARAM / hw.hbm_bandwidth

    out = {**compute, "optimizer (HBM)": t_optim}
    if s * lo.dp_replicate > 1:
        out["exposed: dp (FSDP)"] = _exposed_fsdp(
            m, hw, lo.dp_shard, lo.dp_replicate, lo.cp, lo.tp, lo.ep, layers, t_fwd_block, t_block
        )
    if lo.cp > 1:
        cp = _layer_cp(m, hw, seq, w.ac, lo.tp, lo.cp, lo.cp_kind, lo.cp_rotate, eff["attention"])
        out["exposed: cp"] = layers * b * cp
    if lo.ep > 1:
        tokens = b * seq / lo.cp / (lo.tp if lo.sp else 1)
        sent = tokens * m.top_k * m.hidden * ACT_BYTES * (lo.ep - 1) / lo.ep
        calls = 2 * (2 + re_gemm)  # dispatch and combine: forward, backward, recompute
        moe = min(layers, m.moe_layers)  # the dense first layers route nothing
        out["exposed: ep"] = moe * calls * link_for(hw, lo.tp, lo.ep).time(sent, lo.ep - 1)
    if lo.tp > 1:
        exposed = _layer_tp(m, hw, w, lo.tp, lo.cp, lo.sp, lo.async_tp, eff["gemm"])
        if exposed:
            out["exposed: tp"] = layers * exposed
    busy = sum(out.values())
    if lo.pp > 1:
        mb = microbatch_count(lo, b)
        bubble = pp_bubble(lo.schedule, lo.pp, mb, lo.virtual)
        out["pp bubble"] = busy * bubble / (1 - bubble)
        boundary = boundary_bytes(b // mb or 1, seq // lo.cp, m.hidden // lo.tp, ACT_BYTES)
        forward = layers * t_fwd_block / mb  # F: one micro-batch's forward on the stage
        send = train_links(hw, lo)["pp"].time(boundary, 1)
        out["exposed: pp sends"] = forward * pp_send_stretch(lo, mb, send / forward)
    seconds = sum(out.values())
    tokens = b * seq * lo.dp_shard * lo.dp_replicate
    rate = tokens / (seconds * lo.world)
    model_flops = rate * flops_per_token(m, seq)
    return Prediction(
        seconds,
        out,
        tokens_per_s_per_gpu=rate,
        tflops_per_gpu=model_flops / 1e12,
        mfu=model_flops / hw.peak_bf16,
    )


@functools.lru_cache(maxsize=1 << 16)  # keyed by what it reads: a search's tens of thousands
def _exposed_fsdp(
    m: ModelShape,
    hw: Hardware,
    dp_shard: int,
    dp_replicate: int,
    cp: int,
    tp: int,
    ep: int,
    layers: int,
    t_fwd_block: float,
    t_block: float,
) -> float:
    """FSDP's exposed seconds a step on a stage of `layers` blocks: each block's all-gather
    prefetched behind a block's forward, and again with its reduce-scatter (and HSDP's
    all-reduce) behind a block's backward; the root's once. Layouts that differ in the kind
    of cp, async TP or the schedule share it."""
    lo = Layout(dp_shard=dp_shard, dp_replicate=dp_replicate, cp=cp, tp=tp, ep=ep)
    links, s = train_links(hw, lo), fsdp_shard(lo)
    link = links["dp_shard_cp"] if s > 1 else links["dp_replicate"]
    unit = _train_unit_bytes(fsdp_block_params(m, lo) // lo.tp, s, lo.dp_replicate)
    root = _train_unit_bytes(m.root_params() // lo.tp, s, lo.dp_replicate)
    ag = link.time(unit["all_gather"], s - 1)
    rs = link.time(unit["reduce_scatter"], s - 1)
    ar = links["dp_replicate"].time(unit["all_reduce"], 2 * (lo.dp_replicate - 1))
    t_bwd_block = t_block - t_fwd_block
    fwd = prefetched(ag, t_fwd_block, layers)
    bwd = prefetched(ag + rs + ar, t_bwd_block, layers)
    root_t = link.time(root["all_gather"] + root["reduce_scatter"], 2 * (s - 1))
    return fwd + bwd + root_t


@functools.lru_cache(maxsize=1 << 14)  # keyed by what it reads: a search's few thousand
def _layer_tp(
    m: ModelShape,
    hw: Hardware,
    w: Workload,
    tp: int,
    cp: int,
    sp: bool,
    async_tp: bool,
    gemm_efficiency: float,
) -> float:
    """`_train_tp` of the layouts with these degrees: all it reads of a layout."""
    lo = Layout(tp=tp, cp=cp, sp=sp, async_tp=async_tp)
    return _train_tp(m, hw, lo, w, train_links(hw, lo)["tp"], {"gemm": gemm_efficiency})


def _train_tp(
    m: ModelShape, hw: Hardware, lo: Layout, w: Workload, link: Link, eff: dict[str, float]
) -> float:
    """Exposed TP time of one layer a step: lab 07's block bytes per phase
    (`paralab.tp.costs.block_bytes`), the forward's collectives twice under full AC (its
    recompute replays them). Megatron's TP communication overlap (userbuffers) pipelines both
    passes: nothing shows. torchtitan's async TP is `_fused_tp_collectives`."""
    if lo.async_tp and w.engine == "megatron":
        return 0.0
    act = w.micro_batch * (w.seq // lo.cp) * m.hidden * ACT_BYTES
    repeats = {"forward": 2 if w.ac == "full" else 1, "backward": 1}
    exposed = 0.0
    for (phase, op), (calls, sent) in block_bytes(act, lo.tp, sequence_parallel=lo.sp).items():
        steps = (2 if op == "all_reduce" else 1) * (lo.tp - 1)
        if lo.async_tp and op != "all_reduce":
            fused, calls, sent = _fused_tp_collectives(
                m, hw, lo, w, link, eff, phase, op, calls, sent
            )
            exposed += repeats[phase] * fused
        if calls:
            exposed += repeats[phase] * link.time(sent, steps, calls)
    return exposed


def _fused_tp_collectives(
    m: ModelShape,
    hw: Hardware,
    lo: Layout,
    w: Workload,
    link: Link,
    eff: dict[str, float],
    phase: str,
    op: str,
    calls: int,
    sent: float,
) -> tuple[float, int, float]:
    """torchtitan's async TP: torch's `micro_pipeline_tp_pass` (torch 2.13,
    torch/_inductor/fx_passes/micro_pipeline_tp.py), run by Inductor on every compiled graph,
    the backward's too, fuses an all-gather into the matmul whose first operand it gathers
    (`fuse_all_gather_matmul`) and a reduce-scatter into the matmul that produces it
    (`fuse_matmul_reduce_scatter`); each then shows only what its transfer takes beyond its
    matmul. With SP a block's gathers feed q, k, v and the MLP's up matmuls and its
    reduce-scatters follow o and the down matmul; in the backward the gathered output
    gradients feed o's and the down matmul's input-gradient matmuls, and the reduce-scatters
    follow q, k, v's and the up matmuls' input gradients. The backward's other two gathers, of
    the inputs the weight gradients need, are contracted over the gathered dimension: no
    pattern matches them and they stay exposed. Returns the fused collectives' exposed time
    and the calls and bytes left unfused."""
    tokens = w.micro_batch * w.seq / lo.cp
    o = m.hidden * m.attention_width
    front = (attention_matmul(m) - o, (m.mlp_matrices - 1) * m.hidden * m.mlp_width())
    back = (o, m.hidden * m.mlp_width())  # o and the down matmul
    gathers_feed_front = phase == "forward"
    weights = front if (op == "all_gather_single") == gathers_feed_front else back
    fused = len(weights)  # one collective of each kind a sub-block (attention, MLP)
    one = sent / calls
    exposed = sum(
        max(
            0.0,
            link.time(one, lo.tp - 1)
            - compute_time(2 * tokens * wt / lo.tp, hw, w.dtype, eff["gemm"]),
        )
        for wt in weights
    )
    return exposed, calls - fused, one * (calls - fused)


def pp_send_stretch(lo: Layout, microbatches: int, latency: float) -> float:
    """How much a step's sends lengthen it, in units of one micro-batch's forward: lab 08's
    `paralab.pp.costs.exposed_link_formula` per schedule (1F1B pays on every micro-batch,
    interleaved and ZB-H1 hide a send shorter than their slack). Where a send outlasts that
    slack the closed form does not hold; there every micro-batch pays, as under 1F1B."""
    try:
        return exposed_link_formula(lo.schedule, lo.pp, microbatches, latency, lo.virtual)
    except ValueError:
        return exposed_link_formula("1f1b", lo.pp, microbatches, latency)


SIMULATED_ACTIONS = 128
"""Up to this many (stage, micro-batch) pairs the bubble is `paralab.pp.simulate`'s; beyond,
the closed form `paralab.pp.costs.bubble_formula` (equal to the simulator on every schedule
lab 08 tests), because the simulator takes seconds at pp 64 and the planner asks thousands."""


@functools.cache
def pp_bubble(schedule: str, pp: int, microbatches: int, virtual: int = 1) -> float:
    """The idle fraction of a pipeline schedule's time."""
    if pp * microbatches * virtual <= SIMULATED_ACTIONS:
        return simulate(schedule, pp, microbatches, virtual).bubble_fraction
    return bubble_formula(schedule, pp, microbatches, virtual)


def _q_and_kv_shards(m: ModelShape, tp: int, seq: int, cp: int) -> tuple[int, int]:
    """One rank's bf16 shard of q (its q heads) and of k or v (its K/V heads): under
    grouped-query attention the Ulysses all-to-alls of k and v move kv_heads / heads of q's."""
    return (
        shard_bytes(1, m.heads // tp, seq, m.head_dim, cp, ACT_BYTES),
        shard_bytes(1, m.kv_heads // tp, seq, m.head_dim, cp, ACT_BYTES),
    )


@functools.lru_cache(maxsize=1 << 14)  # keyed by what it reads: a search's few thousand
def _layer_cp(
    m: ModelShape,
    hw: Hardware,
    seq: int,
    ac: str,
    tp: int,
    cp: int,
    cp_kind: str,
    cp_rotate: str,
    attention_efficiency: float,
) -> float:
    """`_train_cp` of the layouts and workloads with these: all it reads of them."""
    lo = Layout(tp=tp, cp=cp, cp_kind=cp_kind, cp_rotate=cp_rotate)
    w = Workload("train", seq, ac=ac)
    return _train_cp(m, hw, lo, w, train_links(hw, lo)["cp"], {"attention": attention_efficiency})


def _train_cp(
    m: ModelShape, hw: Hardware, lo: Layout, w: Workload, link: Link, eff: dict[str, float]
) -> float:
    """Exposed cp time of one layer and one sequence (forward, backward, recompute).

    Ring kinds as torch's context parallel runs them under torchtitan: with `cp_rotate`
    "allgather" (the default) each pass all-gathers every K/V shard in one collective, issued
    before the first sub-SDPA (the diagonal block) and waited after it, so only that block hides
    it; the backward's fp32 dK, dV still travel a hop at a time (torch's `dkv_rotater` is
    all-to-all), each behind a hop's backward block. With "alltoall" K/V move hop by hop too.
    Either way each of the cp - 1 later sub-SDPAs' partial output (and in the backward its
    gradients) is merged into the running one between kernels (`ring_merge_time`, the
    ring-flash-attention count a floor for torch's eager merge)."""
    cp, seq = lo.cp, w.seq
    recompute = RECOMPUTE[w.ac][1]
    if lo.cp_kind == "ulysses":
        sent = ulysses_gqa_bytes(*_q_and_kv_shards(m, lo.tp, seq, cp), cp)
        one = link.time(sent["forward"], cp - 1, calls=4)
        return one * (2 + recompute)
    s = shard_bytes(1, m.kv_heads // lo.tp, seq, m.head_dim, cp, ACT_BYTES)
    kv = ring_bytes(s, cp)["forward"]
    dkv = ring_backward_bytes(m, lo.tp, seq, cp)["dkv"]
    attn_hop = 2 * seq * seq * m.attention_width / lo.tp / cp / cp
    hop_c = compute_time(attn_hop, hw, "bf16", eff["attention"])
    bwd_c = hop_c * BACKWARD_ATTENTION / BACKWARD_ATTENTION_SPEED
    q_elements = seq / cp * m.attention_width / lo.tp
    merges = ring_merge_time(q_elements, cp - 1, hw, "forward") * (1 + recompute)
    merges += ring_merge_time(q_elements, cp - 1, hw, "backward")
    if lo.cp_rotate == "allgather":
        gather = link.time(kv, cp - 1)
        fwd = max(0.0, gather - hop_c)
        bwd = max(0.0, gather - bwd_c) + ring_exposed(dkv / (cp - 1), bwd_c, cp, link)
    else:
        fwd = ring_exposed(kv / (cp - 1), hop_c, cp, link)
        bwd = ring_exposed((kv + dkv) / (cp - 1), bwd_c, cp, link)
    return fwd * (1 + recompute) + bwd + merges


# ------------------------------------------------------------------ diffusion inference
@functools.cache
def inference_links(hw: Hardware, layout: Layout) -> dict[str, Link]:
    """Links of the inference axes from `ParallelDims.mesh_layouts`: overlay (rest, cfgp, cp)
    with cp innermost; dp (dp_replicate, dp_shard) with dp_shard innermost; lb (lb_rest, lb)."""
    from paralab.parallel_dims import ParallelDims

    pd = ParallelDims(
        world_size=inference_world(layout),
        dp_shard=layout.dp_shard,
        cp=layout.cp,
        cfgp=layout.cfgp,
        lb=layout.lb,
        enable_inference_mode=True,
    )
    out = {}
    for dims, names in pd.mesh_layouts().values():
        stride = 1
        for size, name in reversed(list(zip(dims, names))):
            out[name] = link_for(hw, stride, size)
            stride *= size
    return out


def inference_world(layout: Layout) -> int:
    """Overlay axes reuse the dp ranks: the world is dp_shard x dp_replicate, at least cp x cfgp."""
    return max(layout.dp_shard * layout.dp_replicate, layout.cp * layout.cfgp)


def forward_flops(m: ModelShape, tokens: int) -> tuple[float, float]:
    """(GEMM, attention) FLOPs of one denoiser forward over `tokens` tokens (full attention)."""
    gemm = 2 * m.matmul_per_layer * tokens * m.layers
    attn = 4 * tokens * tokens * m.attention_width * m.layers
    attn += 4 * tokens * m.cross_tokens * m.attention_width * m.layers
    return gemm, attn


VAE_ITEM = "VAE: encode and decode (each rank, whole video)"


def vae_seconds(m: ModelShape, hw: Hardware, w: Workload, eff: dict[str, float]) -> float:
    """The autoencoder's passes over the whole video at the fitted convolution share of the bf16
    peak (`FITTED[...]["conv"]`): no rank splits them, so they do not shrink with the GPUs."""
    frames, height, width = w.video
    if not m.autoencoder or not frames:
        return 0.0
    encode, decode = AUTOENCODERS[m.autoencoder](frames, height * width)
    n_encode, n_decode = m.vae_passes
    return compute_time(n_encode * encode + n_decode * decode, hw, "bf16", eff["conv"])


def predict_vae(
    m: ModelShape, hw: Hardware, layout: Layout, w: Workload, eff: dict[str, float]
) -> Prediction:
    """The autoencoder alone: `m.vae_passes` over `w.video` on one GPU."""
    seconds = vae_seconds(m, hw, w, eff)
    return Prediction(seconds, {VAE_ITEM: seconds})


def predict_diffusion(
    m: ModelShape, hw: Hardware, layout: Layout, w: Workload, eff: dict[str, float]
) -> Prediction:
    """One video: `steps` denoising steps, `branches / cfgp` forwards a step on each rank, each
    forward's work cut over cp (heads for Ulysses, tokens for the ring)."""
    lo, n = layout, w.seq
    cp = lo.cp
    links = inference_links(hw, lo)
    forwards = w.steps * max(1, m.branches // lo.cfgp)
    gemm, attn = forward_flops(m, n)
    t_gemm = forwards * compute_time(gemm / cp, hw, w.dtype, eff["gemm"])
    t_attn = forwards * compute_time(attn / cp, hw, "bf16", eff["attention"])
    out = {"compute: GEMM": t_gemm, "compute: attention": t_attn}
    t_block = (t_gemm + t_attn) / forwards / m.layers
    if cp > 1:
        out["exposed: cp"] = forwards * m.layers * _inference_cp(m, hw, lo, n, links["cp"], eff)
    if lo.cfgp > 1:
        channels = m.latent_channels * m.patch[0] * m.patch[1] * m.patch[2]
        swap = cfgp_bytes((1, n - m.text_tokens, channels), w.steps, cfgp_rank=1, cp=cp)
        sent = _scaled(swap["cfgp swap"], ACT_BYTES)
        out["exposed: cfgp swap"] = w.steps * links["cfgp"].time(sent / w.steps, 1)
    if lo.dp_shard > 1:
        unit = fsdp_unit_bytes(m.block_params(), lo, inference=True)
        ag = links["dp_shard"].time(unit["all_gather"], lo.dp_shard - 1)
        out["exposed: dp_shard all-gather"] = forwards * prefetched(ag, t_block, m.layers)
    if vae := vae_seconds(m, hw, w, eff):
        out[VAE_ITEM] = vae
    seconds = sum(out.values())
    videos = max(1, inference_world(lo) // (cp * lo.cfgp))
    return Prediction(seconds, out, notes=[f"{videos} video(s) at once"])


def _inference_cp(
    m: ModelShape, hw: Hardware, lo: Layout, n: int, link: Link, eff: dict[str, float]
) -> float:
    """Exposed cp time of one layer of one forward: all-to-alls exposed, ring hops hidden."""
    cp = lo.cp
    s = shard_bytes(1, m.heads, n, m.head_dim, cp, ACT_BYTES)
    if lo.cp_kind == "ulysses" and not lo.ulysses:
        sent = ulysses_gqa_bytes(*_q_and_kv_shards(m, 1, n, cp), cp)
        return link.time(sent["forward"], cp - 1, calls=4)
    u = lo.ulysses if lo.cp_kind == "ulysses" or lo.ulysses else 1
    r = cp // u
    sent = usp_bytes(s, u, r)
    a2a = link.time(sent["all_to_all"], u - 1, calls=4) if u > 1 else 0.0
    if r == 1:
        return a2a
    attn_hop = 4 * n * n * m.attention_width / cp / r
    hop_c = compute_time(attn_hop, hw, "bf16", eff["attention"])
    return a2a + ring_exposed(sent["ring"] / (r - 1), hop_c, r, link)


# ------------------------------------------------------------------ attention alone
def ring_critical_blocks(cp_kind: str, cp: int) -> float:
    """Causal attention on a ring of `cp` ranks: the blocks on the critical path, in units of one
    full (unmasked) local block, the ranks in lockstep (each hop waits for its K/V).

    Step 0 is every rank's own causal diagonal, half a block. After it, zhuzilin/
    ring-flash-attention@8996282 computes, per step:
    - `ring` (contiguous shards): rank r a full block while the K/V come from a rank before it,
      nothing after; the last rank works every step, so cp - 1 full blocks follow;
    - `zigzag` (chunks i and 2cp - 1 - i): every rank half a block every step;
    - `stripe` (tokens r, r + cp, ...): every rank a causal block (half) every step.
    The ideal, the causal work spread evenly, is cp / 2 blocks: a plain ring takes
    (2cp - 1) / cp times that, zigzag and stripe exactly that."""
    if cp_kind == "ring":
        return 0.5 + (cp - 1)
    if cp_kind in ("zigzag", "stripe"):
        return cp / 2
    raise ValueError(f"ring attention kind must be ring, zigzag or stripe, got {cp_kind!r}")


MERGE_BYTES = {"forward": 10, "stripe_forward": 18, "backward": 15}
"""HBM bytes per element of q (tokens x heads x head_dim) that one ring hop's bookkeeping moves,
counted from ring-flash-attention@8996282:ring_flash_attn/utils.py and the three kernels' loops:
forward, `_update_out_and_lse` (a TorchScript function, its elementwise chain fused into one
pass) reads the fp32 out (4) and the bf16 block out (2) and writes the fp32 out (4); stripe's
hops from a later rank merge a slice `out[slice_]` and write it back (+ 4 read, 4 written);
backward, `dq += dq_buffer` reads the fp32 dq (4) and the bf16 block gradient (2) and writes
the fp32 dq (4): 10, and dk, dv the same on K/V's quarter of q's size under 8 of 32 heads
(2 x 10 / 4 = 5)."""


def ring_merge_time(q_elements: float, hops: int, hw: Hardware, pass_: str) -> float:
    """The per-hop merge of a ring's partial outputs (or gradients), bytes over HBM bandwidth:
    it runs between the hop's attention kernels, on the same stream, so it is not hidden."""
    return hops * q_elements * MERGE_BYTES[pass_] / hw.hbm_bandwidth


def predict_attention(
    m: ModelShape, hw: Hardware, layout: Layout, w: Workload, eff: dict[str, float]
) -> Prediction:
    """ring-flash-attention's efficiency: cp x (one GPU's causal attention on its `seq` tokens)
    over the ring's time on cp x seq tokens, forward (+ backward unless `forward_only`).

    The ring's time: the critical path's blocks (`ring_critical_blocks`), each hop's merge
    (`ring_merge_time`), and whatever of each hop's K/V transfer its block does not hide."""
    cp, seq, kind = layout.cp, w.seq, layout.cp_kind
    bwd = 0.0 if w.forward_only else BACKWARD_ATTENTION / BACKWARD_ATTENTION_SPEED
    full_fwd = 4 * seq * seq * m.attention_width  # one full local block: q and k of seq tokens
    per_block = compute_time(full_fwd * (1 + bwd), hw, "bf16", eff["attention"])
    ideal = cp * per_block / 2  # one GPU's causal call, cp times
    out = {"compute: attention": ideal}
    if cp > 1:
        out["ring imbalance"] = (ring_critical_blocks(kind, cp) - cp / 2) * per_block
        q_elements = seq * m.attention_width
        fwd_pass = "stripe_forward" if kind == "stripe" else "forward"
        merge = ring_merge_time(q_elements, cp - 1, hw, fwd_pass)
        if not w.forward_only:
            merge += ring_merge_time(q_elements, cp - 1, hw, "backward")
        out["ring merges (HBM)"] = merge
        link = train_links(hw, layout)["cp"]
        sent = ring_bytes(shard_bytes(1, m.kv_heads, seq * cp, m.head_dim, cp, ACT_BYTES), cp)
        hop_block = per_block / (1 + bwd) / 2  # every rank computes at least half a block a hop
        exposed = ring_exposed(sent["forward"] / (cp - 1), hop_block, cp, link)
        if not w.forward_only:
            back = ring_backward_bytes(m, 1, seq * cp, cp)  # bf16 K, V and fp32 dK, dV a hop
            hop = (back["kv"] + back["dkv"]) / (cp - 1)
            exposed += ring_exposed(hop, hop_block * bwd, cp, link)
        out["exposed: cp"] = exposed
    seconds = sum(out.values())
    return Prediction(seconds, out, efficiency=ideal / seconds)


PREDICTORS = {
    "train": predict_train,
    "diffusion": predict_diffusion,
    "attention": predict_attention,
    "vae": predict_vae,
}


def predict(
    m: ModelShape, hw: Hardware, layout: Layout, w: Workload, eff: dict[str, float]
) -> Prediction:
    if w.kind not in PREDICTORS:
        raise ValueError(f"workload kind must be one of {sorted(PREDICTORS)}, got {w.kind!r}")
    return PREDICTORS[w.kind](m, hw, layout, w, eff)
