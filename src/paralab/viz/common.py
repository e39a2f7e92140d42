"""Shared by every picture: `show`, the colours, and the bug-clinic diff pictures."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

PALETTE = plt.get_cmap("tab20").colors


_RANK_COLORS = plt.get_cmap("tab10").colors


PICTURES_AS_TEXT = "PARALAB_PICTURES_AS_TEXT"
"""Set (by the test suite's conftest.py) where nobody looks at the pictures: nbval compares a
notebook's text outputs and skips its PNGs. Encoding them took 10.2 of the 15.3 CPU-s the 13
labs' 72 pictures cost in their kernels; drawing them (the other 5.1) stays."""


def show(fig: Figure) -> None:
    """Show a figure once in the notebook and free it: the one way every lab shows a picture.

    Under `PICTURES_AS_TEXT` the figure is still drawn, so a picture that cannot be drawn still
    fails its cell, and shows as the text a PNG's output carries beside it."""
    from IPython.display import display

    if os.environ.get(PICTURES_AS_TEXT):
        fig.canvas.draw()
        display({"text/plain": repr(fig)}, raw=True)
    else:
        display(fig)
    plt.close(fig)


def plot_diff_heatmap(
    expected: torch.Tensor,
    actual: torch.Tensor,
    title: str = "",
    row_label: str = "row",
    col_label: str = "column",
) -> Figure:
    """|actual - expected| element by element, as a heatmap over the last two dims.

    Leading dims are stacked into rows, so any tensor shows as one picture; zero
    differences are white, so the pattern of the bug is what stands out.
    """
    diff = (actual.detach().double() - expected.detach().double()).abs()
    grid = diff.reshape(-1, diff.shape[-1]) if diff.dim() > 1 else diff.reshape(1, -1)
    fig, ax = plt.subplots(
        figsize=(min(10, 1.5 + 0.25 * grid.shape[1]), min(6, 1.2 + 0.12 * grid.shape[0]))
    )
    image = ax.imshow(grid.numpy(), cmap="Reds", aspect="auto", interpolation="nearest", vmin=0)
    fig.colorbar(image, ax=ax, label="|buggy - correct|")
    wrong = int((grid != 0).sum())
    ax.set_title(f"{title}\n{wrong} of {grid.numel()} elements differ", fontsize=9)
    ax.set_xlabel(col_label, fontsize=8)
    ax.set_ylabel(row_label, fontsize=8)
    fig.tight_layout()
    return fig


def plot_rank_strip(
    expected: torch.Tensor,
    actual: torch.Tensor,
    segments: list[tuple[str, int]],
    title: str = "",
    unit: str = "|buggy - correct|",
) -> Figure:
    """|actual - expected| with one row per rank (every rank labelled) and the columns cut into named segments.

    `expected` and `actual` are (ranks, columns); `segments` names consecutive column
    blocks and their widths (an axis' group slots, a unit's shard), drawn apart by
    black lines and labelled under the picture. `unit` labels the colour bar.
    """
    diff = (actual.detach().double() - expected.detach().double()).abs()
    ranks, width = diff.shape
    fig, ax = plt.subplots(figsize=(min(10.0, 3.0 + 0.45 * width), 1.6 + 0.36 * ranks))
    image = ax.imshow(diff.numpy(), cmap="Reds", aspect="auto", interpolation="nearest", vmin=0)
    fig.colorbar(image, ax=ax, label=unit, fraction=0.04, pad=0.02)
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)], fontsize=9)
    start, centres = 0, []
    for name, size in segments:
        centres.append((start + (size - 1) / 2, f"{name}\n({size})"))
        start += size
        if start < width:
            ax.axvline(start - 0.5, color="black", linewidth=1.5)
    ax.set_xticks([c for c, _ in centres], [n for _, n in centres], fontsize=9)
    ax.tick_params(axis="x", length=0)
    wrong = int((diff != 0).sum())
    ax.set_title(f"{title}\n{wrong} of {diff.numel()} elements differ (white: equal)", fontsize=10)
    fig.tight_layout()
    return fig
