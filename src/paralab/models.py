"""Small deterministic models the labs run on every rank and in the notebook's own process.

Fixed seeds and float64, so a parallel result can be compared with the
single-process one element by element. One section per lab.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


# ---------------------------------------------------------------------------
# Lab 04 (VAE load balancing): a stand-in for a video VAE encoder
# ---------------------------------------------------------------------------
def normalize_pixels(video: torch.Tensor) -> torch.Tensor:
    """uint8 pixels in [0, 255] -> float64 in [-1, 1] (x / 127.5 - 1: exact at 0 and 255)."""
    if video.dtype != torch.uint8:
        raise TypeError(f"normalize_pixels expects raw uint8 pixels, got {video.dtype}")
    return video.to(torch.float64).div_(127.5).sub_(1.0)  # in place: one float64 buffer, not three


class TinyVideoEncoder:
    """Raw (C, T, H, W) uint8 video -> (latent_channels, T/time_down, H/space_down, W/space_down) float64.

    Like a video VAE encoder it normalizes pixels first, then compresses time
    and space; here by average pooling plus a fixed channel mix, so the same
    video always gives the same bits, whichever rank encodes it.
    """

    def __init__(self, in_channels: int = 3, latent_channels: int = 4, time_down: int = 2,
                 space_down: int = 4, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.mix = torch.randn(latent_channels, in_channels, generator=generator, dtype=torch.float64)
        self.time_down, self.space_down = time_down, space_down

    def latent_shape(self, video_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        channels, frames, height, width = video_shape
        if channels != self.mix.shape[1]:
            raise ValueError(f"encoder expects {self.mix.shape[1]} channels, got {channels}")
        for name, size, down in (("frames", frames, self.time_down), ("height", height, self.space_down),
                                 ("width", width, self.space_down)):
            if size % down:
                raise ValueError(f"encoder: {name}={size} is not divisible by its downsampling factor {down}")
        return (self.mix.shape[0], frames // self.time_down, height // self.space_down, width // self.space_down)

    def encode_normalized(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder body: expects floats in [-1, 1] (it cannot tell raw pixels cast to float)."""
        self.latent_shape(tuple(x.shape))
        kernel = (self.time_down, self.space_down, self.space_down)
        pooled = F.avg_pool3d(x.unsqueeze(0), kernel_size=kernel).squeeze(0)
        latent = self.mix[:, 0, None, None, None] * pooled[0]
        for c in range(1, pooled.shape[0]):  # fixed order: bitwise-reproducible anywhere
            latent = latent + self.mix[:, c, None, None, None] * pooled[c]
        return latent

    def __call__(self, video: torch.Tensor) -> torch.Tensor:
        return self.encode_normalized(normalize_pixels(video))


def random_video_shapes(count: int, seed: int, max_frames: int = 16, max_side: int = 64) -> list[tuple[int, ...]]:
    """`count` random (3, T, H, W) shapes that differ a lot, as raw video data does.

    T is a multiple of 2 up to `max_frames`, H and W multiples of 8 up to
    `max_side`, so `TinyVideoEncoder()` accepts all of them.
    """
    generator = torch.Generator().manual_seed(seed)

    def pick(step: int, top: int) -> int:
        return step * int(torch.randint(1, top // step + 1, (1,), generator=generator))

    return [(3, pick(2, max_frames), pick(8, max_side), pick(8, max_side)) for _ in range(count)]


def random_raw_videos(count: int, seed: int, max_frames: int = 16, max_side: int = 64) -> list[torch.Tensor]:
    """`count` random uint8 videos with the shapes of `random_video_shapes`."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
            for shape in random_video_shapes(count, seed, max_frames, max_side)]
