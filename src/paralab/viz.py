"""Pictures for the labs (matplotlib). Each lab's plots live in its own section."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure


# ======================================================================
# Lab 01 (FSDP / HSDP): who holds which shard, bytes per step, memory per rank.
# ======================================================================
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
