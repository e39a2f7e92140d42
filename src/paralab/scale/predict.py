"""Seconds from FLOPs and bytes: a roofline for compute, alpha-beta for every collective.

Compute: FLOPs / (peak x efficiency), with one fitted efficiency per hardware and kernel class
(GEMM, attention: `fit.FITTED`). Communication: the bytes one rank sends come from the labs'
own `costs.py` (evaluated here at real sizes and dtypes), the time of a collective is
alpha x steps + bytes / busbw on the link its group crosses. Overlap, as the engines do it:

| traffic | how it overlaps |
|---|---|
| FSDP all-gather / reduce-scatter | prefetched: hidden behind the neighbouring block's compute, the excess shows |
| ring attention hop | hidden behind the block of attention it feeds, the excess shows |
| Ulysses all-to-all, TP all-reduce (no async TP), cfgp swap | exposed |
| PP | the bubble of `paralab.pp.simulate`'s schedule, plus the fill and drain sends |
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paralab.cfgp.costs import cfgp_bytes
from paralab.cp.costs import ring_bytes, shard_bytes, ulysses_gqa_bytes, usp_bytes
from paralab.fsdp.costs import traffic_formula
from paralab.pp.clock import simulate
from paralab.pp.costs import boundary_bytes
from paralab.scale.hardware import BASE_LATENCY, STEP_LATENCY, Hardware
from paralab.scale.models import ModelShape
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
"""Flash attention's backward runs at 79 % of its forward's FLOP rate (causal, head dim 128,
8K tokens: "FA Python fwd: 0.775ms, 1418.1 TFLOPS", "bwd: 2.459ms, 1117.9 TFLOPS",
Dao-AILab/flash-attention#2280): a measured ratio, not a fit."""
RECOMPUTE = {"none": (0.0, 0.0), "selective": (0.5, 0.0), "full": (1.0, 1.0)}
"""(GEMM, attention) forward FLOPs recomputed in the backward: torchtitan's op-level selective
AC saves attention and every other matmul output; full AC recomputes the whole forward."""
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

    @property
    def world(self) -> int:
        return self.dp_shard * self.dp_replicate * self.cp * self.tp * self.pp * self.cfgp


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
    forward_only: bool = False
    """For "attention": the forward alone (ring-flash-attention's "fwd only" rows)."""


@dataclass(frozen=True)
class Link:
    name: str
    busbw: float
    step_latency: float

    def time(self, bytes_sent: float, steps: int, calls: int = 1) -> float:
        """alpha x steps + bytes / busbw, NCCL's model for `calls` collectives of `steps` steps."""
        return calls * (BASE_LATENCY + steps * self.step_latency) + bytes_sent / self.busbw


def link_for(hw: Hardware, stride: int, size: int) -> Link:
    """The link a group of `size` ranks, `stride` apart in rank order, crosses.

    Ranks fill nodes in order, so the group stays in one node when stride x size <= node size;
    a bridged pair of NVL cards (stride 1, size 2) uses its NVLink bridge."""
    if stride * size > hw.gpus_per_node:
        return Link("network", hw.inter_busbw, STEP_LATENCY["net"])
    if hw.pair_busbw and size == 2 and stride == 1:
        return Link("nvlink bridge", hw.pair_busbw, STEP_LATENCY["nvlink"])
    return Link(hw.intra_link, hw.intra_busbw, STEP_LATENCY[hw.intra_link])


def train_links(hw: Hardware, layout: Layout) -> dict[str, Link]:
    """Each training axis' link, from torchtitan's mesh order (pp, dp_replicate, dp_shard, cp, tp)."""
    out, stride = {}, 1
    for axis in reversed(TRAIN_MESH):
        size = getattr(layout, axis)
        out[axis] = link_for(hw, stride, size)
        stride *= size
    return out


@dataclass
class Prediction:
    """Seconds (per training step, per video, or per attention call) and where they go."""

    seconds: float
    breakdown: dict[str, float] = field(default_factory=dict)
    tokens_per_s_per_gpu: float = 0.0
    efficiency: float = 0.0
    notes: list[str] = field(default_factory=list)

    def value(self, measured_key: str) -> float:
        return {
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "seconds": self.seconds,
            "efficiency": self.efficiency,
        }[measured_key]


def compute_time(flops: float, hw: Hardware, dtype: str, efficiency: float) -> float:
    return flops / (hw.peak(dtype) * efficiency)


def _scaled(ledger_bytes: int, itemsize: int) -> float:
    return ledger_bytes * itemsize / LEDGER_ITEMSIZE


def fsdp_unit_bytes(numel: int, layout: Layout, inference: bool = False) -> dict[str, float]:
    """Lab 01's `traffic_formula` for one unit at real dtypes: bytes one rank sends per gather
    (bf16), per reduce-scatter and per replica all-reduce (fp32)."""
    world = layout.dp_shard * layout.dp_replicate
    ledger = traffic_formula("fsdp", [numel], world, layout.dp_replicate, not inference)
    gathers = 1 if inference else 2
    return {
        "all_gather": _scaled(ledger["all_gather_into_tensor"], PARAM_BYTES) / gathers,
        "reduce_scatter": _scaled(ledger["reduce_scatter_tensor"], REDUCE_BYTES),
        "all_reduce": _scaled(ledger.get("all_reduce", 0), REDUCE_BYTES),
    }


def prefetched(comm: float, compute: float, units: int) -> float:
    """Exposed time of `units` equal transfers, each prefetched behind one unit of compute:
    the first cannot hide, each later one shows only what exceeds its neighbour's compute."""
    return comm + (units - 1) * max(0.0, comm - compute) if units else 0.0


def ring_exposed(hop_bytes: float, hop_compute: float, cp: int, link: Link) -> float:
    """cp - 1 hops, each hidden behind the block of attention computed meanwhile."""
    hop = link.time(hop_bytes, 1)
    return (cp - 1) * max(0.0, hop - hop_compute)


# ------------------------------------------------------------------ training
def predict_train(
    m: ModelShape, hw: Hardware, layout: Layout, w: Workload, eff: dict[str, float]
) -> Prediction:
    """One optimizer step on every GPU: `micro_batch` sequences of `seq` tokens per dp rank."""
    lo, seq, b = layout, w.seq, w.micro_batch
    split = lo.cp * lo.tp
    layers = -(-m.layers // lo.pp)  # the busiest stage sets the pace
    links = train_links(hw, lo)
    re_gemm, re_attn = RECOMPUTE[w.ac]
    imbalance = (2 * lo.cp - 1) / lo.cp if lo.cp_kind == "ring" and lo.cp > 1 else 1.0

    gemm_fwd_layer = 2 * m.matmul_per_layer * seq * b / split
    attn_fwd_layer = 2 * seq * seq * m.attention_width * b / split * imbalance  # causal
    head_fwd = 2 * m.vocab * m.hidden * seq * b / split / lo.pp
    gemm_layer = gemm_fwd_layer * (1 + BACKWARD_GEMM + re_gemm)
    attn_layer = attn_fwd_layer * (1 + re_attn + BACKWARD_ATTENTION / BACKWARD_ATTENTION_SPEED)
    t_gemm = layers * compute_time(gemm_layer, hw, w.dtype, eff["gemm"])
    t_gemm += compute_time(head_fwd * (1 + BACKWARD_GEMM), hw, "bf16", eff["gemm"])
    t_attn = layers * compute_time(attn_layer, hw, "bf16", eff["attention"])
    local_params = m.params / (lo.dp_shard * lo.tp * lo.pp)
    t_optim = local_params * ADAM_BYTES_PER_PARAM / hw.hbm_bandwidth
    t_fwd_block = compute_time(gemm_fwd_layer, hw, w.dtype, eff["gemm"]) + compute_time(
        attn_fwd_layer, hw, "bf16", eff["attention"]
    )
    t_block = (t_gemm + t_attn) / layers

    out = {"compute: GEMM": t_gemm, "compute: attention": t_attn, "optimizer (HBM)": t_optim}
    if lo.dp_shard * lo.dp_replicate > 1:
        link = links["dp_shard"] if lo.dp_shard > 1 else links["dp_replicate"]
        unit = fsdp_unit_bytes(m.block_params() // lo.tp, lo)
        root = fsdp_unit_bytes(m.root_params() // lo.tp, lo)
        s = lo.dp_shard
        ag = link.time(unit["all_gather"], s - 1)
        rs = link.time(unit["reduce_scatter"], s - 1)
        ar = links["dp_replicate"].time(unit["all_reduce"], 2 * (lo.dp_replicate - 1))
        t_bwd_block = t_block - t_fwd_block
        fwd = prefetched(ag, t_fwd_block, layers)
        bwd = prefetched(ag + rs + ar, t_bwd_block, layers)
        root_t = link.time(root["all_gather"] + root["reduce_scatter"], 2 * (s - 1))
        out["exposed: dp (FSDP)"] = fwd + bwd + root_t
    if lo.cp > 1:
        out["exposed: cp"] = layers * b * _train_cp(m, hw, lo, w, links["cp"], eff)
    if lo.tp > 1 and not lo.async_tp:
        act = b * (seq // lo.cp) * m.hidden * ACT_BYTES
        per_block = block_bytes(act, lo.tp, sequence_parallel=False)
        calls = sum(c for c, _ in per_block.values())
        sent = sum(n for _, n in per_block.values())
        passes = 1 + (re_gemm == 1.0) * 0.5  # full AC repeats the forward's two all-reduces
        out["exposed: tp"] = layers * passes * links["tp"].time(sent, 2 * (lo.tp - 1), calls)
    busy = sum(out.values())
    if lo.pp > 1:
        mb = lo.microbatches or max(lo.pp, b)
        bubble = simulate(lo.schedule, lo.pp, mb, lo.virtual).bubble_fraction
        out["pp bubble"] = busy * bubble / (1 - bubble)
        boundary = boundary_bytes(b // mb or 1, seq // lo.cp, m.hidden // lo.tp, ACT_BYTES)
        out["exposed: pp sends"] = 2 * (lo.pp - 1) * links["pp"].time(boundary, 1)
    seconds = sum(out.values())
    tokens = b * seq * lo.dp_shard * lo.dp_replicate
    return Prediction(seconds, out, tokens_per_s_per_gpu=tokens / (seconds * lo.world))


def _q_and_kv_shards(m: ModelShape, tp: int, seq: int, cp: int) -> tuple[int, int]:
    """One rank's bf16 shard of q (its q heads) and of k or v (its K/V heads): under
    grouped-query attention the Ulysses all-to-alls of k and v move kv_heads / heads of q's."""
    return (
        shard_bytes(1, m.heads // tp, seq, m.head_dim, cp, ACT_BYTES),
        shard_bytes(1, m.kv_heads // tp, seq, m.head_dim, cp, ACT_BYTES),
    )


def _train_cp(
    m: ModelShape, hw: Hardware, lo: Layout, w: Workload, link: Link, eff: dict[str, float]
) -> float:
    """Exposed cp time of one layer and one sequence (forward, backward, recompute)."""
    cp, seq = lo.cp, w.seq
    recompute = RECOMPUTE[w.ac][1]
    if lo.cp_kind == "ulysses":
        sent = ulysses_gqa_bytes(*_q_and_kv_shards(m, lo.tp, seq, cp), cp)
        one = link.time(sent["forward"], cp - 1, calls=4)
        return one * (2 + recompute)
    s = shard_bytes(1, m.kv_heads // lo.tp, seq, m.head_dim, cp, ACT_BYTES)
    sent = ring_bytes(s, cp)
    attn_hop = 2 * seq * seq * m.attention_width / lo.tp / cp / cp
    hop_c = compute_time(attn_hop, hw, "bf16", eff["attention"])
    fwd = ring_exposed(sent["forward"] / (cp - 1), hop_c, cp, link)
    bwd_c = hop_c * BACKWARD_ATTENTION / BACKWARD_ATTENTION_SPEED
    bwd = ring_exposed(sent["backward"] / (cp - 1), bwd_c, cp, link)
    return fwd * (1 + recompute) + bwd


# ------------------------------------------------------------------ diffusion inference
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


MERGE_BYTES = {"forward": 10, "stripe_forward": 18, "backward": 18}
"""HBM bytes per element of q (tokens x heads x head_dim) that one ring hop's bookkeeping moves,
counted from ring-flash-attention@8996282:ring_flash_attn/utils.py and the three kernels' loops:
forward, `_update_out_and_lse` (a TorchScript function, its elementwise chain fused into one
pass) reads the fp32 out (4) and the bf16 block out (2) and writes the fp32 out (4); stripe's
hops from a later rank merge a slice `out[slice_]` and write it back (+ 4 read, 4 written);
backward, `dq += block_dq` in fp32 (12) and dk, dv the same on K/V's quarter of q's size under
8 of 32 heads (2 x 12 / 4 = 6)."""


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
            exposed += ring_exposed(sent["backward"] / (cp - 1), hop_block * bwd, cp, link)
        out["exposed: cp"] = exposed
    seconds = sum(out.values())
    return Prediction(seconds, out, efficiency=ideal / seconds)


PREDICTORS = {
    "train": predict_train,
    "diffusion": predict_diffusion,
    "attention": predict_attention,
}


def predict(
    m: ModelShape, hw: Hardware, layout: Layout, w: Workload, eff: dict[str, float]
) -> Prediction:
    if w.kind not in PREDICTORS:
        raise ValueError(f"workload kind must be one of {sorted(PREDICTORS)}, got {w.kind!r}")
    return PREDICTORS[w.kind](m, hw, layout, w, eff)
