"""Pipeline parallelism: the ranks × time diagram of a recorded timeline, the bubble against m."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from paralab.pp.clock import Timeline

ACTION_COLORS = {"F": "#4c78a8", "B": "#f58518", "W": "#54a24b"}
"""Forward blue, (input) backward orange, weight backward green; idle stays white."""


def _draw(ax, timeline: Timeline, title: str, labels: bool) -> None:
    t0 = min(e.start for e in timeline.events)
    for e in timeline.events:
        width = e.end - e.start
        # a later virtual stage of the same rank: a lighter shade of the same colour
        alpha = 1.0 if e.stage < timeline.pp else 0.55
        ax.barh(
            e.rank,
            width,
            left=e.start - t0,
            height=0.8,
            color=ACTION_COLORS[e.kind],
            alpha=alpha,
            edgecolor="black",
            linewidth=0.4,
        )
        if labels:
            tag = f"{e.microbatch}" + ("'" if e.stage >= timeline.pp else "")
            ax.text(e.start - t0 + width / 2, e.rank, tag, ha="center", va="center", fontsize=7)
    for t in timeline.transfers:
        # a message on the link: from the end of the sending action to its arrival
        ax.plot([t.sent - t0, t.arrived - t0], [t.src, t.dst], color="0.35", lw=0.6, alpha=0.7)
    ax.set_yticks(range(timeline.pp), [f"rank {r}" for r in range(timeline.pp)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, timeline.makespan)
    ax.set_xlabel(timeline.label, fontsize=8)
    ax.set_title(f"{title}: bubble {timeline.bubble_fraction:.3f}", fontsize=9)


def plot_pipeline_timeline(
    timelines: Sequence[tuple[str, Timeline]], labels: bool = True
) -> Figure:
    """One ranks × time diagram per (title, timeline), one row each, F/B/W coloured, idle white.

    The boxes are the events the clock (or the wall clock) recorded: every gap is waiting
    that was measured. A number is the micro-batch; with two stages per rank, the second
    stage's boxes are lighter and carry a prime. On a clock with a link, each message is a
    grey line from the end of the action that sent it to its arrival on the next rank.
    """
    longest = max(t.makespan for _, t in timelines)
    fig, axes = plt.subplots(
        len(timelines),
        1,
        figsize=(10, 0.9 + 0.42 * sum(t.pp for _, t in timelines) + 0.5 * len(timelines)),
        squeeze=False,
    )
    for ax, (title, timeline) in zip(axes[:, 0], timelines):
        _draw(ax, timeline, title, labels)
        if timeline.label.startswith("logical"):
            ax.set_xlim(0, longest)
    handles = [Patch(color=c, label=k) for k, c in ACTION_COLORS.items()]
    fig.legend(handles=handles, loc="upper right", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def plot_bubble_vs_m(
    measured: dict[str, list[tuple[int, float]]],
    formula: Callable[[str, int], float],
    pp: int,
    m_max: int,
) -> Figure:
    """Measured bubble fractions (dots, from the clock) and the closed form (line) against m."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, points) in enumerate(measured.items()):
        color = plt.get_cmap("tab10").colors[i]
        ms = list(range(pp, m_max + 1))
        ax.plot(
            ms,
            [formula(name, m) for m in ms],
            color=color,
            linewidth=1,
            label=f"{name}: closed form",
        )
        ax.plot(
            [m for m, _ in points],
            [b for _, b in points],
            "o",
            color=color,
            markersize=5,
            label=f"{name}: measured",
        )
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction")
    ax.set_title(f"bubble vs m, pp = {pp} (logical clock)", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.set_ylim(0, None)
    fig.tight_layout()
    return fig
