"""Training memory per GPU, item by item: what the busiest GPU has allocated at its peak.

Every item is a count of tensors a torchtitan-style run (FSDP2 mixed precision: bf16 compute,
fp32 master weights, fp32 gradient reduction, AdamW) keeps, per token or per parameter, times
the bytes of its dtype. The peak is the start of the first stage's backward, at its last layer,
the first to run (every saved activation alive, the loss's gradients and one layer's working
set on top). The figure is *allocated* memory: torchtitan reports `torch.cuda.max_memory_reserved`,
which the caching allocator's rounding and fragmentation put above it; neither that nor the CUDA
context and NCCL's buffers (outside the allocator) are counted here.
"""

from __future__ import annotations

import functools
from pathlib import Path

import tomllib

from paralab.pp.costs import in_flight_formula
from paralab.scale.hardware import GiB
from paralab.scale.models import ModelShape, model
from paralab.scale.predict import (
    Layout,
    Workload,
    changed,
    fsdp_shard,
    stage_split,
)

ACT = 2
"""bf16 activations."""
STATE_BYTES = {
    "parameters (fp32 master)": 4,
    "gradients (fp32)": 4,
    "optimizer (AdamW m, v fp32)": 8,
}
"""Per parameter of the GPU's shard (sharded over dp_shard x cp by FSDP, tp, pp)."""
LOSS_BYTES = 12
"""Per token and vocabulary entry of the last stage, at the start of the backward: the loss
upcasts the bf16 logits to fp32 and `log_softmax` saves its fp32 output (4); the backward then
holds the fp32 gradient arriving from the loss (4) and the one it produces (4)."""
GATHERED_UNIT_BYTES = 2 * 2 + 2 + 4
"""Per parameter of one FSDP unit (a block, over tp): two gathered bf16 copies (the running
block and the prefetched next), the block's unsharded bf16 gradient and its fp32 copy for the
reduce-scatter."""
STAGE_KEPT_BYTES = 2 + 4
"""Per parameter of a pipeline stage under FSDP: torchtitan does not reshard after the forward
when pp is on (every micro-batch would gather again), so the stage stays gathered in bf16 (2),
and gradients accumulate unsharded in fp32 (4) until the last micro-batch's reduce-scatter."""


@functools.cache
def layer_tensors(m: ModelShape) -> dict[str, tuple[int, int]]:
    """Elements per token a Llama block's backward needs, as (outside TP regions, inside them):
    outside, the block's input and the two norms' inputs and outputs (full hidden); inside,
    q and k after RoPE, v, the attention output, and the SwiGLU's w1, w3, silu and product
    (per expert a token passes through in a mixture of experts; a GELU MLP's fc1 and GELU
    outputs)."""
    h, attn, kv = m.hidden, m.attention_width, m.kv_heads * m.head_dim
    up = (m.mlp_matrices - 1) * round(m.mlp_width())  # the MLP's matmul outputs inside
    none = (4 * h, 2 * attn + 2 * kv + 2 * up)
    return {
        "none": none,
        # Megatron's selective recompute checkpoints core attention alone
        # (NVIDIA/Megatron-LM@d98e8a6:megatron/core/transformer/attention.py,
        # `_checkpointed_attention_forward`): q, k and v stay as its inputs and the output
        # projection keeps its input; under flash attention nothing else was kept.
        "attention": none,
        # torchtitan's op-level selective AC saves SDPA's output and every other matmul's
        # output (half of wq, wk, wv, w1, w3 inside; half of wo, w2 outside) and the input.
        "selective": (h + h, attn + (attn + 2 * kv + up) // 2),
        "full": (h, 0),
    }


@functools.cache
def per_token_layer_bytes(m: ModelShape, ac: str, tp: int, sp: bool) -> float:
    """Saved bytes per token per layer: inside the TP regions cut over tp; outside, cut over tp
    only under sequence parallelism, replicated on every tp rank without it."""
    ### BEGIN SOLUTION
    outside, inside = layer_tensors(m)[ac]
    return ACT * (outside / (tp if sp else 1) + inside / tp)
    ### END SOLUTION


def stage_layers(m: ModelShape, lo: Layout, w: Workload, rank: int) -> int:
    """Layers pipeline rank `rank` holds: the last rank its share under the planner's split
    (`stage_split`); the others the rest, split as torchtitan generated its split points
    (pytorch/torchtitan@6b03ffa:torchtitan/parallelisms/pipelining_utils.py): the first the
    even share, the next ones one more until the remainder is spent. The 405B's 126 layers
    over 8 ranks come out as its runs held them, 15, 16 x 6, 15."""
    if lo.pp == 1:
        return m.layers
    return _layers_per_rank(m.layers, stage_split(m, lo, w)[1], lo.pp)[rank]


@functools.lru_cache(maxsize=1 << 12)  # keyed by plain numbers: a search asks a million times
def _layers_per_rank(layers: int, last_layers: int, pp: int) -> tuple[int, ...]:
    share, extra = divmod(layers - last_layers, pp - 1)
    return (*(share + (1 <= rank <= extra) for rank in range(pp - 1)), last_layers)


def stage_dense_layers(m: ModelShape, lo: Layout, w: Workload, rank: int) -> int:
    """How many of a mixture of experts' dense first layers pipeline rank `rank` holds. The
    layers run in order through the chunks, each rank's first chunk, then (interleaved) each
    rank's second; a rank's layers split over its `virtual` chunks as evenly as they divide,
    the first rank's larger chunks last and the others' first, as `stage_layers` hands out
    the extra layers."""
    if not (m.experts and m.dense_layers) or lo.pp == 1:
        return m.dense_layers if m.experts else 0
    held = _layers_per_rank(m.layers, stage_split(m, lo, w)[1], lo.pp)
    return _dense_per_rank(m.dense_layers, held, lo.virtual)[rank]


@functools.lru_cache(maxsize=1 << 12)
def _dense_per_rank(dense_layers: int, held: tuple[int, ...], v: int) -> tuple[int, ...]:
    chunks = [
        [n // v + (k >= v - n % v if r == 0 else k < n % v) for r, n in enumerate(held)]
        for k in range(v)
    ]
    dense = [0] * len(held)
    start = 0
    for round_ in chunks:
        for rank, size in enumerate(round_):
            dense[rank] += min(size, max(0, dense_layers - start))
            start += size
    return tuple(dense)


def stage_params(m: ModelShape, lo: Layout, w: Workload, rank: int) -> tuple[int, int]:
    """(parameters, of them routed experts') of pipeline rank `rank`'s layers (`stage_layers`,
    the dense ones `stage_dense_layers`), whole, the embedding on the first rank, the head and
    final norm on the last."""
    if lo.pp == 1:
        return m.params, m.routed_expert_params()
    layers = stage_layers(m, lo, w, rank)
    dense = stage_dense_layers(m, lo, w, rank)
    routed = (layers - dense) * m.layer_routed_params()
    params = dense * m.layer_params(dense=True) + (layers - dense) * m.layer_params()
    params += m.vocab * m.hidden * (rank == 0) + (m.vocab + 1) * m.hidden * (rank == lo.pp - 1)
    return params, routed


def stage_memory(
    m: ModelShape, lo: Layout, w: Workload, local_batch: int, rank: int
) -> dict[str, float]:
    """Bytes pipeline rank `rank` holds at its peak; `local_batch` sequences per dp rank."""
    params, routed = stage_params(m, lo, w, rank)
    shard = fsdp_shard(lo) * lo.tp  # the routed experts over ep x (dp_shard x cp / ep) alike
    states = {name: size * params / shard for name, size in STATE_BYTES.items()}
    microbatches = lo.microbatches if lo.pp > 1 else 1
    tokens = local_batch // microbatches * w.seq // lo.cp
    chunk_layers = -(-stage_layers(m, lo, w, rank) // lo.virtual)
    in_flight = (
        in_flight_formula(lo.schedule, lo.pp, microbatches, rank, lo.virtual) if lo.pp > 1 else 1
    )
    saved = per_token_layer_bytes(m, w.ac, lo.tp, lo.sp) * tokens * chunk_layers * in_flight
    working = per_token_layer_bytes(m, "none", lo.tp, lo.sp) * tokens
    # the layer running its backward: its activations (recomputed unless kept) and their grads
    saved += working * (1 if layer_tensors(m)[w.ac] == layer_tensors(m)["none"] else 2)
    last = rank == lo.pp - 1
    items = {
        **states,
        "activations": saved,
        "logits and loss (fp32)": LOSS_BYTES * tokens * m.vocab / lo.tp if last else 0.0,
        "FSDP buffers": 0.0,
    }
    if fsdp_shard(lo) > 1:
        if lo.pp > 1:  # a rank's stage: its 1/ep of the routed experts, the rest whole
            held = params - routed + routed / lo.ep
            items["FSDP buffers"] = STAGE_KEPT_BYTES * held / lo.tp
        else:  # the largest block, a rank's 1/ep of its routed experts; the root stays gathered
            routed = m.layer_routed_params()
            unit = m.layer_params() - routed + routed / lo.ep
            items["FSDP buffers"] = (GATHERED_UNIT_BYTES * unit + 2 * m.root_params()) / lo.tp
    return items


def train_memory(m: ModelShape, lo: Layout, w: Workload, local_batch: int) -> dict[str, float]:
    """The heaviest pipeline rank: among the first ones (the most micro-batches in flight),
    up to the first holding the busiest share and none of a mixture of experts' lighter dense
    layers, and the last (the logits and the loss): the GPU that runs out first.
    Neither async TP nor the kind of cp changes a tensor counted here (each is counted as
    zigzag cp), and of the workload only the sequence and the AC mode do: layouts and
    workloads that differ only there share one count (the planner asks each)."""
    return _heavier_stage(m, memory_alike(lo), _memory_workload(w.seq, w.ac), local_batch)


def memory_alike(lo: Layout) -> Layout:
    """`lo` as `train_memory` counts it, async TP off and cp zigzag; `lo` itself if so already."""
    if lo.async_tp or lo.cp_kind != "zigzag":
        return changed(lo, async_tp=False, cp_kind="zigzag")
    return lo


@functools.cache  # a few dozen
def _memory_workload(seq: int, ac: str) -> Workload:
    return Workload("train", seq, ac=ac)


@functools.lru_cache(maxsize=1 << 16)  # keyed by layout: a search's worth
def _heavier_stage(m: ModelShape, lo: Layout, w: Workload, local_batch: int) -> dict[str, float]:
    # the first ranks hold the most micro-batches in flight, the last the logits; weigh each
    # rank up to the first that holds the busiest share and none of the dense first layers
    busiest = stage_split(m, lo, w)[0]
    full = next(
        (
            r
            for r in range(lo.pp - 1)
            if stage_layers(m, lo, w, r) == busiest and not stage_dense_layers(m, lo, w, r)
        ),
        lo.pp - 2,
    )
    ranks = {*range(max(full, 0) + 1), lo.pp - 1}
    stages = (stage_memory(m, lo, w, local_batch, rank) for rank in sorted(ranks))
    return max(stages, key=lambda items: sum(items.values()))


PUBLISHED = Path(__file__).with_name("MEMORY.toml")


def published_memory(path: Path = PUBLISHED) -> list[dict]:
    """Each published row with the model's figure beside it: `predicted_gib` (allocated) and
    `relative_error` against the row's `memory_gib` (reserved)."""
    out = []
    for row in tomllib.loads(path.read_text())["row"]:
        m = model(row["model"])
        lo = Layout(cp_kind="zigzag", **row["layout"])
        w = Workload("train", seq=row["seq"], micro_batch=row["local_batch"], ac=row["ac"])
        predicted = sum(train_memory(m, lo, w, row["local_batch"]).values()) / GiB
        error = (predicted - row["memory_gib"]) / row["memory_gib"]
        out.append({**row, "predicted_gib": predicted, "relative_error": error})
    return out


@functools.cache
def reserved_over_allocated() -> float:
    """The most a published reserved peak has exceeded the model's allocated figure for it
    (`published_memory`: torchtitan's 18 rows). The planner calls a training layout "tight"
    when its allocated bytes times this pass HBM: the model has fallen that short before."""
    return max(row["memory_gib"] / row["predicted_gib"] for row in published_memory())
