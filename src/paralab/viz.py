"""Pictures for the labs (matplotlib). Each lab appends its own clearly headed section."""
from __future__ import annotations


# =====================================================================================
# Lab 02 — context parallelism: ring attention vs Ulysses
# =====================================================================================
import matplotlib.pyplot as plt
import numpy as np

from paralab.cp.layout import causal_work, chunk_ids, kv_source, ring_blocks


def _work_grid(world: int, zigzag: bool) -> np.ndarray:
    return np.array([[causal_work(r, s, world, causal=True, zigzag=zigzag) for s in range(world)]
                     for r in range(world)])


def plot_ring_timeline(world: int = 4) -> plt.Figure:
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


def plot_causal_ownership(world: int = 4, tokens_per_chunk: int = 6) -> plt.Figure:
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
                  formula: dict[str, dict[str, list[int]]], full_bytes: int) -> plt.Figure:
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


# =====================================================================
# Lab 03 (cfgp): latents during sampling, the two branches and their combination
# =====================================================================
import torch


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


def plot_step_traffic(per_step: dict[str, dict[str, int]]):
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
