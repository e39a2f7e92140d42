"""FSDP / HSDP: who holds which shard, bytes per step, memory, one step's timeline."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure


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
