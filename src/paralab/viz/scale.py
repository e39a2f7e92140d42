"""Pictures of the scale lab: alpha-beta and the roofline, every axis at a real size, the ring's
efficiency against the work per GPU, predicted against measured, and the planner's breakdown.
Every number is computed here from `paralab.scale`, never typed in."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from paralab.scale import FITTED, Layout, Workload, hardware, load_cases, model, predict
from paralab.scale.axes import alpha_beta_knee, inference_step_bytes, ring_collective_seconds
from paralab.scale.models import COSMOS_LIKE_14B, LAB06_TOY
from paralab.scale.plan import describe
from paralab.scale.predict import link_for
from paralab.viz.common import PALETTE


def plot_alpha_beta(names: tuple[str, ...] = ("h100-sxm", "h100-nvl"), n: int = 8) -> Figure:
    """All-gather time against size: flat (alpha) for small messages, a slope of 1/busbw after."""
    sizes = np.logspace(3, 10, 60)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, name in enumerate(names):
        hw = hardware(name)
        for stride, style in ((1, "-"), (hw.gpus_per_node, "--")):
            link = link_for(hw, stride, n)
            t = [ring_collective_seconds(hw, s, n, stride)["all_gather"] for s in sizes]
            ax.loglog(sizes, t, style, color=PALETTE[2 * i], label=f"{name}, {link.name}")
            ax.axvline(alpha_beta_knee(hw, n, stride), color=PALETTE[2 * i], lw=0.5, ls=style)
    ax.set(
        xlabel="gathered tensor S (bytes)",
        ylabel="seconds",
        title=f"all-gather over {n} ranks: alpha until S ~ alpha x busbw, then bytes / busbw",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_roofline(name: str = "h100-sxm") -> Figure:
    """Attainable FLOP/s against arithmetic intensity, with a GEMM and an attention block marked."""
    hw = hardware(name)
    intensity = np.logspace(-1, 4, 200)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.loglog(intensity, np.minimum(hw.peak_bf16, intensity * hw.hbm_bandwidth), color="k")
    marks = {
        "GEMM 4096 x 4096 x 16384 tokens": 2
        * 4096
        * 4096
        * 16384
        / (2 * (4096 * 4096 + 2 * 4096 * 16384)),
        "LayerNorm (1 FLOP a byte)": 1.0,
        "ring hop on NVLink (FLOPs per byte sent)": hw.peak_bf16 / hw.intra_busbw,
    }
    for i, (label, x) in enumerate(marks.items()):
        ax.plot(x, min(hw.peak_bf16, x * hw.hbm_bandwidth), "o", color=PALETTE[2 * i], label=label)
    ax.axvline(hw.peak_bf16 / hw.hbm_bandwidth, color="grey", lw=0.5)
    ax.set(xlabel="FLOPs per byte", ylabel="FLOP/s", title=f"{name} roofline (bf16 dense)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_axis_seconds(rows: dict[str, dict[str, float]]) -> Figure:
    """One panel per axis: the seconds of its traffic next to the compute it competes with."""
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.4))
    for ax, (axis, parts) in zip(np.atleast_1d(axes), rows.items()):
        ax.bar(range(len(parts)), list(parts.values()), color=PALETTE[: len(parts)])
        ax.set_xticks(range(len(parts)), list(parts), rotation=30, ha="right", fontsize=7)
        ax.set_title(axis, fontsize=9)
        ax.set_yscale("log")
    axes[0].set_ylabel("seconds")
    fig.tight_layout()
    return fig


def plot_cosmos_step_bytes(dp_shard: int = 8, cp: int = 8, tokens: int = 75_600) -> Figure:
    """Lab 06's all-gathers against its cp traffic: toy size (as the lab ran) vs 14B, 75,600 tokens."""
    m = model(COSMOS_LIKE_14B)
    real = inference_step_bytes(m, dp_shard, cp, tokens)
    toy_model = model(LAB06_TOY)
    toy = inference_step_bytes(toy_model, 4, 2, 64)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, (title, data) in zip(
        axes, (("toy (lab 06's scale)", toy), (f"{m.params / 1e9:.0f}B, {tokens:,} tokens", real))
    ):
        ax.bar(list(data), list(data.values()), color=PALETTE[:3])
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("bytes one rank sends per step")
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return fig


def plot_ring_efficiency(names: tuple[str, ...] = ("h800", "h100-nvl"), cp: int = 8) -> Figure:
    """Ring attention's efficiency (ideal / predicted) against the tokens each GPU holds."""
    shape = model("llama3-8b-attention")
    seqs = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, name in enumerate(names):
        hw = hardware(name)
        eff = FITTED[hw.efficiency_from]
        ys = [
            predict(
                shape, hw, Layout(cp=cp, cp_kind="zigzag"), Workload("attention", seq=s), eff
            ).efficiency
            for s in seqs
        ]
        ax.semilogx(seqs, ys, "o-", color=PALETTE[2 * i], label=f"{name}, predicted", base=2)
        for case in load_cases():
            if case.measure == "efficiency" and case.hardware.name == name:
                project = case.source.split("@")[0]
                ax.plot(
                    case.workload.seq,
                    case.measured,
                    "*",
                    ms=12,
                    color=PALETTE[2 * i + 1],
                    label=f"{name}, measured ({project})",
                )
    ax.set(
        xlabel="tokens per GPU",
        ylabel="efficiency = ideal / predicted",
        ylim=(0, 1.05),
        title=f"zigzag ring attention on {cp} GPUs, forward + backward",
    )
    ax.legend()
    fig.tight_layout()
    return fig


def plot_prediction_scatter(
    rows: list[dict], tolerance: float = 0.25, held_out: list[dict] | None = None
) -> Figure:
    """Every case: predicted against measured (log-log, each in its own unit) and the band;
    `held_out` rows (not fitted) as hollow marks, one legend entry for them all."""
    fig, ax = plt.subplots(figsize=(6, 5.5))
    measured = np.array([r["measured"] for r in rows + (held_out or [])])
    line = np.logspace(np.log10(measured.min() / 2), np.log10(measured.max() * 2), 10)
    ax.fill_between(
        line, line * (1 - tolerance), line * (1 + tolerance), color="0.9", label=f"±{tolerance:.0%}"
    )
    ax.loglog(line, line, color="k", lw=0.5)
    for i, r in enumerate(rows):
        ax.loglog(
            r["measured"],
            r["predicted"],
            "o",
            color=PALETTE[i % len(PALETTE)],
            label=f"{r['name'][:38]} ({r['relative_error']:+.0%})",
        )
    if held_out:
        inside = sum(abs(r["relative_error"]) <= tolerance for r in held_out)
        ax.loglog(
            [r["measured"] for r in held_out],
            [r["predicted"] for r in held_out],
            "o",
            mfc="none",
            color="0.4",
            label=f"held out, not fitted: {inside}/{len(held_out)} within {tolerance:.0%}",
        )
    ax.set(xlabel="measured (tokens/s/GPU, s or efficiency)", ylabel="predicted")
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    return fig


def plot_plan(rows: list, top: int = 8) -> Figure:
    """The planner's best layouts: stacked seconds by where they go (the timed ones: the
    planner does not time a layout that does not fit)."""
    rows = [r for r in rows if r.prediction][:top]
    keys = sorted({k for r in rows for k in r.prediction.breakdown})
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rows) + 1.5))
    left = np.zeros(len(rows))
    for i, key in enumerate(keys):
        widths = np.array([r.prediction.breakdown.get(key, 0.0) for r in rows])
        ax.barh(range(len(rows)), widths, left=left, color=PALETTE[i % len(PALETTE)], label=key)
        left += widths
    labels = [describe(r.layout, r.ac) + (" (OOM)" if r.oom else "") for r in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("predicted seconds")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig
