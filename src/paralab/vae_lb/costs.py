"""Lab 04's closed-form costs: the predicted encode cost of a video, and the bytes each rank moves.

The planner only needs numbers that grow like the encode time; `encode_cost`
is that number, and the lab measures how well it predicts the time.

Bytes per rank of one `offload_encode` (n = lb group size, m = most videos on a
rank of the group, M = the metadata record's bytes):
- all_gather sent: 8(n-1) for the counts + 8(n-1)m for the padded costs;
- a moved video of T x H x W: the owner sends M + 3THW (uint8, 3 channels) and
  its helper receives them; the helper sends the latent back, M + THW (4 float64
  channels of (T/2)(H/4)(W/4) values: 4 * 8 / 32 = 1 byte per pixel).
"""

from __future__ import annotations

import torch

from paralab.vae_lb.protocol import META_BYTES


def encode_cost(video: torch.Tensor) -> float:
    """Predicted encode cost of a raw (channels, frames, height, width) video.

    The encoder touches every pixel a constant number of times (normalize,
    pool), so its time grows with frames * height * width; channels are the
    same for every video and only scale all costs alike.
    """
    if video.dim() != 4:
        raise ValueError(
            f"a raw video is (channels, frames, height, width), got shape {tuple(video.shape)}"
        )
    _, frames, height, width = video.shape
    return float(frames * height * width)


def exchange_bytes(
    batch: list[list[torch.Tensor]], plan: list[tuple[int, int, int]], groups: list[list[int]]
) -> tuple[list[int], list[int], list[int]]:
    """Per global rank: P2P bytes sent, P2P bytes received, all_gather bytes sent.

    `plan` holds (owner, helper, local index) in global ranks; `groups` the global ranks of each lb group.
    """
    world = sum(len(g) for g in groups)
    sent, received, gathered = [0] * world, [0] * world, [0] * world
    for ranks in groups:
        n, most = len(ranks), max(len(batch[r]) for r in ranks)
        for r in ranks:
            gathered[r] = 8 * (n - 1) + 8 * (n - 1) * most
    for owner, helper, index in plan:
        frames, height, width = batch[owner][index].shape[1:]
        raw, latent = 3 * frames * height * width, frames * height * width
        sent[owner] += META_BYTES + raw
        received[helper] += META_BYTES + raw
        sent[helper] += META_BYTES + latent
        received[owner] += META_BYTES + latent
    return sent, received, gathered


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares line y = a x + b, and its R^2: how much of the variation in `ys` the cost explains."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    a = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    b = mean_y - a * mean_x
    residual = sum((y - b - a * x) ** 2 for x, y in zip(xs, ys))
    return a, b, 1 - residual / sum((y - mean_y) ** 2 for y in ys)
