"""Pictures for the labs. Every function returns a matplotlib Figure; the notebook displays it.

One section per lab; the mesh pictures of lab 00 come first.
"""

from __future__ import annotations

import math
import textwrap

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from paralab.cp.layout import causal_work, chunk_ids, kv_source, ring_blocks

PALETTE = plt.get_cmap("tab20").colors
_RANK_COLORS = plt.get_cmap("tab10").colors


# =====================================================================================
# Lab 00 — ParallelDims: rank grids coloured by group
# =====================================================================================
def show(fig: Figure) -> None:
    """Show a figure once in the notebook and free it: the one way every lab shows a picture."""
    from IPython.display import display

    display(fig)
    plt.close(fig)


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


# =====================================================================================
# Bug clinic (every lab): where a buggy result departs from the correct one
# =====================================================================================
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


# =====================================================================================
# Lab 01 (FSDP / HSDP): who holds which shard, bytes per step, memory per rank.
# =====================================================================================
def plot_shard_layout(
    numels: list[int], world: int, dp_replicate: int = 1, unit_names: list[str] | None = None
) -> Figure:
    """Each unit's flat parameter vector cut into equal shards; hatched = padding."""
    shard = world // dp_replicate
    names = unit_names or [f"unit {i}" for i in range(len(numels))]
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.55 * len(numels)))
    for row, (_name, numel) in enumerate(zip(names, numels)):
        size = -(-numel // shard)  # elements per shard; the bar is drawn in units of whole shards
        for s in range(shard):
            real = max(0, min(size, numel - s * size)) / size
            ax.barh(row, real, left=s, color=colors(s), edgecolor="white")
            if real < 1:
                ax.barh(
                    row, 1 - real, left=s + real, color="white", edgecolor=colors(s), hatch="//"
                )
            holders = ",".join(str(r * shard + s) for r in range(dp_replicate))
            ax.text(s + 0.5, row, holders, ha="center", va="center", fontsize=8)
    ax.set_yticks(
        range(len(numels)),
        [f"{n}: {p} params, shards of {-(-p // shard)}" for n, p in zip(names, numels)],
    )
    ax.invert_yaxis()
    ax.set_xticks(range(shard + 1))
    ax.set_xlabel(
        "the unit's flat padded vector, one column per shard (labels: ranks holding it; hatched: padding)",
        fontsize=9,
    )
    layout = f"HSDP {dp_replicate}x{shard}" if dp_replicate > 1 else f"ZeRO-3, {world} ranks"
    ax.set_title(f"Flat shards per FSDP unit — {layout}")
    fig.tight_layout()
    return fig


def plot_traffic(table: dict[str, dict[int, tuple[int, ...]]]) -> Figure:
    """Bytes sent per rank per step: one panel per strategy, world sizes along x; black tick = the formula.

    `table[strategy][world]` is `(measured, formula)`, or `(within, across, formula)`
    to split the bytes into those inside the shard (or DDP) group and those
    crossing between replicas (HSDP's gradient all-reduce).
    """
    strategies = list(table)
    all_worlds = sorted({w for rows in table.values() for w in rows})
    fig, panels = plt.subplots(
        1, len(strategies), figsize=(2.3 * len(strategies) + 1.0, 3.8), sharey=True, squeeze=False
    )
    for panel, name in zip(panels[0], strategies):
        worlds = sorted(table[name])
        xs = [all_worlds.index(w) for w in worlds]
        within = [table[name][w][0] for w in worlds]
        across = [table[name][w][1] if len(table[name][w]) == 3 else 0 for w in worlds]
        formula = [table[name][w][-1] for w in worlds]
        panel.bar(xs, within, 0.6, color="tab:blue", label="within the shard group")
        panel.bar(xs, across, 0.6, bottom=within, color="tab:orange", label="across replicas")
        panel.plot(xs, formula, "k_", markersize=26, mew=2, label="formula (total)")
        for x, w, a in zip(xs, within, across):
            panel.text(x, w + a, f"{w + a:,}", ha="center", va="bottom", fontsize=8)
        panel.set_xticks(range(len(all_worlds)), [f"{w}" for w in all_worlds], fontsize=9)
        panel.set_xlim(-0.6, len(all_worlds) - 0.4)
        panel.set_xlabel("ranks", fontsize=9)
        panel.set_title(name, fontsize=10)
        for side in ("top", "right"):
            panel.spines[side].set_visible(False)
    panels[0][0].set_ylabel("bytes sent per rank per step")
    handles, labels = panels[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=9, ncol=3, loc="lower center", frameon=False)
    fig.suptitle("Traffic per step (ledger, ring model), one strategy per panel", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plot_memory(table: dict[str, dict[str, int]], formulas: dict[str, int]) -> Figure:
    """Stacked horizontal bars of the bytes one rank holds, one row per job; a black tick marks the formula's total."""
    parts = ["params", "grads", "optimizer", "gathered peak"]
    labels = list(table)
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.42 * len(labels)))
    left = [0] * len(labels)
    for part in parts:
        widths = [table[label][part] for label in labels]
        ax.barh(range(len(labels)), widths, 0.6, left=left, label=part)
        left = [x + w for x, w in zip(left, widths)]
    ax.plot(
        [formulas[label] for label in labels],
        range(len(labels)),
        "k|",
        markersize=18,
        mew=2,
        label="formula total",
    )
    for y, total in enumerate(left):
        ax.text(total + 0.01 * max(left), y, f"{total:,} B", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15 * max(max(left), max(formulas.values())))
    ax.set_xlabel("bytes held by one rank")
    ax.set_title("Memory per rank, float64 + Adam (measured on the real tensors)", fontsize=10)
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, fontsize=8, ncol=5, loc="lower center", frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout(rect=(0, 0.4 / fig.get_figheight(), 1, 1))
    return fig


# =====================================================================================
# Lab 02 — context parallelism: ring attention vs Ulysses
# =====================================================================================


def _work_grid(cp: int, zigzag: bool) -> np.ndarray:
    return np.array(
        [[causal_work(r, s, cp, causal=True, zigzag=zigzag) for s in range(cp)] for r in range(cp)]
    )


def plot_ring_timeline(cp: int = 4) -> Figure:
    """Which K/V block each rank holds at each ring step, and how much causal work it does with it.

    One panel per layout (contiguous, zigzag): rows = ranks, columns = steps,
    shade = fraction of a full shard-by-shard block computed (0 = skipped);
    red arrows are the K/V hops (rank r's block moves to rank r+1 for the next step),
    and the dashed one closes the ring: the last rank's block leaves at the bottom and
    comes back in at rank 0. A third panel sums each rank's work: the slowest rank sets the pace.
    """
    fig, axes = plt.subplots(
        1,
        3,
        figsize=(max(10.0, 2.2 + 2.0 * cp), 2.6 + 0.95 * cp),
        gridspec_kw={"width_ratios": [1, 1, 0.62]},
    )
    hop = dict(arrowstyle="-|>", color="tab:red", linewidth=1.4, mutation_scale=13)
    wrap = dict(hop, linestyle=(0, (3, 2)), shrinkA=0, shrinkB=0)
    margin = (
        0.45  # blank band above and below the grid where the wrapping hop leaves and comes back
    )
    for ax, zigzag in zip(axes, (False, True)):
        grid = _work_grid(cp, zigzag)
        ax.imshow(grid, cmap="Blues", vmin=-0.2, vmax=2.6, aspect="auto")
        for r in range(cp):
            for s in range(cp):
                src = kv_source(r, s, cp)
                chunks = ",".join(str(c) for c in chunk_ids(src, cp, zigzag=zigzag))
                work = "skip" if grid[r, s] == 0 else f"{grid[r, s]:g}"
                ax.text(
                    s,
                    r,
                    f"K/V {src}\n[{chunks}]\n{work}",
                    ha="center",
                    va="center",
                    fontsize=10,
                    color="0.45" if grid[r, s] == 0 else "black",
                )
                if s + 1 == cp:
                    continue
                if r + 1 < cp:  # the block this rank holds now is the next rank's at the next step
                    ax.annotate(
                        "", xy=(s + 0.62, r + 0.7), xytext=(s + 0.38, r + 0.3), arrowprops=hop
                    )
                else:  # the last rank's block goes to rank 0: out at the bottom, back in at the top
                    ax.annotate(
                        "",
                        xy=(s + 0.5, cp - 0.5 + margin * 0.8),
                        xytext=(s + 0.38, r + 0.3),
                        arrowprops=wrap,
                    )
                    ax.annotate(
                        "",
                        xy=(s + 0.62, -0.3),
                        xytext=(s + 0.5, -0.5 - margin * 0.8),
                        arrowprops=wrap,
                    )
        ax.text(
            0.58,
            cp - 0.5 + margin / 2,
            "to rank 0",
            ha="left",
            va="center",
            fontsize=9,
            color="tab:red",
        )
        ax.text(
            0.68,
            -0.5 - margin / 2,
            f"from rank {cp - 1}",
            ha="left",
            va="center",
            fontsize=9,
            color="tab:red",
        )
        ax.set_ylim(cp - 0.5 + margin, -0.5 - margin)
        for side in ("top", "bottom"):
            ax.spines[side].set_visible(False)
        ax.set_xticks(range(cp), [str(s) for s in range(cp)], fontsize=10)
        ax.set_xlabel("ring step", fontsize=10)
        ax.tick_params(axis="x", length=0)
        ax.set_yticks(
            range(cp),
            [
                f"rank {r}\n[{','.join(map(str, chunk_ids(r, cp, zigzag=zigzag)))}]"
                for r in range(cp)
            ],
            fontsize=10,
        )
        ax.set_title(
            f"{'zigzag' if zigzag else 'contiguous'}: K/V of rank, [chunks], work\n"
            f"dashed: rank {cp - 1} -> rank 0 closes the ring",
            fontsize=10,
        )
    ranks = np.arange(cp)
    for offset, zigzag in ((-0.2, False), (0.2, True)):
        axes[2].bar(
            ranks + offset,
            _work_grid(cp, zigzag).sum(axis=1),
            width=0.4,
            label="zigzag" if zigzag else "contiguous",
        )
    axes[2].set_xticks(ranks, [str(r) for r in ranks], fontsize=10)
    axes[2].set_xlabel("rank", fontsize=10)
    axes[2].tick_params(axis="y", labelsize=10)
    axes[2].set_ylabel("blocks of work per forward", fontsize=10)
    axes[2].set_title(f"causal work per rank, cp = {cp}\n(slowest rank sets the pace)", fontsize=10)
    axes[2].legend(fontsize=10)
    fig.tight_layout()
    return fig


def plot_error_by_token(
    diff: torch.Tensor, cp: int, zigzag: bool = True, title: str = ""
) -> Figure:
    """Largest |buggy - correct| per token on a log scale, with chunk and rank boundaries.

    `diff` is `(..., tokens)`: every leading dim is reduced by max. Tokens whose
    value is bitwise right get a marker at the bottom instead of a bar, so "which
    tokens are exact" and "how the error fades" are both visible.
    """
    per_token = diff.detach().double().abs().reshape(-1, diff.shape[-1]).amax(dim=0).numpy()
    n, chunks = per_token.size, 2 * cp
    chunk_len = n // chunks
    owner = {c: r for r in range(cp) for c in chunk_ids(r, cp, zigzag=zigzag)}
    fig, ax = plt.subplots(figsize=(11, 3.8))
    wrong = per_token > 0
    floor = per_token[wrong].min() / 10 if wrong.any() else 1e-16
    colors = [_RANK_COLORS[owner[t // chunk_len] % 10] for t in range(n)]
    ax.bar(
        np.arange(n)[wrong],
        per_token[wrong],
        color=np.array(colors, dtype=object)[wrong],
        bottom=floor,
        width=0.85,
    )
    ax.scatter(
        np.arange(n)[~wrong],
        np.full(int((~wrong).sum()), floor * 1.6),
        marker="o",
        color="black",
        s=18,
        label="bitwise right (0)",
        zorder=3,
    )
    ax.set_yscale("log")
    top = per_token.max() * 8 if wrong.any() else 1.0
    ax.set_ylim(floor, top)
    for c in range(chunks):
        if c:
            ax.axvline(c * chunk_len - 0.5, color="0.3", linewidth=0.8)
        ax.text(
            c * chunk_len + chunk_len / 2 - 0.5,
            top / 1.6,
            f"chunk {c}\nrank {owner[c]}",
            ha="center",
            va="top",
            fontsize=9,
        )
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_xlabel("token (sequence order; bar colour = rank that owns the token)", fontsize=10)
    ax.set_ylabel("max |buggy - correct|\n(log scale)", fontsize=10)
    ax.set_title(f"{title}\n{int(wrong.sum())} of {n} tokens wrong", fontsize=10)
    ax.legend(loc="lower left", fontsize=9)
    fig.tight_layout()
    return fig


def plot_scale_scatter(
    correct: torch.Tensor, buggy: torch.Tensor, factor: float, title: str = ""
) -> Figure:
    """Every element, buggy against correct: on the line of slope `factor` means "exactly factor × too large"."""
    x = correct.detach().double().flatten().numpy()
    y = buggy.detach().double().flatten().numpy()
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    ax.scatter(x, y, s=6, alpha=0.5, color="tab:red", label=f"{x.size} elements")
    span = np.array([x.min(), x.max()])
    ax.plot(span, factor * span, color="black", linewidth=1, label=f"buggy = {factor:g} × correct")
    ax.plot(span, span, "--", color="0.5", linewidth=1, label="buggy = correct")
    ax.set_xlabel("correct value", fontsize=10)
    ax.set_ylabel("buggy value", fontsize=10)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_causal_ownership(cp: int = 4, tokens_per_chunk: int = 6) -> Figure:
    """The causal attention matrix, token by token, coloured by the rank that computes each score.

    Blank = a key in the query's future (never computed). Contiguous: the last rank
    owns the widest rows. Zigzag: every rank owns one short and one long band of
    rows, the same area in total.
    """
    n = 2 * cp * tokens_per_chunk
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.4))
    cmap = plt.get_cmap("tab10", cp)
    for ax, zigzag in zip(axes, (False, True)):
        chunk_len = tokens_per_chunk if zigzag else 2 * tokens_per_chunk
        owner = np.full((n, n), np.nan)
        for r in range(cp):
            for s in range(cp):
                q_chunks = chunk_ids(r, cp, zigzag=zigzag)
                kv_chunks = chunk_ids(kv_source(r, s, cp), cp, zigzag=zigzag)
                for i, j, _ in ring_blocks(r, s, cp, causal=True, zigzag=zigzag):
                    rows = np.arange(q_chunks[i] * chunk_len, (q_chunks[i] + 1) * chunk_len)[
                        :, None
                    ]
                    cols = np.arange(kv_chunks[j] * chunk_len, (kv_chunks[j] + 1) * chunk_len)[
                        None, :
                    ]
                    block = owner[rows, cols]
                    owner[rows, cols] = np.where(cols <= rows, r, block)
        ax.imshow(owner, cmap=cmap, vmin=-0.5, vmax=cp - 0.5, interpolation="nearest")
        ax.set_title(
            f"{'zigzag' if zigzag else 'contiguous'}: who computes each score", fontsize=10
        )
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        ax.set_xticks([]), ax.set_yticks([])
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(r)) for r in range(cp)]
    fig.legend(handles, [f"rank {r}" for r in range(cp)], loc="lower center", ncol=cp, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plot_cp_bytes(
    cps: list[int],
    measured: dict[str, dict[str, list[int]]],
    formula: dict[str, dict[str, list[int]]],
    full_bytes: int,
) -> Figure:
    """Bytes each rank sends vs cp, forward and backward: ledger (markers) over formulas (lines).

    `measured[name][phase]` and `formula[name][phase]` hold one value per cp; values
    are shown in units of one full q tensor (`full_bytes`) so that sizes compare at a glance.
    """
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, phase in zip(axes, ("forward", "backward")):
        for color, name in zip(("tab:red", "tab:blue", "tab:green"), measured):
            ax.plot(cps, np.array(formula[name][phase]) / full_bytes, "--", color=color, alpha=0.6)
            ax.plot(cps, np.array(measured[name][phase]) / full_bytes, "o", color=color, label=name)
        ax.set_xticks(cps)
        ax.set_xlabel("cp")
        ax.set_title(f"{phase}: bytes sent per rank (markers: ledger, dashes: formula)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("× bytes of one full q tensor")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


# =====================================================================================
# Lab 03 — CFG parallelism: latents during sampling, the two branches and their combination
# =====================================================================================


def _frames(
    latent: torch.Tensor, frames: int, height: int, width: int, channel: int
) -> torch.Tensor:
    """(1, frames*height*width, channels) -> (frames, height, width) of one channel."""
    return latent.detach()[0, :, channel].reshape(frames, height, width)


def plot_cfg_branches(
    cond_pred: torch.Tensor,
    uncond_pred: torch.Tensor,
    guided: torch.Tensor,
    guidance_scale: float,
    frames: int,
    height: int,
    width: int,
    channel: int = 0,
    frame: int = 0,
):
    """The two branches (one per cfgp rank) and the guided velocity both ranks compute from them."""
    panels = [
        ("rank 0 computes:\ncond branch", cond_pred),
        ("rank 1 computes:\nuncond branch", uncond_pred),
        ("what the swap lets both see:\ncond - uncond", cond_pred - uncond_pred),
        (f"both ranks compute:\nuncond + {guidance_scale:g}(cond - uncond)", guided),
    ]
    images = [_frames(t, frames, height, width, channel)[frame] for _, t in panels]
    lim = max(float(im.abs().max()) for im in images)
    diff_lim = float(images[2].abs().max())
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4))
    for i, (ax, (title, _), im) in enumerate(zip(axes, panels, images)):
        scale = diff_lim if i == 2 else lim
        image = ax.imshow(im.numpy(), cmap="RdBu_r", vmin=-scale, vmax=scale)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        ax.set_title(title + ("\n(own colour scale)" if i == 2 else ""), fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(
        f"predicted velocity, channel {channel}, frame {frame}: guidance amplifies the difference",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return fig


def plot_step_traffic(per_step: dict[str, dict[str, int]]) -> Figure:
    """Bytes one rank sends per sampling step, grouped by layout: the cfgp swap next to cp's attention traffic."""
    layouts = list(per_step)
    kinds = list(next(iter(per_step.values())))
    fig, ax = plt.subplots(figsize=(8.5, 3.4))
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        xs = [j + (i - (len(kinds) - 1) / 2) * width for j in range(len(layouts))]
        values = [per_step[layout][kind] for layout in layouts]
        bars = ax.bar(xs, values, width, label=kind)
        ax.bar_label(bars, labels=[f"{v / 1024:.1f} KiB" for v in values], fontsize=8)
    ax.set_xticks(range(len(layouts)), layouts)
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 3)
    ax.set_ylabel("bytes sent per step by one rank")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(
        "cfgp moves one latent shard per step; cp moves hidden states in every layer", fontsize=10
    )
    fig.tight_layout()
    return fig


# =====================================================================================
# Lab 04 — VAE load balancing: predicted load per rank
# =====================================================================================
def _stacked_loads(
    ax,
    costs: dict[int, list[float]],
    where: dict[tuple[int, int], int],
    ranks: list[int],
    groups: list[list[int]],
    label: str,
) -> None:
    """One bar per rank, one segment per sample it encodes, coloured by the sample's owner; guests hatched."""
    x_of = {rank: k for k, rank in enumerate(ranks)}
    load = {rank: 0.0 for rank in ranks}
    for (owner, index), rank in sorted(
        where.items(), key=lambda item: (x_of[item[1]], item[1] != item[0][0], item[0])
    ):
        cost = costs[owner][index]
        ax.bar(
            x_of[rank],
            cost,
            bottom=load[rank],
            width=0.7,
            color=PALETTE[(2 * x_of[owner]) % len(PALETTE)],
            edgecolor="black",
            linewidth=0.5,
            hatch="//" if owner != rank else None,
        )
        load[rank] += cost
    spreads = []
    for group in groups[1:]:
        ax.axvline(x_of[group[0]] - 0.5, color="grey", linestyle=":", linewidth=1)
    for group in groups:
        mean = sum(load[r] for r in group) / len(group)
        ax.hlines(
            mean,
            x_of[group[0]] - 0.45,
            x_of[group[-1]] + 0.45,
            color="black",
            linestyle="--",
            linewidth=1,
        )
        spreads.append(max(load[r] for r in group) - min(load[r] for r in group))
    ax.set_xticks(range(len(ranks)), [str(r) for r in ranks], fontsize=8)
    ax.set_xlabel("rank", fontsize=8)
    ax.set_title(
        f"{label}: max load {max(load.values()):,.0f}, spread {max(spreads):,.0f}", fontsize=8
    )


def plot_lb_loads(
    costs: dict[int, list[float]],
    after: dict[tuple[int, int], int],
    groups: list[list[int]] | None = None,
    title: str = "",
) -> Figure:
    """Predicted load per rank before and after a plan, stacked by sample.

    `costs[rank]` are the owner's sample costs; `after[(owner, index)]` is the
    rank that encodes that sample once the plan is applied. Segments keep their
    owner's colour; a hatched segment is a guest encoded for another rank.
    Dashed lines: the mean load of each lb group (`groups`, default: one group;
    dotted lines separate groups); the spread shown is the largest within one group.
    """
    ranks = sorted(costs)
    groups = groups or [ranks]
    before = {(rank, i): rank for rank in ranks for i in range(len(costs[rank]))}
    fig, panels = plt.subplots(1, 2, figsize=(1.6 + 0.9 * len(ranks), 3.0), sharey=True)
    for panel, where, name in ((panels[0], before, "before"), (panels[1], after, "after")):
        _stacked_loads(panel, costs, where, ranks, groups, name)
    panels[0].set_ylabel("predicted cost (frames x height x width)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_cost_fit(
    pixels: list[float], seconds: list[float], slope: float, intercept: float
) -> Figure:
    """Measured encode time against frames x height x width, with the fitted line."""
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    ax.scatter(pixels, seconds, s=14, color=PALETTE[0])
    top = max(pixels)
    ax.plot([0, top], [intercept, intercept + slope * top], color=PALETTE[6], linewidth=1)
    ax.set_xlabel("frames x height x width", fontsize=8)
    ax.set_ylabel("encode time (s)", fontsize=8)
    ax.set_title("encode time against frames x height x width", fontsize=9)
    fig.tight_layout()
    return fig


# =====================================================================================
# Primer (00_collectives_primer): one picture per collective
# =====================================================================================


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


# =====================================================================================
# Pictures for the axis labs, drawn from their schedules
# =====================================================================================
_EVENT_STYLE = {  # kind -> (short label in the box, colour)
    "gather": ("AG", "tab:blue"),
    "forward": ("fwd", "0.8"),
    "backward": ("bwd", "0.55"),
    "free": ("free", "white"),
    "reduce-scatter": ("RS", "tab:orange"),
    "all-reduce": ("AR", "tab:red"),
}
_EVENT_NAMES = {
    "gather": "AG: all-gather the unit's parameters",
    "forward": "fwd: compute",
    "backward": "bwd: gradient of the unit",
    "free": "free the gathered parameters",
    "reduce-scatter": "RS: reduce-scatter the gradient",
    "all-reduce": "AR: all-reduce across replicas",
}


def _full_bytes(record) -> int:
    """The unsharded tensor behind a ledger record: the ledger books (n-1)/n of it for AG and RS."""
    n = record.group_size
    return record.bytes_sent * n // (n - 1) if n > 1 else record.bytes_sent


def fsdp_events(records) -> list[tuple[str, int, str, int]]:
    """(phase, unit, kind, change in bytes held) in order, from one rank's ledger records of one FSDP step.

    Forward: each all-gather is a unit's gather, then its forward, then its free
    (no free when the backward gathers nothing: reshard_after_forward=False).
    Backward, units in reverse: gather (if resharded), backward (the unit's full
    gradient appears), free the parameters, reduce-scatter (the full gradient
    goes), all-reduce across replicas for HSDP. This is `paralab.fsdp`'s order.
    Records of several steps: only the first step is read.
    """
    first_step, seen_backward = [], False
    for r in records:
        seen_backward |= r.phase == "backward"
        if seen_backward and r.phase == "forward":
            break
        first_step.append(r)
    records = first_step
    gathers = ("all_gather_into_tensor", "all_gather", "all_gather_single", "_all_gather_base")
    sizes = [_full_bytes(r) for r in records if r.phase == "forward" and r.op in gathers]
    backward = [r for r in records if r.phase == "backward"]
    reshard = any(r.op in gathers for r in backward)
    events: list[tuple[str, int, str, int]] = []
    for unit, size in enumerate(sizes):
        events += [("forward", unit, "gather", size), ("forward", unit, "forward", 0)]
        if reshard:
            events.append(("forward", unit, "free", -size))
    unit = len(sizes)
    for r in backward:
        if r.op in gathers:
            unit -= 1
            events.append(("backward", unit, "gather", sizes[unit]))
        elif r.op in ("reduce_scatter_tensor", "reduce_scatter", "_reduce_scatter_base"):
            if not reshard:
                unit -= 1
            events += [
                ("backward", unit, "backward", sizes[unit]),
                ("backward", unit, "free", -sizes[unit]),
                ("backward", unit, "reduce-scatter", -_full_bytes(r)),
            ]
        elif r.op == "all_reduce":
            events.append(("backward", unit, "all-reduce", 0))
    return events


def plot_fsdp_timeline(
    records, unit_names: list[str] | None = None, resident_bytes: int = 0
) -> Figure:
    """One FSDP step on one rank: per unit gather -> compute -> free -> reduce-scatter, and the memory it holds.

    `records` are one rank's ledger records of one step, with phases "forward"
    and "backward" (as `paralab.fsdp`'s runs record them). Top: one row per
    unit, one box per event, in the order they happen. Bottom: the unsharded
    bytes held (gathered parameters plus the unit's full gradient until it is
    reduce-scattered), on top of `resident_bytes` (shards, optimizer state).
    """
    events = fsdp_events(records)
    units = 1 + max(u for _, u, _, _ in events)
    names = unit_names or [f"unit {u}" for u in range(units)]
    forward_end = sum(1 for phase, *_ in events if phase == "forward")
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(min(11.0, max(7.0, 0.32 * len(events) + 1.8)), 0.5 * units + 4.4),
        sharex=True,
        gridspec_kw={"height_ratios": [0.5 * units + 0.9, 2.0]},
    )
    held, curve = 0, [0]
    for x, (_, unit, kind, delta) in enumerate(events):
        label, color = _EVENT_STYLE[kind]
        y = units - 1 - unit
        top.add_patch(
            plt.Rectangle((x + 0.04, y + 0.08), 0.92, 0.84, facecolor=color, edgecolor="black")
        )
        top.text(
            x + 0.5,
            y + 0.5,
            label,
            ha="center",
            va="center",
            fontsize=9 if len(label) < 4 else 8,
            color="white" if kind in ("gather", "backward", "all-reduce") else "black",
        )
        held += delta
        curve.append(held)
    kinds = list(dict.fromkeys(kind for _, _, kind, _ in events))
    fig.legend(
        [
            plt.Rectangle((0, 0), 1, 1, facecolor=_EVENT_STYLE[k][1], edgecolor="black")
            for k in kinds
        ],
        [_EVENT_NAMES[k] for k in kinds],
        fontsize=9,
        ncol=3,
        loc="lower center",
        frameon=False,
    )
    for ax in (top, bottom):
        ax.axvline(forward_end, color="black", linestyle="--", linewidth=1)
    top.text(forward_end / 2, units + 0.15, "forward", ha="center", fontsize=10)
    top.text(
        (forward_end + len(events)) / 2,
        units + 0.15,
        "backward (units in reverse)",
        ha="center",
        fontsize=10,
    )
    top.set_ylim(0, units + 0.7)
    top.tick_params(axis="x", length=0)
    top.set_yticks([units - 1 - u + 0.5 for u in range(units)], names, fontsize=10)
    for side in ("top", "right"):
        top.spines[side].set_visible(False)
    top.set_title("one training step on one rank: each FSDP unit's events, in order", fontsize=10)
    kib = [
        c / 1024 for c in curve[1:] + curve[-1:]
    ]  # during event k: what is held once it has happened
    bottom.step(range(len(kib)), kib, where="post", color="black")
    bottom.fill_between(range(len(kib)), kib, step="post", color="tab:blue", alpha=0.3)
    bottom.set_xticks([])
    bottom.set_ylabel("unsharded, held (KiB)", fontsize=10)
    bottom.set_xlabel("event, in order (not to time scale)", fontsize=10)
    bottom.set_xlim(0, len(events))
    bottom.set_ylim(0, 1.15 * max(kib))
    bottom.set_title(
        f"gathered parameters + the unit's full gradient: peak {max(kib):.2f} KiB"
        + (
            f"\non top of {resident_bytes / 1024:.2f} KiB resident (shards, optimizer state)"
            if resident_bytes
            else ""
        ),
        fontsize=10,
    )
    bottom.tick_params(labelsize=9)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def plot_ulysses_reshape(cp: int, heads: int, seq: int) -> Figure:
    """Which rank holds which (token chunk, head group) block before and after Ulysses' seq->heads all-to-all.

    Before: rank r holds tokens chunk r, every head (a column). After: rank r
    holds every token, head group r (a row). Block (t, g) travels from rank t
    to rank g; the diagonal stays home. heads_to_seq is the same picture read
    right to left.
    """
    if heads % cp or seq % cp:
        raise ValueError(f"Ulysses needs heads ({heads}) and seq ({seq}) divisible by cp ({cp})")
    tokens, group = seq // cp, heads // cp
    fig, panels = plt.subplots(1, 2, figsize=(4.0 + 2.2 * cp, 1.6 + 0.75 * cp))
    for panel, (title, holder) in zip(
        panels,
        (
            ("before: sequence-sharded", lambda t, g: t),
            ("after seq_to_heads: head-sharded", lambda t, g: g),
        ),
    ):
        for t in range(cp):
            for g in range(cp):
                rank = holder(t, g)
                y = cp - 1 - g
                panel.add_patch(
                    plt.Rectangle(
                        (t, y),
                        0.95,
                        0.95,
                        facecolor=_RANK_COLORS[rank % 10],
                        alpha=0.55,
                        edgecolor="black",
                        linewidth=2.0 if t == g else 0.8,
                    )
                )
                moved = (
                    "stays"
                    if t == g
                    else (f"from rank {t}" if holder(t, g) == g else f"to rank {g}")
                )
                panel.text(
                    t + 0.47, y + 0.55, f"rank {rank}", ha="center", va="center", fontsize=10
                )
                panel.text(
                    t + 0.47, y + 0.25, moved, ha="center", va="center", fontsize=9, color="0.25"
                )
        panel.set_xlim(-0.05, cp)
        panel.set_ylim(-0.05, cp)
        panel.set_xticks(
            [t + 0.47 for t in range(cp)],
            [f"tokens\n{t * tokens}-{(t + 1) * tokens - 1}" for t in range(cp)],
            fontsize=9,
        )
        panel.set_yticks(
            [cp - 1 - g + 0.47 for g in range(cp)],
            [f"heads {g * group}-{(g + 1) * group - 1}" for g in range(cp)],
            fontsize=9,
        )
        panel.tick_params(length=0)
        for side in ("top", "right", "left", "bottom"):
            panel.spines[side].set_visible(False)
        panel.set_title(title, fontsize=10)
    fig.suptitle(
        f"Ulysses all-to-all, cp = {cp}, {heads} heads, {seq} tokens: "
        "each (token chunk, head group) block and the rank holding it",
        fontsize=10,
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


def plot_cfgp_timeline(steps: int = 2, latent_bytes: int | None = None) -> Figure:
    """Guided sampling on a cfgp pair: each rank runs one branch, they swap, both combine and step.

    Two lanes (cfgp rank 0: cond, rank 1: uncond), time to the right, `steps`
    sampling steps; crossing arrows are the swap (one latent-sized
    prediction each way, `latent_bytes` if given). The noise is broadcast once
    before the first step.
    """
    model_w, swap_w, combine_w, euler_w, gap = 1.8, 1.2, 1.8, 1.2, 0.5
    step_w = model_w + swap_w + combine_w + euler_w + gap
    lanes = {0: 1.5, 1: 0.2}
    fig, ax = plt.subplots(figsize=(min(11.0, 1.8 + 0.62 * (1.6 + steps * step_w)), 3.4))
    ax.add_patch(
        plt.Rectangle((-1.6, 0.2), 1.3, 2.1, facecolor="tab:purple", alpha=0.35, edgecolor="black")
    )
    ax.text(-0.95, 1.25, "broadcast\nnoise\n(rank 0's)", ha="center", va="center", fontsize=9)

    def box(x: float, y: float, w: float, text: str, color: str, alpha: float = 1.0) -> None:
        ax.add_patch(plt.Rectangle((x, y), w, 0.8, facecolor=color, alpha=alpha, edgecolor="black"))
        ax.text(x + w / 2, y + 0.4, text, ha="center", va="center", fontsize=9)

    for step in range(steps):
        x0 = step * step_w
        x1 = x0 + model_w + swap_w
        for rank, y in lanes.items():
            branch = "cond" if rank == 0 else "uncond"
            box(
                x0,
                y,
                model_w,
                f"model\n(x, t, {branch})",
                "tab:blue" if rank == 0 else "tab:green",
                0.45,
            )
            box(x1, y, combine_w, "combine\nu + w (c - u)", "0.85")
            box(x1 + combine_w, y, euler_w, "Euler\nstep of x", "0.7")
        for src, dst in ((0, 1), (1, 0)):
            ax.annotate(
                "",
                xy=(x1, lanes[dst] + 0.4),
                xytext=(x0 + model_w, lanes[src] + 0.4),
                arrowprops=dict(arrowstyle="-|>", color="black", linewidth=1.5),
            )
        label = "swap" + (f" {latent_bytes / 1024:.1f} KiB\neach way" if latent_bytes else "")
        ax.text(x0 + model_w + swap_w / 2, 2.45, label, ha="center", va="bottom", fontsize=9)
        ax.text(
            x0 + (step_w - gap) / 2,
            2.95,
            f"step {step}",
            ha="center",
            fontsize=10,
            fontweight="bold",
        )
    ax.set_xlim(-1.8, steps * step_w)
    ax.set_ylim(0, 3.25)
    ax.set_yticks(
        [lanes[0] + 0.4, lanes[1] + 0.4],
        ["cfgp rank 0\n(cond)", "cfgp rank 1\n(uncond)"],
        fontsize=10,
    )
    ax.set_xticks([])
    ax.set_xlabel(
        "time (schematic): both ranks hold the same x, and the same guided x after every step",
        fontsize=9,
    )
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(
        "cfgp: one branch per rank, one swap per step, the same combine on both", fontsize=10
    )
    fig.tight_layout()
    return fig


def plot_lb_protocol(moves, world: int) -> Figure:
    """The lb step as a sequence diagram: share -> plan -> exchange -> encode -> return, one lane per rank.

    `moves` are the plan's moves (objects with `from_rank`, `to_rank`,
    `local_index`, as `plan_rebalance` returns them); ranks are lb-group ranks.
    Time runs downwards; arrows are messages (metadata then payload, one
    arrow per move here).
    """
    moves = list(moves)
    rows = 3 + len(moves) + 1 + len(moves) + 1
    fig, ax = plt.subplots(figsize=(1.8 + 1.7 * world, 1.2 + 0.42 * rows))
    xs = [1.7 * r for r in range(world)]
    top = rows
    for r, x in enumerate(xs):
        ax.plot([x, x], [0, top], color="0.6", linewidth=1, zorder=0)
        ax.text(x, top + 0.4, f"lb rank {r}", ha="center", fontsize=10, fontweight="bold")

    def band(y: float, text: str, color: str) -> None:
        ax.add_patch(
            plt.Rectangle(
                (xs[0] - 0.6, y - 0.35),
                xs[-1] - xs[0] + 1.2,
                0.7,
                facecolor=color,
                alpha=0.3,
                edgecolor="black",
                zorder=1,
            )
        )
        ax.text((xs[0] + xs[-1]) / 2, y, text, ha="center", va="center", fontsize=9, zorder=2)

    def phase(y: float, text: str) -> None:
        ax.text(xs[-1] + 0.9, y, text, ha="left", va="center", fontsize=10, fontweight="bold")

    y = top - 0.8
    band(
        y,
        "all_gather the counts, then the predicted costs: every rank knows every cost",
        "tab:blue",
    )
    phase(y, "1 share")
    y -= 1.0
    band(y, "plan_rebalance on every rank: the same plan, no message", "0.8")
    phase(y, "2 plan")
    y -= 1.0

    def lane(y: float, home: bool) -> float:
        """One arrow per move: videos out to their helpers, or latents home to their owners."""
        for m in moves:
            start, end = (m.to_rank, m.from_rank) if home else (m.from_rank, m.to_rank)
            ax.annotate(
                "",
                xy=(xs[end], y),
                xytext=(xs[start], y),
                arrowprops=dict(
                    arrowstyle="-|>", color="tab:red" if home else "tab:orange", linewidth=2
                ),
            )
            label = (
                f"latent {m.local_index} home to rank {m.from_rank}"
                if home
                else f"video {m.local_index} of rank {m.from_rank}"
            )
            ax.text(
                (xs[m.from_rank] + xs[m.to_rank]) / 2,
                y + 0.12,
                label,
                ha="center",
                va="bottom",
                fontsize=9,
                bbox=dict(facecolor="white", edgecolor="none", pad=1),
            )
            y -= 1.0
        return y

    phase(y - (len(moves) - 1) / 2 if moves else y, "3 exchange\n(metadata,\nthen payload)")
    y = lane(y, home=False)
    if not moves:
        ax.text(
            (xs[0] + xs[-1]) / 2,
            y,
            "no move: the load was already balanced",
            ha="center",
            fontsize=9,
        )
        y -= 1.0
    band(y, "encode what each rank now holds (own videos + guests)", "tab:green")
    phase(y, "4 encode")
    y -= 1.0
    phase(y - (len(moves) - 1) / 2 if moves else y, "5 return\n(metadata,\nthen payload)")
    y = lane(y, home=True)
    ax.set_xlim(xs[0] - 0.9, xs[-1] + 2.6)
    ax.set_ylim(y + 0.3, top + 0.9)
    ax.axis("off")
    ax.set_title(
        "VAE load balancing, one step (time runs down; every rank makes every collective call)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


# =====================================================================================
# Lab 06 — the inference pipeline: samples, where the bytes go, memory per rank
# =====================================================================================
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
    fig.suptitle(
        "Where the bytes go: the parameter all-gathers dominate every step they run in", fontsize=10
    )
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


# =====================================================================================
# Lab 05 — training composition: who loads which tokens, bytes per group and phase.
# =====================================================================================
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
