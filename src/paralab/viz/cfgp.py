"""CFG parallelism: the two branches and their combination, bytes per step, the timeline."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure


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
