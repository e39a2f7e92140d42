"""Lab 03's closed-form costs: bytes one rank sends over a whole guided sampling run.

A rank holds a latent shard of `L = batch * tokens/cp * channels * 8` bytes
(float64; cp = 1 without the cp overlay). Per run, one rank sends:

| what | bytes |
|---|---|
| cfgp swap (p2p, or all_gather of 2: the same bytes) | steps * L |
| noise broadcast | L on cfgp rank 0, 0 on the other |
| latent return (all_gather over cp) | (cp - 1) * L |
| cp attention, per layer and step | lab 02's forward formula: ring 2(cp-1)S, Ulysses 4(cp-1)S/cp |
"""

from __future__ import annotations

from paralab.cp.costs import ring_bytes, shard_bytes, ulysses_bytes

ITEMSIZE = 8  # float64


def latent_shard_bytes(latent_shape: tuple[int, ...], cp: int = 1) -> int:
    """L: one rank's share of a (batch, tokens, channels) float64 latent."""
    batch, tokens, channels = latent_shape
    return batch * (tokens // cp) * channels * ITEMSIZE


def cfgp_bytes(
    latent_shape: tuple[int, ...], steps: int, cfgp_rank: int, cp: int = 1
) -> dict[str, int]:
    """Bytes one rank sends for the cfgp axis over `steps` steps, by what they carry."""
    shard = latent_shard_bytes(latent_shape, cp)
    return {
        "cfgp swap": steps * shard,
        "noise broadcast": shard if cfgp_rank == 0 else 0,
        "latent return": (cp - 1) * shard,
    }


def cp_attention_bytes(
    kind: str, steps: int, layers: int, batch: int, heads: int, tokens: int, head_dim: int, cp: int
) -> int:
    """Bytes one rank sends for the denoiser's cp attention (forward only: sampling has no backward)."""
    s = shard_bytes(batch, heads, tokens, head_dim, cp)
    per_layer = ring_bytes(s, cp) if kind == "ring" else ulysses_bytes(s, cp)
    return steps * layers * per_layer["forward"]
