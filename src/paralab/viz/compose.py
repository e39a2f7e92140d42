"""Pictures of the composed layout: every rank's place on the grid, and the bytes per group."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from paralab.compose.grid import Grid
from paralab.viz.common import PALETTE

SHORT = {"dp_replicate": "dr", "dp_shard": "ds", "pp": "pp", "cp": "cp", "tp": "tp"}


def plot_rank_places(
    grid: Grid, names: tuple[str, ...] = ("tp", "cp", "pp", "dp_replicate")
) -> Figure:
    """One panel per group name: the ranks in rows of 8 (one row a node of 8), each cell coloured
    by its group on that axis and labelled with its rank and its coordinates in `grid.order`."""
    cols = min(8, grid.world)
    rows = -(-grid.world // cols)
    fig, panels = plt.subplots(
        len(names), 1, figsize=(1.05 * cols + 0.4, (0.75 * rows + 0.7) * len(names)), squeeze=False
    )
    for panel, name in zip(panels.flat, names):
        ids = {g: i for i, g in enumerate(grid.groups(name))}
        for rank in range(grid.world):
            r, c = divmod(rank, cols)
            gid = ids[grid.group(rank, name)]
            coords = grid.coords(rank)
            label = f"{rank}\n" + ",".join(
                f"{SHORT[a]}{coords[a]}" for a in grid.order if getattr(grid, a) > 1
            )
            panel.add_patch(
                plt.Rectangle(
                    (c, rows - 1 - r),
                    0.94,
                    0.94,
                    facecolor=PALETTE[(2 * gid + 1) % len(PALETTE)],
                    edgecolor="black",
                )
            )
            panel.text(c + 0.47, rows - 1 - r + 0.47, label, ha="center", va="center", fontsize=7)
        panel.set_xlim(-0.05, cols)
        panel.set_ylim(-0.05, rows)
        panel.set_aspect("equal")
        panel.axis("off")
        size = grid.size(name)
        panel.set_title(
            f"{name}: {len(ids)} groups of {size}, partners {grid.stride(name)} ranks apart",
            fontsize=9,
        )
    order = " -> ".join(reversed(grid.order))
    fig.suptitle(f"{grid.world} ranks, inner -> outer {order}; a row is a node of 8", fontsize=10)
    fig.tight_layout()
    return fig


def plot_group_bytes(tables: dict[str, dict[str, int]], unit: str = "B") -> Figure:
    """One panel per scenario: bytes per step its heaviest member sends over each group, log scale."""
    fig, panels = plt.subplots(1, len(tables), figsize=(4.6 * len(tables), 2.8), squeeze=False)
    for panel, (title, table) in zip(panels.flat, tables.items()):
        groups = list(table)
        values = [max(table[g], 1) for g in groups]
        colors = [PALETTE[(2 * i) % len(PALETTE)] for i in range(len(groups))]
        panel.barh(groups, values, color=colors)
        panel.set_xscale("log")
        panel.invert_yaxis()
        panel.set_xlabel(f"bytes per step, heaviest rank ({unit})")
        panel.set_title(title, fontsize=9)
        for y, v in enumerate(values):
            panel.text(v, y, f" {v:.3g}", va="center", fontsize=8)
    fig.tight_layout()
    return fig
