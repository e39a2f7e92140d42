"""Small deterministic models the labs run on every rank and in the notebook's own process.

Fixed seeds and float64, so a parallel result can be compared with the
single-process one element by element. One section per lab.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


# =====================================================================================
# Lab 01 (FSDP / HSDP): a stack of residual MLP blocks plus a linear head.
# Each block and the head is one FSDP unit. Sizes are chosen so that the
# units do not divide evenly by 2, 4 or 8 ranks (padding is exercised) and
# the head is so small that some ranks hold nothing but padding.
# =====================================================================================
class MLPBlock(nn.Module):
    """x + fc2(tanh(fc1(x))): two Linear layers with biases, one residual."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)))


class MLPStack(nn.Module):
    """`n_blocks` residual MLP blocks then a Linear head; `units()` lists the FSDP units in order."""

    def __init__(self, width: int = 5, hidden: int = 7, n_blocks: int = 3, out: int = 1) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(width, hidden) for _ in range(n_blocks))
        self.head = nn.Linear(width, out)

    def units(self) -> list[nn.Module]:
        return [*self.blocks, self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.units():
            x = unit(x)
        return x


def make_mlp_stack(
    seed: int = 0, width: int = 5, hidden: int = 7, n_blocks: int = 3, out: int = 1
) -> MLPStack:
    """The same float64 weights in every process that calls it with the same seed."""
    torch.manual_seed(seed)
    return MLPStack(width, hidden, n_blocks, out).double()


def regression_data(
    batch: int, width: int = 5, out: int = 1, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed float64 global batch (inputs, targets)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, width, generator=g, dtype=torch.float64)
    y = torch.randn(batch, out, generator=g, dtype=torch.float64)
    return x, y


# =====================================================================================
# Lab 03 (cfgp): a small conditional denoiser for a latent "video"
# =====================================================================================
#
# Latent: (batch, frames * height * width, channels) tokens. Text: (batch,
# n_text, text_dim) embedding; the unconditional branch passes a null (zero)
# embedding of the same shape. Every op is per token except self-attention,
# which is a pluggable callable so that on a cp group each rank can hold a
# sequence shard and call ring / Ulysses attention instead.

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain bidirectional attention, layout (batch, heads, seq, head_dim): the single-process default."""
    return F.scaled_dot_product_attention(q, k, v)


def sinusoidal_embedding(values: torch.Tensor, dim: int) -> torch.Tensor:
    """(...,) -> (..., dim) sin/cos features; elementwise, so a shard of `values` gives a shard of the result."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    angles = values.to(torch.float64).unsqueeze(-1) * freqs
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


class DenoiserBlock(nn.Module):
    """adaLN-modulated self-attention (pluggable), cross-attention to the text, and an MLP."""

    def __init__(self, dim: int, heads: int, text_dim: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads = heads
        self.modulation = nn.Linear(dim, 6 * dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_out = nn.Linear(dim, dim)
        self.cross_q = nn.Linear(dim, dim)
        self.cross_kv = nn.Linear(text_dim, 2 * dim)
        self.cross_out = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim)
        )

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        return x.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        b, h, s, dh = x.shape
        return x.transpose(1, 2).reshape(b, s, h * dh)

    def forward(
        self, x: torch.Tensor, text: torch.Tensor, emb: torch.Tensor, attention: Attention
    ) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = (
            self.modulation(F.silu(emb)).unsqueeze(1).chunk(6, dim=-1)
        )
        h = F.layer_norm(x, x.shape[-1:]) * (1 + scale1) + shift1
        q, k, v = (self._heads(t) for t in self.qkv(h).chunk(3, dim=-1))
        x = x + gate1 * self.attn_out(self._merge(attention(q, k, v)))
        h = F.layer_norm(x, x.shape[-1:])
        tk, tv = (self._heads(t) for t in self.cross_kv(text).chunk(2, dim=-1))
        x = x + self.cross_out(
            self._merge(F.scaled_dot_product_attention(self._heads(self.cross_q(h)), tk, tv))
        )
        h = F.layer_norm(x, x.shape[-1:]) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(h)


class CondDenoiser(nn.Module):
    """Predicts the flow velocity of a latent video given the time t in [0, 1] and a text embedding.

    `forward(x, t, text, attention=..., positions=...)`: `x` may be a sequence
    shard; `positions` are then the global token indices of that shard (the
    positional embedding must not restart at 0 on every cp rank).
    """

    def __init__(
        self,
        channels: int = 4,
        dim: int = 32,
        heads: int = 4,
        text_dim: int = 16,
        n_blocks: int = 2,
        frames: int = 2,
        height: int = 4,
        width: int = 4,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.frames, self.height, self.width, self.channels = frames, height, width, channels
        self.text_dim = text_dim
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.inp = nn.Linear(channels, dim)
        self.time_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.text_pool = nn.Linear(text_dim, dim)
        self.blocks = nn.ModuleList(DenoiserBlock(dim, heads, text_dim) for _ in range(n_blocks))
        self.out = nn.Linear(dim, channels)
        torch.random.set_rng_state(generator_state)
        self.to(torch.float64)

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """(batch=1, tokens, channels) of one latent video."""
        return (1, self.frames * self.height * self.width, self.channels)

    @property
    def n_attention_layers(self) -> int:
        return len(self.blocks)

    def forward(
        self,
        x: torch.Tensor,
        t: float,
        text: torch.Tensor,
        *,
        attention: Attention = full_attention,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        if positions is None:
            positions = torch.arange(seq)
        dim = self.inp.out_features
        h = self.inp(x) + sinusoidal_embedding(positions, dim)
        time = torch.full((batch,), float(t), dtype=torch.float64)
        emb = self.time_mlp(sinusoidal_embedding(1000.0 * time, dim)) + self.text_pool(
            text.mean(dim=1)
        )
        for block in self.blocks:
            h = block(h, text, emb, attention)
        return self.out(F.layer_norm(h, h.shape[-1:]))


def make_text_embedding(seed: int, n_text: int = 8, text_dim: int = 16) -> torch.Tensor:
    """A stand-in for an encoded prompt: (1, n_text, text_dim) float64, deterministic in `seed`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, n_text, text_dim, generator=g, dtype=torch.float64)


def null_text_embedding(like: torch.Tensor) -> torch.Tensor:
    """The unconditional branch's 'empty prompt': zeros of the same shape."""
    return torch.zeros_like(like)


# =====================================================================================
# Lab 04 (VAE load balancing): a stand-in for a video VAE encoder
# =====================================================================================
def normalize_pixels(video: torch.Tensor) -> torch.Tensor:
    """uint8 pixels in [0, 255] -> float64 in [-1, 1] (x / 127.5 - 1: exact at 0 and 255)."""
    if video.dtype != torch.uint8:
        raise TypeError(f"normalize_pixels expects raw uint8 pixels, got {video.dtype}")
    ### BEGIN SOLUTION
    return video.to(torch.float64).div_(127.5).sub_(1.0)  # in place: one float64 buffer, not three
    ### END SOLUTION


class TinyVideoEncoder:
    """Raw (C, T, H, W) uint8 video -> (latent_channels, T/time_down, H/space_down, W/space_down) float64.

    Like a video VAE encoder it normalizes pixels first, then compresses time
    and space; here by average pooling plus a fixed channel mix, so the same
    video always gives the same bits, whichever rank encodes it.
    """

    def __init__(
        self,
        in_channels: int = 3,
        latent_channels: int = 4,
        time_down: int = 2,
        space_down: int = 4,
        seed: int = 0,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.mix = torch.randn(
            latent_channels, in_channels, generator=generator, dtype=torch.float64
        )
        self.time_down, self.space_down = time_down, space_down

    def latent_shape(self, video_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        channels, frames, height, width = video_shape
        if channels != self.mix.shape[1]:
            raise ValueError(f"encoder expects {self.mix.shape[1]} channels, got {channels}")
        for name, size, down in (
            ("frames", frames, self.time_down),
            ("height", height, self.space_down),
            ("width", width, self.space_down),
        ):
            if size % down:
                raise ValueError(
                    f"encoder: {name}={size} is not divisible by its downsampling factor {down}"
                )
        return (
            self.mix.shape[0],
            frames // self.time_down,
            height // self.space_down,
            width // self.space_down,
        )

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


def random_video_shapes(
    count: int, seed: int, max_frames: int = 16, max_side: int = 64
) -> list[tuple[int, ...]]:
    """`count` random (3, T, H, W) shapes that differ a lot, as raw video data does.

    T is a multiple of 2 up to `max_frames`, H and W multiples of 8 up to
    `max_side`, so `TinyVideoEncoder()` accepts all of them.
    """
    generator = torch.Generator().manual_seed(seed)

    def pick(step: int, top: int) -> int:
        return step * int(torch.randint(1, top // step + 1, (1,), generator=generator))

    return [(3, pick(2, max_frames), pick(8, max_side), pick(8, max_side)) for _ in range(count)]


def random_raw_videos(
    count: int, seed: int, max_frames: int = 16, max_side: int = 64
) -> list[torch.Tensor]:
    """`count` random uint8 videos with the shapes of `random_video_shapes`."""
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
        for shape in random_video_shapes(count, seed, max_frames, max_side)
    ]


# =====================================================================================
# Lab 06 (inference pipeline): a stand-in for a video VAE decoder
# =====================================================================================
class TinyVideoDecoder:
    """Latent tokens (1, frames*height*width, C) float64 -> a (3, T*time_up, H*space_up, W*space_up) video in [-1, 1].

    The mirror of `TinyVideoEncoder`: a fixed channel mix, nearest upsampling in
    time and space, and tanh to land in the pixel range. Deterministic, so the
    same latent gives the same bits on any rank.
    """

    def __init__(
        self,
        frames: int,
        height: int,
        width: int,
        latent_channels: int = 4,
        out_channels: int = 3,
        time_up: int = 2,
        space_up: int = 4,
        seed: int = 1,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.mix = torch.randn(
            out_channels, latent_channels, generator=generator, dtype=torch.float64
        )
        self.frames, self.height, self.width = frames, height, width
        self.time_up, self.space_up = time_up, space_up

    def __call__(self, latent: torch.Tensor) -> torch.Tensor:
        tokens, channels = latent.shape[-2:]
        if tokens != self.frames * self.height * self.width:
            raise ValueError(
                f"decoder expects {self.frames * self.height * self.width} latent tokens, got {tokens}"
            )
        grid = latent.reshape(self.frames, self.height, self.width, channels).permute(3, 0, 1, 2)
        mixed = torch.einsum("oc,cthw->othw", self.mix, grid)
        for dim, factor in ((1, self.time_up), (2, self.space_up), (3, self.space_up)):
            mixed = mixed.repeat_interleave(factor, dim=dim)
        return torch.tanh(mixed)
