"""Training composition: who loads which tokens, bytes per group and phase."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from paralab.viz.common import PALETTE


def plot_token_ownership(
    samples: list[int], positions: list[list[int]], tokens: int, title: str = ""
) -> Figure:
    """Rows = ranks, columns = global token positions; a cell is coloured by the sample the rank holds there."""
    grid = np.full((len(samples), tokens), np.nan)
    for rank, (sample, held) in enumerate(zip(samples, positions)):
        grid[rank, held] = sample
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.35 * len(samples)))
    n_colors = max(samples) + 1
    cmap = plt.matplotlib.colors.ListedColormap([PALETTE[2 * (i % 10)] for i in range(n_colors)])
    ax.imshow(
        grid, cmap=cmap, vmin=-0.5, vmax=n_colors - 0.5, aspect="auto", interpolation="nearest"
    )
    for rank, sample in enumerate(samples):
        ax.text(
            positions[rank][len(positions[rank]) // 2],
            rank,
            f"sample {sample}",
            ha="center",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(len(samples)), [f"rank {r}" for r in range(len(samples))])
    ax.set_xlabel("global token position")
    ax.set_title(title or "which sample and which tokens each rank holds", fontsize=9)
    fig.tight_layout()
    return fig


def plot_group_phase_bytes(table: dict[str, dict[tuple[str, str], tuple[int, int]]]) -> Figure:
    """Per configuration, one bar per group stacked by phase (ledger); black ticks = the formula's running total.

    table: {configuration: {(group, phase): (measured, formula)}}. A group that sends nothing
    in a configuration (no replicas, cp 1) gets no bar; long configuration names wrap.
    """
    order = ["dp_shard", "dp_replicate", "cp"]
    phases = ["forward", "backward", "recompute"]
    colors = {"forward": PALETTE[0], "backward": PALETTE[2], "recompute": PALETTE[6]}
    width = 0.8 / len(order)
    fig, ax = plt.subplots(figsize=(11, 4.4))
    top = 1
    for c, cells in enumerate(table.values()):
        groups = [g for g in order if any(sum(cells.get((g, p), (0, 0))) for p in phases)]
        for g, group in enumerate(groups):
            x = c + (g - (len(groups) - 1) / 2) * width
            bottom, formula_top = 0, 0
            for p in phases:
                measured, formula = cells.get((group, p), (0, 0))
                ax.bar(x, measured, width * 0.9, bottom=bottom, color=colors[p], edgecolor="white")
                bottom += measured
                formula_top += formula
                if formula:
                    ax.plot([x - width * 0.4, x + width * 0.4], [formula_top] * 2, "k-", lw=1.5)
            ax.text(x, bottom, group.replace("dp_", ""), ha="center", va="bottom", fontsize=8)
            top = max(top, bottom)
    handles = [plt.matplotlib.patches.Patch(color=colors[p], label=p) for p in phases]
    handles.append(plt.matplotlib.lines.Line2D([], [], color="k", label="formula (running total)"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(range(len(table)), [textwrap.fill(name, 14) for name in table], fontsize=8)
    ax.set_ylabel("bytes sent per rank per step")
    ax.set_title(
        "One training step: bytes per group and phase (ledger) vs the closed form", fontsize=10
    )
    fig.tight_layout()
    return fig


def plot_wrapper_nesting(cases: dict[str, dict]) -> Figure:
    """One panel per case: `model.blocks[0]` as nested boxes, outermost first, and what it ran.

    `cases`: title -> {"nesting": class names outside in, "inside": the attention label,
    "outcome": one line}.
    """
    fig, axes = plt.subplots(1, len(cases), figsize=(2.6 * len(cases), 2.9), squeeze=False)
    for ax, (title, case) in zip(axes[0], cases.items()):
        layers = [*case["nesting"], case["inside"]]
        for depth, name in enumerate(layers):
            inset = 0.07 * depth
            inner = depth == len(layers) - 1
            ax.add_patch(
                plt.Rectangle(
                    (inset, inset),
                    1 - 2 * inset,
                    0.92 - 2 * inset,
                    facecolor=PALETTE[1 + 2 * (depth % 10)] if not inner else "white",
                    edgecolor="black",
                    linewidth=1.0,
                )
            )
            ax.text(
                0.5,
                0.92 - inset - 0.045 if not inner else 0.46,
                name,
                ha="center",
                va="center",
                fontsize=7.5,
                fontweight="bold" if inner else "normal",
            )
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.2, 1.05)
        ax.axis("off")
        ax.set_title("\n".join(textwrap.wrap(title, 26)), fontsize=8.5)
        ax.text(0.5, -0.1, "\n".join(textwrap.wrap(case["outcome"], 30)), ha="center", fontsize=7.5)
    fig.tight_layout()
    return fig


def plot_ac_activation_memory(terms: dict[str, dict[str, int]], counted: dict[str, int]) -> Figure:
    """One bar per AC mode: the closed form's bytes stacked by kind of tensor; a black tick = counted.

    terms: {mode: {kind of tensor: bytes}}; counted: {mode: bytes the saved-tensor hooks saw}.
    """
    kinds = list(dict.fromkeys(kind for by_kind in terms.values() for kind in by_kind))
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.7 * len(terms)))
    for row, (mode, by_kind) in enumerate(terms.items()):
        left = 0
        for k, kind in enumerate(kinds):
            width = by_kind.get(kind, 0)
            ax.barh(row, width, left=left, color=PALETTE[2 * k], edgecolor="white", label=kind)
            left += width
        ax.plot([counted[mode]] * 2, [row - 0.42, row + 0.42], "k-", lw=2)
        ax.text(left, row, f"  {counted[mode]:,} B counted", va="center", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    ax.set_yticks(range(len(terms)), [f"ac={mode}" for mode in terms])
    ax.invert_yaxis()
    ax.set_xlim(0, max(counted.values()) * 1.3)
    ax.set_xlabel("bytes saved for backward (one process, one sample, parameters excluded)")
    ax.set_title(
        "What each AC mode keeps for backward: closed form by kind, and counted", fontsize=10
    )
    fig.tight_layout()
    return fig
