"""Context parallelism: the ring's timeline and causal work, Ulysses' reshape, bytes, bugs."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from paralab.cp.layout import causal_work, chunk_ids, kv_source, ring_blocks
from paralab.viz.common import _RANK_COLORS


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
