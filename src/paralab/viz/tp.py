"""Tensor-parallel pictures: how a weight splits, where f, g, AG and RS sit, bytes per phase, saved memory."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

_RANK_COLORS = plt.get_cmap("tab10").colors


def plot_weight_split(tp: int, out_features: int = 12, in_features: int = 8) -> Figure:
    """A weight (out, in) coloured by the rank that holds each entry: column-, row-, fused-q/k/v-split."""
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.4))
    panels = [
        (
            "column-parallel: cut on out\n(rank r: rows of its outputs)",
            lambda o, i: o * tp // out_features,
        ),
        (
            "row-parallel: cut on in\n(rank r: columns of its inputs)",
            lambda o, i: i * tp // in_features,
        ),
        (
            "fused q/k/v, column-parallel:\ncut in each of q, k, v",
            lambda o, i: (o % (out_features // 3)) * tp // (out_features // 3),
        ),
    ]
    for ax, (title, owner) in zip(axes, panels):
        for o in range(out_features):
            for i in range(in_features):
                ax.add_patch(
                    plt.Rectangle((i, o), 1, 1, color=_RANK_COLORS[owner(o, i)], ec="white", lw=0.5)
                )
        ax.set_xlim(0, in_features)
        ax.set_ylim(out_features, 0)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("in features", fontsize=8)
        ax.set_ylabel("out features", fontsize=8)
        ax.set_title(title, fontsize=9)
    for k in range(3):
        axes[2].axhline(k * out_features // 3, color="black", lw=1.5)
        axes[2].text(in_features + 0.2, (k + 0.5) * out_features / 3, "qkv"[k], va="center")
    handles = [plt.Rectangle((0, 0), 1, 1, color=_RANK_COLORS[r]) for r in range(tp)]
    fig.legend(handles, [f"rank {r}" for r in range(tp)], loc="lower center", ncol=tp, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def plot_block_regions(sequence_parallel: bool) -> Figure:
    """One block left to right: what each rank holds, and each crossing's forward / backward collective."""
    enter, leave = (
        (("AG", "AG+RS"), ("RS", "AG")) if sequence_parallel else (("f: id", "AR"), ("g: AR", "id"))
    )
    stages = [
        ("norm", "s/tp tokens" if sequence_parallel else "full, replicated", "region"),
        (enter[0], enter[1], "cross"),
        ("q/k/v\ncolumn", "its heads", "tp"),
        ("attention", "h/tp heads", "tp"),
        ("proj\nrow", "partial sum", "tp"),
        (leave[0], leave[1], "cross"),
        ("+ residual\nnorm", "s/tp tokens" if sequence_parallel else "full, replicated", "region"),
        (enter[0], enter[1], "cross"),
        ("up\ncolumn", "ffn/tp", "tp"),
        ("GELU", "ffn/tp", "tp"),
        ("down\nrow", "partial sum", "tp"),
        (leave[0], leave[1], "cross"),
        ("+ residual", "s/tp tokens" if sequence_parallel else "full, replicated", "region"),
    ]
    colours = {"region": "#dddddd", "tp": "#9ecae1", "cross": "#fdae6b"}
    fig, ax = plt.subplots(figsize=(13, 2.6))
    for k, (name, note, kind) in enumerate(stages):
        ax.add_patch(
            FancyBboxPatch(
                (k + 0.08, 0.35), 0.84, 0.5, boxstyle="round,pad=0.02", fc=colours[kind], ec="black"
            )
        )
        if kind == "cross":
            ax.text(
                k + 0.5, 0.72, f"fwd {name}", ha="center", va="center", fontsize=8, weight="bold"
            )
            ax.text(k + 0.5, 0.48, f"bwd {note}", ha="center", va="center", fontsize=8)
        else:
            ax.text(k + 0.5, 0.6, name, ha="center", va="center", fontsize=8)
            ax.text(k + 0.5, 0.2, note, ha="center", va="center", fontsize=7, color="#444444")
    ax.set_xlim(0, len(stages))
    ax.set_ylim(0, 1)
    ax.axis("off")
    mode = "TP + SP (Megatron-SP)" if sequence_parallel else "TP (Megatron)"
    ax.set_title(
        f"{mode}: one block; orange = a crossing, its forward and backward collective "
        "(AR all-reduce, AG all-gather, RS reduce-scatter; AG+RS: the saved shard re-gathered)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def plot_phase_bytes(measured: dict[str, dict[str, dict[str, int]]]) -> Figure:
    """Bytes sent per rank per phase, stacked by collective: {run label: {phase: {op: bytes}}}."""
    labels = list(measured)
    phases = sorted(
        {p for run in measured.values() for p in run},
        key=["forward", "backward", "grad sync"].index,
    )
    ops = sorted({op for run in measured.values() for ph in run.values() for op in ph})
    fig, axes = plt.subplots(1, len(phases), figsize=(3.3 * len(phases), 3.2), sharey=True)
    for ax, phase in zip(axes, phases):
        bottom = [0] * len(labels)
        for k, op in enumerate(ops):
            heights = [measured[label].get(phase, {}).get(op, 0) for label in labels]
            ax.bar(labels, heights, bottom=bottom, color=_RANK_COLORS[k], label=op)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_title(phase, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].set_ylabel("bytes sent per rank (ledger)")
    axes[-1].legend(fontsize=7)
    fig.suptitle("one training step of the whole model, per phase", fontsize=10)
    fig.tight_layout()
    return fig


def plot_activation_memory(parts: dict[str, dict[str, int]], measured: dict[str, int]) -> Figure:
    """Saved-for-backward bytes of one block per rank: the closed form's parts stacked, the measure as a dot."""
    labels = list(parts)
    names = list(next(iter(parts.values())))
    fig, ax = plt.subplots(figsize=(7, 3.4))
    bottom = [0] * len(labels)
    for k, name in enumerate(names):
        heights = [parts[label][name] for label in labels]
        ax.bar(labels, heights, bottom=bottom, color=_RANK_COLORS[k], label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.plot(
        labels, [measured[label] for label in labels], "k*", markersize=10, label="measured (hooks)"
    )
    ax.set_ylabel("bytes saved for backward, per rank")
    ax.set_title(
        "one block's activation memory per rank: closed form (bars) and measure (stars)", fontsize=9
    )
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig
