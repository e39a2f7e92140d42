"""VAE load balancing: load per rank, the cost fit, the protocol's sequence diagram."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from paralab.viz.common import PALETTE


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
