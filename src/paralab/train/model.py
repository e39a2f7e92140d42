"""A small float64 DiT-like denoiser whose attention dispatch can be swapped.

tokens (batch, N, channels) -> embed + position[global position] + noise level
-> blocks of (norm, multi-head attention, MLP) -> norm -> head -> predicted noise.

Two seams make it parallelizable without touching its arithmetic:
- `Block.attention` is a module of its own (`LocalAttention` here); context
  parallelism replaces it with ring or Ulysses attention over the cp group.
- `DiT.shard` says which tokens of the sequence this rank holds
  (`SequenceShard`); positions are always GLOBAL token positions, so a cp
  shard knows where its tokens sit in the sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from paralab.cp.blocks import attention_block
from paralab.cp.layout import shard_sequence

DTYPE = torch.float64
SHAPE = dict(channels=4, dim=16, heads=8, tokens=32, blocks=2, hidden=32)
"""8 heads split over cp = 2, 4, 8 (Ulysses); 32 tokens divide by 16 (zigzag at cp = 8)."""


@dataclass(frozen=True)
class SequenceShard:
    """Which tokens of every sample this rank holds: shard `rank` of the `cp` shards, contiguous or zigzag."""

    rank: int = 0
    cp: int = 1
    zigzag: bool = False

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of x (batch, N, ...)."""
        return (
            x if self.cp == 1 else shard_sequence(x, self.rank, self.cp, dim=1, zigzag=self.zigzag)
        )

    def positions(self, n_tokens: int) -> torch.Tensor:
        """The global positions of this rank's tokens in a sequence of `n_tokens`."""
        return self.tokens(torch.arange(n_tokens).view(1, n_tokens)).view(-1)


class LocalAttention(nn.Module):
    """Attention over the tokens this process holds (the whole sequence when there is no cp)."""

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention_block(q, k, v, diagonal=self.causal)[0]


class QKV(nn.Module):
    """Norm, then one projection to queries, keys and values as (batch, heads, tokens, head_dim)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim, dtype=DTYPE)
        self.proj = nn.Linear(
            dim, 3 * dim, bias=False, dtype=DTYPE
        )  # a key bias has a zero gradient: Adam would amplify its rounding noise

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, dim = x.shape
        qkv = (
            self.proj(self.norm(x))
            .view(b, n, 3, self.heads, dim // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        return qkv[0].contiguous(), qkv[1].contiguous(), qkv[2].contiguous()


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, dtype=DTYPE)
        self.up = nn.Linear(dim, hidden, dtype=DTYPE)
        self.down = nn.Linear(hidden, dim, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(self.norm(x))))


class Block(nn.Module):
    """x + out(attention(qkv(x))), then x + mlp(x). Only `attention` sees other tokens."""

    def __init__(self, dim: int, heads: int, hidden: int, causal: bool) -> None:
        super().__init__()
        self.qkv = QKV(dim, heads)
        self.attention: nn.Module = LocalAttention(causal)
        self.out = nn.Linear(dim, dim, dtype=DTYPE)
        self.mlp = MLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention(*self.qkv(x))  # (b, heads, n, head_dim)
        x = x + self.out(a.transpose(1, 2).reshape(x.shape))
        return x + self.mlp(x)


class DiT(nn.Module):
    """The denoiser: predicts the noise in `noisy` (batch, N, channels) at noise level `sigma` (batch,)."""

    def __init__(
        self,
        channels: int,
        dim: int,
        heads: int,
        tokens: int,
        blocks: int,
        hidden: int,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.embed = nn.Linear(channels, dim, dtype=DTYPE)
        self.position = nn.Parameter(0.1 * torch.randn(tokens, dim, dtype=DTYPE))
        self.noise_level = nn.Linear(1, dim, dtype=DTYPE)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, causal) for _ in range(blocks))
        self.norm = nn.LayerNorm(dim, dtype=DTYPE)
        self.head = nn.Linear(dim, channels, dtype=DTYPE)
        self.shard = SequenceShard()

    def forward(self, noisy: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """The prediction for THIS rank's tokens of the full samples `noisy`."""
        return self.predict(self.shard.tokens(noisy), self.shard.positions(noisy.shape[1]), sigma)

    def predict(
        self, tokens: torch.Tensor, positions: torch.Tensor, sigma: torch.Tensor
    ) -> torch.Tensor:
        h = self.embed(tokens) + self.position[positions] + self.noise_level(sigma.view(-1, 1, 1))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def generate(self, prompt: torch.Tensor, sigma: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Autoregressive decoding (causal model): append the prediction at the last position, repeat.

        A method other than `forward`: under FSDP its parameters are only gathered if
        the method is registered with `register_fsdp_forward_method`.
        """
        seq = prompt
        for _ in range(new_tokens):
            pred = self.predict(seq, torch.arange(seq.shape[1]), sigma)
            seq = torch.cat([seq, pred[:, -1:]], dim=1)
        return seq


def build_model(causal: bool = False, seed: int = 0) -> DiT:
    """The same initial parameters in every process: the init draws from its own seeded RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DiT(**SHAPE, causal=causal)


def loss_of(
    model: nn.Module, noisy: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """Mean squared error over the tokens this rank holds (the cp-local loss).

    Why the plain local mean is the right normalization: a sample's loss is the
    mean over its N tokens; its cp partners hold N/cp tokens each, so their local
    means sum to cp times the sample loss. FSDP averages gradients over all
    dp_replicate * dp_shard = world ranks, which hold world/cp samples:
    (1/world) * sum over ranks = (1/world) * cp * sum over samples = mean over samples.
    Exact only when every shard holds the same number of loss tokens: with padding or
    packing use `paralab.train.tokens` (the global token count).
    """
    target = model.shard.tokens(noise)
    return ((model(noisy, sigma) - target) ** 2).mean()
