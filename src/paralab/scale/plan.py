"""The layout planner: every valid layout of a model on a cluster, its memory per GPU against HBM
and its predicted time, ranked; the ones that do not fit are marked OOM.

Training enumerates torchtitan's consuming descriptor (dp_shard, cp, tp, pp: their product is
the world); inference enumerates `paralab.ParallelDims` (dp_shard shards the weights, cp,
cfgp and lb overlay the same ranks; lb balances the VAE encode before the denoiser, shown as
its exchange seconds and the busiest rank's encode load). Memory per GPU is itemized:
parameters, gradients, optimizer state, activations under the AC mode, logits, FSDP buffers.
`python -m paralab.plan --help`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace

import torch

from paralab.parallel_dims import ParallelDims
from paralab.scale.fit import FITTED
from paralab.scale.hardware import Hardware, hardware
from paralab.scale.models import ModelShape, model
from paralab.scale.predict import Layout, Prediction, Workload, fsdp_shard, link_for, predict
from paralab.vae_lb.costs import encode_cost, exchange_bytes
from paralab.vae_lb.planner import assignment_from_moves, loads_of, plan_rebalance

TRAIN_STATE_BYTES = {"parameters": 4, "gradients": 4, "optimizer": 8}
"""Per parameter, each sharded over dp_shard x cp x tp x pp (torchtitan's FSDP2 mixed precision,
FSDP on the flattened dp_shard x cp group: `predict.fsdp_shard`): the fp32 master weight, the
fp32 gradient, AdamW's two fp32 moments."""
RAW_VIDEO = (93, 704, 1280)
"""(frames, height, width) of the raw video each inference group encodes by default: 720p."""
SAVED_BYTES_PER_TOKEN = {"none": 34, "selective": 16, "full": 2}
"""Activation bytes a block keeps per token, in units of the hidden size. none: 34 h, the
count of Korthikanti et al. (2022, "Reducing Activation Recomputation", eq. 1) without its
attention-score term, which flash attention never stores. full: the block's bf16 input (2 h).
selective (torchtitan's op policy, which keeps attention and every other matmul output):
about half of the 34 h, our estimate."""
LOGIT_BYTES = 6
"""Per token and vocabulary entry: bf16 logits and their fp32 copy for the loss."""
INFERENCE_WORKING_BYTES = 24
"""Per token of one block in inference, in units of hidden: input, q, k, v, output (2 bytes each)
and the 4 h MLP activation, held while the block runs."""


@dataclass
class Row:
    layout: Layout
    prediction: Prediction
    memory: dict[str, float]
    hbm: float
    score: float
    score_name: str
    extras: dict[str, float] = field(default_factory=dict)
    """Numbers outside the time and the memory, shown as columns: the VAE encode's load."""

    @property
    def total_memory(self) -> float:
        return sum(self.memory.values())

    @property
    def oom(self) -> bool:
        return self.total_memory > self.hbm


def powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def train_memory(m: ModelShape, layout: Layout, w: Workload) -> dict[str, float]:
    """Bytes one GPU holds at its peak: sharded states, FSDP's gathered blocks, activations, logits."""
    lo = layout
    shard = fsdp_shard(lo) * lo.tp * lo.pp
    tokens = w.micro_batch * w.seq // lo.cp
    layers = -(-m.layers // lo.pp)
    in_flight = min(lo.pp, lo.microbatches or w.micro_batch) if lo.pp > 1 else 1
    per_mb = tokens // max(1, lo.microbatches or 1) if lo.pp > 1 else tokens
    saved = SAVED_BYTES_PER_TOKEN[w.ac] * m.hidden * per_mb * layers * in_flight / lo.tp
    if w.ac == "full":
        saved += SAVED_BYTES_PER_TOKEN["none"] * m.hidden * per_mb / lo.tp
    states = {name: size * m.params / shard for name, size in TRAIN_STATE_BYTES.items()}
    return {
        **states,
        "activations": saved,
        "logits": LOGIT_BYTES * per_mb * m.vocab / lo.tp,
        "FSDP buffers": (3 * m.block_params() * 2 / lo.tp) if fsdp_shard(lo) > 1 else 0.0,
    }


def plan_train(
    m: ModelShape, hw: Hardware, gpus: int, seq: int, global_batch: int, ac: str, dtype: str
) -> list[Row]:
    rows = []
    eff = FITTED[hw.efficiency_from]
    for tp in powers_of_two(min(gpus, hw.gpus_per_node)):
        if m.heads % tp or m.kv_heads % tp:
            continue
        for cp in powers_of_two(gpus // tp):
            if seq % (2 * cp):
                continue
            for pp in powers_of_two(gpus // (tp * cp)):
                if pp > m.layers:
                    continue
                dp = gpus // (tp * cp * pp)
                if global_batch % dp:
                    continue
                local = global_batch // dp
                layout = Layout(
                    dp_shard=dp,
                    cp=cp,
                    cp_kind="zigzag",
                    tp=tp,
                    pp=pp,
                    microbatches=local if pp > 1 else 0,
                )
                w = Workload("train", seq=seq, micro_batch=local, dtype=dtype, ac=ac)
                p = predict(m, hw, layout, w, eff)
                rows.append(
                    Row(
                        layout,
                        p,
                        train_memory(m, layout, w),
                        hw.hbm_bytes,
                        p.tokens_per_s_per_gpu,
                        "tokens/s/GPU",
                    )
                )
    return rank(rows, higher_is_better=True)


def inference_memory(m: ModelShape, layout: Layout, tokens: int) -> dict[str, float]:
    gathered = 2 * m.block_params() * 2 if layout.dp_shard > 1 else 0.0
    return {
        "parameters": 2 * m.params / layout.dp_shard,
        "activations": INFERENCE_WORKING_BYTES * m.hidden * tokens / layout.cp,
        "FSDP buffers": gathered,
    }


def vae_lb_effect(
    hw: Hardware, layout: Layout, gpus: int, videos: list[tuple[int, int, int]]
) -> tuple[float, float]:
    """What lb changes: the VAE encode before the denoiser, which the time model does not price
    (no VAE FLOPs or efficiency; the cases time the denoiser alone). The raw `videos`
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


LB_EXCHANGE = "exposed: lb exchange"
LB_LOAD = "VAE encode, busiest rank (Mpx)"


def plan_inference(
    m: ModelShape,
    hw: Hardware,
    gpus: int,
    tokens: int,
    steps: int,
    videos: list[tuple[int, int, int]] | None = None,
) -> list[Row]:
    """Layouts of one video on `gpus` GPUs, fastest first (the other dp ranks' videos aside):
    every (dp_shard, cp, cfgp, lb) that `ParallelDims` accepts. `videos`: the raw videos the
    groups encode first (default one `RAW_VIDEO` each); lb only changes that encode."""
    rows = []
    eff = FITTED[hw.efficiency_from]
    for cfgp in (1, 2) if m.branches == 2 else (1,):
        for cp in powers_of_two(gpus // cfgp):
            for dp_shard in powers_of_two(gpus):
                for lb in powers_of_two(gpus):
                    try:
                        ParallelDims(
                            gpus,
                            dp_shard=dp_shard,
                            cp=cp,
                            cfgp=cfgp,
                            lb=lb,
                            enable_inference_mode=True,
                        )
                    except ValueError:
                        continue
                    kind = "ulysses" if m.heads % cp == 0 else "ring"
                    layout = Layout(
                        dp_shard=dp_shard,
                        dp_replicate=gpus // dp_shard,
                        cp=cp,
                        cp_kind=kind,
                        cfgp=cfgp,
                        lb=lb,
                    )
                    w = Workload("diffusion", seq=tokens, steps=steps)
                    p = predict(m, hw, layout, w, eff)
                    raw = videos or [RAW_VIDEO] * (gpus // (cp * cfgp))
                    load, exchange = vae_lb_effect(hw, layout, gpus, raw)
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
                            inference_memory(m, layout, tokens),
                            hw.hbm_bytes,
                            p.seconds,
                            "s for one video",
                            {LB_LOAD: load / 1e6},
                        )
                    )
    return rank(rows, higher_is_better=False)


def rank(rows: list[Row], higher_is_better: bool) -> list[Row]:
    """Layouts that fit first, best first; then the OOM ones."""
    sign = -1 if higher_is_better else 1
    return sorted(rows, key=lambda r: (r.oom, sign * r.score))


def describe(layout: Layout) -> str:
    parts = [
        f"{k} {getattr(layout, k)}"
        for k in ("dp_shard", "cp", "cfgp", "lb", "tp", "pp")
        if getattr(layout, k) > 1
    ]
    if layout.cp > 1:
        parts[[p.startswith("cp") for p in parts].index(True)] += f" ({layout.cp_kind})"
    return " x ".join(parts) or "1 GPU"


def why(rows: list[Row]) -> str:
    """One sentence: what the best layout saves, from the breakdowns, against plain FSDP
    (training, dp_shard alone) when that fits, else against the best layout that splits the
    work differently (another cp, cfgp, tp or pp: dp_shard alone only moves memory)."""
    fitting = [r for r in rows if not r.oom]
    if not fitting:
        return "No layout fits in HBM: more GPUs, more sharding or full AC."
    best = fitting[0]

    def axes(r: Row) -> tuple[int, ...]:
        return (r.layout.cp, r.layout.cfgp, r.layout.tp, r.layout.pp)

    higher = best.score_name == "tokens/s/GPU"

    def tied(r: Row) -> bool:
        return math.isclose(r.score, best.score, rel_tol=1e-9)

    ties = [r for r in fitting[1:] if tied(r)]
    pure_dp = [r for r in fitting if higher and axes(r) == (1, 1, 1, 1) and not tied(r)]
    others = (
        pure_dp
        or [r for r in fitting if axes(r) != axes(best) and not tied(r)]
        or [r for r in fitting[1:] if not tied(r)]
    )
    tie_note = (
        f"; {', '.join(describe(r.layout) for r in ties[:3])}"
        f"{f' and {len(ties) - 3} more' if len(ties) > 3 else ''} tie with it"
        if ties
        else ""
    )
    if not others:
        return f"{describe(best.layout)} is the only layout that fits in HBM{tie_note}."
    other = others[0]
    keys = set(best.prediction.breakdown) | set(other.prediction.breakdown)
    gap = {
        k: other.prediction.breakdown.get(k, 0.0) - best.prediction.breakdown.get(k, 0.0)
        for k in keys
    }
    key = max(gap, key=gap.get)
    oom_faster = [r for r in rows if r.oom and (r.score > best.score) == higher]
    tail = (
        (
            f"; {describe(oom_faster[0].layout)} would be faster but needs "
            f"{oom_faster[0].total_memory / 1e9:.0f} GB"
        )
        if oom_faster
        else ""
    )
    return (
        f"{describe(best.layout)} wins: against {'plain FSDP' if pure_dp else 'the runner-up'} "
        f"({describe(other.layout)}) it "
        f"spends {gap[key]:.3g} s less on {key}{tail}{tie_note}."
    )


def table(rows: list[Row], limit: int = 12) -> str:
    """Seconds by where they go, then each memory entry in GB and the total against HBM."""
    keys = sorted({k for r in rows for k in r.prediction.breakdown})
    memory = list(rows[0].memory)
    extras = list(rows[0].extras)
    hbm = f"GB/GPU of {rows[0].hbm / 1e9:.0f}"
    head = ["layout", rows[0].score_name, "seconds", *keys, *extras, *memory, hbm, "fits"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows[:limit]:
        cells = [describe(r.layout), f"{r.score:.4g}", f"{r.prediction.seconds:.3g}"]
        cells += [f"{r.prediction.breakdown.get(k, 0.0):.3g}" for k in keys]
        cells += [f"{r.extras[k]:.4g}" for k in extras]
        cells += [f"{r.memory[k] / 1e9:.1f}" for k in memory]
        cells += [f"{r.total_memory / 1e9:.1f}", "OOM" if r.oom else "yes"]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paralab.plan", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--gpus", type=int, required=True)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--train", action="store_true")
    mode.add_argument("--inference", action="store_true")
    parser.add_argument("--seq", type=int, default=8192, help="training sequence length")
    parser.add_argument("--global-batch", type=int, default=0, help="sequences (default 2 a GPU)")
    parser.add_argument("--ac", default="selective", choices=["none", "selective", "full"])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"])
    parser.add_argument("--tokens", type=int, default=0, help="inference: tokens of one video")
    parser.add_argument("--steps", type=int, default=35, help="inference: denoising steps")
    parser.add_argument(
        "--videos",
        default="",
        help="inference: raw videos FxHxW,... dealt to the video groups (default 93x704x1280 each)",
    )
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    m, hw = model(args.model), hardware(args.hardware)
    if args.train:
        rows = plan_train(
            m, hw, args.gpus, args.seq, args.global_batch or 2 * args.gpus, args.ac, args.dtype
        )
    else:
        tokens = args.tokens or m.video_tokens(1280, 704, 93)
        videos = [tuple(int(x) for x in v.split("x")) for v in args.videos.split(",") if v]
        rows = plan_inference(m, hw, args.gpus, tokens, args.steps, videos or None)
    print(table(rows, args.top))
    print(why(rows))
    return 0
