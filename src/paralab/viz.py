"""Pictures for the labs. Every function returns a matplotlib Figure; the notebook displays it.

One section per lab; the mesh pictures of lab 00 come first.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from paralab.cp.layout import causal_work, chunk_ids, kv_source, ring_blocks

PALETTE = plt.get_cmap("tab20").colors


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
) -> Figure:
    """One panel per axis: every rank a cell, coloured by the group it belongs to on that axis.

    `groups[rank][axis]` is the list of ranks in `rank`'s group (as returned by
    `ParallelDims.group_ranks()` on each rank). Ranks without the axis are grey.
    """
    world = len(groups)
    if axes is None:
        axes = list(dict.fromkeys(a for g in groups for a in g))
    rows, cols = _grid_shape(world)
    fig, panels = plt.subplots(1, len(axes), figsize=(2.6 * len(axes) * cols / 4 + 0.6, 1.2 * rows + 0.9), squeeze=False)
    for panel, axis in zip(panels[0], axes):
        group_ids: dict[tuple[int, ...], int] = {}
        for rank in range(world):
            members = tuple(groups[rank].get(axis, ()))
            r, c = divmod(rank, cols)
            if members:
                gid = group_ids.setdefault(members, len(group_ids))
                color, label = PALETTE[(2 * gid) % len(PALETTE)], f"{rank}\ng{gid}"
            else:
                color, label = (0.85, 0.85, 0.85), str(rank)
            panel.add_patch(plt.Rectangle((c, rows - 1 - r), 0.94, 0.94, color=color))
            panel.text(c + 0.47, rows - 1 - r + 0.47, label, ha="center", va="center", fontsize=8)
        panel.set_xlim(-0.05, cols)
        panel.set_ylim(-0.05, rows)
        panel.set_aspect("equal")
        panel.axis("off")
        panel.set_title(f"{axis}: {len(group_ids)} group(s)", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_dp_grid(dp_replicate: int, dp_shard: int) -> Figure:
    """The dp mesh as a (replicas x shards) table of ranks: rows are replicas, columns shard slots."""
    fig, ax = plt.subplots(figsize=(1.0 * dp_shard + 1.2, 0.8 * dp_replicate + 0.9))
    for rep in range(dp_replicate):
        for shard in range(dp_shard):
            rank = rep * dp_shard + shard
            y = dp_replicate - 1 - rep
            ax.add_patch(plt.Rectangle((shard, y), 0.94, 0.94, color=PALETTE[(2 * shard) % len(PALETTE)]))
            ax.text(shard + 0.47, y + 0.47, f"rank {rank}", ha="center", va="center", fontsize=8)
    ax.set_xticks([s + 0.47 for s in range(dp_shard)], [f"shard {s}" for s in range(dp_shard)], fontsize=8)
    ax.set_yticks([dp_replicate - 1 - r + 0.47 for r in range(dp_replicate)],
                  [f"replica {r}" for r in range(dp_replicate)], fontsize=8)
    ax.set_xlim(-0.05, dp_shard)
    ax.set_ylim(-0.05, dp_replicate)
    ax.set_aspect("equal")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title("dp mesh: a row is one full copy (dp_shard group),\na column one shard slot (dp_replicate group)",
                 fontsize=9)
    fig.tight_layout()
    return fig


# =====================================================================================
# Bug clinic (every lab): where a buggy result departs from the correct one
# =====================================================================================
def plot_diff_heatmap(expected: torch.Tensor, actual: torch.Tensor, title: str = "",
                      row_label: str = "row", col_label: str = "column") -> Figure:
    """|actual - expected| element by element, as a heatmap over the last two dims.

    Leading dims are stacked into rows, so any tensor shows as one picture; zero
    differences are white, so the pattern of the bug is what stands out.
    """
    diff = (actual.detach().double() - expected.detach().double()).abs()
    grid = diff.reshape(-1, diff.shape[-1]) if diff.dim() > 1 else diff.reshape(1, -1)
    fig, ax = plt.subplots(figsize=(min(10, 1.5 + 0.25 * grid.shape[1]), min(6, 1.2 + 0.12 * grid.shape[0])))
    image = ax.imshow(grid.numpy(), cmap="Reds", aspect="auto", interpolation="nearest", vmin=0)
    fig.colorbar(image, ax=ax, label="|buggy - correct|")
    wrong = int((grid != 0).sum())
    ax.set_title(f"{title}\n{wrong} of {grid.numel()} elements differ", fontsize=9)
    ax.set_xlabel(col_label, fontsize=8)
    ax.set_ylabel(row_label, fontsize=8)
    fig.tight_layout()
    return fig


# =====================================================================================
# Lab 01 (FSDP / HSDP): who holds which shard, bytes per step, memory per rank.
# =====================================================================================
def plot_shard_layout(numels: list[int], world: int, dp_replicate: int = 1, unit_names: list[str] | None = None) -> Figure:
    """Each unit's flat parameter vector cut into equal shards; hatched = padding."""
    shard = world // dp_replicate
    names = unit_names or [f"unit {i}" for i in range(len(numels))]
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.55 * len(numels)))
    for row, (name, numel) in enumerate(zip(names, numels)):
        size = -(-numel // shard)  # elements per shard; the bar is drawn in units of whole shards
        for s in range(shard):
            real = max(0, min(size, numel - s * size)) / size
            ax.barh(row, real, left=s, color=colors(s), edgecolor="white")
            if real < 1:
                ax.barh(row, 1 - real, left=s + real, color="white", edgecolor=colors(s), hatch="//")
            holders = ",".join(str(r * shard + s) for r in range(dp_replicate))
            ax.text(s + 0.5, row, holders, ha="center", va="center", fontsize=8)
    ax.set_yticks(range(len(numels)), [f"{n}: {p} params, shards of {-(-p // shard)}" for n, p in zip(names, numels)])
    ax.invert_yaxis()
    ax.set_xticks(range(shard + 1))
    ax.set_xlabel("the unit's flat padded vector, one column per shard (labels: ranks holding it; hatched: padding)", fontsize=9)
    layout = f"HSDP {dp_replicate}x{shard}" if dp_replicate > 1 else f"ZeRO-3, {world} ranks"
    ax.set_title(f"Flat shards per FSDP unit — {layout}")
    fig.tight_layout()
    return fig


def plot_traffic(table: dict[str, dict[int, tuple[int, int]]]) -> Figure:
    """Grouped bars: bytes sent per rank per step against world size; dots = the formula."""
    strategies = list(table)
    worlds = sorted({w for rows in table.values() for w in rows})
    width = 0.8 / len(strategies)
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, name in enumerate(strategies):
        xs = [worlds.index(w) + (i - (len(strategies) - 1) / 2) * width for w in table[name]]
        measured = [m for m, _ in table[name].values()]
        formula = [f for _, f in table[name].values()]
        ax.bar(xs, measured, width, label=name)
        ax.plot(xs, formula, "k.", markersize=8)
    ax.plot([], [], "k.", label="formula")
    ax.set_xticks(range(len(worlds)), [f"{w} ranks" for w in worlds])
    ax.set_ylabel("bytes sent per rank per step")
    ax.set_title("Traffic per step (ledger, ring model)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_memory(table: dict[str, dict[str, int]], formulas: dict[str, int]) -> Figure:
    """Stacked bars of bytes one rank holds; a black tick marks the formula's total."""
    parts = ["params", "grads", "optimizer", "gathered peak"]
    labels = list(table)
    fig, ax = plt.subplots(figsize=(9, 4))
    bottom = [0] * len(labels)
    for part in parts:
        heights = [table[label][part] for label in labels]
        ax.bar(range(len(labels)), heights, 0.6, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.plot(range(len(labels)), [formulas[label] for label in labels], "k_", markersize=30, mew=2, label="formula total")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylim(0, 1.25 * max(max(bottom), max(formulas.values())))
    ax.set_ylabel("bytes held by one rank")
    ax.set_title("Memory per rank, float64 + Adam (measured on the real tensors)")
    ax.legend(fontsize=8, ncol=5, loc="upper center")
    fig.tight_layout()
    return fig


# =====================================================================================
# Lab 02 — context parallelism: ring attention vs Ulysses
# =====================================================================================


def _work_grid(world: int, zigzag: bool) -> np.ndarray:
    return np.array([[causal_work(r, s, world, causal=True, zigzag=zigzag) for s in range(world)]
                     for r in range(world)])


def plot_ring_timeline(world: int = 4) -> Figure:
    """Which K/V block each rank holds at each ring step, and how much causal work it does with it.

    One panel per layout (contiguous, zigzag): rows = ranks, columns = steps,
    shade = fraction of a full shard-by-shard block computed (0 = skipped).
    A third panel sums each rank's work: the slowest rank sets the pace.
    """
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), gridspec_kw={"width_ratios": [1, 1, 0.9]})
    for ax, zigzag in zip(axes, (False, True)):
        grid = _work_grid(world, zigzag)
        ax.imshow(grid, cmap="Blues", vmin=0, vmax=1.3)
        for r in range(world):
            for s in range(world):
                src = kv_source(r, s, world)
                chunks = ",".join(str(c) for c in chunk_ids(src, world, zigzag=zigzag))
                work = "skip" if grid[r, s] == 0 else f"{grid[r, s]:g}"
                ax.text(s, r, f"K/V {src}\n[{chunks}]\n{work}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(world), [f"step {s}" for s in range(world)], fontsize=8)
        ax.set_yticks(range(world), [f"rank {r} [{','.join(map(str, chunk_ids(r, world, zigzag=zigzag)))}]"
                                     for r in range(world)], fontsize=8)
        ax.set_title(f"{'zigzag' if zigzag else 'contiguous'}: K/V held, [chunks], causal work", fontsize=9)
    ranks = np.arange(world)
    for offset, zigzag in ((-0.2, False), (0.2, True)):
        axes[2].bar(ranks + offset, _work_grid(world, zigzag).sum(axis=1), width=0.4,
                    label="zigzag" if zigzag else "contiguous")
    axes[2].set_xticks(ranks, [f"rank {r}" for r in ranks], fontsize=8)
    axes[2].set_ylabel("blocks of work per forward")
    axes[2].set_title(f"causal work per rank, cp = {world}", fontsize=9)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_causal_ownership(world: int = 4, tokens_per_chunk: int = 6) -> Figure:
    """The causal attention matrix, token by token, coloured by the rank that computes each score.

    Blank = a key in the query's future (never computed). Contiguous: the last rank
    owns the widest rows. Zigzag: every rank owns one short and one long band of
    rows, the same area in total.
    """
    n = 2 * world * tokens_per_chunk
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.4))
    cmap = plt.get_cmap("tab10", world)
    for ax, zigzag in zip(axes, (False, True)):
        chunk_len = tokens_per_chunk if zigzag else 2 * tokens_per_chunk
        owner = np.full((n, n), np.nan)
        for r in range(world):
            for s in range(world):
                q_chunks = chunk_ids(r, world, zigzag=zigzag)
                kv_chunks = chunk_ids(kv_source(r, s, world), world, zigzag=zigzag)
                for i, j, _ in ring_blocks(r, s, world, causal=True, zigzag=zigzag):
                    rows = np.arange(q_chunks[i] * chunk_len, (q_chunks[i] + 1) * chunk_len)[:, None]
                    cols = np.arange(kv_chunks[j] * chunk_len, (kv_chunks[j] + 1) * chunk_len)[None, :]
                    block = owner[rows, cols]
                    owner[rows, cols] = np.where(cols <= rows, r, block)
        ax.imshow(owner, cmap=cmap, vmin=-0.5, vmax=world - 0.5, interpolation="nearest")
        ax.set_title(f"{'zigzag' if zigzag else 'contiguous'}: who computes each score", fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        ax.set_xticks([]), ax.set_yticks([])
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(r)) for r in range(world)]
    fig.legend(handles, [f"rank {r}" for r in range(world)], loc="lower center", ncol=world, fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plot_cp_bytes(cps: list[int], measured: dict[str, dict[str, list[int]]],
                  formula: dict[str, dict[str, list[int]]], full_bytes: int) -> Figure:
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


def _frames(latent: torch.Tensor, frames: int, height: int, width: int, channel: int) -> torch.Tensor:
    """(1, frames*height*width, channels) -> (frames, height, width) of one channel."""
    return latent.detach()[0, :, channel].reshape(frames, height, width)


def plot_latent_steps(
    trajectory: list[torch.Tensor], step_ids: list[int], frames: int, height: int, width: int, channel: int = 0
):
    """One row per chosen step, one column per video frame: noise (step 0) turning into the sample."""
    fig, axes = plt.subplots(len(step_ids), frames, figsize=(1.6 * frames, 1.6 * len(step_ids)), squeeze=False)
    lim = max(float(trajectory[s][..., channel].abs().max()) for s in step_ids)
    for row, s in enumerate(step_ids):
        video = _frames(trajectory[s], frames, height, width, channel)
        for f in range(frames):
            ax = axes[row][f]
            ax.imshow(video[f].numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"frame {f}", fontsize=9)
            if f == 0:
                ax.set_ylabel(f"after step {s}" if s else "noise", fontsize=9)
    fig.suptitle(f"latent channel {channel} during guided sampling", fontsize=10)
    fig.tight_layout()
    return fig


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
        ("cond (cfgp rank 0)", cond_pred),
        ("uncond (cfgp rank 1)", uncond_pred),
        ("cond - uncond", cond_pred - uncond_pred),
        (f"uncond + {guidance_scale:g}(cond - uncond)", guided),
    ]
    images = [_frames(t, frames, height, width, channel)[frame] for _, t in panels]
    lim = max(float(im.abs().max()) for im in images)
    diff_lim = float(images[2].abs().max())
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 3.2))
    for i, (ax, (title, _), im) in enumerate(zip(axes, panels, images)):
        scale = diff_lim if i == 2 else lim
        ax.imshow(im.numpy(), cmap="RdBu_r", vmin=-scale, vmax=scale)
        ax.set_title(title + (f"\n(own scale, max {diff_lim:.2f})" if i == 2 else ""), fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"predicted velocity, channel {channel}, frame {frame}: guidance amplifies the difference", fontsize=10)
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
    ax.set_title("cfgp moves one latent shard per step; cp moves hidden states in every layer", fontsize=10)
    fig.tight_layout()
    return fig


# =====================================================================================
# Lab 04 — VAE load balancing: predicted load per rank
# =====================================================================================
def _stacked_loads(ax, costs: dict[int, list[float]], where: dict[tuple[int, int], int], ranks: list[int],
                   groups: list[list[int]], label: str) -> None:
    """One bar per rank, one segment per sample it encodes, coloured by the sample's owner; guests hatched."""
    x_of = {rank: k for k, rank in enumerate(ranks)}
    load = {rank: 0.0 for rank in ranks}
    for (owner, index), rank in sorted(where.items(), key=lambda item: (x_of[item[1]], item[1] != item[0][0], item[0])):
        cost = costs[owner][index]
        ax.bar(x_of[rank], cost, bottom=load[rank], width=0.7, color=PALETTE[(2 * x_of[owner]) % len(PALETTE)],
               edgecolor="black", linewidth=0.5, hatch="//" if owner != rank else None)
        load[rank] += cost
    spreads = []
    for group in groups[1:]:
        ax.axvline(x_of[group[0]] - 0.5, color="grey", linestyle=":", linewidth=1)
    for group in groups:
        mean = sum(load[r] for r in group) / len(group)
        ax.hlines(mean, x_of[group[0]] - 0.45, x_of[group[-1]] + 0.45, color="black", linestyle="--", linewidth=1)
        spreads.append(max(load[r] for r in group) - min(load[r] for r in group))
    ax.set_xticks(range(len(ranks)), [str(r) for r in ranks], fontsize=8)
    ax.set_xlabel("rank", fontsize=8)
    ax.set_title(f"{label}: max load {max(load.values()):,.0f}, spread {max(spreads):,.0f}", fontsize=8)


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


def plot_cost_fit(pixels: list[float], seconds: list[float], slope: float, intercept: float) -> Figure:
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
