"""Expert parallelism: the token journey, tokens per expert, drops against capacity, the split
matrix, the load over training steps, the grouped matmul's padded batch."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from paralab.ep.dispatch import expert_permutation
from paralab.viz.common import PALETTE

_EXPERT_COLORS = plt.get_cmap("tab10").colors


def _journey_columns(experts: list[torch.Tensor], ep: int, num_experts: int) -> list[list[list]]:
    """Per stage, per rank, the (source rank, token, expert) of each row, in the order it lies."""
    local = num_experts // ep
    home = [[(r, t, int(e)) for t, e in enumerate(chosen)] for r, chosen in enumerate(experts)]
    permuted = [
        [rows[i] for i in expert_permutation(chosen)[0]] for rows, chosen in zip(home, experts)
    ]
    arrived = [
        [row for rows in permuted for row in rows if row[2] // local == d] for d in range(ep)
    ]
    grouped = [
        sorted(rows, key=lambda row: row[2]) for rows in arrived
    ]  # stable: arrival order kept
    return [home, permuted, arrived, grouped]


def plot_token_journey(experts: list[torch.Tensor], ep: int, num_experts: int) -> Figure:
    """Top-1 tokens of every rank through permute, all-to-all, the experts, and back.

    `experts[r]` is (tokens,) the expert each token of rank r chose; a cell is one token,
    coloured by its expert and labelled source.token. The way back is the same columns
    read right to left.
    """
    stages = _journey_columns(experts, ep, num_experts)
    titles = [
        "1. on its rank\n(token order)",
        "2. permuted by expert\n(send buffer)",
        "3. after dispatch\n(source rank, expert)",
        "4. grouped by local\nexpert: experts run",
    ]
    width = max(len(rows) for stage in stages for rows in stage)
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.9 * ep))
    for s, stage in enumerate(stages):
        x0 = s * (width + 3)
        for r, rows in enumerate(stage):
            y = ep - 1 - r
            for i, (source, token, expert) in enumerate(rows):
                ax.add_patch(
                    Rectangle((x0 + i, y), 0.95, 0.8, color=_EXPERT_COLORS[expert % 10], alpha=0.85)
                )
                ax.text(
                    x0 + i + 0.47,
                    y + 0.4,
                    f"{source}.{token}",
                    ha="center",
                    va="center",
                    fontsize=4.5,
                )
            if s == 0:
                ax.text(-0.6, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=8)
        ax.text(x0 + width / 2, ep + 0.15, titles[s], ha="center", va="bottom", fontsize=8)
        if s < len(stages) - 1:
            ax.annotate(
                "",
                (x0 + width + 2.6, ep / 2),
                (x0 + width + 0.4, ep / 2),
                arrowprops={"arrowstyle": "->", "color": "grey"},
            )
    for e in range(num_experts):
        ax.add_patch(Rectangle((0, 0), 0, 0, color=_EXPERT_COLORS[e % 10], label=f"expert {e}"))
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=num_experts, fontsize=7, frameon=False
    )
    ax.set_xlim(-3, len(stages) * (width + 3))
    ax.set_ylim(-0.3, ep + 1.2)
    ax.axis("off")
    ax.set_title(
        "the token journey: combine walks the same columns back (4 -> 3 -> 2 -> 1), "
        "then sums each token's rows, gate-weighted",
        fontsize=8,
    )
    fig.tight_layout()
    return fig


def plot_tokens_per_expert(
    counts: torch.Tensor, ep: int, slots: int | None = None, title: str = ""
) -> Figure:
    """Assignments per expert, stacked by source rank: counts is (ranks, E). Experts of one ep
    rank share a shaded band; `slots` (per source rank) draws the capacity each rank may fill."""
    ranks, num_experts = counts.shape
    local = num_experts // ep
    fig, ax = plt.subplots(figsize=(6, 3))
    bottom = torch.zeros(num_experts)
    for r in range(ranks):
        ax.bar(
            range(num_experts),
            counts[r].double(),
            bottom=bottom,
            color=PALETTE[(2 * r) % len(PALETTE)],
            edgecolor="black",
            linewidth=0.5,
            label=f"from rank {r}",
        )
        bottom += counts[r].double()
    for d in range(0, ep, 2):
        ax.axvspan(d * local - 0.5, (d + 1) * local - 0.5, color="grey", alpha=0.1)
    mean = bottom.mean().item()
    ax.axhline(mean, color="black", linestyle="--", linewidth=1, label=f"mean {mean:g}")
    if slots is not None:
        ax.axhline(ranks * slots, color="red", linewidth=1, label=f"capacity x {ranks} ranks")
    ax.set_xticks(
        range(num_experts), [f"e{e}\nrank {e // local}" for e in range(num_experts)], fontsize=7
    )
    ax.set_ylabel("assignments", fontsize=8)
    ax.set_title(f"{title}\nmax / mean = {bottom.max().item() / mean:.3g}", fontsize=9)
    ax.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    return fig


def plot_drop_rate(factors: list[float], rates: dict[str, list[float]]) -> Figure:
    """Fraction of assignments dropped against the capacity factor, one line per routing."""
    fig, ax = plt.subplots(figsize=(5, 3))
    for k, (name, values) in enumerate(rates.items()):
        ax.plot(factors, values, marker="o", color=_EXPERT_COLORS[k], label=name)
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("capacity factor c (slots = ceil(c * tokens * k / E))", fontsize=8)
    ax.set_ylabel("assignments dropped", fontsize=8)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.set_title("drop rate against the capacity factor", fontsize=9)
    fig.tight_layout()
    return fig


def plot_split_matrix(splits: torch.Tensor, title: str = "") -> Figure:
    """Who sends how many rows to whom: splits[i, j] rows rank i sends rank j (the diagonal stays home)."""
    ep = splits.shape[0]
    fig, ax = plt.subplots(figsize=(1.6 + 0.7 * ep, 1.2 + 0.6 * ep))
    image = ax.imshow(splits.double().numpy(), cmap="Blues", vmin=0)
    for i in range(ep):
        for j in range(ep):
            ax.text(
                j,
                i,
                str(int(splits[i, j])),
                ha="center",
                va="center",
                fontsize=8,
                fontweight="bold" if i == j else "normal",
            )
    ax.set_xticks(range(ep), [str(j) for j in range(ep)], fontsize=8)
    ax.set_yticks(range(ep), [str(i) for i in range(ep)], fontsize=8)
    ax.set_xlabel("to rank (its experts)", fontsize=8)
    ax.set_ylabel("from rank", fontsize=8)
    fig.colorbar(image, ax=ax, label="rows")
    ax.set_title(title or "dispatch split matrix", fontsize=9)
    fig.tight_layout()
    return fig


def plot_balance_history(histories: dict[str, list[float]]) -> Figure:
    """max / mean assignments per expert over training steps, one line per run."""
    fig, ax = plt.subplots(figsize=(5, 3))
    for k, (name, values) in enumerate(histories.items()):
        ax.plot(range(len(values)), values, marker=".", color=_EXPERT_COLORS[k], label=name)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training step", fontsize=8)
    ax.set_ylabel("max / mean tokens per expert", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title("load imbalance during training", fontsize=9)
    fig.tight_layout()
    return fig


def plot_load_over_steps(loads: dict[str, torch.Tensor]) -> Figure:
    """Tokens per expert at every training step, one panel per run, one line per expert.

    `loads[name]` is (steps, experts): the assignments each expert got at each step, summed
    over every rank. The dotted line is the mean: a balanced router sits on it."""
    fig, axes = plt.subplots(1, len(loads), figsize=(3.2 * len(loads), 2.8), sharey=True)
    for ax, (name, load) in zip(list(getattr(axes, "flat", [axes])), loads.items()):
        for e in range(load.shape[1]):
            ax.plot(load[:, e].tolist(), color=_EXPERT_COLORS[e % 10], label=f"expert {e}")
        ax.axhline(load[0].double().mean().item(), color="grey", linestyle=":", linewidth=1)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("training step", fontsize=8)
    axes_list = list(getattr(axes, "flat", [axes]))
    axes_list[0].set_ylabel("tokens per expert", fontsize=8)
    axes_list[-1].legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    return fig


def plot_grouped_batch(counts: list[int], alignment: int) -> Figure:
    """What the grouped matmul batches on one rank: per local expert, its rows, the zero rows
    that align its block (torchtitan's layout), and the rows that pad it to the longest block
    (the float64 stand-in's batch)."""
    aligned = [-(-max(c, alignment) // alignment) * alignment for c in counts]
    longest = max(aligned)
    fig, ax = plt.subplots(figsize=(7.5, 1.0 + 0.45 * len(counts)))
    parts = (
        ("rows", PALETTE[0], "", lambda c, a: (0, c)),
        ("alignment padding", "white", "///", lambda c, a: (c, a - c)),
        ("batch padding", "#dddddd", "", lambda c, a: (a, longest - a)),
    )
    for e, (count, size) in enumerate(zip(counts, aligned)):
        for label, color, hatch, span in parts:
            start, width = span(count, size)
            ax.barh(
                e,
                width,
                left=start,
                color=color,
                hatch=hatch,
                edgecolor="black",
                linewidth=0.5,
                label=label if e == 0 else None,
            )
        ax.text(longest + 0.5, e, f"{count} → {size}", va="center", fontsize=7)
    for x in range(alignment, longest, alignment):
        ax.axvline(x, color="grey", linewidth=0.5, linestyle=":")
    ax.set_yticks(range(len(counts)), [f"local expert {e}" for e in range(len(counts))])
    ax.invert_yaxis()
    ax.set_xlim(0, longest + 4)
    ax.set_xlabel(f"row slot (alignment {alignment})", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"grouped matmul batch: ({len(counts)}, {longest}, dim)", fontsize=9)
    fig.tight_layout()
    return fig
