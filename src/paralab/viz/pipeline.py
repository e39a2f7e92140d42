"""The inference pipeline: samples, bytes per phase, memory per rank."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from paralab.viz.common import PALETTE


def plot_pipeline_samples(videos: list[torch.Tensor], outputs: torch.Tensor) -> Figure:
    """Top: frame 0 of each raw conditioning video (uint8); bottom: frame 0 of each generated video ([-1, 1])."""
    n = len(videos)
    fig, axes = plt.subplots(2, n, figsize=(2.1 * n, 4.3), squeeze=False)
    for i, (video, out) in enumerate(zip(videos, outputs)):
        axes[0][i].imshow(video[:, 0].permute(1, 2, 0).numpy())
        axes[0][i].set_title(
            f"sample {i}: {video.shape[1]}x{video.shape[2]}x{video.shape[3]}", fontsize=8
        )
        axes[1][i].imshow(((out[:, 0] + 1) / 2).permute(1, 2, 0).numpy())
        axes[1][i].set_title(f"generated {out.shape[1]}x{out.shape[2]}x{out.shape[3]}", fontsize=8)
        for row in (0, 1):
            axes[row][i].axis("off")
    fig.suptitle(
        "conditioning videos of unequal sizes (top), generated videos (bottom), frame 0",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def plot_bytes_by_phase(panels: dict[str, dict[str, dict[str, int]]]) -> Figure:
    """One panel per run: a stacked bar per phase (encode, step 1, ...), stacked by traffic group, KiB per rank."""
    groups = list(
        dict.fromkeys(g for phases in panels.values() for row in phases.values() for g in row)
    )
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.0 * len(panels), 3.9), sharey=True, squeeze=False
    )
    top = max(sum(row.values()) for phases in panels.values() for row in phases.values()) / 1024
    for ax, (title, phases) in zip(axes[0], panels.items()):
        names = list(phases)
        bottom = [0.0] * len(names)
        for i, group in enumerate(groups):
            heights = [phases[p].get(group, 0) / 1024 for p in names]
            ax.bar(
                range(len(names)),
                heights,
                0.65,
                bottom=bottom,
                label=group,
                color=PALETTE[2 * i % len(PALETTE)],
            )
            bottom = [b + h for b, h in zip(bottom, heights)]
        for x, total in enumerate(bottom):
            ax.text(x, total + 0.01 * top, f"{total:.0f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1.1 * top)
        ax.set_title(title, fontsize=9)
    axes[0][0].set_ylabel("KiB sent by one rank")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Bytes one rank sends in each phase, by group (the toy model)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_pipeline_memory(
    measured: dict[str, dict[str, int]], formula: dict[str, dict[str, int]]
) -> Figure:
    """Grouped bars per setting (shards, gathered between steps, gathered peak); black ticks = the formula."""
    settings = list(measured)
    parts = list(next(iter(measured.values())))
    width = 0.8 / len(parts)
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for i, part in enumerate(parts):
        xs = [j + (i - (len(parts) - 1) / 2) * width for j in range(len(settings))]
        ax.bar(
            xs,
            [measured[s][part] for s in settings],
            width,
            label=part,
            color=PALETTE[2 * i % len(PALETTE)],
        )
        ax.plot(xs, [formula[s][part] for s in settings], "k_", markersize=18, mew=2)
    ax.plot([], [], "k_", markersize=12, mew=2, label="formula")
    ax.set_xticks(range(len(settings)), settings)
    ax.set_ylabel("parameter bytes held by one rank")
    ax.set_title(
        "reshard_after_forward: parameters kept gathered between steps, or not", fontsize=10
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
