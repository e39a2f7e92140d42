"""ParallelDims pictures: rank grids coloured by group, and overlaid meshes side by side."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from paralab.viz.common import PALETTE


def _grid_shape(world_size: int) -> tuple[int, int]:
    rows = 2 if world_size >= 4 and world_size % 2 == 0 else 1
    return rows, math.ceil(world_size / rows)


def plot_rank_groups(
    groups: list[dict[str, list[int]]],
    axes: list[str] | None = None,
    title: str = "",
    columns: int = 3,
) -> Figure:
    """One panel per axis, `columns` panels a row: every rank a cell, coloured by its group on that axis.

    `groups[rank][axis]` is the list of ranks in `rank`'s group (as returned by
    `ParallelDims.group_ranks()` on each rank). Each cell says its rank and its
    group (`g0`, `g1`, ...); each panel lists its groups. Ranks without the axis are grey.
    """
    world = len(groups)
    if axes is None:
        axes = list(dict.fromkeys(a for g in groups for a in g))
    rows, cols = _grid_shape(world)
    columns = min(columns, len(axes))
    lines = -(-len(axes) // columns)
    fig, panels = plt.subplots(
        lines, columns, figsize=(3.0 * columns, (0.62 * rows + 1.25) * lines), squeeze=False
    )
    for panel in panels.flat[len(axes) :]:
        panel.axis("off")
    for panel, axis in zip(panels.flat, axes):
        group_ids: dict[tuple[int, ...], int] = {}
        for rank in range(world):
            members = tuple(groups[rank].get(axis, ()))
            r, c = divmod(rank, cols)
            if members:
                gid = group_ids.setdefault(members, len(group_ids))
                color, label = PALETTE[(2 * gid + 1) % len(PALETTE)], f"r{rank}\ng{gid}"
            else:
                color, label = (0.85, 0.85, 0.85), f"r{rank}"
            panel.add_patch(
                plt.Rectangle((c, rows - 1 - r), 0.94, 0.94, facecolor=color, edgecolor="black")
            )
            panel.text(c + 0.47, rows - 1 - r + 0.47, label, ha="center", va="center", fontsize=10)
        panel.set_xlim(-0.05, cols)
        panel.set_ylim(-0.05, rows)
        panel.set_aspect("equal")
        panel.axis("off")
        listed = "  ".join(f"g{g}={{{','.join(map(str, m))}}}" for m, g in group_ids.items())
        panel.set_title(
            f"{axis}: {len(group_ids)} groups of {len(next(iter(group_ids), ()))}\n{listed}",
            fontsize=9,
        )
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def plot_dp_grid(dp_replicate: int, dp_shard: int) -> Figure:
    """The dp mesh as a (replicas x shards) table of ranks, with the collective each direction carries:
    along a row (one dp_shard group) FSDP's all-gather and reduce-scatter, down a column (one
    dp_replicate group) HSDP's gradient all-reduce."""
    fig, ax = plt.subplots(figsize=(1.45 * dp_shard + 3.6, 1.1 * dp_replicate + 1.6))
    for rep in range(dp_replicate):
        for shard in range(dp_shard):
            y = dp_replicate - 1 - rep
            ax.add_patch(
                plt.Rectangle((shard, y), 0.94, 0.94, color=PALETTE[(2 * shard + 1) % len(PALETTE)])
            )
            ax.text(
                shard + 0.47,
                y + 0.47,
                f"rank {rep * dp_shard + shard}",
                ha="center",
                va="center",
                fontsize=10,
            )
    ax.set_xticks(
        [s + 0.47 for s in range(dp_shard)], [f"shard {s}" for s in range(dp_shard)], fontsize=10
    )
    ax.set_yticks(
        [dp_replicate - 1 - r + 0.47 for r in range(dp_replicate)],
        [f"replica {r}" for r in range(dp_replicate)],
        fontsize=10,
    )
    arrow = dict(arrowstyle="<->", color="black", lw=1.4)
    top = dp_replicate - 1
    ax.annotate(
        "",
        (dp_shard - 0.02, top + 1.08),
        (0.02, top + 1.08),
        arrowprops=arrow,
        annotation_clip=False,
    )
    ax.text(
        dp_shard / 2,
        top + 1.18,
        f"a row = one dp_shard group ({dp_shard} ranks): all-gather params, reduce-scatter grads",
        ha="center",
        va="bottom",
        fontsize=10,
    )
    if dp_replicate > 1:
        ax.annotate(
            "",
            (dp_shard + 0.12, 0.02),
            (dp_shard + 0.12, dp_replicate - 0.02),
            arrowprops=arrow,
            annotation_clip=False,
        )
        ax.text(
            dp_shard + 0.22,
            dp_replicate / 2,
            f"a column = one\ndp_replicate group\n({dp_replicate} ranks):\nall-reduce grads",
            ha="left",
            va="center",
            fontsize=10,
        )
    ax.set_xlim(-0.05, dp_shard + (1.9 if dp_replicate > 1 else 0.05))
    ax.set_ylim(-0.05, dp_replicate + 0.55)
    ax.set_aspect("equal")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    ax.set_title(
        f"the dp mesh (dp_replicate={dp_replicate}, dp_shard={dp_shard}), row-major",
        fontsize=11,
        pad=4,
    )
    fig.tight_layout()
    return fig


def _rank_cells(
    ax, world: int, colour_of: list[int], text_of: list[str], pairs: list[list[int]], title: str
) -> None:
    """A 2-row grid of ranks, filled by group, with a bar joining each pair (cp partners)."""
    rows, cols = _grid_shape(world)
    width, step_x, step_y = 1.4, 1.6, 1.45
    where = {}
    for rank in range(world):
        r, c = divmod(rank, cols)
        x, y = c * step_x, (rows - 1 - r) * step_y
        where[rank] = (x + width / 2, y + 0.5)
        ax.add_patch(
            plt.Rectangle(
                (x, y),
                width,
                1.0,
                facecolor=PALETTE[(2 * colour_of[rank] + 1) % len(PALETTE)],
                edgecolor="black",
            )
        )
        ax.text(
            x + width / 2,
            y + 0.66,
            f"rank {rank}",
            ha="center",
            va="center",
            fontsize=10,
            fontweight="bold",
        )
        ax.text(x + width / 2, y + 0.3, text_of[rank], ha="center", va="center", fontsize=9)
    for pair in pairs:
        (x0, y0), (x1, y1) = where[pair[0]], where[pair[-1]]
        ax.plot(
            [x0, x1], [y0 - 0.62, y1 - 0.62], color="black", linewidth=3, solid_capstyle="round"
        )
    ax.set_xlim(-0.1, cols * step_x)
    ax.set_ylim(-0.3, rows * step_y)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title, fontsize=10)


def plot_overlay_vs_consuming(
    overlay: list[dict[str, list[int]]],
    consuming: list[dict[str, list[int]]],
    fsdp_axes: tuple[str, str] = ("dp_shard", "dp_shard_cp"),
    second_axes: tuple[str, str] = ("dp_replicate", "dp_shard"),
    pair_axis: str = "cp",
) -> Figure:
    """The same ranks read two ways, side by side: paralab's overlay and torchtitan's consuming reading.

    `overlay[rank]` and `consuming[rank]` map axis -> the ranks of that rank's
    group (`ParallelDims.group_ranks()`, `predict_groups`; for torchtitan, its
    mesh's sub-meshes, FSDP's being the flattened `dp_shard_cp`). Fill = the
    FSDP group (`fsdp_axes`), text = the group on `second_axes`, black bar =
    `pair_axis` partners.
    """
    world = len(overlay)
    fig, panels = plt.subplots(1, 2, figsize=(11, 3.9))
    for panel, groups, fsdp, second, name in (
        (panels[0], overlay, fsdp_axes[0], second_axes[0], "overlay (paralab)"),
        (panels[1], consuming, fsdp_axes[1], second_axes[1], "consuming (torchtitan)"),
    ):
        ids: dict[tuple[int, ...], int] = {}
        colour_of = [
            ids.setdefault(tuple(groups[r].get(fsdp, [r])), len(ids)) for r in range(world)
        ]
        second_ids: dict[tuple[int, ...], int] = {}
        text_of = [
            f"{second.replace('replicate', 'rep')} "
            f"g{second_ids.setdefault(tuple(groups[r].get(second, [r])), len(second_ids))}"
            for r in range(world)
        ]
        pairs = list(
            {tuple(groups[r][pair_axis]): None for r in range(world) if pair_axis in groups[r]}
        )
        _rank_cells(
            panel,
            world,
            colour_of,
            text_of,
            [list(p) for p in pairs],
            f"{name}\nfill = FSDP group ({fsdp}): {len(ids)} group{'s' if len(ids) > 1 else ''} "
            f"of {world // len(ids)} ranks\n"
            f"text = {second} group; bar = {pair_axis} pair",
        )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig
