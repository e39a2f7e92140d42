"""The collectives primer: one picture per collective, before and after."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from paralab.viz.common import _RANK_COLORS


def _value_grid(ax, tensors: list[torch.Tensor], origin: dict[int, int], title: str) -> None:
    """Rows = ranks, columns = element slots; a cell takes the colour of the rank its value came from."""
    world, width = len(tensors), max(t.numel() for t in tensors)
    for rank, t in enumerate(tensors):
        for slot, v in enumerate(t.tolist()):
            v = int(v)
            y = world - 1 - rank
            source = origin.get(v)
            color = "white" if source is None else _RANK_COLORS[source % len(_RANK_COLORS)]
            ax.add_patch(
                plt.Rectangle(
                    (slot, y),
                    0.92,
                    0.92,
                    facecolor=color,
                    edgecolor="black",
                    linewidth=2.0 if source is None else 0.8,
                    alpha=1.0 if source is None else 0.55,
                )
            )
            ax.text(
                slot + 0.46,
                y + 0.46,
                str(v),
                ha="center",
                va="center",
                fontsize=11,
                fontweight="bold" if source is None else "normal",
            )
    ax.set_xlim(-0.1, width)
    ax.set_ylim(-0.1, world)
    ax.set_aspect("equal")
    ax.set_yticks(
        [world - 1 - r + 0.46 for r in range(world)],
        [f"rank {r}" for r in range(world)],
        fontsize=10,
    )
    ax.set_xticks([s + 0.46 for s in range(width)], [str(s) for s in range(width)], fontsize=9)
    ax.set_xlabel("element index", fontsize=9)
    ax.tick_params(length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=10)


def plot_collective(
    op: str,
    before: list[torch.Tensor],
    after: list[torch.Tensor],
    before_label: str = "before",
    after_label: str = "after",
) -> Figure:
    """What every rank holds before and after one collective, as two rank x element grids.

    A value keeps the colour of the rank that held it before, so arrows are not
    needed: the colours show where each number travelled. A white cell with a
    bold frame holds a new value: a sum over ranks (reduce-scatter, all-reduce).
    """
    origin: dict[int, int] = {}
    for rank, t in enumerate(before):
        for v in t.tolist():
            origin.setdefault(int(v), rank)
    width_before = max(t.numel() for t in before)
    width_after = max(t.numel() for t in after)
    fig, (left, mid, right) = plt.subplots(
        1,
        3,
        figsize=(max(6.5, 2.8 + 0.62 * (width_before + width_after)), 0.55 * len(before) + 1.7),
        gridspec_kw={"width_ratios": [width_before, 1.1, width_after]},
    )
    _value_grid(left, before, origin, before_label)
    _value_grid(right, after, origin, after_label)
    mid.axis("off")
    mid.annotate(
        "",
        xy=(1.0, 0.5),
        xytext=(0.0, 0.5),
        xycoords="axes fraction",
        arrowprops=dict(arrowstyle="-|>", linewidth=2, color="black"),
    )
    new_values = any(int(v) not in origin for t in after for v in t.tolist())
    fig.suptitle(
        f"{op} on {len(before)} ranks\ncolour = the rank a value came from"
        + ("; white, bold frame = a sum over ranks" if new_values else ""),
        fontsize=10,
    )
    fig.tight_layout()
    return fig
