"""Small float64 models the labs run, one clearly headed section per lab.

They are deliberately tiny (a CPU runs them in milliseconds) and float64 (so a
parallel result can be compared bit for bit with one process).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


# =====================================================================
# Lab 03 (cfgp): a small conditional denoiser for a latent "video"
# =====================================================================
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
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        return x.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        b, h, s, dh = x.shape
        return x.transpose(1, 2).reshape(b, s, h * dh)

    def forward(self, x: torch.Tensor, text: torch.Tensor, emb: torch.Tensor, attention: Attention) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(F.silu(emb)).unsqueeze(1).chunk(6, dim=-1)
        h = F.layer_norm(x, x.shape[-1:]) * (1 + scale1) + shift1
        q, k, v = (self._heads(t) for t in self.qkv(h).chunk(3, dim=-1))
        x = x + gate1 * self.attn_out(self._merge(attention(q, k, v)))
        h = F.layer_norm(x, x.shape[-1:])
        tk, tv = (self._heads(t) for t in self.cross_kv(text).chunk(2, dim=-1))
        x = x + self.cross_out(self._merge(F.scaled_dot_product_attention(self._heads(self.cross_q(h)), tk, tv)))
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
        emb = self.time_mlp(sinusoidal_embedding(1000.0 * time, dim)) + self.text_pool(text.mean(dim=1))
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
