"""The layout planner: every valid layout of a model on a cluster, its memory per GPU against HBM
and its predicted time, ranked; the ones that do not fit are marked OOM.

Training enumerates torchtitan's consuming descriptor (dp_shard, cp, tp, pp: their product is
the world); inference enumerates `paralab.ParallelDims` (dp_shard shards the weights, cp and
cfgp overlay the same ranks). `python -m paralab.plan --help`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from paralab.parallel_dims import ParallelDims
from paralab.scale.fit import FITTED
from paralab.scale.hardware import Hardware, hardware
from paralab.scale.models import ModelShape, model
from paralab.scale.predict import Layout, Prediction, Workload, predict

TRAIN_STATE_BYTES = 16
"""Per parameter, sharded over dp_shard x tp x pp: fp32 master weight 4, fp32 gradient 4, two
fp32 Adam moments 8 (torchtitan's FSDP2 mixed precision)."""
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
    shard = lo.dp_shard * lo.tp * lo.pp
    tokens = w.micro_batch * w.seq // lo.cp
    layers = -(-m.layers // lo.pp)
    in_flight = min(lo.pp, lo.microbatches or w.micro_batch) if lo.pp > 1 else 1
    per_mb = tokens // max(1, lo.microbatches or 1) if lo.pp > 1 else tokens
    saved = SAVED_BYTES_PER_TOKEN[w.ac] * m.hidden * per_mb * layers * in_flight / lo.tp
    if w.ac == "full":
        saved += SAVED_BYTES_PER_TOKEN["none"] * m.hidden * per_mb / lo.tp
    return {
        "params + grads + Adam": TRAIN_STATE_BYTES * m.params / shard,
        "FSDP gathered blocks": (3 * m.block_params() * 2 / lo.tp) if lo.dp_shard > 1 else 0.0,
        "activations": saved,
        "logits": LOGIT_BYTES * per_mb * m.vocab / lo.tp,
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
        "weights (bf16)": 2 * m.params / layout.dp_shard,
        "FSDP gathered blocks": gathered,
        "activations": INFERENCE_WORKING_BYTES * m.hidden * tokens / layout.cp,
    }


def plan_inference(m: ModelShape, hw: Hardware, gpus: int, tokens: int, steps: int) -> list[Row]:
    """Layouts of one video on `gpus` GPUs, fastest first (the other dp ranks' videos aside)."""
    rows = []
    eff = FITTED[hw.efficiency_from]
    for cfgp in (1, 2) if m.branches == 2 else (1,):
        for cp in powers_of_two(gpus // cfgp):
            for dp_shard in powers_of_two(gpus):
                if gpus % dp_shard:
                    continue
                try:
                    ParallelDims(
                        gpus, dp_shard=dp_shard, cp=cp, cfgp=cfgp, enable_inference_mode=True
                    )
                except ValueError:
                    continue
                kind = "ulysses" if m.heads % cp == 0 else "ring"
                layout = Layout(
                    dp_shard=dp_shard, dp_replicate=gpus // dp_shard, cp=cp, cp_kind=kind, cfgp=cfgp
                )
                w = Workload("diffusion", seq=tokens, steps=steps)
                p = predict(m, hw, layout, w, eff)
                rows.append(
                    Row(
                        layout,
                        p,
                        inference_memory(m, layout, tokens),
                        hw.hbm_bytes,
                        p.seconds,
                        "s for one video",
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
        for k in ("dp_shard", "cp", "cfgp", "tp", "pp")
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
    pure_dp = [r for r in fitting if higher and axes(r) == (1, 1, 1, 1) and r is not best]
    others = pure_dp or [r for r in fitting if axes(r) != axes(best)] or fitting[1:]
    if not others:
        return f"{describe(best.layout)} is the only layout that fits in HBM."
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
        f"spends {gap[key]:.3g} s less on {key}{tail}."
    )


def table(rows: list[Row], limit: int = 12) -> str:
    keys = sorted({k for r in rows for k in r.prediction.breakdown})
    head = ["layout", rows[0].score_name, "seconds", *keys, "GB/GPU", "fits"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows[:limit]:
        cells = [describe(r.layout), f"{r.score:.4g}", f"{r.prediction.seconds:.3g}"]
        cells += [f"{r.prediction.breakdown.get(k, 0.0):.3g}" for k in keys]
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
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    m, hw = model(args.model), hardware(args.hardware)
    if args.train:
        rows = plan_train(
            m, hw, args.gpus, args.seq, args.global_batch or 2 * args.gpus, args.ac, args.dtype
        )
    else:
        tokens = args.tokens or m.video_tokens(1280, 704, 93)
        rows = plan_inference(m, hw, args.gpus, tokens, args.steps)
    print(table(rows, args.top))
    print(why(rows))
    return 0
