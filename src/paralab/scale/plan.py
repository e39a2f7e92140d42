"""The layout planner: every valid layout of a model on a cluster, its memory per GPU against HBM
and its predicted time, ranked; the ones that do not fit are marked OOM.

Training enumerates torchtitan's descriptor (dp_replicate x dp_shard, cp and its kind, tp with
or without SP and async TP, pp with its schedule, virtual stages and micro-batches; their
product is exactly the GPUs asked for) under each AC mode, counts memory first
(`paralab.scale.memory`) and times only what fits; the fastest step ranks first. Without pp a
dp rank may run its sequences as micro-batches one after another (gradient accumulation), as
many as its AC mode needs to fit. `rank_published` asks it the question of a published run and
says where the run's own degrees come.

Inference plans the diffusion models: it enumerates `paralab.ParallelDims` at every divisor
(dp_replicate x dp_shard is the GPUs, dp_shard sharding the weights; cp, cfgp and lb overlay the
same ranks, so a row's JSON lists them under "overlays" and their product is not the GPUs; lb
balances the VAE encode before the denoiser, shown as its exchange seconds and the busiest
rank's encode load). A video's VAE passes, which no rank splits, are timed for
Cosmos-Transfer2.5. `python -m paralab.plan --help`.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import functools
import gc
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from paralab.parallel_dims import MAX_CP, ParallelDims
from paralab.scale.cases import SHIPPED, Case, load_cases
from paralab.scale.fit import FITTED
from paralab.scale.hardware import HARDWARE, GiB, Hardware, hardware
from paralab.scale.heldout import GENERALIZATION
from paralab.scale.memory import memory_alike, reserved_over_allocated, train_memory
from paralab.scale.models import AUTOENCODER_PEAK_GIB, MODELS, ModelShape, model
from paralab.scale.predict import (
    ENGINES,
    Layout,
    Prediction,
    Workload,
    changed,
    link_for,
    predict,
)
from paralab.tables import text_table
from paralab.vae_lb.costs import encode_cost, exchange_bytes
from paralab.vae_lb.planner import assignment_from_moves, loads_of, plan_rebalance

RAW_VIDEO = (93, 704, 1280)
"""(frames, height, width) of the raw video each inference group encodes by default: 720p."""
INFERENCE_WORKING_BYTES = 18
"""Bytes per token per unit of hidden that one block holds at its peak in inference, with no
autograd keeping anything: in the MLP, the block's input (h), the first matmul's output (4 h)
and the activation's (4 h), 9 h elements of 2 bytes. Attention holds less: input, q, k, v and
its output, 5 h."""


@dataclass
class Row:
    layout: Layout
    prediction: Prediction | None
    """None for a layout that does not fit: the planner does not time it."""
    memory: dict[str, float]
    hbm: float
    score: float
    score_name: str
    extras: dict[str, float] = field(default_factory=dict)
    """Numbers outside the time and the memory, shown as columns: MFU, the VAE encode's load."""
    ac: str = ""
    """Training: the activation checkpointing mode."""
    total_memory: float = field(init=False)
    """The memory items' sum: a search sorts and filters a million rows by it, so it is summed
    once, as a plain attribute (a cached property's first read costs more than the sum)."""

    def __post_init__(self) -> None:
        self.total_memory = sum(self.memory.values())

    @property
    def oom(self) -> bool:
        return self.total_memory > self.hbm

    @property
    def tight(self) -> bool:
        """Training: fits as counted, but not with the margin by which published reserved
        peaks have exceeded the model's allocated figure (`memory.reserved_over_allocated`)."""
        return (
            bool(self.ac)
            and not self.oom
            and (self.total_memory * reserved_over_allocated() > self.hbm)
        )


ENGINE_AC_MODES = {
    "torchtitan": ("none", "selective", "full"),
    "megatron": ("none", "attention", "full"),
}
"""Each engine's AC modes, least recompute first: torchtitan's op-level selective AC, Megatron's
selective recompute of core attention ("attention")."""
AC_MODES = ("none", "selective", "attention", "full")
TRAIN_SCHEDULES = ("1f1b", "interleaved", "zbh1", "gpipe")
CP_KINDS = ("zigzag", "ring", "ulysses")
INTERLEAVED_VIRTUAL = (2, 4)
"""Virtual stages a rank holds under the interleaved schedule."""


@functools.cache
def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def layers_split(m: ModelShape, stages: int) -> bool:
    """At least one layer a stage. An uneven split runs (Llama 3 put 126 layers on 16 stages,
    DeepSeek-V3 61 on 16): `paralab.scale.predict.stage_split` chooses how many the last stage,
    which also runs the output layer and the loss, holds; the busiest stage sets the pace, which
    the time and memory models count."""
    return stages <= m.layers


def pipeline_options(m: ModelShape, pp: int, local: int) -> list[tuple[str, int, int]]:
    """(schedule, virtual, micro-batches) for `pp` stages and `local` sequences per dp rank:
    the fewest micro-batches that fill the pipe (>= pp) and one sequence each."""
    if pp == 1:
        return [("1f1b", 1, 1)]
    filling = [d for d in divisors(local) if d >= pp]
    counts = sorted({filling[0], local}) if filling else []
    out = []
    for mb in counts:
        for schedule in TRAIN_SCHEDULES:
            for v in INTERLEAVED_VIRTUAL if schedule == "interleaved" else (1,):
                if layers_split(m, pp * v) and (schedule != "interleaved" or mb % pp == 0):
                    out.append((schedule, v, mb))
    return out


@dataclass(frozen=True)
class TrainQuestion:
    """What the planner is asked: a model on `gpus` GPUs, sequences of `seq` tokens,
    `global_batch` sequences a step, under one AC mode or (None) every one of the engine's;
    `dtype`, `compile` (torch.compile of each block) and `engine` (whose kernels and overlap,
    `paralab.scale.predict.ENGINES`) are the software the layouts run."""

    model: ModelShape
    hardware: Hardware
    gpus: int
    seq: int
    global_batch: int
    ac: str | None = None
    dtype: str = "bf16"
    compile: bool = False
    engine: str = "torchtitan"

    @property
    def ac_modes(self) -> tuple[str, ...]:
        return (self.ac,) if self.ac else ENGINE_AC_MODES[self.engine]


def accumulation(layout: Layout) -> int:
    """Micro-batches a dp rank runs one after another before its optimizer step without a
    pipeline (gradient accumulation); 1: its whole batch in one pass."""
    return layout.microbatches if layout.pp == 1 and layout.microbatches > 1 else 1


OPTIMIZER_ITEM = "optimizer (HBM)"
"""The one item of `predict_train`'s breakdown a step spends once, however many passes."""


def accumulated(p: Prediction, passes: int) -> Prediction:
    """A step of `passes` forward-backward passes and one optimizer step. FSDP2 as torchtitan
    accumulates (pytorch/torchtitan@b5bcd76:torchtitan/trainer.py) gathers the parameters and
    reduce-scatters the gradients in every pass, so every item but the optimizer repeats."""
    if passes == 1:
        return p
    items = {k: v if k == OPTIMIZER_ITEM else passes * v for k, v in p.breakdown.items()}
    seconds = sum(items.values())
    faster = passes * p.seconds / seconds  # the step's tokens grew `passes` times
    return replace(
        p,
        seconds=seconds,
        breakdown=items,
        tokens_per_s_per_gpu=p.tokens_per_s_per_gpu * faster,
        tflops_per_gpu=p.tflops_per_gpu * faster,
        mfu=p.mfu * faster,
    )


def workload(q: TrainQuestion, layout: Layout, ac: str, passes: int = 0) -> tuple[Workload, int]:
    """The workload of one pass of `layout`'s step, and the passes a step (default the layout's
    `accumulation`). Without a pipeline the time and memory models read no micro-batch count:
    they take the layout as it is and one pass's sequences."""
    passes = passes or accumulation(layout)
    per_pass = q.global_batch // (layout.dp_shard * layout.dp_replicate) // passes
    return train_workload(q.seq, per_pass, q.dtype, ac, q.compile, q.engine), passes


@functools.cache  # a search asks for a few dozen, hundreds of thousands of times
def train_workload(
    seq: int, micro_batch: int, dtype: str, ac: str, compile: bool, engine: str
) -> Workload:
    """A training workload, made once: it is frozen, so every layout asking shares it."""
    return Workload("train", seq, micro_batch, dtype=dtype, ac=ac, compile=compile, engine=engine)


def fits(q: TrainQuestion, layout: Layout, ac: str, passes: int = 0, room: bool = False) -> bool:
    """Memory alone: does `layout` under `ac` (in `passes` passes, default its own) fit in HBM,
    with `room`, the reserved margin of `Row.tight`, to spare."""
    w, _ = workload(q, layout, ac, passes)
    allocated = sum(train_memory(q.model, layout, w, w.micro_batch).values())
    return allocated * (reserved_over_allocated() if room else 1) <= q.hardware.hbm_bytes


def train_row(q: TrainQuestion, layout: Layout, ac: str, timed: bool = True) -> Row:
    """One layout's memory and (if `timed`) its predicted step: memory at one pass's
    sequences, the step as `accumulated` passes."""
    w, passes = workload(q, layout, ac)
    memory = train_memory(q.model, layout, w, w.micro_batch)
    p = (
        accumulated(
            predict(q.model, q.hardware, layout, w, FITTED[q.hardware.efficiency_from]), passes
        )
        if timed
        else None
    )
    seconds = p.seconds if p else math.inf
    extras = (
        {
            "tokens/s/GPU": p.tokens_per_s_per_gpu,
            "MFU": p.mfu,
        }
        if p
        else {}
    )
    return Row(layout, p, memory, q.hardware.hbm_bytes, seconds, "s a step", extras, ac)


def train_layouts(q: TrainQuestion):
    """Every layout whose degrees multiply to exactly `q.gpus` and divide what they
    cut: heads and kv heads by tp (and by tp x cp for Ulysses), the sequence by 2 cp, the global
    batch by dp and each dp rank's batch by its micro-batches; at least a layer a stage."""
    m, hw = q.model, q.hardware
    for tp in divisors(min(q.gpus, hw.gpus_per_node)):
        if q.gpus % tp or m.heads % tp or m.kv_heads % tp:
            continue
        for cp in divisors(q.gpus // tp):
            if q.seq % (2 * cp):
                continue
            for pp in divisors(q.gpus // (tp * cp)):
                if not layers_split(m, pp):
                    continue
                dp = q.gpus // (tp * cp * pp)
                if q.global_batch % dp:
                    continue
                local = q.global_batch // dp
                for kind in CP_KINDS if cp > 1 else ("zigzag",):
                    if kind == "ulysses" and (m.heads % (tp * cp) or m.kv_heads % (tp * cp)):
                        continue
                    for schedule, v, mb in pipeline_options(m, pp, local):
                        for sp, async_tp in ((False, False), (True, False), (True, True)):
                            if tp == 1 and (sp or async_tp):
                                continue
                            for ep in expert_degrees(m, dp * cp):
                                yield Layout(
                                    dp_shard=dp,
                                    cp=cp,
                                    cp_kind=kind,
                                    tp=tp,
                                    pp=pp,
                                    schedule=schedule,
                                    virtual=v,
                                    microbatches=mb if pp > 1 else 0,
                                    sp=sp,
                                    async_tp=async_tp,
                                    ep=ep,
                                )


def expert_degrees(m: ModelShape, carved_from: int) -> list[int]:
    """ep degrees for a mixture of experts: dividing both the experts and the dp_shard x cp
    ranks they are carved from; 1 for a dense model."""
    if not m.experts:
        return [1]
    return [e for e in divisors(carved_from) if m.experts % e == 0]


def least_recompute_that_fits(q: TrainQuestion, layout: Layout, room: bool = False) -> str | None:
    """The AC mode that recomputes least and still fits (none, then selective, then full:
    each saves memory by spending FLOPs, nothing else changes), or None."""
    for ac in q.ac_modes:
        if fits(q, layout, ac, room=room):
            return ac
    return None


def accumulation_choices(
    q: TrainQuestion, layout: Layout, room: bool = False
) -> list[tuple[Layout, str]]:
    """Without a pipeline: for each AC mode, the fewest passes (dividing the dp rank's batch)
    at which it fits. Fewer passes move fewer bytes (FSDP gathers every pass), less recompute
    spends fewer FLOPs: a mode is kept only if it needs fewer passes than every mode that
    recomputes less (at equal passes the one that recomputes less is faster)."""
    counts = divisors(q.global_batch // (layout.dp_shard * layout.dp_replicate))
    out, fewest = [], math.inf
    for ac in q.ac_modes:
        # memory only falls with more passes: the first that fits, by bisection
        first = bisect.bisect_left(
            counts, True, key=lambda k, ac=ac: fits(q, layout, ac, k, room=room)
        )
        if first < len(counts) and counts[first] < fewest:
            fewest = counts[first]
            out.append((changed(layout, microbatches=fewest if fewest > 1 else 0), ac))
    return out


def knob_choices(q: TrainQuestion, layout: Layout) -> list[tuple[Layout, str]]:
    """The (layout, AC mode) pairs worth timing: under a pipeline the least recompute that
    fits at the layout's micro-batches; without one, `accumulation_choices`. Each, too, as it
    fits with the reserved margin (`Row.tight`) where that takes more recompute or passes: a
    practitioner can then pick the fastest layout with room, not only the fastest."""
    if layout.pp == 1:
        choices = accumulation_choices(q, layout)
        roomy = accumulation_choices(q, layout, room=True)
    else:
        choices = [(layout, mode)] if (mode := least_recompute_that_fits(q, layout)) else []
        roomy = [(layout, m)] if (m := least_recompute_that_fits(q, layout, room=True)) else []
    return list(dict.fromkeys(choices + roomy))


def hsdp_choice(q: TrainQuestion, layout: Layout, ac: str) -> Layout:
    """dp as plain FSDP (every dp rank one shard group) unless a smaller shard group, replicated
    (HSDP), still fits: then the smallest such group, whose all-gathers cross fewer nodes."""
    dp = layout.dp_shard * layout.dp_replicate
    shards = divisors(dp)[:-1]

    def grouped(shard: int) -> Layout:
        return changed(layout, dp_shard=shard, dp_replicate=dp // shard)

    # a larger shard group only holds less: the first that fits, by bisection
    first = bisect.bisect_left(shards, True, key=lambda shard: fits(q, grouped(shard), ac))
    return grouped(shards[first]) if first < len(shards) else layout


def memory_choices(q: TrainQuestion, layout: Layout) -> list[tuple[Layout, str]]:
    """The (layout, AC mode) pairs worth timing: `knob_choices`, and beside each with FSDP its
    `hsdp_choice` where that differs."""
    out = []
    for chosen, mode in knob_choices(q, layout):
        out.append((chosen, mode))
        if chosen.dp_shard > 1:
            hsdp = hsdp_choice(q, chosen, mode)
            if hsdp != chosen:
                out.append((hsdp, mode))
    return out


def plan_train(
    m: ModelShape,
    hw: Hardware,
    gpus: int,
    seq: int,
    global_batch: int,
    ac: str | None = None,
    dtype: str = "bf16",
    compile: bool = False,
    engine: str = "torchtitan",
    oom: bool = True,
) -> list[Row]:
    """Every layout of exactly `gpus` GPUs, the ones that fit in HBM timed and ranked by step
    time (the same job on the same GPUs: fastest step = most tokens/s/GPU), then (`oom`) the
    ones that do not, by memory. Memory is counted first and only the fitting layouts are
    timed."""
    q = TrainQuestion(m, hw, gpus, seq, global_batch, ac, dtype, compile, engine)
    with cyclic_gc_paused():
        fitting, too_big = search(q, oom)
    fitting.sort(key=lambda r: r.score)
    too_big.sort(key=lambda r: r.total_memory)
    return fitting + too_big


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """A search allocates hundreds of thousands of rows, layouts and memory items, and keeps
    them: none is cyclic garbage, yet Python's cyclic collector walked them all again at every
    full collection (a third of the CPU of asking the 46 published rows' questions). After the
    search they are promoted to the oldest generation unwalked (freeze, then unfreeze), rather
    than walked once more by the next young collection (a tenth of that CPU); any cyclic garbage
    among them is still collected, at the next full collection. Skipped where the process froze
    objects itself (a rank): unfreezing would hand them back to the collector."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()


def search(q: TrainQuestion, oom: bool) -> tuple[list[Row], list[Row]]:
    """`plan_train`'s rows, unsorted: those that fit, timed, and (`oom`) those that do not."""
    fitting, too_big = [], []
    chosen_for: dict[Layout, list[tuple[Layout, str]]] = {}
    for layout in train_layouts(q):
        # Neither async TP nor the kind of cp changes memory (`memory.train_memory`): layouts
        # that differ only there fit alike, so their knobs are chosen once (a third of the
        # search's memory counts at cp > 1).
        alike = memory_alike(layout)
        choices = chosen_for.get(alike)
        if choices is None:
            choices = chosen_for[alike] = memory_choices(q, alike)
        if oom and not choices:
            too_big.append(train_row(q, layout, q.ac or "full", timed=False))
        for chosen, mode in choices:
            # the chosen knobs, on the layout's own async TP and kind of cp
            own = (
                chosen
                if layout is alike
                else changed(chosen, async_tp=layout.async_tp, cp_kind=layout.cp_kind)
            )
            fitting.append(train_row(q, own, mode))
    return fitting, too_big


def what_would_fit(q: TrainQuestion, batch_given: bool = False) -> str:
    """When no layout fits: the fewest GPUs at which one does with the reserved margin
    (`Row.tight`), and fewer still if one fits tight, counting a GPU at a time up to a node and
    a node at a time beyond, up to 64x; the most whole nodes below the question's GPUs that
    fit; and the longest sequence (halving) that fits. Memory alone. The global batch grows
    with the GPUs (2 sequences a GPU, the default) unless the question gave it."""

    def rows(question: TrainQuestion) -> Iterator[Row]:
        for lo in train_layouts(question):
            for chosen, mode in knob_choices(question, lo):
                yield train_row(question, chosen, mode, timed=False)

    def asked(gpus: int) -> TrainQuestion:
        batch = q.global_batch if batch_given else q.global_batch * gpus // q.gpus
        return replace(q, gpus=gpus, global_batch=batch)

    node = q.hardware.gpus_per_node
    more = [*range(q.gpus + 1, node), *range((q.gpus // node + 1) * node, 64 * q.gpus + 1, node)]
    hints, tight = [], 0
    for gpus in more:
        fitting = [r.tight for r in rows(asked(gpus))]
        if fitting and not all(fitting):
            fewer = f"{tight} GPUs fit tight, " if tight else ""
            hints.append(f"{fewer}{gpus} GPUs with room (global batch {asked(gpus).global_batch})")
            break
        tight = tight or (gpus if fitting else 0)
    else:
        if tight:
            hints.append(f"{tight} GPUs, tight (global batch {asked(tight).global_batch})")
    below = next(
        (g for g in range((q.gpus - 1) // node * node, 0, -node) if next(rows(asked(g)), None)),
        0,
    )
    if below:
        hints.append(f"or {below} GPUs (global batch {asked(below).global_batch})")
    seq = q.seq // 2
    while seq >= 512 and not next(rows(replace(q, seq=seq)), None):
        seq //= 2
    if seq >= 512:
        hints.append(f"sequences of {seq} tokens")
    if q.ac and q.ac != "full":
        hints.append("full AC (--ac full)" if next(rows(replace(q, ac="full")), None) else "")
    return "; ".join(h for h in hints if h) or "nothing within 64x the GPUs"


def inference_would_fit(m: ModelShape, hw: Hardware, gpus: int, tokens: int) -> str:
    """When no inference layout fits: the fewest GPUs (up to 64x) on which one does, its weights
    sharded over all of them and its tokens cut by the widest cp that divides them."""
    for more in range(gpus + 1, 64 * gpus + 1):
        cp = max(c for c in divisors(more) if c <= MAX_CP and tokens % c == 0)
        layout = Layout(dp_shard=more, cp=cp)
        if sum(inference_memory(m, layout, tokens).values()) <= hw.hbm_bytes:
            return f"{more} GPUs (dp_shard {more}, cp {cp})"
    return "nothing within 64x the GPUs"


VAE_OVER_WORKING = "VAE peak, over the denoiser's working set"


def inference_memory(m: ModelShape, layout: Layout, tokens: int) -> dict[str, float]:
    """A GPU's bytes at the peak of a video: the denoiser's parameters (sharded over dp_shard)
    and a text encoder's (sharded over all the GPUs, dp_replicate x dp_shard, but for its FSDP
    root, which stays gathered after its forward), then the larger of the denoiser's working
    set (one block's, cut over cp, and FSDP's two gathered blocks) and the VAE's measured peak
    (`AUTOENCODER_PEAK_GIB`), which come one after the other. Guardrail and image-context
    models, the CUDA context and the allocator's reserve are not counted (lab 11, chapter 2)."""
    working = {
        "activations": INFERENCE_WORKING_BYTES * m.hidden * tokens / layout.cp,
        "FSDP buffers": 2 * m.block_params() * 2 if layout.dp_shard > 1 else 0.0,
    }
    vae = AUTOENCODER_PEAK_GIB.get(m.autoencoder, 0.0) * GiB
    root, gpus = m.text_encoder_root, layout.dp_replicate * layout.dp_shard
    return {
        "parameters": 2 * m.params / layout.dp_shard,
        "text encoder (bf16)": 2 * (root + (m.text_encoder - root) / gpus),
        **working,
        VAE_OVER_WORKING: max(0.0, vae - sum(working.values())),
    }


def vae_lb_effect(
    hw: Hardware, layout: Layout, gpus: int, videos: list[tuple[int, int, int]]
) -> tuple[float, float]:
    """What lb changes: the VAE encode before the denoiser. The time model prices one video's
    passes on every rank of its group (`predict.vae_seconds`); what lb balances, uneven batches
    of raw videos over the ranks, is given here as the busiest rank's pixels. The raw `videos`
    (frames, height, width) are dealt round-robin to the video groups (cp x cfgp ranks each,
    every rank of a group holding the group's videos); each lb group of consecutive ranks runs
    lab 04's closest-fit plan on their `encode_cost`s. Returns the busiest rank's encode cost
    (pixels) and the seconds of the exchange: the costs' all-gather, then the raw videos out and
    the latents home (`exchange_bytes`; lab 04's latent, 1 byte a pixel), alpha-beta on the lb
    group's link. A rank with one video never moves it: only uneven batches gain."""
    group = layout.cp * layout.cfgp
    groups = gpus // group
    batch = [
        [torch.empty(3, *v, dtype=torch.uint8, device="meta") for v in videos[r // group :: groups]]
        for r in range(gpus)
    ]
    costs = {r: [encode_cost(v) for v in batch[r]] for r in range(gpus)}
    lb_groups = [list(range(start, start + layout.lb)) for start in range(0, gpus, layout.lb)]
    plan, loads = [], {}
    for ranks in lb_groups:
        local = {r: costs[r] for r in ranks}
        moves = plan_rebalance(local) if layout.lb > 1 else []
        loads.update(loads_of(local, assignment_from_moves(local, moves)))
        plan += [(mv.from_rank, mv.to_rank, mv.local_index) for mv in moves]
    if layout.lb == 1:
        return max(loads.values()), 0.0
    sent, received, gathered = exchange_bytes(batch, plan, lb_groups)
    link = link_for(hw, 1, layout.lb)
    seconds = max(
        link.time(gathered[r], layout.lb - 1)
        + (link.time(max(sent[r], received[r]), 1, calls=2) if sent[r] or received[r] else 0.0)
        for r in range(gpus)
    )
    return max(loads.values()), seconds


@functools.lru_cache(maxsize=256)  # keyed by lb: a question's divisors
def one_video_a_rank(hw: Hardware, lb: int) -> tuple[float, float]:
    """`vae_lb_effect` when every rank holds one copy of the same `RAW_VIDEO` (the planner's
    default): every lb group is alike, so one group of `lb` ranks gives it."""
    return vae_lb_effect(hw, Layout(lb=lb), lb, [RAW_VIDEO] * lb)


LB_EXCHANGE = "exposed: lb exchange"
LB_LOAD = "VAE encode, busiest rank (Mpx)"


def plan_inference(
    m: ModelShape,
    hw: Hardware,
    gpus: int,
    tokens: int,
    steps: int,
    videos: list[tuple[int, int, int]] | None = None,
    video: tuple[int, int, int] = (0, 0, 0),
) -> list[Row]:
    """Layouts of one video on `gpus` GPUs, fastest first (the other dp ranks' videos aside):
    every (dp_shard, cp, cfgp, lb) of divisors that `ParallelDims` accepts, cp dividing the
    tokens. `videos`: the raw videos the groups encode first (default one `RAW_VIDEO` each); lb
    only changes that encode.
    `video`: (frames, height, width) of the video the `tokens` come from, for the VAE's seconds
    (a model whose autoencoder is priced); (0, 0, 0) leaves them out.

    The denoiser's time does not depend on lb, nor the encode on dp_shard: each is computed once
    per layout it does depend on. With the default videos every rank holds one copy of the same
    video, so every lb group is alike and one of them gives the busiest load and the exchange."""
    eff = FITTED[hw.efficiency_from]
    w = Workload("diffusion", seq=tokens, steps=steps, video=video)
    rows = []

    @functools.cache
    def encode(cp: int, cfgp: int, lb: int) -> tuple[float, float]:
        if videos is None:
            return one_video_a_rank(hw, lb)
        return vae_lb_effect(hw, Layout(cp=cp, cfgp=cfgp, lb=lb), gpus, videos)

    # `ParallelDims` checks lb against the world size alone, the other axes without it: a
    # combination is valid when both parts are, so each part is asked once
    lbs = [lb for lb in divisors(gpus) if _valid_dims(gpus, lb=lb)]
    for cfgp in (1, 2) if m.branches == 2 else (1,):
        # cp splits the video's tokens evenly (Ulysses its heads too, else a ring)
        for cp in (d for d in divisors(gpus // cfgp) if d <= MAX_CP and tokens % d == 0):
            kind = "ulysses" if m.heads % cp == 0 else "ring"
            for dp_shard in divisors(gpus):
                if not _valid_dims(gpus, dp_shard=dp_shard, cp=cp, cfgp=cfgp):
                    continue
                denoiser = None
                partition = Layout(dp_shard=dp_shard, dp_replicate=gpus // dp_shard, cp=cp)
                memory = inference_memory(m, partition, tokens)
                for lb in lbs:
                    layout = Layout(
                        dp_shard=dp_shard,
                        dp_replicate=gpus // dp_shard,
                        cp=cp,
                        cp_kind=kind,
                        cfgp=cfgp,
                        lb=lb,
                    )
                    denoiser = denoiser or predict(m, hw, layout, w, eff)
                    load, exchange = encode(cp, cfgp, lb)
                    p = denoiser
                    if lb > 1:
                        p = replace(
                            p,
                            seconds=p.seconds + exchange,
                            breakdown={**p.breakdown, LB_EXCHANGE: exchange},
                        )
                    rows.append(
                        Row(
                            layout,
                            p,
                            memory,  # lb moves no byte of the denoiser's
                            hw.hbm_bytes,
                            p.seconds,
                            "s for one video",
                            {LB_LOAD: load / 1e6},
                        )
                    )
    return rank(rows, higher_is_better=False)


def _valid_dims(gpus: int, **sizes: int) -> bool:
    """Whether `ParallelDims` accepts these inference sizes on `gpus` ranks."""
    try:
        ParallelDims(gpus, enable_inference_mode=True, **sizes)
    except ValueError:
        return False
    return True


def rank(rows: list[Row], higher_is_better: bool) -> list[Row]:
    """Layouts that fit first, best first; then the OOM ones."""
    sign = -1 if higher_is_better else 1
    return sorted(rows, key=lambda r: (r.oom, sign * r.score))


def describe(layout: Layout, ac: str = "") -> str:
    """A layout in one line: its degrees above 1, then the training knobs that were chosen.
    Inference (no `ac`): the overlay axes, which group the same GPUs again, then how the
    weights are sharded over the partition (`ParallelDims`: dp_replicate x dp_shard = GPUs)."""
    if not ac:
        overlays = [
            f"{k} {getattr(layout, k)}" for k in ("cp", "cfgp", "lb") if getattr(layout, k) > 1
        ]
        if layout.cp > 1:
            overlays[0] += f" ({layout.cp_kind})"
        sharded = f", weights over dp_shard {layout.dp_shard}" if layout.dp_shard > 1 else ""
        return (" x ".join(overlays) or "a video a GPU") + sharded
    parts = [
        f"{k} {getattr(layout, k)}"
        for k in ("dp_replicate", "dp_shard", "cp", "cfgp", "lb", "tp", "pp")
        if getattr(layout, k) > 1
    ]
    if layout.cp > 1:
        parts[[p.startswith("cp") for p in parts].index(True)] += f" ({layout.cp_kind})"
    knobs = [f"ep {layout.ep} of dp_shard x cp"] if layout.ep > 1 else []
    if layout.tp > 1:
        knobs.append("SP" if layout.sp else "no SP")
        knobs += ["async TP"] if layout.async_tp else []
    if layout.pp > 1:
        v = f" v{layout.virtual}" if layout.virtual > 1 else ""
        knobs.append(f"{layout.schedule}{v} m{layout.microbatches}")
    elif accumulation(layout) > 1:
        knobs.append(f"accumulate {layout.microbatches}")
    return (" x ".join(parts) or "1 GPU") + f" [{', '.join([*knobs, f'AC {ac}'])}]"


NEAR_TIE_SHOWN = 1e-3
"""A winner's lead under this share of its time is called a near tie: the table's four
digits do not tell the two apart."""


def why(rows: list[Row]) -> str:
    """One sentence: what the best layout saves, from the breakdowns, against plain FSDP
    (training, dp_shard alone) when that fits, else against the best layout that splits the
    work differently (another cp, cfgp, tp or pp: dp_shard alone only moves memory)."""
    fitting = [r for r in rows if not r.oom]
    if not fitting:
        least = min(rows, key=lambda r: r.total_memory) if rows else None
        need = f" (the least, {describe(least.layout, least.ac)}, needs " if least else " ("
        gib = f"{least.total_memory / GiB:.1f} GiB of {least.hbm / GiB:.1f})" if least else ")"
        return f"No layout fits in HBM{need}{gib}."
    best = fitting[0]
    training = bool(best.ac)

    def axes(r: Row) -> tuple[int, ...]:
        return (r.layout.cp, r.layout.cfgp, r.layout.tp, r.layout.pp)

    def tied(r: Row) -> bool:
        return math.isclose(r.score, best.score, rel_tol=1e-9)

    ties = [r for r in fitting[1:] if tied(r) and line_name(r) != line_name(best)]
    pure_dp = [
        r for r in fitting if training and axes(r) == (1, 1, 1, 1) != axes(best) and not tied(r)
    ]
    others = (
        pure_dp
        or [r for r in fitting if axes(r) != axes(best) and not tied(r)]
        or [r for r in fitting[1:] if not tied(r)]
    )
    tie_note = (
        f"; {', '.join(describe(r.layout, r.ac) for r in ties[:3])}"
        f"{f' and {len(ties) - 3} more' if len(ties) > 3 else ''} tie with it"
        if ties
        else ""
    )
    roomy = next((r for r in fitting if not r.tight), None)
    margin = (
        f"; it is tight ({best.total_memory / GiB:.1f} GiB allocated of {best.hbm / GiB:.1f}, "
        f"and published reserved peaks ran up to {reserved_over_allocated():.2f}x the model's "
        "figure)"
        + (
            f": the fastest ranked layout with that room is {describe(roomy.layout, roomy.ac)}"
            if roomy
            else ": no ranked layout has that room"
        )
        if best.tight
        else ""
    )
    if not others:
        alone = "ties with every other layout that fits" if ties else "is the only layout that fits"
        return f"{describe(best.layout, best.ac)} {alone} in HBM{margin}."
    other = others[0]
    keys = set(best.prediction.breakdown) | set(other.prediction.breakdown)
    gap = {
        k: other.prediction.breakdown.get(k, 0.0) - best.prediction.breakdown.get(k, 0.0)
        for k in keys
    }
    key = max(gap, key=gap.get)
    lead = other.score - best.score
    near = (
        f", a near tie ({lead:.3g} s of {_number(best.score, 4)})"
        if lead < NEAR_TIE_SHOWN * best.score
        else ""
    )
    oom_faster = [r for r in rows if r.oom and r.prediction and r.score < best.score]
    tail = (
        (
            f"; {describe(oom_faster[0].layout, oom_faster[0].ac)} would be faster but needs "
            f"{oom_faster[0].total_memory / GiB:.0f} GiB"
        )
        if oom_faster
        else ""
    )
    return (
        f"{describe(best.layout, best.ac)} wins: against "
        f"{'pure dp' if pure_dp else 'the runner-up'} ({describe(other.layout, other.ac)}) it "
        f"spends {gap[key]:.3g} s less on {key}{near}{tail}{tie_note}{margin}."
    )


def _number(value: float, digits: int) -> str:
    """`digits` significant digits, a large or small value written out rather than in
    e-notation."""
    if abs(value) >= 10**digits:
        return f"{value:.0f}"
    if 0 < abs(value) < 1e-4:  # where the g format turns to e-notation
        return f"{value:.{digits - 1 - math.floor(math.log10(abs(value)))}f}"
    return f"{value:.{digits}g}"


def _extra(key: str, value: float) -> str:
    """MFU as a percentage, as the breakdown prints it."""
    return f"{value:.1%}" if key == "MFU" else _number(value, 4)


def _cells(r: Row, keys: list[str], extras: list[str], memory: list[str]) -> list[str]:
    p = None if r.oom else r.prediction  # a layout that does not fit is not timed in the table
    cells = [_number(r.score, 4) if p else "-"]
    cells += [_number(p.breakdown.get(k, 0.0), 3) if p else "-" for k in keys]
    cells += [_extra(k, r.extras[k]) if k in r.extras else "-" for k in extras]
    cells += [f"{r.memory.get(k, 0.0) / GiB:.1f}" for k in memory]
    return cells + [
        f"{r.total_memory / GiB:.1f}",
        "OOM" if r.oom else "tight" if r.tight else "yes",
    ]


def line_name(r: Row) -> str:
    """The layout as its table line names it: rows that differ only in lb share a line."""
    return describe(replace(r.layout, lb=1), r.ac)


def lb_alike(r: Row) -> tuple:
    """What a table line shows but the lb degree and the lb exchange: rows that share it are
    one line."""
    p = r.prediction
    times = [(k, _number(v, 3)) for k, v in p.breakdown.items() if k != LB_EXCHANGE] if p else []
    return (
        line_name(r),
        _number(r.score, 4) if p else "-",
        tuple(sorted(times)),
        tuple(sorted((k, f"{v:.4g}") for k, v in r.extras.items())),
        tuple(sorted((k, f"{v / GiB:.1f}") for k, v in r.memory.items())),
        r.oom,
    )


LB_LISTED = 6
"""A table line names at most this many of the lb degrees it merges; beyond, the first ones,
the last and their count."""


def _shown_rank(r: Row) -> tuple[bool, float]:
    """Where a row ranks as its line prints it: fitting first, then its time at four digits."""
    return r.oom, float(_number(r.score, 4)) if r.prediction else math.inf


def table(rows: list[Row], limit: int = 12) -> str:
    """The first `limit` lines of ranked `rows`: seconds by where they go, then each memory
    entry in GiB (allocated) and the total against HBM. Rows that differ only in lb and print
    the same numbers but the lb exchange are one line: their lb degrees joined, the exchange as
    its range."""
    lines_of: dict[tuple, list[Row]] = {}
    last = None
    for r in rows:
        if last and len(lines_of) == limit and _shown_rank(r) > _shown_rank(last):
            break  # ranked rows: no later one prints the numbers of a line already shown
        key = lb_alike(r)
        if key in lines_of or len(lines_of) < limit:
            lines_of.setdefault(key, []).append(r)
            last = r
    shown = [r for group in lines_of.values() for r in group]
    keys = sorted({k for r in shown if r.prediction for k in r.prediction.breakdown})
    memory = list(dict.fromkeys(k for r in shown for k in r.memory))
    extras = list(dict.fromkeys(k for r in shown for k in r.extras))
    hbm = f"GiB/GPU of {rows[0].hbm / GiB:.1f}"
    head = ["layout", rows[0].score_name, *keys, *extras, *memory, hbm, "fits"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for group in lines_of.values():
        first, cells = group[0], _cells(group[0], keys, extras, memory)
        name = describe(first.layout, first.ac)
        if len(group) > 1:
            lbs = [str(lb) for lb in sorted(r.layout.lb for r in group)]
            listed = "|".join(lbs)
            if len(lbs) > LB_LISTED:
                listed = (
                    "|".join([*lbs[: LB_LISTED - 1], "...", lbs[-1]]) + f" ({len(lbs)} degrees)"
                )
            name = f"{line_name(first)}, lb {listed}"
            spent = [r.prediction.breakdown.get(LB_EXCHANGE, 0.0) for r in group]
            cells[head.index(LB_EXCHANGE) - 1] = (
                f"{_number(min(spent), 3)}-{_number(max(spent), 3)}"
            )
        lines.append(" | ".join([name, *cells]))
    return "\n".join(lines)


def row_json(r: Row) -> dict:
    """One row as plain data: the layout's degrees and knobs, memory (GiB) item by item, time."""
    lo, p = r.layout, r.prediction
    layout = {k: getattr(lo, k) for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp")}
    layout |= {
        "ep": lo.ep,
        "cfgp": lo.cfgp,
        "lb": lo.lb,
        "cp_kind": lo.cp_kind if lo.cp > 1 else None,
        "schedule": lo.schedule if lo.pp > 1 else None,
        "virtual": lo.virtual,
        "microbatches": lo.microbatches,
        "async_tp": lo.async_tp,
        "sp": lo.sp,
        "ac": r.ac or None,
    }
    overlays = [] if r.ac else ["cp", "cfgp", "lb"]
    return {
        "layout": layout,
        "memory_gib": r.total_memory / GiB,
        "memory_items": {k: v / GiB for k, v in r.memory.items()},
        "overlays": overlays,
        "memory_kind": "allocated",
        "fits": not r.oom,
        "tight": r.tight,
        "step_seconds": p.seconds if p else None,
        "breakdown": dict(p.breakdown) if p else {},
        "tokens_per_s_per_gpu": (p.tokens_per_s_per_gpu or None) if p else None,
        "mfu": r.extras.get("MFU"),
        **{k: v for k, v in r.extras.items() if k not in ("MFU", "tokens/s/GPU")},
    }


LAYOUT_KEYS = {
    "dp_replicate": int,
    "dp_shard": int,
    "cp": int,
    "tp": int,
    "pp": int,
    "ep": int,
    "virtual": int,
    "microbatches": int,
    "schedule": str,
    "cp_kind": str,
    "sp": bool,
    "async_tp": bool,
    "ac": str,
}


BOOLEANS = {"1": True, "true": True, "yes": True, "on": True}
BOOLEANS |= {"0": False, "false": False, "no": False, "off": False}


def parse_layout(text: str, gpus: int) -> tuple[Layout, str | None, frozenset[str]]:
    """`--layout "dp_shard=8,tp=8,pp=16"` as a Layout, its AC mode (None if not given) and the
    fields it gives; dp_shard, if not given, takes the GPUs the other degrees leave. Raises
    ValueError naming the bad field."""
    fields: dict = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in LAYOUT_KEYS:
            raise ValueError(f"unknown layout field {key!r}; fields: {', '.join(LAYOUT_KEYS)}")
        if key in fields:
            raise ValueError(f"layout field {key} is given twice")
        kind = LAYOUT_KEYS[key]
        value = value.strip()
        if kind is bool:
            if value.lower() not in BOOLEANS:
                raise ValueError(f"layout field {key}={value!r}: one of {', '.join(BOOLEANS)}")
            fields[key] = BOOLEANS[value.lower()]
        elif kind is int:
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"layout field {key}={value!r} must be a positive integer")
            fields[key] = int(value)
        else:
            fields[key] = value
    given = set(fields)
    ac = fields.pop("ac", None)
    if ac is not None and ac not in AC_MODES:
        raise ValueError(f"ac={ac!r}; AC modes: {', '.join(AC_MODES)}")
    if fields.get("schedule", "1f1b") not in TRAIN_SCHEDULES:
        raise ValueError(
            f"schedule={fields['schedule']!r}; schedules: {', '.join(TRAIN_SCHEDULES)}"
        )
    if fields.get("cp_kind", "zigzag") not in CP_KINDS:
        raise ValueError(f"cp_kind={fields['cp_kind']!r}; kinds: {', '.join(CP_KINDS)}")
    fields.setdefault("cp_kind", "zigzag")
    # virtual stages imply the interleaved schedule; an interleaved one leaves their count open
    if fields.get("virtual", 1) > 1:
        fields.setdefault("schedule", "interleaved")
        given.add("schedule")
    if fields.get("schedule") == "interleaved":
        fields.setdefault("virtual", INTERLEAVED_VIRTUAL[0])
    others = math.prod(fields.get(k, 1) for k in ("dp_replicate", "cp", "tp", "pp"))
    if "dp_shard" not in fields and gpus % others == 0:
        fields["dp_shard"] = gpus // others
    layout = Layout(**fields)
    if layout.world != gpus:
        raise ValueError(f"the layout's degrees multiply to {layout.world}, not --gpus {gpus}")
    for knob in ("sp", "async_tp"):
        if getattr(layout, knob) and layout.tp == 1:
            raise ValueError(f"{knob} needs tp > 1 (tp={layout.tp})")
    if "sp" in given and layout.async_tp and not layout.sp:
        raise ValueError(
            "async_tp needs sp: torch's async TP fuses SP's all-gathers and reduce-scatters into "
            "the matmuls, and Megatron overlaps TP communication only under sequence parallel"
        )
    if "cp_kind" in given and layout.cp == 1:
        raise ValueError(f"cp_kind={layout.cp_kind} needs cp > 1 (cp={layout.cp})")
    return layout, ac, frozenset(given)


LEAST_MEMORY = {
    "cp_kind": "zigzag",
    "sp": "SP on",
    "async_tp": "async TP off",
    "schedule": "1F1B",
    "virtual": "two virtual stages",
    "microbatches": "a sequence a micro-batch (or a pass)",
    "ep": "the widest ep",
    "ac": "the AC mode that recomputes least and fits, else full AC",
}
"""What `--layout` may leave out for the planner to choose (the degrees it always fixes), and
what each is when no choice fits (`layout_row`)."""
KNOBS = tuple(LEAST_MEMORY)


def layout_row(
    q: TrainQuestion, layout: Layout, ac: str | None, given: frozenset[str]
) -> tuple[Row, bool]:
    """`--layout`'s row, and whether its knobs were searched. The degrees, the dp_replicate x
    dp_shard split and every knob given stay; the knobs left out are chosen as the search
    chooses them, over the layouts it tries with these degrees: the least recompute that fits
    (without pp, the fewest passes) and, of those, the fastest (`ac` narrows the AC modes).
    Where none fits, or the search never tries these degrees (tp across nodes, or fewer
    sequences a dp rank than stages), the least memory instead: SP on under tp (torchtitan
    applies it with every TP plan; Megatron's published runs set it), async TP off, 1F1B, the
    widest ep, a sequence a micro-batch (or, without pp, a pass) that the schedule allows, and
    the least recompute that fits, else full AC. Raises ValueError when no micro-batch count
    suits the layout's schedule."""
    q = replace(q, ac=ac) if ac else q
    fixed = {k: getattr(layout, k) for k in given if k in KNOBS and k != "ac"}
    split = {"dp_shard": layout.dp_shard, "dp_replicate": layout.dp_replicate}
    tried = dict.fromkeys(  # in the search's order: a tie goes the same way every run
        changed(lo, **split, **fixed) for lo in train_layouts(q) if degrees(lo) == degrees(layout)
    )
    rows = []
    for lo in tried:
        if check_layout(q, lo):  # a given knob the searched one does not go with
            continue
        if lo.async_tp and not lo.sp:  # async TP comes with SP in the search, as in the engines
            continue
        if lo.pp == 1 and "microbatches" in fixed:
            choices = [(lo, mode)] if (mode := least_recompute_that_fits(q, lo)) else []
        else:
            choices = knob_choices(q, lo)
        rows += [train_row(q, chosen, mode) for chosen, mode in choices]
    if rows:
        return min(rows, key=lambda r: r.score), True
    least = {"sp": layout.tp > 1, "ep": expert_degrees(q.model, layout.dp_shard * layout.cp)[-1]}
    layout = changed(layout, **{k: v for k, v in least.items() if k not in given})
    if "microbatches" not in given:
        local = q.global_batch // (layout.dp_shard * layout.dp_replicate)
        interleaved = layout.schedule == "interleaved"
        counts = [d for d in divisors(local) if not interleaved or d % layout.pp == 0]
        if not counts:
            raise ValueError(
                f"interleaved needs micro-batches divisible by pp={layout.pp}; {local} "
                "sequences per dp rank have none"
            )
        passes = counts[-1] if counts[-1] > 1 or layout.pp > 1 else 0
        layout = changed(layout, microbatches=passes)
    return train_row(q, layout, least_recompute_that_fits(q, layout) or q.ac or "full"), False


def chosen_knobs(m: ModelShape, layout: Layout, given: frozenset[str]) -> list[str]:
    """The knobs of `layout` that `--layout` left out and that apply to it."""
    applies = {
        "cp_kind": layout.cp > 1,
        "sp": layout.tp > 1,
        "async_tp": layout.tp > 1,
        "schedule": layout.pp > 1,
        "virtual": layout.schedule == "interleaved",
        "microbatches": True,
        "ep": bool(m.experts),
        "ac": True,
    }
    return [k for k in KNOBS if k not in given and applies[k]]


def check_layout(q: TrainQuestion, layout: Layout) -> str:
    """Why `layout` cannot run `q` (divisibility), or ''."""
    m, dp = q.model, layout.dp_shard * layout.dp_replicate
    if layout.ep > 1 and not m.experts:
        return f"ep={layout.ep}: {m.name} has no experts"
    if layout.ep not in expert_degrees(m, layout.dp_shard * layout.cp):
        return f"ep={layout.ep} must divide {m.name}'s {m.experts} experts and dp_shard x cp"
    if m.heads % layout.tp or m.kv_heads % layout.tp:
        return f"tp={layout.tp} must divide {m.heads} heads and {m.kv_heads} kv heads"
    ulysses = layout.tp * layout.cp
    if (
        layout.cp_kind == "ulysses"
        and layout.cp > 1
        and (m.heads % ulysses or m.kv_heads % ulysses)
    ):
        return f"ulysses: tp x cp = {ulysses} must divide {m.heads} heads and {m.kv_heads} kv heads"
    if q.seq % (2 * layout.cp):
        return f"--seq {q.seq} is not divisible by 2 x cp = {2 * layout.cp}"
    if layout.pp == 1 and (layout.virtual > 1 or layout.schedule != "1f1b"):
        return f"schedule={layout.schedule} and virtual={layout.virtual} need pp > 1"
    if (layout.virtual > 1) != (layout.schedule == "interleaved"):
        return (
            f"schedule={layout.schedule}, virtual={layout.virtual}: interleaved alone takes "
            "virtual > 1, and needs it"
        )
    if not layers_split(m, layout.pp * layout.virtual):
        return f"pp x virtual = {layout.pp * layout.virtual} stages for {m.layers} layers"
    if q.global_batch % dp:
        return f"--global-batch {q.global_batch} is not divisible by dp = {dp}"
    if layout.schedule == "interleaved" and layout.microbatches % layout.pp:
        return (
            f"interleaved needs micro-batches divisible by pp={layout.pp}, "
            f"not {layout.microbatches}"
        )
    if layout.microbatches > 1 and (q.global_batch // dp) % layout.microbatches:
        return f"{q.global_batch // dp} sequences per dp rank do not split into {layout.microbatches} micro-batches"
    return ""


def breakdown(r: Row) -> str:
    """One layout in full: every time item and every memory item."""
    p = r.prediction
    lines = [describe(r.layout, r.ac), "", "| time | seconds |", "| --- | --- |"]
    lines += [f"| {k} | {v:.4g} |" for k, v in p.breakdown.items()]
    lines += [f"| step | {p.seconds:.4g} |", f"| tokens/s/GPU | {p.tokens_per_s_per_gpu:.4g} |"]
    lines += [
        f"| MFU | {r.extras['MFU']:.1%} |",
        "",
        "| memory (allocated) | GiB |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v / GiB:.2f} |" for k, v in r.memory.items()]
    verdict = "OOM" if r.oom else "tight" if r.tight else "fits"
    lines.append(f"| total | {r.total_memory / GiB:.2f} of {r.hbm / GiB:.1f}: {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paralab.plan",
        # argparse's generated usage spells out every model and part: ten lines above a
        # one-line error. This one fits a line; --help still lists the choices.
        usage="%(prog)s --model MODEL --hardware PART --gpus N (--train | --inference) [options]",
        description=__doc__,
    )
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--hardware", required=True, choices=sorted(HARDWARE))
    parser.add_argument("--gpus", type=int, required=True)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--train", action="store_true")
    mode.add_argument("--inference", action="store_true")
    parser.add_argument("--seq", type=int, default=8192, help="training sequence length")
    parser.add_argument(
        "--global-batch", type=int, default=0, help="sequences a step (default, or 0: 2 a GPU)"
    )
    parser.add_argument(
        "--ac", choices=AC_MODES, help="one AC mode (default: each of the engine's)"
    )
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"])
    parser.add_argument("--compile", action="store_true", help="training: torch.compile each block")
    parser.add_argument(
        "--engine",
        default="torchtitan",
        choices=ENGINES,
        help="training: whose kernels and overlap",
    )
    parser.add_argument(
        "--layout",
        help='training: evaluate one layout, e.g. "dp_shard=8,tp=8,pp=16"; knobs left out '
        "(sp, async_tp, schedule, virtual, microbatches, ep, ac, cp_kind) as the search picks",
    )
    parser.add_argument("--json", default="", help="write every row as a JSON list (- = stdout)")
    parser.add_argument(
        "--tokens", type=int, default=0, help="inference: tokens of one video (VAE not timed)"
    )
    parser.add_argument("--steps", type=int, default=35, help="inference: denoising steps")
    parser.add_argument(
        "--videos",
        default="",
        help="inference: raw videos FxHxW,... dealt to the video groups (default 93x704x1280 each)",
    )
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    m, hw = model(args.model), hardware(args.hardware)
    for name in ("gpus", "seq", "top", "steps"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} {getattr(args, name)} must be a positive integer")
    for name in ("global_batch", "tokens"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 0")
    if args.dtype == "fp8" and hw.peak_fp8 <= 0:
        parser.error(f"--dtype fp8: {hw.name} has no fp8 tensor cores; use bf16")
    if args.train and m.kind != "lm":
        lms = ", ".join(k for k, v in MODELS.items() if v.kind == "lm")
        parser.error(f"--train plans language models ({lms}); {m.name} is a {m.kind} model")
    if args.inference and m.kind != "dit":
        dits = ", ".join(k for k, v in MODELS.items() if v.kind == "dit")
        parser.error(f"--inference plans the diffusion models ({dits}); {m.name} is not one")
    mode_only = (
        ("steps", "tokens", "videos")
        if args.train
        else ("seq", "global_batch", "ac", "engine", "compile", "dtype", "layout")
    )
    for name in mode_only:
        if getattr(args, name) != parser.get_default(name):
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} is for {'--inference' if args.train else '--train'}")
    if args.inference and m.makes != "video" and not args.tokens:
        image = m.video_tokens(1024, 1024, 1)
        parser.error(
            f"{m.name} makes images: give --tokens (one 1024x1024 image is {image} latent patches)"
        )
    if args.layout is not None and not args.layout.replace(" ", "").strip(","):
        parser.error('--layout is empty; give degrees, e.g. "dp_shard=8,tp=8,pp=16"')
    if args.train:
        gb = args.global_batch or 2 * args.gpus
        q = TrainQuestion(
            m, hw, args.gpus, args.seq, gb, args.ac, args.dtype, args.compile, args.engine
        )
        if args.layout:
            try:
                layout, ac, given = parse_layout(args.layout, args.gpus)
            except (ValueError, TypeError) as e:
                parser.error(f"--layout {args.layout!r}: {e}")
            if args.ac and ac and args.ac != ac:
                parser.error(f"--ac {args.ac} and the layout's ac={ac} disagree; give one")
            if args.ac:
                given |= {"ac"}
            problem = check_layout(q, layout)
            if problem:
                parser.error(f"--layout {args.layout!r}: {problem}")
            try:
                row, searched = layout_row(q, layout, args.ac or ac, given)
            except ValueError as e:
                parser.error(f"--layout {args.layout!r}: {e}")
            rows = [row]
        else:
            rows = plan_question(q)
            if not rows:
                parser.error(
                    f"no layout of exactly {args.gpus} GPUs divides {m.name}'s heads, "
                    f"layers, --seq {args.seq} and --global-batch {gb}"
                )
    else:
        frames, height, width = RAW_VIDEO
        tokens = args.tokens or m.video_tokens(width, height, frames)
        video = (0, 0, 0) if args.tokens else RAW_VIDEO
        try:
            videos = [tuple(int(x) for x in v.split("x")) for v in args.videos.split(",") if v]
        except ValueError:
            parser.error(f"--videos {args.videos!r}: expected FxHxW,... (e.g. 93x704x1280)")
        if any(len(v) != 3 or min(v) <= 0 for v in videos):
            parser.error(f"--videos {args.videos!r}: each video is FxHxW, positive integers")
        rows = plan_inference(m, hw, args.gpus, tokens, args.steps, videos or None, video)
    if args.json:
        text = json.dumps([row_json(r) for r in rows], indent=1)
        if args.json == "-":
            print(text)
            return 0
        try:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        except OSError as e:
            parser.error(f"--json {args.json}: {e.strerror}")
    if args.layout:
        print(breakdown(rows[0]))
        left = chosen_knobs(m, rows[0].layout, given)
        if left and searched:
            print(
                "\nLeft out of --layout, as the search's fastest row of these degrees: "
                f"{', '.join(left)}."
            )
        elif left:
            print(
                f"\nLeft out of --layout: {', '.join(left)}. The search times no row of these "
                "degrees that fits (it tries none with tp across nodes, or with fewer sequences "
                "a dp rank than stages), so they are set for the least memory: "
                f"{', '.join(LEAST_MEMORY[k] for k in left)}."
            )
        if layout.tp > hw.gpus_per_node:
            print(
                f"\ntp {layout.tp} spans {-(-layout.tp // hw.gpus_per_node)} nodes of "
                f"{hw.gpus_per_node} GPUs: its collectives cross the network (the search keeps "
                "tp inside a node)."
            )
        return 0
    print(table(rows, args.top))
    print(why(rows))
    if all(r.oom for r in rows):
        hint = (
            what_would_fit(q, batch_given=bool(args.global_batch))
            if args.train
            else inference_would_fit(m, hw, args.gpus, tokens)
        )
        print(f"What would fit: {hint}.")
    return 0


def degrees(layout: Layout) -> tuple[int, int, int, int]:
    """(dp, cp, tp, pp), dp = dp_replicate x dp_shard: the degrees a published layout states."""
    return (layout.dp_replicate * layout.dp_shard, layout.cp, layout.tp, layout.pp)


def tuple_rank(rows: list[Row], wanted: tuple[int, int, int, int]) -> tuple[int | None, int]:
    """Where `wanted` degrees come among the distinct degree tuples of the rows that fit, each
    at its fastest row (1 = first; None if no fitting row has them), and how many tuples fit."""
    tuples = list(dict.fromkeys(degrees(r.layout) for r in rows if not r.oom))
    return (tuples.index(wanted) + 1 if wanted in tuples else None), len(tuples)


TOP = 3
"""Where a published layout's degrees should come: among the planner's first three tuples."""
NEAR_TIE = 0.05
"""A step within 5 % of the first's is a tie to this model: it times every GEMM at one fitted
efficiency, while Megatron-LM's own weak-scaling table, one code on one cluster, spans 41 % to
49 % MFU as the GEMMs grow (NVIDIA/Megatron-LM@d98e8a6:images/model_table.png)."""
WHY_NOT_FIRST = {
    "near tie": "its step is within 5 % of the first's",
    "recompute": "the first recomputes less: the run paid AC, or its AC does not fit here",
    "exposed: tp": "the run's TP backward collectives stay exposed; the first has less TP",
    "pp bubble": "the run's pipeline idles: too few micro-batches for its stages",
    "exposed: ep": "every all-to-all of the run's ep is exposed; the first has less ep",
    "no fit": "its degrees fit in no layout the memory model counts",
}
"""Why a published row's degrees rank below the top three: `RankCheck.reason`."""


@dataclass
class RankCheck:
    """A published training row asked of the planner: the row's question (model, hardware,
    GPUs, sequence, global batch, dtype, compile) with every AC mode open, and on demand at the
    run's own AC mode."""

    name: str
    degrees: tuple[int, int, int, int]
    ac: str
    """The AC mode the run used."""
    rank: int | None
    tuples: int
    first: Row
    published: Row | None
    """The fastest fitting row with the published degrees."""
    question: TrainQuestion
    """The row's question, every AC mode open."""

    @functools.cached_property
    def rank_at_ac(self) -> int | None:
        """The published degrees' rank when the planner is held to the run's AC mode: a second
        search, run only when asked (a recompute reason, a table), not for every row."""
        return tuple_rank(planned(replace(self.question, ac=self.ac)), self.degrees)[0]

    @property
    def gap(self) -> float:
        """How much longer the published degrees' best step is than the first's."""
        return self.published.score / self.first.score - 1 if self.published else math.inf

    def saving(self) -> tuple[str, float]:
        """The item of the breakdown on which the first row saves most against the published
        degrees' best, and the seconds."""
        mine, theirs = self.first.prediction.breakdown, self.published.prediction.breakdown
        gaps = {k: theirs.get(k, 0.0) - mine.get(k, 0.0) for k in {*mine, *theirs}}
        item = max(sorted(gaps), key=gaps.get)
        return item, gaps[item]

    def reason(self) -> str | None:
        """None in the top three; else a key of `WHY_NOT_FIRST`: no fit, a near tie, or the
        item the first saves most on (a compute item is recompute: the model times a GEMM or
        attention FLOP alike in every layout)."""
        if self.rank is not None and self.rank <= TOP:
            return None
        if self.published is None:
            return "no fit"
        if self.gap < NEAR_TIE:
            return "near tie"
        item, _ = self.saving()
        return "recompute" if item.startswith("compute") else item


def plan_question(q: TrainQuestion, oom: bool = True) -> list[Row]:
    """`plan_train` of a question."""
    question = (q.model, q.hardware, q.gpus, q.seq, q.global_batch, q.ac, q.dtype)
    return plan_train(*question, q.compile, q.engine, oom=oom)


@functools.lru_cache(maxsize=8)  # the published rows that share a question come together
def planned(q: TrainQuestion) -> tuple[Row, ...]:
    """The layouts that fit `q`, ranked, asked once: published rows that differ only in what
    the question leaves out (async TP or not, the pipeline schedule) share it. A rank among
    them reads no layout that does not fit, so none is counted."""
    return tuple(plan_question(q, oom=False))


def rank_published(case: Case, hw: Hardware | None = None) -> RankCheck:
    """`RankCheck` of a published training row, asked on `hw` (default the row's hardware)."""
    lo, w = case.layout, case.workload
    batch = w.micro_batch * lo.dp_shard * lo.dp_replicate
    q = TrainQuestion(
        case.model, hw or case.hardware, case.gpus, w.seq, batch, None, w.dtype, w.compile, w.engine
    )
    rows = planned(q)
    if not rows:
        raise ValueError(f"{case.name}: no layout of {case.gpus} GPUs fits its question")
    rank, tuples = tuple_rank(rows, degrees(lo))
    published = next((r for r in rows if not r.oom and degrees(r.layout) == degrees(lo)), None)
    return RankCheck(case.name, degrees(lo), w.ac, rank, tuples, rows[0], published, q)


def rank_table(checks: list[RankCheck]) -> str:
    """One line a published row: its degrees and AC mode, their rank (free, and at the run's
    AC mode), the planner's first, both steps, and the item the first saves most on."""

    def dots(d: tuple[int, ...]) -> str:
        return "·".join(map(str, d))

    rows = []
    for c in checks:
        item, seconds = c.saving() if c.published and c.rank != 1 else ("-", 0.0)
        rows.append(
            (
                c.name,
                f"{dots(c.degrees)} ({c.ac})",
                f"{c.rank or '-'}/{c.tuples}",
                c.rank_at_ac or "-",
                f"{dots(degrees(c.first.layout))} ({c.first.ac})",
                f"{c.first.score:.3g}",
                f"{c.published.score:.3g}" if c.published else "-",
                f"{item} {seconds:.3g} s" if item != "-" else "-",
                c.reason() or "top 3",
            )
        )
    header = (
        "published row",
        "dp·cp·tp·pp (AC)",
        "rank",
        "at its AC",
        "planner's first (AC)",
        "first s",
        "its best s",
        "first saves most on",
        "why",
    )
    return text_table(header, rows, align_right=(2, 3, 5, 6))


def published_training_rows() -> list[Case]:
    """Every published training row (`CASES.toml`, `GENERALIZATION.toml`): each states the
    layout it ran."""
    cases = [c for path in (SHIPPED, GENERALIZATION) for c in load_cases(path)]
    return [c for c in cases if c.workload.kind == "train"]
