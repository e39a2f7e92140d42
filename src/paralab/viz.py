"""Plots for the labs, one clearly headed section per lab (matplotlib, returned as figures)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch


# =====================================================================
# Lab 03 (cfgp): latents during sampling, the two branches and their combination
# =====================================================================

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
